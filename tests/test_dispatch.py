"""Dispatch (evo.engine.dispatch) hides its queues and answers a finished request with a tagged,
frozen completion record; the engine's ``seen`` ids are lent read-only (evo.engine.seen) and the
proposer's counters are its own. A scripted runtime, no threads: every result is set by the test."""

from __future__ import annotations

import dataclasses
import random
from collections import deque

import pytest

from evo.core.records import Candidate, StageResult, Status
from evo.engine.bookkeeping import Pending
from evo.engine.dispatch import (CompileDone, CompileFailed, Dispatch, GpuDone, GpuFailed, ProfileDone,
                                 ProfileFailed)
from evo.engine.recovery import GpuFaults
from evo.engine.seen import SeenIds
from evo.engine.survivors import ProfileJob


class Boom(RuntimeError):
    """The scripted runtime's remote error."""


class ScriptedRuntime:
    """Submissions return numbered refs; ``results[ref]`` is what ``get`` answers (an
    exception instance is raised)."""

    gpu_slots = 2

    def __init__(self) -> None:
        self.n, self.results, self.submitted = 0, {}, []

    def _ref(self, kind: str, *what) -> int:
        self.n += 1
        self.submitted.append((kind, self.n) + what)
        return self.n

    def submit_compile(self, candidate):
        return self._ref("compile", candidate.id)

    def submit_gpu(self, gpu, candidate, so_bytes):
        return self._ref("gpu", gpu, candidate.id)

    def submit_profile(self, gpu, candidate, so_bytes, shape_idx, settings):
        return self._ref("profile", gpu, candidate.id)

    def get(self, ref):
        value = self.results[ref]
        if isinstance(value, BaseException):
            raise value
        return value

    @staticmethod
    def remote_errors():
        return (Boom,)


def _pending(tile: str) -> Pending:
    return Pending(candidate=Candidate.create("t", "src", {"TILE": tile}), pre_stages=(StageResult("policy", Status.OK),))


def _dispatch(n_gpus: int = 2):
    rt = ScriptedRuntime()
    d = Dispatch(rt, GpuFaults(), profile=None)
    d.start(n_gpus)
    return rt, d


def test_take_answers_a_compile_with_a_frozen_tagged_record():
    rt, d = _dispatch()
    ok, bad = _pending("1"), _pending("2")
    d.compile(ok)
    d.compile(bad)
    (_, r_ok, _), (_, r_bad, _) = rt.submitted
    rt.results[r_ok], rt.results[r_bad] = "outcome", Boom("worker died")
    assert d.waiting() == [r_ok, r_bad] and d.compiling() == 2
    done = d.take(r_ok)
    assert done == CompileDone(ok, "outcome")
    with pytest.raises(dataclasses.FrozenInstanceError):
        done.pending = bad
    failed = d.take(r_bad)
    assert isinstance(failed, CompileFailed) and failed.pending is bad and str(failed.error) == "worker died"
    assert d.waiting() == [] and len(d) == 0


def test_take_answers_gpu_and_profile_requests_with_their_gpu_and_frees_its_slot():
    rt, d = _dispatch(n_gpus=1)
    a, b = _pending("1"), _pending("2")
    job = ProfileJob(a.candidate, b"so", 0)
    d.compiled(a, trial=False)
    d.compiled(b, trial=False)
    d.add_profiles([job])
    assert d.queued() == 2
    d.fill_gpus()  # two slots on the one GPU: both mutations, the profile waits
    assert [s[0] for s in rt.submitted] == ["gpu", "gpu"] and d.queued() == 0
    r_a, r_b = rt.submitted[0][1], rt.submitted[1][1]
    assert set(d.on_gpus()) == {r_a, r_b}
    rt.results[r_a], rt.results[r_b] = "result", Boom("actor died")
    assert d.take(r_a) == GpuDone(0, a, "result")
    d.fill_gpus()  # the freed slot takes the profile
    r_p = rt.submitted[2][1]
    assert rt.submitted[2][0] == "profile"
    failed = d.take(r_b)
    assert isinstance(failed, GpuFailed) and (failed.gpu, failed.pending) == (0, b)
    rt.results[r_p] = StageResult("profile", Status.OK)
    assert d.take(r_p) == ProfileDone(0, job, rt.results[r_p])
    d.add_profiles([job])
    d.fill_gpus()
    rt.results[rt.submitted[3][1]] = Boom("ncu broke")
    assert isinstance(d.take(rt.submitted[3][1]), ProfileFailed)


