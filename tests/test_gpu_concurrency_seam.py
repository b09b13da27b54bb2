"""The GPU seam's concurrency is explicit: :attr:`evo.engine.seams.Stages.evaluate_concurrent`
decides whether the GPU actor may call the evaluate function from several threads at once (the
judge's, which serialises its own GPU work) or one call at a time (a stand-in); the function's
signature decides nothing."""

from __future__ import annotations

import threading
import time

import pytest

from evaluators.actor import CONCURRENT_CALLS, SLOTS, GpuEvaluator
from evaluators.base import CompileSettings, HarnessSettings
from evo.core.records import Candidate, Evaluation, StageResult, Status
from evo.engine.local_runtime import LocalRuntime
from evo.engine.seams import Stages
from fakes import stages as fake


class _Recorder:
    """An evaluate function that counts how many of its calls overlap."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.most = 0
        self.calls = 0

    def __call__(self, candidate: Candidate, so_bytes: bytes, settings: HarnessSettings) -> Evaluation:
        with self.lock:
            self.inside += 1
            self.calls += 1
            self.most = max(self.most, self.inside)
        time.sleep(0.05)
        with self.lock:
            self.inside -= 1
        stages = (StageResult("correctness", Status.OK), StageResult("timing", Status.OK, metrics={"speedup": 1.0}))
        return Evaluation(candidate.id, stages, 1.0, gpu="fake")


def _candidate(i: int = 0) -> Candidate:
    return Candidate.create("kb19_relu", fake.SOURCE, {"TILE": "32", "STAGES": "2", "VEC": str(1 + i)})


@pytest.mark.parametrize("concurrent", [True, False])
def test_the_stages_say_whether_the_actor_may_overlap_calls(concurrent):
    evaluate = _Recorder()
    rt = LocalRuntime(stages=Stages(fake.fake_compile, evaluate, evaluate_concurrent=concurrent),
                      compile_settings=CompileSettings(), harness_settings=HarnessSettings(), num_gpus=1).start()
    try:
        assert rt.gpu_slots == SLOTS
        refs = [rt.submit_gpu(0, c, b"\x7fELF-fake-" + c.id.encode()) for c in (_candidate(0), _candidate(1))]
        assert all(rt.get(r).evaluation.correct for r in refs)
        assert evaluate.calls == 2
        assert (evaluate.most == 2) if concurrent else (evaluate.most == 1)
    finally:
        rt.shutdown()


def test_a_stand_in_actor_runs_one_call_at_a_time():
    assert GpuEvaluator.concurrency(concurrent=True) == CONCURRENT_CALLS > 1
    assert GpuEvaluator.concurrency(concurrent=False) == 1 and GpuEvaluator.slots() == SLOTS >= 2
    evaluate = _Recorder()
    actor = GpuEvaluator(evaluate, HarnessSettings(), concurrent=False)
    try:
        threads = [threading.Thread(target=actor.evaluate, args=(_candidate(i), b"")) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert evaluate.calls == 3 and evaluate.most == 1, "the actor's own lock, not only Ray's threads"
    finally:
        actor.close()
