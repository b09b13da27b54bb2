"""Knobs sweeps: a tunable whose single change moved fitness is walked through its whole set."""

from __future__ import annotations

import random

import pytest

from evo.config import parse_config
from evo.core.records import Candidate, Member, Operator
from evo.engine.search import make_mutator
from mutators.base import MutationContext
from mutators.knobs import KnobsMutator, KnobsSettings

SRC = """// @tunable T = 1 in {1, 2, 3, 4, 5, 6, 7, 8}
// @tunable U = 0 in {0, 1, 2, 3, 4, 5, 6, 7}
// @tunable V = 0 in {0, 1, 2, 3, 4, 5, 6, 7}
// @constraint T != 7
"""


def _member(params, fitness):
    return Member(Candidate.create("t", SRC, params, operator=Operator.SEED), fitness)


def _child_id(p):
    return Candidate.create("t", SRC, p.params).id


def _learn(m, parent, rng, gain):
    """Propose until a single-tunable change of T comes back; observe it with ``gain``."""
    seen = set()
    for _ in range(200):
        p = m.propose([parent], MutationContext("t", 0, 1, frozenset(seen)), rng)
        seen.add(_child_id(p))
        changed = [k for k in p.params if p.params[k] != parent.candidate.params_dict[k]]
        m.observe(_child_id(p), parent.fitness * (gain if changed == ["T"] else 1.0))
        if changed == ["T"]:
            return seen
    raise AssertionError("no single change of T in 200 proposals")


def test_a_tunable_that_matters_is_walked_through_its_whole_set():
    m = KnobsMutator(crossover_rate=0.0, perturb_max=2, sweep_rate=1.0)
    parent = _member({"T": "4", "U": "3", "V": "3"}, 1.0)
    rng = random.Random(0)
    seen = _learn(m, parent, rng, gain=1.2)
    assert m.matters and next(iter(m.matters.values())) == {"T"}
    walked = set()
    for _ in range(8):
        p = m.propose([parent], MutationContext("t", 0, 1, frozenset(seen)), rng)
        seen.add(_child_id(p))
        walked.add(p.params["T"]) if p.notes.startswith("sweep T") else None
        assert p.operator == "knobs" and p.parents == (parent.id,)
    # every value of T but the parent's own and the infeasible 7, within the next children
    tried = {Candidate.create("t", SRC, {"T": v, "U": "3", "V": "3"}).id for v in "12345678"}
    assert tried - seen == {Candidate.create("t", SRC, {"T": v, "U": "3", "V": "3"}).id for v in "47"}
    assert walked <= set("123568") and len(walked) >= 5


def test_a_change_inside_the_threshold_does_not_start_a_sweep():
    m = KnobsMutator(crossover_rate=0.0, perturb_max=2, sweep_rate=1.0, sweep_threshold=0.05)
    parent = _member({"T": "4", "U": "3", "V": "3"}, 1.0)
    _learn(m, parent, random.Random(0), gain=1.02)
    assert not any(m.matters.values())


@pytest.mark.parametrize("kw", [{"sweep_rate": 1.5}, {"sweep_threshold": 0.0}])
def test_bad_sweep_settings_are_refused(kw):
    with pytest.raises(ValueError, match="sweep"):
        KnobsMutator(**kw)


def _configured(**mutator):
    return make_mutator(parse_config({"tasks": {"include": ["kb19_relu"]}, "mutator": mutator}))


def test_config_keys_reach_the_mutator():
    m = _configured(crossover_rate=0.0, sweep_rate=1.0, sweep_threshold=0.5)
    assert (m.crossover_rate, m.sweep_rate, m.sweep_threshold) == (0.0, 1.0, 0.5)
    default = _configured()
    assert (default.sweep_rate, default.sweep_threshold) == (KnobsSettings.sweep_rate, KnobsSettings.sweep_threshold)


@pytest.mark.parametrize("threshold, matters", [(0.1, True), (0.5, False)])
def test_configured_threshold_decides_whether_a_gain_starts_a_sweep(threshold, matters):
    m = _configured(crossover_rate=0.0, sweep_rate=1.0, sweep_threshold=threshold)
    _learn(m, _member({"T": "4", "U": "3", "V": "3"}, 1.0), random.Random(0), gain=1.2)
    assert any(m.matters.values()) is matters


@pytest.mark.parametrize("rate, sweeps", [(1.0, 4), (0.0, 0)])
def test_configured_rate_decides_how_often_a_sweep_step_is_taken(rate, sweeps):
    m = _configured(crossover_rate=0.0, sweep_rate=rate)
    parent = _member({"T": "4", "U": "3", "V": "3"}, 1.0)
    rng = random.Random(0)
    seen = _learn(m, parent, rng, gain=1.2)
    notes = []
    for _ in range(4):  # fewer than T's untried feasible values
        p = m.propose([parent], MutationContext("t", 0, 1, frozenset(seen)), rng)
        seen.add(_child_id(p))
        notes.append(p.notes)
    assert sum(n.startswith("sweep T") for n in notes) == sweeps
