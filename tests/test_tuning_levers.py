"""Search levers of the tuning studies (evo.tuning.tuning): constraint-aware sampling, studies seeded
with the run's known points, and exploration around a point TPE keeps returning."""

from __future__ import annotations

import pytest

optuna = pytest.importorskip("optuna")

from evo.core.records import Candidate, Evaluation, StageResult, Status  # noqa: E402
from evo.core.tunables import constraint_checker, violated_constraints  # noqa: E402
from evo.tuning.tuning import FeasibleSampler, TuningStudy, tune_once  # noqa: E402

#: 8 x 8 points, 10 feasible: an unconstrained sampler mostly draws infeasible ones.
SRC = """// @tunable A = 0 in {0, 1, 2, 3, 4, 5, 6, 7}
// @tunable B = 0 in {0, 1, 2, 3, 4, 5, 6, 7}
// @constraint A + B <= 3
"""


def _ok(fitness):
    return lambda cid: Evaluation(cid, (StageResult("timing", Status.OK),), fitness)


def _evaluate(seen):
    def evaluate(c):
        seen.append(c.params_dict)
        p = c.params_dict
        return Evaluation(c.id, (StageResult("timing", Status.OK),), 1.0 + int(p["A"]) + 0.5 * int(p["B"]))
    return evaluate


def test_constraint_checker_agrees_with_violated_constraints():
    ok = constraint_checker(SRC)
    for a in range(8):
        for b in range(8):
            p = {"A": str(a), "B": str(b)}
            assert ok(p) == (not violated_constraints(SRC, p))


def test_feasible_sampler_draws_only_feasible_points():
    study = optuna.create_study(direction="maximize",
                                sampler=FeasibleSampler(SRC, {"A": "0", "B": "0"}, seed=4))
    dists = {k: optuna.distributions.CategoricalDistribution([str(i) for i in range(8)]) for k in "AB"}
    for _ in range(40):
        t = study.ask(dists)
        assert int(t.params["A"]) + int(t.params["B"]) <= 3
        study.tell(t, float(t.params["A"]))


def test_a_study_spends_no_trial_on_an_infeasible_point_and_counts_feasible_ones(tmp_path):
    parent = Candidate.create("t", SRC, {"A": "0", "B": "0"})
    records, seen = [], []
    # a budget the space runs out before: TPE repeats its points in so small a space, and each
    # repeat, told at once, counts as a trial
    st = TuningStudy(tmp_path / "s.journal", "r", parent, seed=2, n_trials=1000, on_trial=records.append)
    assert st.feasible_size == 10
    tune_once(st, _evaluate(seen))
    assert not [r for r in records if r.status == "pruned"]
    assert len(seen) == len(set(map(tuple, map(sorted, map(dict.items, seen))))) == 10  # every feasible point once
    assert st.exhausted and st.best()[1] == 4.0


def test_known_points_seed_the_study_and_are_never_evaluated_again(tmp_path):
    parent = Candidate.create("t", SRC, {"A": "0", "B": "0"})
    known_params = [{"A": "1", "B": "0"}, {"A": "0", "B": "1"}, {"A": "2", "B": "1"}, {"A": "3", "B": "0"}]
    known = []
    for p in known_params:
        c = Candidate.create("t", SRC, p)
        known.append((p, Evaluation(c.id, (StageResult("timing", Status.OK),), 1.0 + int(p["A"]) + 0.5 * int(p["B"]))))
    bad = Candidate.create("t", SRC, {"A": "1", "B": "1"})
    known.append(({"A": "1", "B": "1"}, Evaluation(bad.id, (StageResult("compile", Status.COMPILE_ERROR),))))
    known.append(({"C": "1"}, known[0][1]))  # another source's tunables: skipped
    records, seen = [], []
    st = TuningStudy(tmp_path / "s.journal", "r", parent, seed=0, n_trials=50, on_trial=records.append)
    st2 = TuningStudy(tmp_path / "k.journal", "r", parent, seed=0, n_trials=1000, known=known, on_trial=records.append)
    # before any ask the seeded study holds the five known points as finished trials
    done = [t for t in st2.study.get_trials() if t.state.is_finished()]
    assert len(done) == 5 and {t.user_attrs["origin"] for t in done} == {"known"}
    assert st2.best()[1] == 4.0 and not st.study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    tune_once(st2, _evaluate(seen))
    evaluated = {tuple(sorted(p.items())) for p in seen}
    assert not evaluated & {tuple(sorted(p.items())) for p in known_params + [{"A": "1", "B": "1"}]}
    assert len(evaluated) == 10 - 5  # only the feasible points nobody had measured
    assert sum(1 for r in records if r.reason.startswith("known")) == 5


def test_a_repeated_point_enqueues_its_nearest_untried_neighbour(tmp_path):
    parent = Candidate.create("t", SRC, {"A": "0", "B": "0"})
    st = TuningStudy(tmp_path / "s.journal", "r", parent, seed=0, n_trials=5, parent_fitness=1.0)
    st._asked_points.add((("A", "1"), ("B", "0")))
    assert st._untried_neighbour({"A": "0", "B": "0"}) == {"A": "0", "B": "1"}
    st._asked_points.update({(("A", "0"), ("B", "1"))})
    assert st._untried_neighbour({"A": "0", "B": "0"}) == {"A": "2", "B": "0"}  # smallest move first
