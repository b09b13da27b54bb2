"""Optuna tuning of survivors: ask/tell contract, trigger rules, and a study through the real
runtime on local Ray (fake compile/GPU stages from tests/fakes/stages.py, real scheduling).

The synthetic objective is ``fakes.stages.fitness_of`` (grows with TILE, STAGES, VEC);
``STAGES = 5`` fails to compile and ``TILE = 256, VEC = 8`` is incorrect, both simulated.
The test source tightens the constraint to ``TILE * STAGES <= 256`` so that about a third
of the space is infeasible (the sampler must never draw it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from evaluators.base import CompileSettings, HarnessSettings  # noqa: E402
from evo.core.records import Candidate, Evaluation, Member, Operator, StageResult, Status  # noqa: E402
from evo.engine.survivors import has_tunables, should_tune  # noqa: E402
from evo.core.tunables import violated_constraints  # noqa: E402
from evo.tuning.tuning import (  # noqa: E402
    TuningError,
    TuningStudy,
    journal_path,
    study_name,
    tune_once,
)
from evo.tuning.tuning_settings import TuningSettings  # noqa: E402
from fakes import stages as fake  # noqa: E402

SOURCE = fake.SOURCE.replace("TILE * STAGES <= 768", "TILE * STAGES <= 256")
PARENT_PARAMS = {"TILE": "32", "STAGES": "2", "VEC": "1"}
PARENT_FIT = fake.fitness_of(PARENT_PARAMS)
COMPILE_FAIL = {"TILE": "16", "STAGES": "5", "VEC": "1"}
INCORRECT = {"TILE": "256", "STAGES": "1", "VEC": "8"}
TrialState = optuna.trial.TrialState


def _parent() -> Candidate:
    return Candidate.create("synthetic_a", SOURCE, PARENT_PARAMS, operator=Operator.KNOBS, island=1, generation=4)


def compile_counted(candidate: Candidate, settings: CompileSettings):
    """fake_compile that appends the candidate id to <cache_dir>/compile.log (works in Ray workers)."""
    with open(Path(settings.cache_dir) / "compile.log", "a") as f:
        f.write(candidate.id + "\n")
    return fake.fake_compile(candidate, settings)


def _local_evaluate(log: Path):
    def evaluate(cand: Candidate) -> Evaluation:
        out = compile_counted(cand, CompileSettings(cache_dir=str(log.parent)))
        if not out.result.passed:
            return Evaluation(cand.id, (out.result,))
        ev = fake.fake_evaluate(cand, out.so_bytes, HarnessSettings())
        return Evaluation(cand.id, (out.result,) + ev.stages, ev.fitness, ev.gpu)

    return evaluate


def _compiled(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


# ---------------------------------------------------------------------- ask/tell, in-process


def test_parent_first_constraints_pruned_failures_recorded(tmp_path):
    log = tmp_path / "compile.log"
    records = []
    st = TuningStudy(tmp_path / "s.journal", "run1", _parent(), seed=7, n_trials=12, on_trial=records.append)
    st.study.enqueue_trial(COMPILE_FAIL)
    st.study.enqueue_trial(INCORRECT)
    summary = tune_once(st, _local_evaluate(log))
    trials = st.study.get_trials()
    assert trials[0].number == 0 and {k: str(v) for k, v in trials[0].params.items()} == PARENT_PARAMS
    # Without parent_fitness, the parent's values are evaluated (the parent itself, not a child).
    compiled = _compiled(log)
    assert compiled[0] == _parent().id
    # 12 trials, each evaluated once or told an earlier trial's result (a repeat costs no compile)
    counts = st.counts()
    assert len(compiled) == len(set(compiled)) == st.issued == counts.evaluated
    assert counts.evaluated + counts.told == 12 and counts.finished
    by_id = {}
    for t in trials:
        if t.state is TrialState.PRUNED and "reason" in t.user_attrs and "constraint" in t.user_attrs["reason"]:
            assert violated_constraints(SOURCE, {k: str(v) for k, v in t.params.items()})
            assert "candidate_id" not in t.user_attrs
        if "candidate_id" in t.user_attrs:
            by_id[t.user_attrs["candidate_id"]] = t
    # the sampler draws feasible points only: no trial is spent on (pruned for) a constraint
    assert not any(r.reason.startswith("constraint") for r in records)
    assert all(not violated_constraints(SOURCE, {k: str(v) for k, v in t.params.items()}) for t in trials)
    for cid in compiled:  # nothing that violates a constraint was compiled
        t = by_id[cid]
        assert not violated_constraints(SOURCE, {k: str(v) for k, v in t.params.items()})
    fails = {tuple(sorted((k, str(v)) for k, v in t.params.items())): t for t in trials if t.state is TrialState.FAIL}
    cf = fails[tuple(sorted(COMPILE_FAIL.items()))]
    assert cf.user_attrs["stage"] == "compile" and cf.user_attrs["status"] == "compile_error"
    assert "simulated" in cf.user_attrs["reason"]
    inc = fails[tuple(sorted(INCORRECT.items()))]
    assert inc.user_attrs["stage"] == "correctness" and inc.user_attrs["status"] == "incorrect"
    best, fit = st.best()
    assert fit > PARENT_FIT and best.operator == "optuna" and best.parents == (_parent().id,)
    assert best.generation == _parent().generation + 1 and best.island == _parent().island
    assert summary.improved and st.improved()
    assert summary.parent_fitness == pytest.approx(PARENT_FIT)
    assert len(records) == len(trials) and all(r.status in ("complete", "failed", "pruned") for r in records)


def test_known_parent_fitness_costs_no_compile_and_lookup_reuses_evaluations(tmp_path):
    log = tmp_path / "compile.log"
    known_child = Candidate.create("synthetic_a", SOURCE, {"TILE": "64", "STAGES": "4", "VEC": "8"})
    known = {known_child.id: Evaluation(known_child.id, (StageResult("timing", Status.OK),), 9.0)}
    st = TuningStudy(str(tmp_path / "s.journal"), "run1", _parent(), seed=1, n_trials=5,
                     parent_fitness=PARENT_FIT, lookup=known.get)
    st.study.enqueue_trial({"TILE": "64", "STAGES": "4", "VEC": "8"})
    tune_once(st, _local_evaluate(log))
    t0 = st.study.trials[0]
    assert t0.value == pytest.approx(PARENT_FIT) and t0.user_attrs["evaluated"] is False
    assert _parent().id not in _compiled(log) and known_child.id not in _compiled(log)
    # the parent is a known point (free); the looked-up child is told and counts as a trial
    counts = st.counts()
    assert counts.known == 1 and counts.told >= 1 and len(_compiled(log)) == counts.evaluated
    assert counts.evaluated + counts.told == 5 and counts.finished
    assert st.best()[1] == 9.0 and st.best()[0].id == known_child.id


def test_tell_contract_errors(tmp_path):
    st = TuningStudy(tmp_path / "s.journal", "r", _parent(), seed=0, n_trials=2)
    n, cand = st.ask()
    with pytest.raises(TuningError, match="asked for"):
        st.tell(n, Evaluation("0" * 64, ()))
    st.tell(n, Evaluation(cand.id, (StageResult("timing", Status.OK),), 1.0))
    with pytest.raises(TuningError, match="not in flight"):
        st.tell(n, Evaluation(cand.id, (StageResult("timing", Status.OK),), 1.0))
    plain = Candidate.create("t", "int x;", {})
    with pytest.raises(TuningError, match="no tunables"):
        TuningStudy(tmp_path / "t.journal", "r", plain)


def test_exhausted_space_stops_without_repeats(tmp_path):
    src = """// @tunable A = 1 in {1, 2}
