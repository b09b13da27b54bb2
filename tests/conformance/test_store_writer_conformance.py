"""Conformance of the lineage store to evo.engine.seams.StoreWriter: the writes the engine makes
(and the three reads it makes back), as the engine relies on them.

Every implementation comes with a reader of its own (what was written must be readable by
another connection) and a way to fill its disk. :class:`evo.store.Store` is the only one;
the durability of a committed write under SIGKILL is tests/test_store.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pytest

from evo.engine.recovery import is_store_full
from evo.core.records import Candidate, Evaluation, Operator, StageResult, Status
from evo.engine.seams import StoreWriter
from evo.store import ReadOnlyStoreError, Store, UnknownIdError


@dataclass
class Impl:
    writer: Any
    reader: Any  # reads what ``writer`` wrote over another connection
    run_id: str
    fill_up: Callable[[], None]  # from now on the next growing write fails as on a full disk
    read_only: Callable[[], Any]  # the same store opened for reading only


def _sqlite(tmp_path) -> Impl:
    path = tmp_path / "evo.db"
    store = Store(path)
    run_id = store.create_run("conformance", {}, seed=0, config_hash="x")

    def fill_up() -> None:  # SQLite's own cap, as tests/test_faults.py fills the disk
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute(f"PRAGMA max_page_count = {pages}")

    return Impl(store, Store.open_reader(path), run_id, fill_up, lambda: Store.open_reader(path))


IMPLS = {"evo.store.Store": _sqlite}


@pytest.fixture(params=sorted(IMPLS))
def impl(request, tmp_path):
    it = IMPLS[request.param](tmp_path)
    yield it
    it.reader.close()
    it.writer.close()


def _cand(tag: str = "", **kw) -> Candidate:
    return Candidate.create("synthetic_a", f"// kernel {tag}\n", {"TILE": "32"}, **kw)


def _ev(cand: Candidate, fitness: float | None = 1.25) -> Evaluation:
    if fitness is None:
        return Evaluation(cand.id, (StageResult("policy", Status.OK), StageResult("compile", Status.COMPILE_ERROR,
                                                                                 reason="error: x")))
    return Evaluation(cand.id, (StageResult("policy", Status.OK), StageResult("timing", Status.OK)), fitness,
                      gpu="fake")


def test_it_is_a_store_writer(impl):
    assert isinstance(impl.writer, StoreWriter)


def test_add_candidate_is_new_once_and_keeps_the_first_lineage(impl):
    w, run = impl.writer, impl.run_id
    first = _cand("a", operator=Operator.SEED, notes="first")
    again = _cand("a", parents=("x" * 64,), operator=Operator.KNOBS, notes="second")
    assert first.id == again.id
    assert w.add_candidate(run, first) is True
    assert w.add_candidate(run, again) is False
    other = _cand("b")
    w.add_candidate(run, other)
    got = impl.reader.candidates(run)
    assert [c.id for c in got] == [first.id, other.id], "insertion order"
    assert got[0].notes == "first" and got[0].parents == ()
    assert [c.id for c in w.candidates(run)] == [first.id, other.id]


def test_add_evaluation_is_recorded_once_and_read_back(impl):
    w, run = impl.writer, impl.run_id
    good, bad = _cand("good"), _cand("bad")
    for c in (good, bad):
        w.add_candidate(run, c)
    assert w.add_evaluation(run, _ev(good)) is True
    assert w.add_evaluation(run, _ev(good, 9.0)) is False, "a second evaluation is a no-op"
    assert w.add_evaluation(run, _ev(bad, None)) is True
    back = w.get_evaluation(good.id, run)
    assert back.fitness == 1.25 and back.correct and [s.stage for s in back.stages] == ["policy", "timing"]
    failed = impl.reader.get_evaluation(bad.id, run)
    assert failed.status is Status.COMPILE_ERROR and failed.fitness is None and failed.failed_stage.reason == "error: x"
    assert sorted(e.candidate_id for e in w.evaluations(run)) == sorted([good.id, bad.id])
    assert w.get_evaluation(_cand("never").id, run) is None


def test_writes_about_unknown_runs_or_candidates_raise_and_write_nothing(impl):
    w, run = impl.writer, impl.run_id
    stranger = _cand("stranger")
    with pytest.raises(UnknownIdError):
        w.add_evaluation(run, _ev(stranger))
    with pytest.raises(UnknownIdError):
        w.add_profile(stranger.id, shape="N=1", gpu="fake", metrics={})
    with pytest.raises(UnknownIdError):
        w.set_champion(run, "synthetic_a", stranger.id, 1.0, {"confirmed": True})
    with pytest.raises(UnknownIdError):
        w.add_candidate("no-such-run", stranger)
    with pytest.raises(UnknownIdError):
        w.log_event("no-such-run", "progress", {})
    assert impl.reader.evaluations(run) == [] and impl.reader.champions(run) == []
    assert impl.reader.candidates(run) == []


def test_add_profile_stores_and_replaces_one_per_shape_and_gpu(impl):
    w, run = impl.writer, impl.run_id
    c = _cand()
    w.add_candidate(run, c)
    w.add_profile(c.id, shape="N=1024", gpu="H200", metrics={"duration_us": 3.0})
    w.add_profile(c.id, shape="N=1024", gpu="H200", metrics={"duration_us": 2.5})
    w.add_profile(c.id, shape="N=2048", gpu="H200", metrics={"duration_us": 5.0})
    assert impl.reader.get_profile(c.id, "N=1024", gpu="H200") == {"duration_us": 2.5}
    assert len(impl.reader.profiles(c.id)) == 2


def test_add_tuning_trial_inserts_then_updates_the_same_trial(impl):
    w, run = impl.writer, impl.run_id
    parent, child = _cand("parent"), _cand("child")
    for c in (parent, child):
        w.add_candidate(run, c)
    w.add_tuning_trial(run, parent.id, 1, {"TILE": "64"}, None, "running", child.id)
    w.add_tuning_trial(run, parent.id, 1, {"TILE": "64"}, 1.5, "complete", child.id)
    w.add_tuning_trial(run, parent.id, 2, {"TILE": "16"}, None, "pruned")
    rows = impl.reader.tuning_trials(run, parent.id)
    assert [(r["trial"], r["value"], r["status"]) for r in rows] == [(1, 1.5, "complete"), (2, None, "pruned")]
    assert rows[0]["params"] == {"TILE": "64"}


def test_set_champion_replaces_the_tasks_champion(impl):
    w, run = impl.writer, impl.run_id
    a, b = _cand("a"), _cand("b")
    for c in (a, b):
        w.add_candidate(run, c)
    w.set_champion(run, "synthetic_a", a.id, 1.1, {"confirmed": False, "error": "x"})
    w.set_champion(run, "synthetic_a", b.id, 1.4, {"confirmed": True, "fitness_confirmed": 1.39})
    (champ,) = impl.reader.champions(run)
    assert champ["candidate_id"] == b.id and champ["fitness"] == 1.4 and champ["confirmation"]["confirmed"] is True


@pytest.mark.parametrize("status", ["finished", "interrupted", "failed"])
def test_set_run_status_takes_every_status_the_engine_sets(impl, status):
    impl.writer.set_run_status(impl.run_id, status)
    assert impl.reader.get_run(impl.run_id)["status"] == status


def test_set_run_status_refuses_an_unknown_status(impl):
    with pytest.raises(ValueError, match="unknown run status"):
        impl.writer.set_run_status(impl.run_id, "exploded")


def test_log_event_appends_in_order(impl):
    w, run = impl.writer, impl.run_id
    ids = [w.log_event(run, "progress", {"evaluations": n}) for n in range(3)]
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert [e["payload"]["evaluations"] for e in impl.reader.events(run, "progress")] == [0, 1, 2]


def test_a_read_only_store_refuses_every_write(impl):
    ro = impl.read_only()
    try:
        c = _cand()
        with pytest.raises(ReadOnlyStoreError):
            ro.add_candidate(impl.run_id, c)
        with pytest.raises(ReadOnlyStoreError):
            ro.log_event(impl.run_id, "progress", {})
    finally:
        ro.close()


def test_a_full_disk_raises_what_the_engine_recognises_and_keeps_what_was_committed(impl):
    w, run = impl.writer, impl.run_id
    kept = _cand("kept")
    w.add_candidate(run, kept)
    w.add_evaluation(run, _ev(kept))
    impl.fill_up()
    with pytest.raises(Exception) as e:
        for i in range(200):  # rows until a page must be added
            c = Candidate.create("synthetic_a", f"// big {i}\n" + "x" * 4000, {})
            w.add_candidate(run, c)
            w.add_evaluation(run, _ev(c))
    assert is_store_full(e.value), f"not recognised as a full disk: {type(e.value).__name__}: {e.value}"
    assert impl.reader.get_evaluation(kept.id, run).fitness == 1.25
