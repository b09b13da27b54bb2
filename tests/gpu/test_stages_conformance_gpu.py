"""Conformance of the real GPU stage callables to evo.engine.seams.EvaluateFn and ProfileFn.

The CPU half of the suite (the compile stage, every fake) is
tests/conformance/test_stages_conformance.py; the checks are shared (tests/conformance/checks.py).
Targets kb19_relu: its seed must come back correct with a fitness, a kernel that writes half
its output (tests/fixtures/bad/partial_write.cu) incorrect, as a result and not an exception.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from conformance.checks import check_evaluation, check_profile
from evaluators.base import HarnessSettings
from evo.core.records import Candidate, Status
from evo.engine.seams import EvaluateFn, ProfileFn

pytestmark = pytest.mark.gpu

TESTS = Path(__file__).resolve().parents[1]
RELU = "kb19_relu"
FAST = HarnessSettings(trials=5, warmup=2, reps=10, timeout_s=300)


@pytest.fixture(scope="module")
def relu_builds(request):
    """The kb19_relu seed and a kernel that writes only half its output, built with nvcc."""
    from toolchain import compile_shared

    from evo.tasks.seeds import seed_params, seed_source

    partial = (TESTS / "fixtures" / "bad" / "partial_write.cu").read_text()
    cands = {"good": Candidate.create(RELU, seed_source(RELU), seed_params(RELU)),
             "bad": Candidate.create(RELU, partial, {})}
    return {k: (c, compile_shared(request, RELU, c.source, c.params_dict).so_bytes) for k, c in cands.items()}


def test_evaluate_built_conforms(relu_builds):
    from evaluators.pipeline import evaluate_built

    assert isinstance(evaluate_built, EvaluateFn)
    assert pickle.loads(pickle.dumps(evaluate_built)) is evaluate_built
    cand, so = relu_builds["good"]
    ev = evaluate_built(cand, so, FAST)
    check_evaluation(ev, cand)
    assert ev.correct and ev.fitness > 0, ev.stages
    cand, so = relu_builds["bad"]
    ev = evaluate_built(cand, so, FAST)
    check_evaluation(ev, cand)
    assert ev.failed_stage.stage == "correctness" and ev.failed_stage.status is Status.INCORRECT, ev.stages


def test_the_gpu_actors_ncu_profile_conforms(relu_builds, tmp_path):
    """The ProfileFn the runtime runs when ``Stages.profile_fn`` is None: GpuEvaluator.profile."""
    from evaluators.actor import GpuEvaluator
    from evaluators.profile import ProfileSettings

    if shutil.which("ncu") is None:
        pytest.skip("ncu (Nsight Compute) is not on PATH")
    profile = GpuEvaluator(None, FAST, concurrent=True).profile
    assert isinstance(profile, ProfileFn)
    cand, so = relu_builds["good"]
    st = profile(cand, so, 0, ProfileSettings(enabled=True, cache_dir=str(tmp_path)))
    check_profile(st)
    assert st.passed, st.reason
