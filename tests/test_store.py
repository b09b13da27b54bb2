"""Contract tests of the lineage store.

Every test goes through the ``open_store`` fixture, which is parametrised over
``STORE_IMPLS`` ("module:Class" strings, so the crash test can rebuild the same
implementation in a child process). To check another implementation against the same
contract, add it to ``STORE_IMPLS``; the few tests that poke at SQLite internals (schema
version pragma, raw SQL) are marked as such in their docstring.
"""

from __future__ import annotations

import importlib
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, HealthCheck
from hypothesis import strategies as st

import evo
from evo.core.records import Candidate, Evaluation, Operator, StageResult, Status
from evo.store import (
    SCHEMA_VERSION,
    AmbiguousIdError,
    Migration,
    MigrationError,
    NotALineageDatabaseError,
    ReadOnlyStoreError,
    RunExistsError,
    SchemaTooNewError,
    SchemaTooOldError,
    Store,
    StoreError,
    StoreNotFoundError,
    UnknownIdError,
)

STORE_IMPLS = {"sqlite": "evo.store:Store"}
REPO_ROOT = Path(evo.__file__).resolve().parent.parent


def _load_impl(spec: str):
    mod, name = spec.split(":")
    return getattr(importlib.import_module(mod), name)


@pytest.fixture(params=sorted(STORE_IMPLS))
def impl(request):
    return STORE_IMPLS[request.param]


@pytest.fixture
def open_store(impl, tmp_path):
    """``open_store(name="lineage.db", readonly=False)`` -> a store; all closed at teardown."""
    cls = _load_impl(impl)
    opened = []

    def _open(name: str = "lineage.db", readonly: bool = False):
        s = cls(tmp_path / name, readonly=readonly)
        opened.append(s)
        return s

    _open.impl = impl  # type: ignore[attr-defined]
    _open.dir = tmp_path  # type: ignore[attr-defined]
    yield _open
    for s in opened:
        s.close()


@pytest.fixture
def store(open_store):
    return open_store()


@pytest.fixture
def run(store):
    return store.create_run("test", {"islands": 2, "nested": {"a": [1, 2]}}, seed=7, config_hash="cfg1")


def _eval(c: Candidate, fitness: float | None, *, status: Status = Status.OK, n_extra: int = 0) -> Evaluation:
    stages = [
        StageResult("policy", Status.OK, seconds=0.001),
        StageResult("compile", Status.OK, metrics={"registers": 128, "smem": 49152, "spills": 0},
                    artifacts={"ptxas": "used 128 registers"}, seconds=3.5),
    ]
    if status is Status.OK:
        stages.append(StageResult("correctness", Status.OK, metrics={"max_abs_err": 1e-3}, seconds=0.7))
        stages.append(StageResult("timing", Status.OK, metrics={"speedup": fitness, "median_ms": [0.1, 0.2]},
                                  seconds=2.0))
    else:
        stages.append(StageResult("correctness", status, reason="mismatch at [3, 7]",
                                  artifacts={"shape": "4096x4096", "index": "(3, 7)"}, seconds=0.5))
        stages.append(StageResult("timing", Status.SKIPPED))
    for i in range(n_extra):
        stages.append(StageResult(f"extra{i}", Status.OK, metrics={"i": i}))
    return Evaluation(c.id, tuple(stages), fitness=fitness if status is Status.OK else None,
                      gpu="NVIDIA H200", env={"torch": "2.11", "cuda": "13.0"})


def _chain(store, run_id: str, n: int, task: str = "gemm") -> list[Candidate]:
    seed = Candidate.create(task, "// seed kernel\n", {"TILE_M": 128})
    out = [seed]
    with store.transaction():
        store.add_candidate(run_id, seed)
        for i in range(n - 1):
            c = Candidate.create(task, f"// gen {i + 1}\n", {"TILE_M": 128}, parents=(out[-1].id,),
                                 operator=Operator.KNOBS, generation=i + 1)
            store.add_candidate(run_id, c)
            out.append(c)
    return out


# ---------------------------------------------------------------------------------------
# round trips
# ---------------------------------------------------------------------------------------


