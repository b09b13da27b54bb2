"""A seed is a parent before its verdict is back, for a mutator that reads only its parents'
source and parameters (issue 40: the GPU waited a compile's length for the first children,
proposed only once the seeds were judged)."""

from __future__ import annotations

import random

from evo.engine.islands import IslandHandle
from evo.engine.ordering import ItemOrder
from evo.engine.proposals import Proposer, seed_candidate
from evo.engine.seen import SeenIds
from evo.core.records import Member
from fakes import stages as fake
from mutators import base as mut
from mutators.knobs import KnobsMutator

SEEDS = {"t": (fake.SOURCE, {"TILE": "32", "STAGES": "2", "VEC": "1"})}


class EmptyIslands:
    """Islands before any verdict came back: no member, no failure."""

    def __init__(self, members: list[Member] | None = None) -> None:
        self.members = members or []
        self.children: list[str] = []

    def parents(self, isl, k):
        return list(self.members[:k])

    def record_child(self, isl, pid):
        self.children.append(pid)


class NeedsFitness:
    """A mutator that does not say it may build on an unjudged parent."""

    def propose(self, parents, ctx, rng):
        raise AssertionError("never asked without parents")


def _proposer(mutator, islands):
    submitted = []
    p = Proposer(mutator=mutator, rng=random.Random(0), islands=islands, seeds=SEEDS, seen=SeenIds().view(),
                 items=ItemOrder(False, lambda: None), max_evaluations=10,
                 submit=lambda cand, item: submitted.append(cand) or True, stop=lambda reason, replace: True)
    return p, submitted


def test_the_knobs_mutator_builds_on_the_seed_before_its_verdict():
    assert mut.builds_on_unjudged(KnobsMutator(0.3, 2)) and not mut.builds_on_unjudged(NeedsFitness())
    islands = EmptyIslands()
    p, submitted = _proposer(KnobsMutator(0.0, 2), islands)
    assert p.propose(IslandHandle(index=0, task="t", spec=None))
    seed = seed_candidate("t", SEEDS)
    (child,) = submitted
    assert child.parents == (seed.id,) and child.generation == 1 and child.task == "t"
    assert child.params != seed.params and islands.children == [seed.id]


def test_a_mutator_that_reads_fitness_waits_for_the_verdict():
    p, submitted = _proposer(NeedsFitness(), EmptyIslands())
    assert not p.propose(IslandHandle(index=0, task="t", spec=None)) and submitted == []


def test_once_the_island_has_members_they_are_the_parents():
    judged = Member(candidate=seed_candidate("t", SEEDS), fitness=1.5)
    other = Member(candidate=seed_candidate("t", {"t": (fake.SOURCE, {"TILE": "64", "STAGES": "2", "VEC": "1"})}),
                   fitness=2.0)
    p, submitted = _proposer(KnobsMutator(0.0, 2), EmptyIslands([other, judged]))
    assert p.propose(IslandHandle(index=0, task="t", spec=None))
    assert submitted[0].parents == (other.id,)
