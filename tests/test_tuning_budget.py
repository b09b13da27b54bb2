"""Tuning studies within a run's evaluation budget: what counts as a trial, when a study is
finished (:class:`evo.tuning.study_counts.StudyCounts`), how the engine sizes a study to the
budget left and keeps its trials out of the mutations' share, and how
benchmarks/search_power.py counts studies from the records."""

from __future__ import annotations

import importlib.util
import random
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("optuna")

from evo.core.records import Candidate, Evaluation, Member, Operator, StageResult, Status  # noqa: E402
from evo.engine.survivors import Survivors, sized_trials  # noqa: E402
from evo.store import Store  # noqa: E402
from evo.tuning.study_counts import StudyCounts  # noqa: E402
from evo.tuning.tuning import TuningStudy, tune_once  # noqa: E402
from evo.tuning.tuning_settings import TuningSettings  # noqa: E402

#: 4 x 4 points, no constraint
SRC = """// @tunable A = 0 in {0, 1, 2, 3}
// @tunable B = 0 in {0, 1, 2, 3}
"""


def _ev(cid: str, fit: float) -> Evaluation:
    return Evaluation(cid, (StageResult("timing", Status.OK),), fit)


def _fitness(p) -> float:
    return 1.0 + int(p["A"]) + 0.5 * int(p["B"])


# ---------------------------------------------------------------------- the counts and the rule


def test_study_counts_state_when_a_study_is_finished():
    c = StudyCounts(n_trials=4, asked=5, issued=3, told=1, pruned=1, known=7, in_flight=1)
    assert (c.evaluated, c.spent, c.done, c.finished, c.owed) == (2, 4, True, False, 0)
    told_back = StudyCounts(**{**c.to_json(), "in_flight": 0})
    assert told_back.finished and StudyCounts.from_json({**told_back.to_json(), "extra": 1}) == told_back
    short = StudyCounts(n_trials=4, issued=2)
    assert (short.done, short.finished, short.owed) == (False, False, 2)
    assert StudyCounts(n_trials=4, issued=1, out_of_points=True).finished  # nothing new left to ask
    with pytest.raises(ValueError, match="n_trials"):
        StudyCounts.from_json({"asked": 1})


def test_a_point_told_from_an_earlier_evaluation_counts_as_one_of_the_studys_trials(tmp_path):
    """A repeat of a point the run measured is told its value at once (no compile) and spends
    one of the study's trials; the parent's own known fitness is a known point (free)."""
    parent = Candidate.create("t", SRC, {"A": "0", "B": "0"})
    measured = {"A": "1", "B": "0"}
    known = [(measured, _ev(Candidate.create("t", SRC, measured).id, _fitness(measured)))]
    st = TuningStudy(tmp_path / "s.journal", "r", parent, seed=0, n_trials=3, parent_fitness=1.0, known=known)
    st.study.enqueue_trial(measured)  # the sampler "chooses" the measured point
    compiled = []

    def evaluate(c):
        compiled.append(c.params_dict)
        return _ev(c.id, _fitness(c.params_dict))

    tune_once(st, evaluate)
    c = st.counts()
    assert (c.told, c.evaluated, c.known, c.pruned) == (1, 2, 2, 0)
    assert len(compiled) == 2 and measured not in compiled and c.finished and st.finished


# ---------------------------------------------------------------------- sizing and what is owed


def test_a_study_is_sized_to_the_trials_the_budget_left_pays_for():
    assert sized_trials(12, None, 3) == 12
    assert sized_trials(12, 59, 3) == 12
    assert sized_trials(12, 9, 3) == 3
    assert sized_trials(12, 2, 3) == 0
    assert sized_trials(12, -4, 3) == 0
    with pytest.raises(ValueError, match="trial_every = 0"):
        sized_trials(12, 9, 0)


def _survivors(tmp_path, store, rid, *, trials=12, budget_left=None, max_concurrent=2):
    return Survivors(store=store, run_id=rid, profile=None,
                     tuning=TuningSettings(enabled=True, trials_per_survivor=trials, top_k=1,
                                           max_concurrent=max_concurrent),
                     tuning_storage=str(tmp_path / "j.journal"), rng=random.Random(0),
                     budget_left=budget_left, trial_every=3)


def _land(store, rid, sv, params, fit, source=SRC, island=0):
    c = Candidate.create("t", source, params, operator=Operator.KNOBS, island=island)
    store.add_candidate(rid, c)
    store.add_evaluation(rid, _ev(c.id, fit))
    sv.triggered(Member(c, fit), b"so", [island])
    return c


def test_survivors_size_each_study_to_the_budget_left_and_owe_its_trials(tmp_path):
    store = Store(tmp_path / "evo.db")
    rid = store.create_run("r", {}, seed=0, config_hash="")
    left = [7]
    sv = _survivors(tmp_path, store, rid, budget_left=lambda: left[0])
    first = _land(store, rid, sv, {"A": "0", "B": "0"}, 1.0)
    assert sv.studies[first.id].n_trials == 2 and sv.owed() == 2  # 7 left: 2 trials at one in 3
    (start,) = [e["payload"] for e in store.events(rid) if e["kind"] == "tuning_start"]
    assert (start["n_trials"], start["configured"], start["budget_left"]) == (2, 12, 7)
    # another space: what the open study is owed is not the new study's (4 left, 2 owed)
    left[0] = 4
    other = _land(store, rid, sv, {"A": "1", "B": "0"}, 2.0, source=SRC + "// another source\n", island=1)
    assert other.id not in sv.studies
    (skip,) = [e["payload"] for e in store.events(rid) if e["kind"] == "tuning_skipped"]
    assert skip["parent"] == other.id and skip["budget_left"] == 2
    # asking spends what is owed
    assert len(list(sv.trials(12, room=lambda: True, seen=set()))) == 2 and sv.owed() == 0
    store.close()