def test_candidate_round_trip_is_exact(store, run):
    p1 = Candidate.create("gemm", "// p1 ✓ unicode\n", {"TILE_M": 64})
    p2 = Candidate.create("gemm", "// p2\n", {"TILE_M": 128, "STAGES": 3, "SWIZZLE": True})
    child = Candidate.create(
        "gemm", "// child\n#define X 1\n", {"TILE_M": 256.0, "STAGES": 4},
        parents=(p2.id, p1.id), operator="llm:qwen-coder", island=3, generation=9, notes="tile 256 × 4",
    )
    for c in (p1, p2, child):
        assert store.add_candidate(run, c) is True
    for c in (p1, p2, child):
        got = store.get_candidate(c.id)
        assert got == c
        assert isinstance(got.params, tuple) and all(isinstance(p, tuple) for p in got.params)
        assert isinstance(got.parents, tuple)
    assert store.get_candidate(child.id).parents == (p2.id, p1.id)  # order kept
    assert store.candidates(run) == [p1, p2, child]
    assert store.candidates(run, task="gemm") == [p1, p2, child]
    assert store.candidates(run, task="softmax") == []
    assert store.has_candidate(child.id) and not store.has_candidate("0" * 64)


def test_evaluation_round_trip_is_exact(store, run):
    good = Candidate.create("gemm", "// good\n")
    bad = Candidate.create("gemm", "// bad\n")
    store.add_candidate(run, good)
    store.add_candidate(run, bad)
    assert store.get_evaluation(good.id) is None
    ev_good = _eval(good, 1.75)
    ev_bad = _eval(bad, None, status=Status.INCORRECT)
    store.add_evaluation(run, ev_good)
    store.add_evaluation(run, ev_bad)
    assert store.get_evaluation(good.id, run) == ev_good
    assert store.get_evaluation(good.id) == ev_good
    got_bad = store.get_evaluation(bad.id, run)
    assert got_bad == ev_bad
    assert got_bad.status is Status.INCORRECT and got_bad.failed_stage.stage == "correctness"
    assert got_bad.stages[-1].status is Status.SKIPPED
    assert store.evaluated_ids(run) == {good.id, bad.id}
    assert store.evaluations(run) == [ev_good, ev_bad]
    assert store.pending_ids(run) == []


_json_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False), st.text(max_size=20),
)
_metrics = st.dictionaries(st.text(max_size=10), st.one_of(_json_scalar, st.lists(_json_scalar, max_size=3)),
                           max_size=5)
_stage = st.builds(
    StageResult,
    stage=st.text(min_size=1, max_size=12),
    status=st.sampled_from(list(Status)),
    reason=st.text(max_size=40),
    metrics=_metrics,
    artifacts=st.dictionaries(st.text(max_size=10), st.text(max_size=60), max_size=3),
    seconds=st.floats(0, 1e4, allow_nan=False),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    source=st.text(max_size=200),
    params=st.dictionaries(st.from_regex(r"[A-Z_]{1,8}", fullmatch=True),
                           st.one_of(st.integers(0, 512), st.booleans(), st.sampled_from(["row", "col"])),
                           max_size=4),
    stages=st.lists(_stage, max_size=5),
    fitness=st.one_of(st.none(), st.floats(0.01, 100.0)),
)
def test_round_trip_property(open_store, source, params, stages, fitness):
    s = open_store("prop.db")
    rid = s.create_run("prop", {}, seed=0, config_hash="")
    c = Candidate.create("t", source, params, notes=source[:10])
    assert s.add_candidate(rid, c) is True
    ev = Evaluation(c.id, tuple(stages), fitness=fitness, gpu="g", env={"k": source[:5]})
    s.add_evaluation(rid, ev)
    assert s.get_candidate(c.id) == c
    assert s.get_evaluation(c.id, rid) == ev


def test_json_metrics_reject_unserialisable_values_clearly(store, run):
    c = Candidate.create("gemm", "// x\n")
    store.add_candidate(run, c)
    ev = Evaluation(c.id, (StageResult("timing", Status.OK, metrics={"bad": object()}),), fitness=1.0)
    with pytest.raises(TypeError, match="JSON"):
        store.add_evaluation(run, ev)
    assert store.get_evaluation(c.id, run) is None  # rolled back, nothing partial


# ---------------------------------------------------------------------------------------
# idempotency
# ---------------------------------------------------------------------------------------


