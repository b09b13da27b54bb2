"""Conformance of the runtimes to evo.engine.seams.ClusterRuntime: what the engine relies on,
member by member, for each of ``RUNTIMES``:

- ``ray``: evo.engine.runtime.Runtime on a real local Ray instance (fake stages);
- ``local``: evo.engine.local_runtime.LocalRuntime (threads, two fake GPUs, plain islands).

A third implementation (another cluster manager) would be added to ``RUNTIMES``.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

from evaluators.actor import GpuResult
from evaluators.base import CompileSettings, HarnessSettings, InfrastructureError
from evo.engine.local_runtime import LocalRuntime
from evo.engine.recovery import infra_cause
from evo.core.records import Candidate, Evaluation, Member, StageResult, Status
from evo.engine.seams import ClusterRuntime, CompileResult, IslandHost, IslandProxy, Stages, SubmittedWork
from fakes import stages as fake

try:
    import ray
    import ray.cloudpickle as cloudpickle
except ImportError:  # pragma: no cover - the local runtime needs no Ray
    ray = None
else:
    cloudpickle.register_pickle_by_value(fake)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

RUNTIMES = ["ray", "local"]

PARAMS = {"TILE": "32", "STAGES": "2", "VEC": "1"}


def conformance_compile(candidate: Candidate, settings: CompileSettings):
    """fake_compile, except that a candidate's notes can ask for a failure of ours."""
    if candidate.notes == "raise-infra":
        raise InfrastructureError("simulated: nvcc is missing", fix="install the CUDA toolkit")
    if candidate.notes == "die":
        os._exit(19)  # the worker process dies, as on OOM
    return fake.fake_compile(candidate, settings)


def _cand(notes: str = "", **params: str) -> Candidate:
    return Candidate.create("synthetic_a", fake.SOURCE, {**PARAMS, **params}, notes=notes)


def _stages():
    return Stages(conformance_compile, fake.fake_evaluate, fake.fake_profile, evaluate_concurrent=False)


@pytest.fixture(scope="module", params=RUNTIMES)
def rt(request):
    if request.param == "local":
        runtime = LocalRuntime(stages=_stages(), compile_settings=CompileSettings(),
                               harness_settings=HarnessSettings(), num_gpus=2, num_cpus=2).start()
        yield runtime
        runtime.shutdown()
        return
    if ray is None:
        pytest.skip("ray is not installed")
    from evo.engine.runtime import Runtime

    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    runtime = Runtime(stages=_stages(), compile_settings=CompileSettings(),
                      harness_settings=HarnessSettings()).start()
    yield runtime
    runtime.shutdown()
    ray.shutdown()


def _kill(rt, island) -> None:
    """Kill an island's actor for good, as each runtime's tests can."""
    if isinstance(rt, LocalRuntime):
        rt.kill(island)
    else:
        ray.kill(island.actor, no_restart=True)


def _built(rt, cand: Candidate) -> bytes:
    out = rt.get(rt.submit_compile(cand))
    assert isinstance(out, CompileResult) and out.result.passed
    return out.so_bytes


def test_it_is_a_cluster_runtime_with_its_gpus_and_cpus(rt):
    assert isinstance(rt, ClusterRuntime) and isinstance(rt, SubmittedWork) and isinstance(rt, IslandHost)
    assert rt.n_gpus == len(rt.gpu_actors) == 2
    assert rt.n_cpus >= 1 and rt.n_cpus == rt.n_cpus
    # islands are called through their typed proxies, never by method name on the runtime
    assert not [m for m in ("call", "ask", "cast", "call_many") if hasattr(rt, m)]
    for g in range(rt.n_gpus):  # the probe the engine sends to a GPU actor that died
        assert isinstance(rt.get(rt.probe_gpu(g)), str)


def test_submit_compile_returns_a_reference_to_the_compile_result(rt):
    good, bad = _cand(), _cand(STAGES="5")  # STAGES=5: fake_compile's compile error
    refs = {rt.submit_compile(good): good, rt.submit_compile(bad): bad}
    assert len(refs) == 2, "references are hashable and distinct"
    outs = {refs[r].id: rt.get(r) for r in refs}
    handle = outs[good.id].so_bytes  # the real runtime: a reference into Ray's object store
    binary = ray.get(handle) if ray is not None and isinstance(handle, ray.ObjectRef) else handle
    assert outs[good.id].result.passed and binary.endswith(good.id.encode())
    assert outs[bad.id].result.status is Status.COMPILE_ERROR and outs[bad.id].so_bytes is None