def test_a_study_is_done_when_its_trials_are_told_back_and_the_run_end_logs_the_open_ones(tmp_path):
    store = Store(tmp_path / "evo.db")
    rid = store.create_run("r", {}, seed=0, config_hash="")
    sv = _survivors(tmp_path, store, rid, trials=2)
    parent = _land(store, rid, sv, {"A": "0", "B": "0"}, 1.0)
    asked = list(sv.trials(12, room=lambda: True, seen=set()))
    assert len(asked) == 2 and sv.studies[parent.id].done

    def kinds():
        return [e["kind"] for e in store.events(rid) if e["kind"].startswith("tuning_")]

    assert kinds() == ["tuning_start"], "done asking, but its trials are in flight: not finished"
    for i, c in enumerate(asked):
        store.add_candidate(rid, c)
        store.add_evaluation(rid, _ev(c.id, _fitness(c.params_dict)))
        sv.told(c.id, _ev(c.id, _fitness(c.params_dict)))
        assert kinds().count("tuning_done") == i  # logged once, with the last trial told back
    (done,) = [e["payload"] for e in store.events(rid) if e["kind"] == "tuning_done"]
    counts = StudyCounts.from_json(done["counts"])
    assert counts.finished and counts.evaluated == done["evaluated"] == 2 and not sv.studies
    # a study the run ends with: its counts still reach the records
    other = _land(store, rid, sv, {"A": "1", "B": "1"}, 3.0, source=SRC + "// another source\n", island=1)
    assert list(sv.trials(12, room=lambda: True, seen=set()))
    sv.close()
    (open_,) = [e["payload"] for e in store.events(rid) if e["kind"] == "tuning_unfinished"]
    left = StudyCounts.from_json(open_["counts"])
    assert open_["parent"] == other.id and left.in_flight >= 1 and not left.finished
    store.close()


# ---------------------------------------------------------------------- through the engine


@pytest.fixture(scope="module")
def sp():
    spec = importlib.util.spec_from_file_location(
        "search_power", Path(__file__).resolve().parents[1] / "benchmarks" / "search_power.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["search_power"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_study_the_engine_opens_finishes_within_the_budget(tmp_path, sp):
    """A budget of 24 evaluations and 12 trials per survivor, one trial in flight at a time and
    trials slower to compile than mutations (as GEMM trials on a busy compile pool were): the
    study opened when the seed lands is sized to what the budget pays for, the mutations leave
    it its trials, and it finishes; search_power's columns read the same numbers back."""
    from evaluators.base import CompileSettings, HarnessSettings
    from evo.engine.engine import Engine, EngineSettings
    from evo.engine.local_runtime import LocalRuntime
    from evo.engine.seams import Stages
    from fakes import stages as fake
    from mutators.knobs import KnobsMutator

    def compile_trials_slowly(candidate, settings):
        if candidate.operator == Operator.OPTUNA.value:
            time.sleep(0.2)
        return fake.fake_compile(candidate, settings)

    store = Store(tmp_path / "evo.db")
    rid = store.create_run("budget", {}, seed=3, config_hash="x")
    rt = LocalRuntime(stages=Stages(compile_trials_slowly, fake.fake_evaluate, evaluate_concurrent=False),
                      compile_settings=CompileSettings(), harness_settings=HarnessSettings(),
                      num_gpus=1, num_cpus=2).start()
    settings = EngineSettings(islands_per_task=2, population_size=8, max_evaluations=24, max_wall_seconds=120,
                              confirm_champions=False,
                              tuning=TuningSettings(enabled=True, trials_per_survivor=12, top_k=1, max_concurrent=1),
                              tuning_storage=str(tmp_path / "studies.journal"))
    try:
        summary = Engine(store=store, runtime=rt, mutator=KnobsMutator(0.3, 2), run_id=rid, tasks=["synthetic_a"],
                         seeds={"synthetic_a": (fake.SOURCE, {"TILE": "32", "STAGES": "2", "VEC": "1"})},
                         settings=settings, rng=random.Random(3), policy=lambda s: StageResult("policy", Status.OK),
                         ).run()
    finally:
        rt.shutdown()
    assert summary.evaluations == 24
    events = store.events(rid)
    starts = [e["payload"] for e in events if e["kind"] == "tuning_start"]
    ends = [e["payload"] for e in events if e["kind"] == "tuning_done"]
    assert starts and starts[0]["n_trials"] == 7  # (24 - 1 proposed) // 3
    assert {p["parent"] for p in ends} == {p["parent"] for p in starts}, "every study opened finished"
    assert not [e for e in events if e["kind"] == "tuning_unfinished"]
    counts = [StudyCounts.from_json(p["counts"]) for p in ends]
    assert all(c.finished and c.spent == c.n_trials for c in counts)
    optuna_evals = [c for c in store.candidates(rid) if c.operator == "optuna"]
    store.close()
    row = sp.read_row(sp.Row(task="synthetic_a", budget=24), tmp_path / "evo.db")
    assert row.studies == row.studies_finished == len(starts)
    assert row.optuna_sized == sum(p["n_trials"] for p in starts)
    assert row.optuna_evaluated + row.optuna_told == row.optuna_sized
    # a trial whose point a mutation had in flight is told that evaluation: no optuna candidate of its own
    assert row.optuna_evaluated == sum(c.evaluated for c in counts) >= len(optuna_evals) > 0
    assert row.optuna_trials == sum(c.asked for c in counts) >= row.optuna_evaluated + row.optuna_told