def test_inserts_are_idempotent(store, run):
    a = Candidate.create("gemm", "// same source\n", {"TILE_M": 64})
    b = Candidate.create("gemm", "// same source\n", {"TILE_M": 128})
    assert store.add_candidate(run, a) is True
    assert store.add_candidate(run, a) is False
    assert store.add_candidate(run, Candidate.create("gemm", "// same source\n", {"TILE_M": 64})) is False
    assert store.add_candidate(run, b) is True
    assert store.candidates(run) == [a, b]
    ev = _eval(a, 2.0)
    assert store.add_evaluation(run, ev) is True
    assert store.add_evaluation(run, _eval(a, 99.0)) is False  # first evaluation wins
    assert store.get_evaluation(a.id, run) == ev
    assert store.get_run(run)["n_evaluated"] == 1


def test_sources_are_stored_once(store, run):
    """Implementation detail of the SQLite store: sources deduped by sha."""
    for tile in (64, 128, 256):
        store.add_candidate(run, Candidate.create("gemm", "// shared\n", {"TILE_M": tile}))
    assert store.db.execute("SELECT COUNT(*) FROM sources").fetchone()[0] == 1


def test_same_candidate_in_two_runs(store, run):
    other = store.create_run("other", {}, seed=1, config_hash="cfg2")
    c = Candidate.create("gemm", "// shared\n")
    assert store.add_candidate(run, c) is True
    assert store.add_candidate(other, c) is True  # new for that run
    assert store.add_candidate(other, c) is False
    store.add_evaluation(run, _eval(c, 1.0))
    store.add_evaluation(other, _eval(c, 3.0))
    assert store.get_evaluation(c.id, run).fitness == 1.0
    assert store.get_evaluation(c.id).fitness == 3.0  # latest across runs
    assert store.evaluated_ids(other) == {c.id}


def test_evaluation_of_unknown_candidate_is_refused(store, run):
    ghost = Candidate.create("gemm", "// never added\n")
    with pytest.raises(UnknownIdError, match="add_candidate"):
        store.add_evaluation(run, _eval(ghost, 1.0))


def test_pending_ids_are_unevaluated_members(store, run):
    cs = [Candidate.create("gemm", f"// {i}\n") for i in range(4)]
    for c in cs:
        store.add_candidate(run, c)
    store.add_evaluation(run, _eval(cs[1], 1.0))
    assert store.pending_ids(run) == [cs[0].id, cs[2].id, cs[3].id]


# ---------------------------------------------------------------------------------------
# lineage
# ---------------------------------------------------------------------------------------


def test_ancestry_of_a_1000_deep_chain_is_fast_and_ordered(store, run):
    chain = _chain(store, run, 1000)
    t0 = time.perf_counter()
    anc = store.ancestry(chain[-1].id)
    elapsed = time.perf_counter() - t0
    assert [c.id for c in anc] == [c.id for c in reversed(chain)]
    assert anc[0] == chain[-1] and anc[-1] == chain[0]
    assert elapsed < 5.0, f"ancestry of a 1000-deep chain took {elapsed:.2f}s"
    assert store.ancestry(chain[0].id) == [chain[0]]
    assert store.children(chain[500].id) == [chain[501]]


def test_ancestry_is_breadth_first_each_once(store, run):
    s = Candidate.create("gemm", "// S\n")
    a = Candidate.create("gemm", "// A\n", parents=(s.id,))
    b = Candidate.create("gemm", "// B\n", parents=(s.id,))
    c = Candidate.create("gemm", "// C\n", parents=(a.id, b.id), operator=Operator.CROSSOVER)
    d = Candidate.create("gemm", "// D\n", parents=(c.id, a.id), operator=Operator.CROSSOVER)
    for x in (s, a, b, c, d):
        store.add_candidate(run, x)
    assert [x.id for x in store.ancestry(d.id)] == [d.id, c.id, a.id, b.id, s.id]
    assert store.children(s.id) == [a, b]
    assert store.children(a.id) == [c, d]
    assert store.children(d.id) == []


def test_ancestry_stops_at_missing_parents(store, run):
    orphan = Candidate.create("gemm", "// orphan\n", parents=("f" * 64,))
    store.add_candidate(run, orphan)
    assert store.ancestry(orphan.id) == [orphan]
    with pytest.raises(UnknownIdError):
        store.ancestry("e" * 64)


# ---------------------------------------------------------------------------------------
# ranking
# ---------------------------------------------------------------------------------------


