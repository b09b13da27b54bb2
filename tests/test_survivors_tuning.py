"""Survivors open tuning studies seeded with the run's evaluated points of the same source."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("optuna")

from evo.core.records import Candidate, Evaluation, Member, Operator, StageResult, Status  # noqa: E402
from evo.store import Store  # noqa: E402
from evo.engine.survivors import Survivors  # noqa: E402
from evo.tuning.tuning_settings import TuningSettings  # noqa: E402

SRC = """// @tunable A = 0 in {0, 1, 2, 3}
// @tunable B = 0 in {0, 1, 2, 3}
"""


def _ev(c, fit):
    return Evaluation(c.id, (StageResult("timing", Status.OK),), fit)


def test_a_study_opens_with_the_runs_points_of_the_same_source(tmp_path):
    store = Store(tmp_path / "evo.db")
    rid = store.create_run("r", {}, seed=0, config_hash="")
    seed = Candidate.create("t", SRC, {"A": "0", "B": "0"}, operator=Operator.SEED, island=-1)
    other_island = Candidate.create("t", SRC, {"A": "1", "B": "0"}, parents=(seed.id,), operator=Operator.KNOBS,
                                    island=1, generation=1)
    broken = Candidate.create("t", SRC, {"A": "3", "B": "3"}, parents=(seed.id,), operator=Operator.KNOBS, island=0,
                              generation=1)
    foreign = Candidate.create("t", SRC + "// edited\n", {"A": "2", "B": "2"}, operator=Operator.KNOBS, island=0)
    best = Candidate.create("t", SRC, {"A": "2", "B": "0"}, parents=(seed.id,), operator=Operator.KNOBS, island=0,
                            generation=1)
    for c, ev in ((seed, _ev(seed, 1.0)), (other_island, _ev(other_island, 1.5)),
                  (broken, Evaluation(broken.id, (StageResult("correctness", Status.INCORRECT),))),
                  (foreign, _ev(foreign, 9.0)), (best, _ev(best, 2.0))):
        store.add_candidate(rid, c)
        store.add_evaluation(rid, ev)
    sv = Survivors(store=store, run_id=rid, profile=None,
                   tuning=TuningSettings(enabled=True, trials_per_survivor=4, top_k=1),
                   tuning_storage=str(tmp_path / "j.journal"), rng=random.Random(0))
    sv.triggered(Member(best, 2.0), b"so", [0])
    (study,) = sv.studies.values()
    trials = study.study.get_trials()
    got = {tuple(sorted(t.params.items())): (t.state.name, t.value) for t in trials}
    assert got == {(("A", "0"), ("B", "0")): ("COMPLETE", 1.0), (("A", "1"), ("B", "0")): ("COMPLETE", 1.5),
                   (("A", "3"), ("B", "3")): ("FAIL", None), (("A", "2"), ("B", "0")): ("COMPLETE", 2.0)}
    stored = store.tuning_trials(rid, best.id)
    assert len(stored) == 4 and {r["candidate_id"] for r in stored} == {seed.id, other_island.id, broken.id, best.id}
    asked = [c for c in sv.trials(12, room=lambda: True, seen=set())]
    known = {seed.id, other_island.id, broken.id, best.id}
    assert asked and not known & {c.id for c in asked}
    store.close()


def test_one_study_per_space_learns_every_point_the_run_evaluates(tmp_path):
    """A second survivor of a space under study joins that study (no second one), and every
    correct point of the space the run evaluates later reaches the open study's sampler."""
    store = Store(tmp_path / "evo.db")
    rid = store.create_run("r", {}, seed=0, config_hash="")
    sv = Survivors(store=store, run_id=rid, profile=None,
                   tuning=TuningSettings(enabled=True, trials_per_survivor=4, top_k=2),
                   tuning_storage=str(tmp_path / "j.journal"), rng=random.Random(0))

    def land(params, fit, island=0):
        c = Candidate.create("t", SRC, params, operator=Operator.KNOBS, island=island)
        store.add_candidate(rid, c)
        store.add_evaluation(rid, _ev(c, fit))
        sv.triggered(Member(c, fit), b"so", [island])
        return c

    first = land({"A": "1", "B": "0"}, 1.0)
    second = land({"A": "2", "B": "0"}, 2.0)          # top-2 of its island: would open a study
    other_island = land({"A": "0", "B": "3"}, 3.0, island=1)
    assert list(sv.studies) == [first.id], "one study for the space"
    joins = [e for e in store.events(rid) if e["kind"] == "tuning_join"]
    assert {e["payload"]["parent"] for e in joins} == {second.id, other_island.id}
    (study,) = sv.studies.values()
    told = {t.user_attrs.get("candidate_id") for t in study.study.get_trials() if t.user_attrs.get("origin") == "known"}
    assert {first.id, second.id, other_island.id} <= told
    late = land({"A": "3", "B": "1"}, 0.5)            # not a survivor: still a point of the space
    told = {t.user_attrs.get("candidate_id") for t in study.study.get_trials() if t.user_attrs.get("origin") == "known"}
    assert late.id in told and len(sv.studies) == 1
    store.close()