def test_dispatch_shows_no_container_of_its_own():
    _, d = _dispatch()
    public = {k: v for k, v in vars(d).items() if not k.startswith("_")}
    assert not [k for k, v in public.items() if isinstance(v, (dict, list, set, deque))], public
    before = d.on_gpus()
    before["x"] = (0, _pending("9"))
    assert d.on_gpus() == {}, "on_gpus() is a copy"


def test_seen_is_lent_read_only_and_live():
    seen = SeenIds()
    view = seen.view()
    assert seen.add("a") and not seen.add("a")
    seen.update(["b"])
    assert "a" in view and "b" in view and len(view) == 2 and frozenset(view) == {"a", "b"}
    assert not hasattr(view, "add") and not hasattr(view, "update") and not hasattr(view, "discard")


def test_the_engine_lends_its_helpers_a_read_only_seen_and_never_writes_the_proposers_counters(tmp_path):
    from evo.engine.engine import Engine, EngineSettings
    from mutators.knobs import KnobsMutator

    eng = Engine(store=None, runtime=None, mutator=KnobsMutator(0.3, 2), run_id="r", tasks=["t"], seeds={},
                 settings=EngineSettings(), rng=random.Random(0), policy=lambda s: StageResult("policy", Status.OK))
    assert not hasattr(eng.proposer.seen, "add"), "the proposer cannot mark an id seen"
    eng.seen.add("x")
    assert "x" in eng.proposer.seen
    for counter in ("claimed", "failed_attempts", "fill_failures"):
        with pytest.raises(AttributeError):
            setattr(eng.proposer, counter, 0)


def test_trials_and_profiles_get_their_turn_while_mutations_wait():
    """Compiles outpace the GPU: mutations always wait. Trials still get one request in
    TRIAL_EVERY and profiles one in PROFILE_EVERY, neither starved nor in a burst."""
    from evo.engine.dispatch import PROFILE_EVERY, TRIAL_EVERY

    rt, d = _dispatch(n_gpus=1)
    rt.gpu_slots = 24
    muts = [_pending(f"m{i}") for i in range(24)]
    trials = [_pending(f"t{i}") for i in range(24)]
    for p in muts:
        d.compiled(p, trial=False)
    for p in trials:
        d.compiled(p, trial=True)
    d.add_profiles([ProfileJob(muts[0].candidate, b"so", 0) for _ in range(24)])
    ids = {p.candidate.id: k for k, ps in (("m", muts), ("t", trials)) for p in ps}
    d.fill_gpus()
    got = ["p" if s[0] == "profile" else ids[s[3]] for s in rt.submitted]
    assert len(got) == 24
    assert got.count("t") == 24 // TRIAL_EVERY and got.count("p") >= 24 // PROFILE_EVERY - 1, got
    # no two trials closer than TRIAL_EVERY requests
    at = [i for i, k in enumerate(got) if k == "t"]
    assert all(b - a >= TRIAL_EVERY for a, b in zip(at, at[1:])), got
    assert got.count("m") >= 24 // 2, got


def test_a_queue_that_filled_late_gets_its_turn_and_no_burst():
    from evo.engine.dispatch import TRIAL_EVERY

    rt, d = _dispatch(n_gpus=1)
    rt.gpu_slots = 10
    muts = [_pending(f"m{i}") for i in range(20)]
    for p in muts:
        d.compiled(p, trial=False)
    d.fill_gpus()                       # ten mutations, no trial waiting
    trials = [_pending(f"t{i}") for i in range(6)]
    for p in trials:
        d.compiled(p, trial=True)
    for s in list(rt.submitted):        # the ten finish
        rt.results[s[1]] = "r"
        d.take(s[1])
    d.fill_gpus()
    tid = {p.candidate.id for p in trials}
    got = ["t" if s[3] in tid else "m" for s in rt.submitted[10:]]
    assert got[0] == "t" and got.count("t") == len(range(0, 10, TRIAL_EVERY)), got


def test_without_mutations_profiles_come_before_trials():
    rt, d = _dispatch(n_gpus=1)
    trial, job = _pending("t"), ProfileJob(_pending("x").candidate, b"so", 0)
    d.compiled(trial, trial=True)
    d.add_profiles([job])
    rt.gpu_slots = 1
    d.fill_gpus()
    # the first request: the trial's turn has not come (no request yet), no mutation: the profile
    assert [s[0] for s in rt.submitted] == ["profile"]
