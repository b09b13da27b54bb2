"""Profiler blind: when the first profiles of a run see no kernel (ncu in front of a sandboxed
runner that it cannot see into) or the profiler fails, profiling stops for the run instead of
spending GPU time on every survivor (issue 41: 22 of 60 candidates profiled in vain on an H100,
each ~6 s of GPU time). One profile that worked keeps profiling on; a single candidate that
launches no kernel (copies only) does not switch it off."""

from __future__ import annotations

import random
from types import SimpleNamespace

from evaluators.profile import ProfileSettings
from evo.core.records import Candidate, Member, Operator, StageResult, Status
from evo.engine.dispatch import Dispatch
from evo.engine.survivors import PROFILER_BLIND_AFTER, ProfileJob, Survivors
from evo.store import Store

SRC = "// @tunable A = 0 in {0, 1, 2, 3}\n"
REGISTRY = SimpleNamespace(get=lambda name: SimpleNamespace(bench_shapes=1, shapes=({"N": 1},)))


def _cand(a: int) -> Candidate:
    return Candidate.create("t", SRC, {"A": str(a)}, operator=Operator.KNOBS, island=0)


def _blind(c: Candidate) -> StageResult:
    return StageResult("profile", Status.CRASH, "ncu captured no kernel from the candidate's call",
                       {"ncu_kernels": 0})


def _ok() -> StageResult:
    return StageResult("profile", Status.OK, "", {"gpu": "H100", "bound": "memory"})


def _survivors(tmp_path):
    store = Store(tmp_path / "evo.db")
    rid = store.create_run("r", {}, seed=0, config_hash="")
    sv = Survivors(store=store, run_id=rid, profile=ProfileSettings(enabled=True, top_k=3, cache_dir=""),
                   tuning=None, tuning_storage="", rng=random.Random(0), task_registry=REGISTRY)
    return store, rid, sv


def _profile(sv, c: Candidate, st: StageResult) -> None:
    sv.store.add_candidate(sv.run_id, c)
    (job,) = sv.triggered(Member(c, 1.0 + int(c.params_dict["A"])), b"so", [0])
    sv.profiled(job, st)


def test_profiles_that_see_nothing_switch_profiling_off(tmp_path):
    store, rid, sv = _survivors(tmp_path)
    cands = [_cand(i) for i in range(PROFILER_BLIND_AFTER + 1)]
    for c in cands[:PROFILER_BLIND_AFTER - 1]:
        _profile(sv, c, _blind(c))
    assert sv.profiling_off is None, "one candidate without a kernel is data, not a blind profiler"
    _profile(sv, cands[PROFILER_BLIND_AFTER - 1], _blind(cands[PROFILER_BLIND_AFTER - 1]))
    assert sv.profiling_off and "no kernel" in sv.profiling_off
    assert sv.triggered(Member(cands[-1], 9.0), b"so", [0]) == [], "no profile queued once off"
    off = [e for e in store.events(rid) if e["kind"] == "profiling_off"]
    assert len(off) == 1 and off[0]["payload"]["candidates"] == [c.id for c in cands[:PROFILER_BLIND_AFTER]]
    store.close()


def test_a_profile_that_worked_keeps_profiling_on(tmp_path):
    store, _rid, sv = _survivors(tmp_path)
    cands = [_cand(i) for i in range(PROFILER_BLIND_AFTER + 2)]
    _profile(sv, cands[0], _ok())
    for c in cands[1:-1]:
        _profile(sv, c, _blind(c))
    assert sv.profiling_off is None
    assert sv.triggered(Member(cands[-1], 9.0), b"so", [0]), "still profiling"
    store.close()


def test_profiler_failures_count_as_blind_and_a_crash_with_kernels_does_not(tmp_path):
    store, _rid, sv = _survivors(tmp_path)
    a, b, c = _cand(0), _cand(1), _cand(2)
    _profile(sv, a, StageResult("profile", Status.CRASH, "the kernel faulted under ncu", {}))
    assert sv.profiling_off is None
    (job,) = sv.triggered(Member(b, 5.0), b"so", [0])
    sv.profile_failed(job, RuntimeError("ncu wrote no report (exit 11)"))
    (job,) = sv.triggered(Member(c, 6.0), b"so", [0])
    sv.profile_failed(job, RuntimeError("ncu wrote no report (exit 11)"))
    assert sv.profiling_off and "exit 11" in sv.profiling_off
    store.close()


def test_dispatch_drops_queued_profiles_only():
    d = Dispatch(rt=None, faults=None, profile=None)
    jobs = [ProfileJob(_cand(i), b"so", 0) for i in range(3)]
    d.add_profiles(jobs)
    assert d.drop_profiles() == 3 and d.drop_profiles() == 0
