"""Conformance of every mutator to mutators.base.Mutator, optional members included.

Implementations: the knobs mutator, and the LLM mutator against the fake OpenAI-compatible
endpoint on 127.0.0.1 (mutators.llm.replay.fake_server) answering from tests/fixtures/llm/lineage.jsonl
(genesis, repair and optimize answers for the tiny copy kernel). What the engine relies on:
``propose`` returns a well-formed Proposal (or None) for a correct parent, for a failed
parent and (with ``genesis``) for none, never a candidate of ``context.seen``, the same one
for the same ``rng`` seed; the optional members have the documented types and defaults.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from evo.core.records import Candidate, Member, Status, candidate_id, canonical_params
from mutators import base as mb
from mutators.base import MutationContext, Mutator, Proposal
from fakes import stages as fake

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "llm"


@dataclass
class Impl:
    """A fresh mutator plus the parents and task it is asked about."""

    mutator: Any
    task: str
    good: list[Member]  # correct parents
    bad: list[Member]  # a failed parent (the island is in fix mode)
    close: Callable[[], None] = lambda: None


def _knobs() -> Impl:
    from mutators.knobs import KnobsMutator

    seed = Candidate.create("synthetic_a", fake.SOURCE, {"TILE": "32", "STAGES": "2", "VEC": "1"}, operator="seed")
    mate = Candidate.create("synthetic_a", fake.SOURCE, {"TILE": "64", "STAGES": "2", "VEC": "1"}, operator="knobs")
    broken = Candidate.create("synthetic_a", fake.SOURCE, {"TILE": "32", "STAGES": "5", "VEC": "1"}, operator="knobs")
    return Impl(KnobsMutator(0.5, 2), "synthetic_a",
                [Member(seed, 1.2, Status.OK), Member(mate, 1.3, Status.OK)],
                [Member(broken, None, Status.COMPILE_ERROR, error="error: simulated")])


def _llm() -> Impl:
    from mutators.llm.replay.cassette import Cassette
    from mutators.llm.client.chat import LLMClient
    from mutators.llm.client.model_spec import ModelSpec
    from mutators.llm.replay.fake_server import FakeLLMServer
    from mutators.llm.mutator import LLMMutator
    from mutators.llm.prompt.context import SimpleContextProvider, TaskInfo

    good_src = (FIX / "tiny_kernel.cu").read_text()
    bad_src = good_src.replace("int64_t(blockIdx.x) * BLOCK", "int64_t(blockIdx.x) * BLOK")
    err = 'kernel.cu(16): error: identifier "BLOK" is undefined'
    task = "tiny_copy"
    abi = (Path(__file__).resolve().parents[2] / "evaluators" / "abi" / "evo_abi.h").read_text()
    info = TaskInfo(reference_src="def reference(x):\n    return x.clone()", abi_text=abi,
                    shapes_text="- {N: 1048576}", dtype="float32", tolerance_text="exact (a copy)")
    broken = Member(Candidate.create(task, bad_src, {}, operator="llm:fake"), None, Status.COMPILE_ERROR, error=err)
    fixed = Member(Candidate.create(task, good_src, {"BLOCK": "256"}, operator="llm:fake", generation=2), 1.5,
                   Status.OK)
    server = FakeLLMServer(Cassette.load(FIX / "lineage.jsonl")).start()
    client = LLMClient(timeout_s=5, max_attempts=1, rng=random.Random(1))
    model = ModelSpec("fake", server.base_url, "fake-coder", key_env="EVO_TEST_NO_KEY")
    provider = SimpleContextProvider({task: info}, failures={broken.id: ("compile", "compile_error", err)})
    return Impl(LLMMutator(client, [model], provider), task, [fixed], [broken], server.stop)


IMPLS = {"knobs": _knobs, "llm": _llm}


@pytest.fixture(params=sorted(IMPLS))
def make(request):
    made: list[Impl] = []

    def factory() -> Impl:
        made.append(IMPLS[request.param]())
        return made[-1]

    yield factory
    for it in made:
        it.close()


def _ctx(it: Impl, parents: list[Member], seen=frozenset()) -> MutationContext:
    gen = max((p.candidate.generation for p in parents), default=-1) + 1
    return MutationContext(task=it.task, island=0, generation=gen, seen=frozenset(seen))


def _check(prop: Proposal | None, parents: list[Member], ctx: MutationContext) -> None:
    if prop is None:
        return
    assert isinstance(prop, Proposal)
    assert isinstance(prop.source, str) and prop.source.strip()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in prop.params.items())
    assert set(prop.parents) <= {p.id for p in parents}, "parents are ids of the given parents"
    assert bool(prop.parents) == bool(parents)
    assert isinstance(prop.operator, str) and prop.operator
    assert candidate_id(prop.source, canonical_params(prop.params), ctx.task) not in ctx.seen


def test_it_is_a_mutator_with_well_typed_optional_members(make):
    m = make().mutator
    assert isinstance(m, Mutator) and isinstance(m.name, str) and m.name
    for attr, kind in (("exhaustive", bool), ("genesis", bool), ("max_failed_attempts", int)):
        if hasattr(m, attr):
            assert isinstance(getattr(m, attr), kind), attr
    k = mb.wants_parents(m)
    assert isinstance(k, int) and k >= 1
    assert isinstance(mb.is_exhaustive(m), bool) and isinstance(mb.writes_genesis(m), bool)
    assert mb.failed_attempt_cap(m, 50) >= 1
    mb.observe(m, "0" * 64, None)  # an id it never proposed, incorrect
    mb.observe(m, "1" * 64, 1.5)


def test_propose_from_correct_parents(make):
    it = make()
    parents = it.good[:mb.wants_parents(it.mutator)]
    ctx = _ctx(it, parents)
    prop = it.mutator.propose(parents, ctx, random.Random(0))
    assert prop is not None, "a child of the fixture's correct parents"
    _check(prop, parents, ctx)


def test_propose_from_a_failed_parent_does_not_raise(make):
    it = make()
    ctx = _ctx(it, it.bad)
    _check(it.mutator.propose(it.bad, ctx, random.Random(0)), it.bad, ctx)


def test_the_same_rng_seed_gives_the_same_child(make):
    a, b = make(), make()
    props = [it.mutator.propose(it.good[:1], _ctx(it, it.good[:1]), random.Random(7)) for it in (a, b)]
    assert props[0] is not None and props[0] == props[1]


def test_a_child_in_seen_is_never_proposed_again(make):
    first, second = make(), make()
    ctx = _ctx(first, first.good[:1])
    prop = first.mutator.propose(first.good[:1], ctx, random.Random(3))
    assert prop is not None
    cid = candidate_id(prop.source, canonical_params(prop.params), first.task)
    ctx2 = _ctx(second, second.good[:1], seen={cid, *(p.id for p in second.good)})
    again = second.mutator.propose(second.good[:1], ctx2, random.Random(3))
    _check(again, second.good[:1], ctx2)


def test_genesis_writes_a_first_kernel_without_parents(make):
    it = make()
    if not mb.writes_genesis(it.mutator):
        assert it.mutator.propose([], _ctx(it, []), random.Random(0)) is None
        return  # the engine never asks it (a task without a seed stops the run before it starts)
    ctx = _ctx(it, [])
    prop = it.mutator.propose([], ctx, random.Random(0))
    assert prop is not None and prop.parents == ()
    _check(prop, [], ctx)


def test_an_exhaustive_mutator_says_none_when_every_child_was_seen(make):
    it = make()
    if not mb.is_exhaustive(it.mutator):
        assert mb.failed_attempt_cap(it.mutator, 50) >= 1  # None is a failed attempt, bounded by the cap
        return
    src = "// @tunable A = 1 in {1, 2}\nextern \"C\" int evo_launch();\n"
    parent = Member(Candidate.create(it.task, src, {"A": "1"}, operator="seed"), 1.0, Status.OK)
    only = candidate_id(src, canonical_params({"A": "2"}), it.task)
    ctx = MutationContext(task=it.task, island=0, generation=1, seen=frozenset({parent.id, only}))
    assert it.mutator.propose([parent], ctx, random.Random(0)) is None


class _Bare:
    """The smallest mutator: a name and propose, every optional member left out."""

    name = "bare"

    def propose(self, parents, context, rng):
        return None


class _Declared(mb.MutatorDefaults):
    name = "declared"

    def propose(self, parents, context, rng):
        return None


@pytest.mark.parametrize("cls", [_Bare, _Declared])
def test_the_optional_members_default_as_documented(cls):
    m = cls()
    assert isinstance(m, Mutator)
    assert mb.wants_parents(m) == 1 and mb.is_exhaustive(m) is False and mb.writes_genesis(m) is False
    assert mb.failed_attempt_cap(m, 50) == 150 and mb.failed_attempt_cap(m, 1) == 10
    mb.observe(m, "0" * 64, None)


def test_a_positive_max_failed_attempts_is_the_cap():
    m = _Declared()
    m.max_failed_attempts = 4
    assert mb.failed_attempt_cap(m, 50) == 4
