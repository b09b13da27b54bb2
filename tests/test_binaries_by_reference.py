"""Issue 29 item 6: a built binary goes from the compile worker to the GPU actor through Ray's
object store; the driver fetches only the compile verdict (real local Ray, fake stages)."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
import ray.cloudpickle as cloudpickle  # noqa: E402

from evaluators.base import CompileSettings, HarnessSettings  # noqa: E402
from evo.engine.runtime import Runtime  # noqa: E402
from evo.engine.seams import Stages  # noqa: E402
from fakes import stages as fake  # noqa: E402

cloudpickle.register_pickle_by_value(fake)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _runtime():
    return Runtime(stages=Stages(fake.fake_compile, fake.fake_evaluate, evaluate_concurrent=False), compile_settings=CompileSettings(),
                   harness_settings=HarnessSettings())


def test_binaries_go_from_compile_worker_to_gpu_actor_without_the_driver(local_ray, tmp_path):
    """The driver fetches only the compile verdict; the .so stays in Ray's object store and
    the GPU actor reads it by reference (fake_evaluate asserts it got its own binary's bytes)."""
    from evo.core.records import Candidate

    rt = _runtime().start()
    try:
        cand = Candidate.create("synthetic_a", fake.SOURCE, {"TILE": "32", "STAGES": "2", "VEC": "1"})
        ref = rt.submit_compile(cand)
        outcome = rt.get(ref)
        assert outcome.result.passed
        assert isinstance(outcome.so_bytes, ray.ObjectRef), type(outcome.so_bytes)
        res = rt.get(rt.submit_gpu(0, cand, outcome.so_bytes))  # fake_evaluate asserts it got the bytes
        assert res.evaluation.correct
        broken = Candidate.create("synthetic_a", fake.SOURCE, {"TILE": "32", "STAGES": "5", "VEC": "1"})
        assert rt.get(rt.submit_compile(broken)).so_bytes is None  # a failed build has no binary
    finally:
        rt.shutdown()