def test_top_k_per_task(store, run):
    fits = {"gemm": [1.2, 3.4, None, 2.2, 0.9], "softmax": [5.0, None, 1.1]}
    by_fit = {}
    for task, fs in fits.items():
        for i, f in enumerate(fs):
            c = Candidate.create(task, f"// {task} {i}\n")
            store.add_candidate(run, c)
            store.add_evaluation(run, _eval(c, f, status=Status.OK if f is not None else Status.INCORRECT))
            by_fit[(task, f)] = c
    # an evaluated candidate with fitness None but status ok must not rank either
    odd = Candidate.create("gemm", "// ok but no fitness\n")
    store.add_candidate(run, odd)
    store.add_evaluation(run, Evaluation(odd.id, (StageResult("policy", Status.OK),), fitness=None))

    top = store.top_k(run, "gemm", k=3)
    assert [(c.id, f) for c, f in top] == [(by_fit[("gemm", f)].id, f) for f in (3.4, 2.2, 1.2)]
    assert [f for _, f in store.top_k(run, "gemm", k=100)] == [3.4, 2.2, 1.2, 0.9]
    both = store.top_k(run, None, k=2)
    assert [(c.task, f) for c, f in both] == [("gemm", 3.4), ("gemm", 2.2), ("softmax", 5.0), ("softmax", 1.1)]
    assert store.top_k(run, "nope") == [] and store.top_k(run, k=0) == []
    best = store.best_per_task(run)
    assert {t: f for t, (_, f) in best.items()} == {"gemm": 3.4, "softmax": 5.0}
    assert best["softmax"][0] == by_fit[("softmax", 5.0)]
    info = store.get_run(run)
    assert info["n_correct"] == 6 and info["n_evaluated"] == 9 and info["best"] == {"gemm": 3.4, "softmax": 5.0}


def test_top_k_ties_prefer_the_earlier_evaluation(store, run):
    cs = [Candidate.create("gemm", f"// tie {i}\n") for i in range(3)]
    for c in cs:
        store.add_candidate(run, c)
    for c in reversed(cs):
        store.add_evaluation(run, _eval(c, 2.0))
    assert [c.id for c, _ in store.top_k(run, "gemm")] == [c.id for c in reversed(cs)]


# ---------------------------------------------------------------------------------------
# ids
# ---------------------------------------------------------------------------------------


def _with_id(cid: str, src: str) -> Candidate:
    return Candidate(id=cid, task="gemm", source=src)


def test_resolve_unique_prefix_and_errors(store, run):
    ids = ["abc1" + "0" * 60, "abc2" + "0" * 60, "abd0" + "0" * 60, "ff00" + "0" * 60]
    for i, cid in enumerate(ids):
        store.add_candidate(run, _with_id(cid, f"// {i}\n"))
    assert store.resolve_id("abc1") == ids[0]
    assert store.resolve_id("ABD") == ids[2]  # case-insensitive
    assert store.resolve_id(ids[3]) == ids[3]
    with pytest.raises(AmbiguousIdError) as amb:
        store.resolve_id("abc")
    assert set(amb.value.near) == {ids[0], ids[1]}
    assert "ambiguous" in str(amb.value) and "abc1" in str(amb.value) and "abc2" in str(amb.value)
    assert isinstance(amb.value, UnknownIdError)
    with pytest.raises(UnknownIdError) as unk:
        store.resolve_id("abe9")
    assert not isinstance(unk.value, AmbiguousIdError)
    assert set(unk.value.near) == {ids[0], ids[1], ids[2]}  # share "ab"
    assert "abe9" in str(unk.value)
    with pytest.raises(UnknownIdError):
        store.resolve_id("0123")
    with pytest.raises(UnknownIdError):
        store.resolve_id("   ")
    with pytest.raises(UnknownIdError) as gc:
        store.get_candidate("abc")
    assert isinstance(gc.value, AmbiguousIdError)
    with pytest.raises(UnknownIdError, match="not a full candidate id"):
        store.get_candidate("ff00")  # a unique prefix is still not an id