// @tunable B = 1 in {1, 2}
// @constraint A * B <= 2
"""
    parent = Candidate.create("t", src, {"A": "1", "B": "1"})
    seen = []

    def evaluate(c):
        seen.append(c.params)
        return Evaluation(c.id, (StageResult("timing", Status.OK),), float(sum(int(v) for _, v in c.params)))

    st = TuningStudy(tmp_path / "s.journal", "r", parent, seed=3, n_trials=50)
    tune_once(st, evaluate)
    assert len(seen) == len(set(seen)) == 3  # (2, 2) violates the constraint; 4 points, 3 feasible
    assert st.exhausted and st.finished
    assert st.best()[1] == 3.0


def test_resume_continues_numbering_without_repeating(tmp_path):
    log = tmp_path / "compile.log"
    path = journal_path(tmp_path / "runs" / "evo.db", "run9")
    assert path == tmp_path / "runs" / "evo.optuna" / "run9.journal"
    a = TuningStudy(path, "run9", _parent(), seed=5, n_trials=6, parent_fitness=PARENT_FIT)
    tune_once(a, _local_evaluate(log))
    first = _compiled(log)
    last_number = max(t.number for t in a.study.trials)
    b = TuningStudy(path, "run9", _parent(), seed=5, n_trials=6, parent_fitness=PARENT_FIT)
    assert b.study.study_name == study_name("run9", _parent()) == a.study.study_name
    assert len(b.study.trials) == len(a.study.trials)  # the parent's values were not enqueued again
    tune_once(b, _local_evaluate(log))
    new = [t for t in b.study.trials if t.number > last_number]
    assert new and min(t.number for t in new) == last_number + 1
    compiled = _compiled(log)
    assert len(compiled) == len(first) + b.counts().evaluated and len(set(compiled)) == len(compiled)
    assert b.counts().spent == a.counts().spent == 6
    assert b.evaluated_trials == a.counts().evaluated + b.counts().evaluated


def test_stale_running_trial_of_a_killed_session_is_failed(tmp_path):
    path = tmp_path / "s.journal"
    a = TuningStudy(path, "r", _parent(), seed=0, n_trials=3, parent_fitness=PARENT_FIT)
    n, cand = a.ask()  # never told: the session "dies"
    b = TuningStudy(path, "r", _parent(), seed=0, n_trials=3, parent_fitness=PARENT_FIT)
    assert b.study.trials[n].state is TrialState.FAIL
    item = b.ask()
    assert item is not None and item[1].id != cand.id


# ---------------------------------------------------------------------- trigger rule


def _member(params=PARENT_PARAMS, fitness=1.5, source=SOURCE, operator=Operator.KNOBS):
    c = Candidate.create("synthetic_a", source, params, operator=operator)
    return Member(candidate=c, fitness=fitness, status=Status.OK if fitness else Status.INCORRECT)


def test_should_tune_rules():
    s = TuningSettings(enabled=True, trials_per_survivor=8, top_k=2)  # enabled: off by default, as in [tuning]
    m = _member()
    other = _member({"TILE": "64", "STAGES": "2", "VEC": "1"})
    assert should_tune(m, [m.id], set(), s)
    assert should_tune(m, [other.id, m.id, "x"], set(), s)
    assert not should_tune(m, [other.id, "x", m.id], set(), s), "outside the configured top-k"
    assert not should_tune(m, [m.id], {m.id}, s), "one study per survivor"
    assert not should_tune(_member(fitness=None), [m.id], set(), s), "incorrect members are not tuned"
    assert not should_tune(m, [m.id], set(), TuningSettings(trials_per_survivor=8, top_k=2)), "off by default"
    assert not should_tune(m, [m.id], set(), TuningSettings(enabled=True, trials_per_survivor=0))
    opt = _member(operator=Operator.OPTUNA)
    assert not should_tune(opt, [opt.id], set(), s), "an Optuna trial is covered by its parent's study"
    fixed = _member(params={}, source="// @tunable A = 1 in {1}\nint x;")
    assert not has_tunables(fixed.candidate.source)
    assert not should_tune(fixed, [fixed.id], set(), s), "nothing to choose"
    # top_k and trials_per_survivor are bounded once, when the config is loaded (tests/test_config.py)


# ---------------------------------------------------------------------- through the runtime on Ray


def _drive(study: TuningStudy, rt, max_concurrent: int = 2) -> None:
    """What the engine will do: trials through the compile pool and GPU actors, ask/tell."""
    compile_refs: dict = {}
    gpu_refs: dict = {}
    while not study.finished:
        while study.in_flight < max_concurrent:
            item = study.ask()
            if item is None:
                break
            n, cand = item
            compile_refs[rt.submit_compile(cand)] = (n, cand)
        refs = list(compile_refs) + list(gpu_refs)
        if not refs:
            break
        for ref in rt.wait(refs, 10.0):
            if ref in compile_refs:
                n, cand = compile_refs.pop(ref)
                out = rt.get(ref)
                if not out.result.passed:
                    study.tell(n, Evaluation(cand.id, (out.result,)))
                else:
                    gpu_refs[rt.submit_gpu(0, cand, out.so_bytes)] = (n, cand, out.result)
            else:
                n, cand, comp = gpu_refs.pop(ref)
                ev = rt.get(ref).evaluation
                study.tell(n, Evaluation(cand.id, (comp,) + ev.stages, ev.fitness, ev.gpu, ev.env))


def test_study_through_the_runtime(tmp_path):
    """A study driven through a runtime (the in-process one: compile threads, one fake GPU)."""
    from evo.engine.local_runtime import LocalRuntime
    from evo.engine.seams import Stages
    from evo.store import Store

    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("tune-test", {}, seed=0, config_hash="x")
    parent = _parent()
    store.add_candidate(run_id, parent)
    rt = LocalRuntime(stages=Stages(compile_counted, fake.fake_evaluate, evaluate_concurrent=False),
                      compile_settings=CompileSettings(cache_dir=str(tmp_path)),
                      harness_settings=HarnessSettings(), num_gpus=1, num_cpus=2).start()
    log = tmp_path / "compile.log"
    path = journal_path(tmp_path / "evo.db", run_id)

    def record(r):
        store.add_tuning_trial(run_id, parent.id, r.number, r.params, r.value, r.status, r.candidate_id)

    try:
        study_obj = TuningStudy(path, run_id, parent, seed=11, n_trials=20, on_trial=record)
        study_obj.study.enqueue_trial(COMPILE_FAIL)
        study_obj.study.enqueue_trial(INCORRECT)
        _drive(study_obj, rt)
        trials = study_obj.study.get_trials()
        compiled = _compiled(log)
        assert {k: str(v) for k, v in trials[0].params.items()} == PARENT_PARAMS
        assert compiled and len(compiled) == len(set(compiled)) == study_obj.counts().evaluated
        assert study_obj.counts().spent == 20 and study_obj.finished
        id_params = {t.user_attrs["candidate_id"]: {k: str(v) for k, v in t.params.items()}
                     for t in trials if "candidate_id" in t.user_attrs}
        assert all(not violated_constraints(SOURCE, id_params[c]) for c in compiled)
        # a third of the space violates the constraint; the sampler never draws from it
        assert not [t for t in trials if t.user_attrs.get("reason", "").startswith("constraint")]
        failed = {t.user_attrs["status"] for t in trials if t.state is TrialState.FAIL and "status" in t.user_attrs}
        assert {"compile_error", "incorrect"} <= failed
        best, fit = study_obj.best()
        assert fit > PARENT_FIT == pytest.approx(study_obj.parent_value())
        assert best.operator == Operator.OPTUNA.value
        stored = store.tuning_trials(run_id, parent.id)
        assert len(stored) == len(trials)
        assert {r["status"] for r in stored} >= {"complete", "failed"}
        # Resume from storage: numbering continues, no point is evaluated twice.
        last = max(t.number for t in trials)
        again = TuningStudy(path, run_id, parent, seed=11, n_trials=5, on_trial=record)
        _drive(again, rt)
        new = [t for t in again.study.get_trials() if t.number > last]
        assert new and min(t.number for t in new) == last + 1
        compiled2 = _compiled(log)
        assert len(compiled2) == len(set(compiled2)) == len(compiled) + again.counts().evaluated
        assert again.counts().spent == 5
    finally:
        rt.shutdown()
        store.close()


def test_evo_tunes_session_finds_its_target_and_records_every_trial_in_the_run(tmp_path, monkeypatch):
    """``evo tune``'s orchestration (evo.tuning.session): the target's run and lease, the GPU
    check, then each trial's candidate, evaluation and trial row recorded in the run."""
    import evaluators.pipeline as pipeline
    from evo.store import Store
    from evo.tuning import session

    class Bar:
        def __init__(self) -> None:
            self.steps, self.entered = [], 0

        def __enter__(self):
            self.entered += 1
            return self

        def __exit__(self, *exc):
            return None

        def update(self, label, done):
            self.steps.append(done)

    db = tmp_path / "evo.db"
    parent = _parent()
    with Store(db) as store:
        run = store.create_run("t", {}, seed=0, config_hash="x", lease=False)
        store.add_candidate(run, parent)
        store.add_evaluation(run, Evaluation(parent.id, (StageResult("timing", Status.OK),), PARENT_FIT))
        target = session.find_target(store, parent.id[:10])
        assert (target.candidate, target.run_id, target.parent.fitness) == (parent, run, PARENT_FIT)
        assert store.holds_lease(run)
        monkeypatch.setattr(pipeline, "gpu_available", lambda: False)
        with pytest.raises(TuningError, match="no CUDA GPU"):
            session.prepare(store, str(db), target, trials=3, compile_settings=None, harness_settings=HarnessSettings())
        monkeypatch.setattr(pipeline, "gpu_available", lambda: True)
        monkeypatch.setattr(session, "make_local_evaluate", lambda cs, hs: _local_evaluate(tmp_path / "compile.log"))
        tuned = session.prepare(store, str(db), target, trials=3, compile_settings=None,
                                harness_settings=HarnessSettings())
        bar = Bar()
        summary = tuned.run(bar)
        assert summary.evaluated == 3 and bar.entered == 1 and bar.steps == [0, 1, 1, 2, 2, 3]
        trials = store.tuning_trials(run, parent.id)
        children = [c for c in store.candidates(run) if c.operator == "optuna"]
        assert len(children) == 3 and all(store.get_evaluation(c.id, run) for c in children)
        assert {t["candidate_id"] for t in trials} >= {c.id for c in children}
        assert journal_path(db, run).exists(), "the study is stored next to the database"
