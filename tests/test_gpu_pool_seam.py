"""The GPU seam's pool is an explicit argument: :attr:`evo.engine.seams.Stages.evaluate_concurrent`
decides whether the GPU actor hands its warm pool to the evaluate function (and runs calls
concurrently) and how many requests a runtime keeps on each GPU; the function's signature
decides nothing."""

from __future__ import annotations

import pytest

from evaluators.actor import GpuEvaluator
from evaluators.base import CompileSettings, HarnessSettings
from evo.core.records import Candidate, Evaluation, StageResult, Status
from evo.engine.local_runtime import LocalRuntime
from evo.engine.seams import Stages
from fakes import stages as fake


class _Recorder:
    """An evaluate function that accepts a pool but must not get one unless told to."""

    def __init__(self) -> None:
        self.pools: list = []

    def __call__(self, candidate: Candidate, so_bytes: bytes, settings: HarnessSettings, pool=None) -> Evaluation:
        self.pools.append(pool)
        stages = (StageResult("correctness", Status.OK), StageResult("timing", Status.OK, metrics={"speedup": 1.0}))
        return Evaluation(candidate.id, stages, 1.0, gpu="fake")


def _candidate() -> Candidate:
    return Candidate.create("kb19_relu", fake.SOURCE, {"TILE": "32", "STAGES": "2", "VEC": "1"})


@pytest.mark.parametrize("pooled", [True, False])
def test_the_stages_say_whether_the_evaluate_function_gets_the_pool(pooled):
    evaluate = _Recorder()
    hs = HarnessSettings(check_concurrency=3)
    rt = LocalRuntime(stages=Stages(fake.fake_compile, evaluate, evaluate_concurrent=pooled),
                      compile_settings=CompileSettings(), harness_settings=hs, num_gpus=1).start()
    try:
        assert rt.gpu_slots == (hs.check_concurrency + 1 if pooled else 2)
        res = rt.get(rt.submit_gpu(0, _candidate(), b"\x7fELF-fake-" + _candidate().id.encode()))
        assert res.evaluation.correct
        assert evaluate.pools == [rt.gpu_actors[0].evaluator.pool if pooled else None]
    finally:
        rt.shutdown()


def test_an_unpooled_actor_runs_one_call_at_a_time_with_the_gpu_to_itself():
    hs = HarnessSettings(check_concurrency=3)
    assert GpuEvaluator.concurrency(hs, pooled=True) == 5 and GpuEvaluator.concurrency(hs, pooled=False) == 1
    assert GpuEvaluator.slots(hs, pooled=True) == 4 and GpuEvaluator.slots(hs, pooled=False) == 2
    evaluate = _Recorder()
    actor = GpuEvaluator(evaluate, hs, pooled=False)
    try:
        actor.evaluate(_candidate(), b"")
        assert evaluate.pools == [None]
    finally:
        actor.close()