def test_runs_and_run_ids(store):
    rid = store.create_run("first", {"a": 1}, seed=3, config_hash="h1")
    assert rid.startswith("r-") and len(rid) <= 24
    named = store.create_run("second", {"b": [1, 2]}, seed=4, config_hash="h2", run_id="nightly-1")
    assert named == "nightly-1"
    with pytest.raises(RunExistsError):
        store.create_run("dup", {}, seed=0, config_hash="", run_id="nightly-1")
    with pytest.raises(ValueError):
        store.create_run("bad", {}, seed=0, config_hash="", run_id="has space")
    info = store.get_run(rid)
    assert info["config"] == {"a": 1} and info["seed"] == 3 and info["status"] == "running"
    assert info["config_hash"] == "h1" and info["n_candidates"] == 0
    assert [r["id"] for r in store.list_runs()] == [named, rid]  # newest first
    store.set_run_status(rid, "finished")
    assert store.get_run(rid)["status"] == "finished"
    with pytest.raises(ValueError, match="running"):
        store.set_run_status(rid, "done")
    with pytest.raises(UnknownIdError) as e:
        store.get_run("r-nope")
    assert e.value.kind == "run"
    with pytest.raises(UnknownIdError):
        store.add_candidate("r-nope", Candidate.create("gemm", "x"))
    assert store.resolve_run("night") == "nightly-1"
    assert [e["kind"] for e in store.events(rid)] == ["run_created", "run_status"]


# ---------------------------------------------------------------------------------------
# other tables
# ---------------------------------------------------------------------------------------


def test_profiles_llm_calls_trials_champions_events(store, run):
    c = Candidate.create("gemm", "// c\n")
    store.add_candidate(run, c)

    assert store.get_profile(c.id) is None
    store.add_profile(c.id, shape="4096x4096", gpu="H200", metrics={"sm_pct": 71.5, "stalls": ["long_scoreboard"]})
    store.add_profile(c.id, shape="1024x1024", gpu="H200", metrics={"sm_pct": 40.0})
    store.add_profile(c.id, shape="4096x4096", gpu="H200", metrics={"sm_pct": 80.0})  # replaces
    assert store.get_profile(c.id, "4096x4096") == {"sm_pct": 80.0}
    assert store.get_profile(c.id, "1024x1024", gpu="H200") == {"sm_pct": 40.0}
    assert store.get_profile(c.id, "1024x1024", gpu="H100") is None
    assert len(store.profiles(c.id)) == 2
    with pytest.raises(UnknownIdError):
        store.add_profile("0" * 64, shape="s", gpu="g", metrics={})

    i1 = store.add_llm_call(run, prompt="p", response="r", model="m", tokens_in=10, tokens_out=5, cost=0.01,
                            latency_s=1.5, error=None, prompt_hash="ph", candidate_id=c.id, kind="optimize")
    i2 = store.add_llm_call(run, prompt="p2", model="m", error="timeout", cached=True)
    assert i2 > i1
    calls = store.llm_calls(run)
    assert [x["id"] for x in calls] == [i1, i2]
    assert calls[0]["tokens_in"] == 10 and calls[0]["candidate_id"] == c.id and calls[1]["cached"] is True
    assert store.llm_totals(run) == {"n_calls": 2, "n_errors": 1, "tokens_in": 10, "tokens_out": 5, "cost": 0.01}
    with pytest.raises(TypeError, match="valid"):
        store.add_llm_call(run, prompt="p", temperature=0.2)

    store.add_tuning_trial(run, c.id, 0, {"TILE_M": 128}, None, "running")
    store.add_tuning_trial(run, c.id, 0, {"TILE_M": 128}, 1.9, "complete", candidate_id=c.id)
    store.add_tuning_trial(run, c.id, 1, {"TILE_M": 256}, None, "pruned")
    trials = store.tuning_trials(run, c.id)
    assert [(t["trial"], t["value"], t["status"], t["params"]) for t in trials] == [
        (0, 1.9, "complete", {"TILE_M": 128}), (1, None, "pruned", {"TILE_M": 256})]
    assert trials[0]["candidate_id"] == c.id

    d = Candidate.create("gemm", "// d\n", parents=(c.id,))
    store.add_candidate(run, d)
    store.set_champion(run, "gemm", c.id, 1.5, {"reps": 5, "speedups": [1.4, 1.6]})
    store.set_champion(run, "gemm", d.id, 2.5, {"reps": 5})
    champs = store.champions(run)
    assert len(champs) == 1 and champs[0]["candidate_id"] == d.id and champs[0]["fitness"] == 2.5
    assert champs[0]["confirmation"] == {"reps": 5}
    assert [e["payload"]["candidate_id"] for e in store.events(run, "champion")] == [c.id, d.id]

    eid = store.log_event(run, "budget", {"spent": 0.5})
    assert store.events(run, "budget") == [
        {"id": eid, "run_id": run, "created": store.events(run, "budget")[0]["created"],
         "kind": "budget", "payload": {"spent": 0.5}}]
    migrations = store.events(None, "migration")
    assert [e["payload"]["version"] for e in migrations] == list(range(1, SCHEMA_VERSION + 1))


