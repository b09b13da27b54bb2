"""Mutator contract, run against every implementation, plus knobs-specific behaviour."""

from __future__ import annotations

import random

import pytest

from evo.core.records import Candidate, Member, Status, candidate_id, canonical_params
from evo.core.tunables import parse_tunables, violated_constraints
from fakes.stages import SOURCE
from mutators.base import MutationContext, Mutator, Proposal
from mutators.knobs import KnobsMutator

IMPLEMENTATIONS = [lambda: KnobsMutator(crossover_rate=0.5, perturb_max=2)]


def member(params, fitness=1.0, source=SOURCE):
    return Member(Candidate.create("t", source, params), fitness, Status.OK)


@pytest.fixture(params=IMPLEMENTATIONS, ids=["knobs"])
def mutator(request) -> Mutator:
    return request.param()


def test_contract_returns_proposal_with_parents_and_new_content(mutator):
    parent = member({"TILE": "32", "STAGES": "2", "VEC": "1"})
    ctx = MutationContext(task="t", island=0, generation=1, seen=frozenset({parent.id}))
    prop = mutator.propose([parent], ctx, random.Random(0))
    assert isinstance(prop, Proposal)
    assert prop.parents[0] == parent.id
    assert candidate_id(prop.source, canonical_params(prop.params), "t") not in ctx.seen
    assert prop.operator


def test_contract_deterministic_given_rng(mutator):
    parent = member({"TILE": "32", "STAGES": "2", "VEC": "1"})
    ctx = MutationContext(task="t", island=0, generation=1)
    a = mutator.propose([parent], ctx, random.Random(7))
    b = mutator.propose([parent], ctx, random.Random(7))
    assert a == b


def test_contract_empty_parents_gives_none(mutator):
    assert mutator.propose([], MutationContext("t", 0, 0), random.Random(0)) is None


def test_knobs_children_respect_declared_sets_and_constraints():
    m = KnobsMutator(crossover_rate=0.0, perturb_max=3)
    parent = member({"TILE": "128", "STAGES": "4", "VEC": "2"})
    choices = {t.name: set(t.choices) for t in parse_tunables(SOURCE)}
    rng = random.Random(1)
    for _ in range(200):
        p = m.propose([parent], MutationContext("t", 0, 1), rng)
        assert p is not None and p.operator == "knobs"
        assert all(p.params[k] in choices[k] for k in choices)
        assert not violated_constraints(SOURCE, p.params)
        assert p.params != {"TILE": "128", "STAGES": "4", "VEC": "2"}


def test_knobs_crossover_mixes_two_parents():
    m = KnobsMutator(crossover_rate=1.0, perturb_max=1)
    a = member({"TILE": "16", "STAGES": "1", "VEC": "1"})
    b = member({"TILE": "64", "STAGES": "3", "VEC": "4"})
    rng = random.Random(3)
    ops = set()
    for _ in range(30):
        p = m.propose([a, b], MutationContext("t", 0, 1), rng)
        ops.add(p.operator)
        if p.operator == "crossover":
            assert p.parents == (a.id, b.id)
            for k, v in p.params.items():
                assert v in (a.candidate.params_dict[k], b.candidate.params_dict[k])
    assert "crossover" in ops


def test_knobs_exhaustion_returns_none():
    src = SOURCE.replace("{16, 32, 64, 128, 256}", "{32}").replace("{1, 2, 3, 4, 5}", "{2}").replace("{1, 2, 4, 8}", "{1, 2}")
    m = KnobsMutator(crossover_rate=0.0, perturb_max=1)
    parent = member({"TILE": "32", "STAGES": "2", "VEC": "1"}, source=src)
    other = candidate_id(src, canonical_params({"TILE": "32", "STAGES": "2", "VEC": "2"}), "t")
    ctx = MutationContext("t", 0, 1, seen=frozenset({parent.id, other}))
    assert m.propose([parent], ctx, random.Random(0)) is None


def test_knobs_rejects_bad_settings():
    with pytest.raises(ValueError, match="crossover_rate"):
        KnobsMutator(crossover_rate=2.0)
    with pytest.raises(ValueError, match="perturb_max"):
        KnobsMutator(perturb_max=0)