def test_submit_gpu_runs_on_the_gpu_asked_for(rt):
    cand = _cand(TILE="64")
    so = _built(rt, cand)
    seen = set()
    for g in range(rt.n_gpus):
        res = rt.get(rt.submit_gpu(g, cand, so))
        assert isinstance(res, GpuResult) and isinstance(res.evaluation, Evaluation)
        assert res.evaluation.candidate_id == cand.id and res.evaluation.correct
        assert res.started <= res.finished
        seen.add(res.evaluation.env["gpu_ids"])
    assert len(seen) == rt.n_gpus, f"each GPU actor holds its own GPU: {seen}"


def test_requests_to_one_gpu_actor_run_in_order_one_at_a_time(rt):
    cands = [_cand(TILE=t) for t in ("16", "32", "64", "128")]
    refs = [rt.submit_gpu(0, c, _built(rt, c)) for c in cands]
    results = [rt.get(r) for r in refs]
    assert [r.evaluation.candidate_id for r in results] == [c.id for c in cands]
    for a, b in zip(results, results[1:]):
        assert a.finished <= b.started


def test_submit_profile_returns_a_profile_stage_result(rt):
    cand = _cand()
    st = rt.get(rt.submit_profile(1, cand, _built(rt, cand), 0, None))
    assert isinstance(st, StageResult) and st.stage == "profile" and st.passed and st.metrics["gpu"]


def test_wait_returns_what_is_ready_and_never_blocks_on_nothing(rt):
    t0 = time.monotonic()
    assert rt.wait([], 30.0) == []
    assert time.monotonic() - t0 < 1.0
    ref = rt.submit_compile(_cand(TILE="128"))  # fake_compile sleeps 0.05 s
    assert rt.wait([ref], 0.0) == []
    assert rt.wait([ref], 30.0) == [ref]
    a, b = rt.submit_compile(_cand(TILE="256")), rt.submit_compile(_cand(TILE="16", VEC="2"))
    rt.get(a), rt.get(b)
    assert set(rt.wait([a, b], 30.0)) == {a, b}, "every finished reference comes back at once"


def test_a_stage_that_raises_is_a_remote_error_with_the_cause_behind_it(rt):
    errors = rt.remote_errors()
    assert isinstance(errors, tuple) and errors and all(issubclass(e, BaseException) for e in errors)
    assert rt.remote_errors() == errors
    ref = rt.submit_compile(_cand(notes="raise-infra"))
    assert rt.wait([ref], 60.0) == [ref], "a failed reference counts as ready"
    with pytest.raises(errors) as e:
        rt.get(ref)
    infra = infra_cause(e.value)
    assert isinstance(infra, InfrastructureError) and infra.fix == "install the CUDA toolkit"


def test_a_worker_that_dies_is_a_remote_error(rt):
    if isinstance(rt, LocalRuntime):
        pytest.skip("in-process compile workers are threads: os._exit would end the test process")
    with pytest.raises(rt.remote_errors()):
        rt.get(rt.submit_compile(_cand(notes="die")))


def test_island_actors_answer_in_call_order(rt):
    from populations.island import IslandSpec

    specs = [IslandSpec(index=i, task="synthetic_a", capacity=4, seed=i) for i in range(2)]
    a, b = rt.make_islands(specs)
    assert isinstance(a, IslandProxy) and isinstance(b, IslandProxy)
    member = Member(candidate=_cand(), fitness=1.2, status=Status.OK)
    a.add(member)  # fire and forget, yet before the next call to the same island
    assert a.summary().size == 1
    ref = a.ask_parents(1)
    assert [p.id for p in rt.get(ref)] == [member.id] == [p.id for p in a.parents(1)]
    assert [rt.get(r).index for r in (b.ask_summary(), a.ask_summary())] == [1, 0]
    a.record_child(member.id)
    assert b.immigrate(a.emigrants(1)) == 1 and b.summary().size == 1
    assert b.add_many([member]) == [False], "already there"


def test_a_dead_island_actor_raises_an_actor_error(rt):
    from populations.island import IslandSpec

    (island,) = rt.make_islands([IslandSpec(index=0, task="synthetic_a", capacity=4)])
    assert island.summary().size == 0
    _kill(rt, island)
    # ray.kill is asynchronous: a call sent right after it may still be served by the
    # living actor (seen once in CI). The contract is that calls fail once it is dead.
    deadline = time.monotonic() + 30.0
    with pytest.raises(rt.remote_errors()) as e:
        while time.monotonic() < deadline:
            island.summary()
            time.sleep(0.05)
    assert "Actor" in type(e.value).__name__, "the engine tells a dead actor from a failed method by the name"
    assert any("Actor" in t.__name__ and isinstance(e.value, t) for t in rt.remote_errors())