def test_events_are_append_only(store, run):
    """SQLite store: triggers refuse UPDATE / DELETE on events."""
    store.log_event(run, "x", {})
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store.db.execute("UPDATE events SET kind = 'y'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store.db.execute("DELETE FROM events")


def test_transaction_groups_writes_and_rolls_back(store, run):
    a = Candidate.create("gemm", "// a\n")
    b = Candidate.create("gemm", "// b\n")
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.add_candidate(run, a)
            store.add_evaluation(run, _eval(a, 1.0))
            raise RuntimeError("boom")
    assert store.candidates(run) == [] and store.evaluated_ids(run) == set()
    with store.transaction():
        store.add_candidate(run, a)
        with pytest.raises(RuntimeError):
            with store.transaction():  # nested: a savepoint
                store.add_candidate(run, b)
                raise RuntimeError("inner")
    assert store.candidates(run) == [a]


# ---------------------------------------------------------------------------------------
# read-only readers, concurrency, crashes
# ---------------------------------------------------------------------------------------


def test_missing_db_read_only_names_the_path(open_store):
    with pytest.raises(StoreNotFoundError) as e:
        open_store("nope.db", readonly=True)
    assert "nope.db" in str(e.value) and isinstance(e.value, FileNotFoundError)
    assert not (open_store.dir / "nope.db").exists()


def test_read_only_reader_cannot_write(store, run, open_store):
    c = Candidate.create("gemm", "// c\n")
    store.add_candidate(run, c)
    reader = open_store(readonly=True)
    assert reader.get_candidate(c.id) == c
    with pytest.raises(ReadOnlyStoreError):
        reader.add_candidate(run, Candidate.create("gemm", "// d\n"))
    with pytest.raises(ReadOnlyStoreError):
        reader.create_run("x", {}, seed=0, config_hash="")
    with pytest.raises(ReadOnlyStoreError):
        reader.log_event(run, "x", {})
    with pytest.raises(ReadOnlyStoreError):
        with reader.transaction():
            pass
    # SQLite store: even raw SQL through the reader's connection is refused.
    with pytest.raises(sqlite3.OperationalError):
        reader.db.execute("INSERT INTO events (run_id, created, kind, payload) VALUES (NULL, 'x', 'x', '{}')")
    assert store.candidates(run) == [c]


def test_reader_opens_after_writer_closed(open_store):
    w = open_store("closed.db")
    rid = w.create_run("r", {}, seed=0, config_hash="")
    w.add_candidate(rid, Candidate.create("gemm", "// x\n"))
    w.close()
    r = open_store("closed.db", readonly=True)
    assert len(r.candidates(rid)) == 1 and r.integrity_check() == ["ok"]
    assert r.schema_version == SCHEMA_VERSION


def test_concurrent_reader_never_sees_errors_or_partial_evaluations(store, run, open_store):
    n_stages = 4 + 3  # _eval(..., n_extra=3)
    reader = open_store(readonly=True)
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = [0]
    seen_max = [0]

    def read_loop() -> None:
        try:
            while not stop.is_set():
                ids = reader.evaluated_ids(run)
                assert len(ids) >= seen_max[0], "reader went back in time"
                seen_max[0] = len(ids)
                for cid in list(ids)[-5:]:
                    ev = reader.get_evaluation(cid, run)
                    assert ev is not None and len(ev.stages) == n_stages, ev
                    assert reader.get_candidate(cid).id == cid
                evs = reader.evaluations(run)
                assert all(len(e.stages) == n_stages for e in evs)
                reader.top_k(run, k=3)
                reader.list_runs()
                reads[0] += 1
        except BaseException as e:  # noqa: BLE001 - reported to the main thread
            errors.append(e)

    t = threading.Thread(target=read_loop, daemon=True)
    t.start()
    n = 150
    for i in range(n):
        c = Candidate.create("gemm", f"// concurrent {i}\n", {"TILE_M": 64})
        store.add_candidate(run, c)
        store.add_evaluation(run, _eval(c, 1.0 + i / n, n_extra=3))
        if i % 30 == 0:
            time.sleep(0.01)  # let the reader interleave
    stop.set()
    t.join(30)
    assert not t.is_alive()
    assert not errors, repr(errors[0])
    assert reads[0] > 0
    assert len(reader.evaluated_ids(run)) == n


def test_concurrent_reader_in_another_process(store, run, open_store):
    """A reader process polls while this process writes; it must never raise."""
    script = textwrap.dedent(
        """
        import importlib, sys, time
        mod, name = sys.argv[1].split(":")
        Store = getattr(importlib.import_module(mod), name)
        r = Store(sys.argv[2], readonly=True)
        print("READY", flush=True)
        last = 0
        deadline = time.time() + 60
        while time.time() < deadline:
            ids = r.evaluated_ids(sys.argv[3])
            assert len(ids) >= last
            last = len(ids)
            for cid in list(ids)[:3]:
                assert len(r.get_evaluation(cid, sys.argv[3]).stages) == 4
            if last >= int(sys.argv[4]):
                break
        print("DONE", last, flush=True)
        """
    )
    n = 60
    proc = subprocess.Popen(
        [sys.executable, "-c", script, open_store.impl, str(store.path), run, str(n)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )
    try:
        assert proc.stdout.readline().strip() == "READY"
        for i in range(n):
            c = Candidate.create("gemm", f"// proc {i}\n")
            store.add_candidate(run, c)
            store.add_evaluation(run, _eval(c, 1.0))
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
    assert proc.returncode == 0, err
    assert out.strip() == f"DONE {n}"


_KILL_SCRIPT = textwrap.dedent(
    """
    import importlib, sys, time
    from evo.core.records import Candidate, Evaluation, StageResult, Status
    mod, name = sys.argv[1].split(":")
    Store = getattr(importlib.import_module(mod), name)
    path, n = sys.argv[2], int(sys.argv[3])
    s = Store(path)
    rid = s.create_run("doomed", {}, seed=0, config_hash="")
    for i in range(n):
        c = Candidate.create("gemm", f"// committed {i}\\n")
        s.add_candidate(rid, c)
        s.add_evaluation(rid, Evaluation(c.id, (StageResult("compile", Status.OK),), fitness=1.0 + i))
    with s.transaction():
        for i in range(200):
            c = Candidate.create("gemm", f"// uncommitted {i}\\n" + "x" * 4000)
            s.add_candidate(rid, c)
            s.add_evaluation(rid, Evaluation(c.id, (StageResult("compile", Status.OK),), fitness=0.5))
        print("READY", rid, flush=True)
        time.sleep(120)
    """
)


def test_sigkill_mid_transaction_loses_nothing_committed(open_store):
    path = open_store.dir / "killed.db"
    n = 25
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILL_SCRIPT, open_store.impl, str(path), str(n)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )
    try:
        line = proc.stdout.readline().split()
        assert line and line[0] == "READY", proc.stderr.read() if proc.poll() is not None else line
        rid = line[1]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
    assert proc.returncode == -signal.SIGKILL

    reader = open_store("killed.db", readonly=True)  # readers can open a crashed DB too
    assert len(reader.candidates(rid)) == n
    reader.close()
    s = open_store("killed.db")
    assert s.integrity_check() == ["ok"]
    cands = s.candidates(rid)
    assert sorted(c.source for c in cands) == sorted(f"// committed {i}\n" for i in range(n))
    assert len(s.evaluated_ids(rid)) == n
    assert [f for _, f in s.top_k(rid, "gemm", k=3)] == [float(n), float(n - 1), float(n - 2)]
    # and the store keeps working
    more = Candidate.create("gemm", "// after the crash\n")
    assert s.add_candidate(rid, more) is True


# ---------------------------------------------------------------------------------------
# schema versions and migrations (SQLite store specifics)
# ---------------------------------------------------------------------------------------


def test_schema_too_new_is_refused_clearly(open_store):
    s = open_store("new.db")
    s.close()
    with sqlite3.connect(open_store.dir / "new.db") as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    for readonly in (False, True):
        with pytest.raises(SchemaTooNewError) as e:
            open_store("new.db", readonly=readonly)
        msg = str(e.value)
        assert str(SCHEMA_VERSION + 5) in msg and str(SCHEMA_VERSION) in msg and "upgrade cute-evo" in msg
        assert e.value.db_version == SCHEMA_VERSION + 5 and e.value.code_version == SCHEMA_VERSION


def test_unknown_applied_migration_counts_as_too_new(open_store):
    s = open_store("alien.db")
    s.close()
    with sqlite3.connect(open_store.dir / "alien.db") as raw:
        raw.execute("INSERT INTO _sqlite_migrations (migration_set, name, applied_at) "
                    "VALUES ('cute-evo', '9999_from_the_future', 'x')")
    with pytest.raises(SchemaTooNewError):
        open_store("alien.db")


def _add_note_column(db):
    db["runs"].add_column("note", str)


class _StoreV2(Store):
    migrations = Store.migrations + (Migration(SCHEMA_VERSION + 1, "add_run_note", _add_note_column),)


def _fail_migration(db):
    db["runs"].add_column("half_done", str)
    raise RuntimeError("migration bug")


class _StoreBroken(Store):
    migrations = Store.migrations + (Migration(SCHEMA_VERSION + 1, "broken", _fail_migration),)


def test_migrations_upgrade_in_order_once(tmp_path):
    path = tmp_path / "old.db"
    with Store(path) as s:
        rid = s.create_run("r", {}, seed=0, config_hash="")
    with pytest.raises(SchemaTooOldError, match="readers never migrate"):
        _StoreV2(path, readonly=True)
    with _StoreV2(path) as s2:
        assert s2.schema_version == SCHEMA_VERSION + 1
        assert "note" in s2.db["runs"].columns_dict
        assert s2.get_run(rid)["name"] == "r"
        mig = s2.events(None, "migration")
        assert [e["payload"]["version"] for e in mig] == list(range(1, SCHEMA_VERSION + 2))
        assert mig[-1]["payload"]["from_version"] == SCHEMA_VERSION
    with _StoreV2(path) as s3:  # reopening applies nothing
        assert len(s3.events(None, "migration")) == SCHEMA_VERSION + 1
    with pytest.raises(SchemaTooNewError):
        Store(path)  # the old code now refuses the newer file


def test_failed_migration_rolls_back(tmp_path):
    path = tmp_path / "broken.db"
    Store(path).close()
    with pytest.raises(MigrationError, match="rolled back") as e:
        _StoreBroken(path)
    assert "migration bug" in str(e.value)
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        assert "half_done" not in s.db["runs"].columns_dict


def test_not_a_lineage_database(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(NotALineageDatabaseError, match="junk.db"):
        Store(junk)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as raw:
        raw.execute("CREATE TABLE songs (id INTEGER PRIMARY KEY)")
    with pytest.raises(NotALineageDatabaseError, match="not a cute-evo"):
        Store(other)
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    with pytest.raises(NotALineageDatabaseError, match="empty"):
        Store(empty, readonly=True)


def test_wal_and_pragmas(store):
    """SQLite store: WAL, foreign keys, busy timeout on the writer's connection."""
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert store.db.execute("PRAGMA busy_timeout").fetchone()[0] >= 30000


def test_closed_store_raises(store):
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.list_runs()


def test_the_writer_holds_a_reader_and_answers_every_read_through_it(tmp_path, monkeypatch):
    """Composition, not inheritance: ``Store`` is no ``StoreReader``; it holds one over its own
    connection (reads inside its transaction see its writes) and has each public read of it."""
    import inspect

    from evo.store import StoreReader
    from evo.store.writer import READS

    assert not issubclass(Store, StoreReader)
    public = {n for n, v in vars(StoreReader).items() if not n.startswith("_") and callable(v)} - {"close"}
    assert set(READS) == public and {"candidates", "get_evaluation", "events"} <= public
    for name in READS:
        assert inspect.signature(getattr(Store, name)) == inspect.signature(getattr(StoreReader, name)), name
    with Store(tmp_path / "evo.db") as store:
        assert isinstance(store.reader, StoreReader)
        rid = store.create_run("t", {}, seed=0, config_hash="x")
        c = Candidate.create("t", "src", {"A": "1"})
        with store.transaction():
            store.add_candidate(rid, c)
            assert [x.id for x in store.reader.candidates(rid)] == [c.id], "one connection: the write is seen"
        calls = []
        monkeypatch.setattr(store.reader, "candidates", lambda *a, **k: calls.append(a) or [])
        assert store.candidates(rid) == [] and calls == [(rid,)], "reads go through the reader"
        assert store.reader.get_run(rid)["writer"] is not None, "the reader sees the lease its writer holds"
