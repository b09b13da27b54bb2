"""`evo export` re-checks every exported binary through the judge (issue 40): the verdict
comes from a process that never loads the candidate, on every shape of its task, and a binary
that fails is not exported. The judge here is a real :class:`~evaluators.judge.judge.Judge`
(CPU stand-in backend) driving the in-process runner of tests/fakes/fake_runner.py on the
fake clock, registered as this process's judge so the export path reaches it exactly as it
would reach the GPU's."""

from __future__ import annotations

import pytest

import evaluators.judge as J
from evo.core.records import Candidate, Operator
from evo.results.export.exporter import JudgeRecheckError, judge_recheck
from tests.fakes.fake_runner import relu_kernel
from tests.test_judge import TASK_FILE, _judge


@pytest.fixture
def registered_judge(tmp_path):
    made: list = []

    def install(**behaviour):
        judge, _clock = _judge(tmp_path, made, **behaviour)
        J._JUDGES["cuda"] = judge
        return made

    yield install
    J.reset_judges()


def _cand() -> Candidate:
    return Candidate.create("judge_relu", "// the source; the judge runs the binary", {}, operator=Operator.USER)


def test_an_honest_binary_is_rechecked_on_every_shape(registered_judge):
    made = registered_judge()
    checks = judge_recheck(_cand(), b"\x7fELF...", (TASK_FILE,), gpu=True)
    assert checks["status"] == "ok" and checks["shapes_checked"] == "all"
    assert (checks["correctness"], checks["timing"]) == ("ok", "ok") and checks["fitness"] > 0
    assert made[0].calls == 2 * 5 * 2 + 10 + 50, "both shapes checked, the benchmark shape timed"


def test_a_binary_that_forges_its_result_is_not_exported(registered_judge):
    registered_judge(forge_at=0)
    with pytest.raises(JudgeRecheckError, match="failed the judge's re-check at export: correctness crash"):
        judge_recheck(_cand(), b"\x7fELF...", (TASK_FILE,), gpu=True)


def test_a_binary_that_lies_about_its_time_is_not_exported(registered_judge):
    registered_judge(lie_factor=20.0)
    with pytest.raises(JudgeRecheckError, match="timing invalid"):
        judge_recheck(_cand(), b"\x7fELF...", (TASK_FILE,), gpu=True)


def test_without_a_gpu_the_manifest_says_nothing_was_rechecked():
    checks = judge_recheck(_cand(), b"\x7fELF...", (TASK_FILE,), gpu=False)
    assert checks == {"status": "not re-checked: no CUDA GPU on this machine (run `evo export` on a GPU machine "
                                "for the judge's re-check)"}


def test_relu_kernel_is_the_honest_control():
    import torch

    x = torch.tensor([-1.0, 2.0])
    y = torch.empty(2)
    assert relu_kernel([x], [y], []) == 0 and y.tolist() == [0.0, 2.0]
