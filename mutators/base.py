"""The Mutator protocol: how parents become a child proposal.

The engine (driver process) calls ``propose`` once per child it wants in flight, with the
parents its island selected and a :class:`MutationContext` describing the task and island.
A mutator returns a :class:`Proposal` (source + tunable values + notes) or ``None`` when it
has nothing new to offer for these parents (e.g. every neighbour of the parent's tunables
was already tried); the engine then asks another island or waits. Mutators never compile,
evaluate or write to the store; they may keep caches keyed by content. Randomness comes
only from the ``rng`` passed in, so a seeded run is reproducible.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from evo.core.records import Member

__all__ = ["Proposal", "MutationContext", "Mutator", "MutatorDefaults", "MutatorStopped", "wants_parents", "observe",
           "is_exhaustive", "writes_genesis", "concurrency", "failed_attempt_cap", "reads_profiles"]


class MutatorStopped(RuntimeError):
    """The mutator can make no more proposals in this run (its budget is spent, every model
    it may call is stopped). The message is one line naming the cause and the fix.

    Subclasses: :class:`mutators.llm.client.budget.BudgetExhausted`, :class:`mutators.llm.client.health.NoModelLeft`.
    Today the engine catches only ``BudgetExhausted`` around ``propose`` (it stops proposing,
    lets the work in flight drain and ends the run with the message as its stop reason);
    any other subclass ends the run with the exception (catching the base class is the
    open change that tests/test_llm_search.py's strict xfail marks).
    """


@dataclass(frozen=True)
class Proposal:
    """A child as a mutator describes it; the engine turns it into a Candidate.

    ``operator`` is recorded on the candidate (``knobs``, ``crossover``, ``llm:<model>``);
    ``parents`` are the ids the child derives from, in order of importance.
    """

    source: str
    params: dict[str, str]
    parents: tuple[str, ...]
    operator: str
    notes: str = ""


@dataclass(frozen=True)
class MutationContext:
    """What a mutator may know about where the child goes.

    ``seen`` answers "was this candidate id proposed before in this run" so mutators can
    avoid duplicates without reading the store; it is a frozenset snapshot.
    """

    task: str
    island: int
    generation: int
    seen: frozenset[str] = field(default_factory=frozenset)


@runtime_checkable
class Mutator(Protocol):
    """Turns selected parents into one child proposal.

    Implemented by :class:`mutators.knobs.KnobsMutator` (offline) and
    :class:`mutators.llm.mutator.LLMMutator`; every implementation passes the conformance suite in
    ``tests/conformance/test_mutator_conformance.py``.

    Required members: ``name`` (recorded in errors and logs) and :meth:`propose`. The
    optional members below are read by the engine through this module's accessors
    (:func:`wants_parents`, :func:`observe`, :func:`is_exhaustive`, :func:`writes_genesis`,
    :func:`failed_attempt_cap`); a mutator that lacks one gets the default in brackets, so a
    plain object with ``name`` and ``propose`` is a complete mutator.
    :class:`MutatorDefaults` spells the optional members out with those defaults.

    - ``exhaustive`` [False], a class attribute: ``None`` from :meth:`propose` means "these
      parents have nothing new": the engine stops asking that island until a correct member
      joins it or a migration round passes. When False, ``None`` is a failed attempt: the
      engine asks again and stops the run after :func:`failed_attempt_cap` of them.
    - ``genesis`` [False]: ``propose([], ...)`` may write a first kernel for a task without a
      seed. When False, a task without a seed stops the run before it starts.
    - ``max_failed_attempts`` [0]: the cap on failed attempts in a run (0: three times the
      evaluation budget, at least 10).
    - ``reads_profiles`` [True], a class attribute: whether its proposals read survivors'
      profile numbers (an LLM's prompts do). When False the engine profiles no survivor
      while the run searches (ncu holds the GPU for seconds per profile, and nobody would
      read the numbers) and profiles each task's champion only, before confirming it (ncu's
      kernel time corroborates the re-timing: :func:`evo.engine.champions.ncu_corroboration`).
    - ``wants_parents()`` [1]: how many parents to select per proposal; asked before every
      proposal.
    - ``observe(candidate_id, fitness)`` [none]: called once for every evaluation the engine
      records in this session, whoever proposed the candidate (seeds, other operators and
      tuning trials too; not for evaluations replayed on resume), ``fitness`` None when it
      is not correct. For learning (a bandit); must not raise.

    - ``concurrency`` [1] and ``begin(parents, context, rng)``: with ``concurrency`` > 1 (and
      ``begin``), the engine keeps up to that many proposals in flight, off its loop.
      ``begin`` is called on the loop, in the engine's order, instead of :meth:`propose`; it
      does what reads the run's state or ``rng`` and returns a job (no arguments, returns
      what :meth:`propose` returns, raises what it raises) that the engine runs on a pool
      thread while it keeps collecting compile and GPU results. ``propose(...)`` must equal
      ``begin(...)()``. Jobs run concurrently with each other and with :func:`observe`.
    - the repair loop, ``offer_repair(member, island=...)``, ``next_repair(task)``,
      ``repair(request, context, rng)`` and ``begin_repair(request, context, rng)``
      [none]: the engine offers every child it records as failed, and serves a queued
      repair of an island's task before a new proposal (``begin_repair`` off the loop like
      ``begin``). :class:`mutators.llm.mutator.LLMMutator` documents them.
    """

    name: str

    def propose(
        self, parents: list[Member], context: MutationContext, rng: random.Random
    ) -> Proposal | None:  # pragma: no cover - protocol
        """One child of ``parents``, or ``None`` when none can be made.

        Called by: the engine's driver loop, once per child it wants in flight, never
        concurrently with itself or :func:`observe`. ``parents``: up to
        :func:`wants_parents` members of the task ``context.task`` selected by the island
        (the first is the primary parent; members may be incorrect: the island is in fix
        mode); empty only for a task without a seed and a mutator with ``genesis``.
        ``context.seen``: every candidate id of the run so far (return none of them; the
        engine drops a duplicate anyway). ``rng``: the run's generator, the only source of
        randomness, so a seeded run replays.

        Returns: a :class:`Proposal` whose ``parents`` are ids of the given parents (empty
        for genesis) and whose ``params`` map tunable names to values as strings; the
        engine builds the Candidate, checks policy, compiles and evaluates it. May change:
        the mutator's own caches and counters only (never the parents, the store, the
        islands).

        Raises: :class:`mutators.llm.client.budget.BudgetExhausted` when the mutator's budget is spent
        (the engine stops proposing, lets the work in flight drain, and the run ends with
        the message as its stop reason); any other exception is a failure of the mutator
        itself (a broken template, a misconfiguration, a replay that diverged) and ends
        the run. Never raise for a bad parent: return ``None``.
        """
        ...


class MutatorDefaults:
    """The optional members of :class:`Mutator` with the defaults the engine assumes.

    Inheriting is optional (the engine reads the members with the accessors below either
    way); it documents, in the class, which members a mutator leaves at their defaults.
    """

    exhaustive: bool = False
    genesis: bool = False
    max_failed_attempts: int = 0
    reads_profiles: bool = True

    def wants_parents(self) -> int:
        return 1

    def observe(self, candidate_id: str, fitness: float | None) -> None:
        return None


def wants_parents(mutator: object) -> int:
    """How many parents ``mutator`` wants selected (its ``wants_parents()``, default 1)."""
    return mutator.wants_parents() if hasattr(mutator, "wants_parents") else 1


def observe(mutator: object, candidate_id: str, fitness: float | None) -> None:
    """Report an evaluated candidate to ``mutator`` if it has ``observe``."""
    if hasattr(mutator, "observe"):
        mutator.observe(candidate_id, fitness)


def is_exhaustive(mutator: object) -> bool:
    """Whether ``None`` from ``mutator.propose`` means "these parents are exhausted"."""
    return bool(getattr(mutator, "exhaustive", False))


def writes_genesis(mutator: object) -> bool:
    """Whether ``mutator`` can write a first kernel for a task without a seed."""
    return bool(getattr(mutator, "genesis", False))


def builds_on_unjudged(mutator: object) -> bool:
    """Whether ``mutator``'s children read only their parents' source and parameters (not
    their fitness), so the engine may give it a seed as a parent before the seed's verdict
    is back (its ``unjudged_parents``; default False)."""
    return bool(getattr(mutator, "unjudged_parents", False))


def concurrency(mutator: object) -> int:
    """How many proposals ``mutator`` may have in flight off the engine's loop: its
    ``concurrency`` when it has ``begin`` and that is above 1, else 1 (``propose`` is called
    on the loop)."""
    n = int(getattr(mutator, "concurrency", 1) or 1)
    return n if n > 1 and callable(getattr(mutator, "begin", None)) else 1


def reads_profiles(mutator: object) -> bool:
    """Whether ``mutator``'s proposals read survivors' profiles (its ``reads_profiles``, default True)."""
    return bool(getattr(mutator, "reads_profiles", True))


def failed_attempt_cap(mutator: object, max_evaluations: int) -> int:
    """Failed attempts (``None`` from a non-exhaustive mutator) after which the run stops:
    ``mutator.max_failed_attempts`` when positive, else ``max(3 * max_evaluations, 10)``."""
    cap = getattr(mutator, "max_failed_attempts", 0) or 0
    return cap if cap > 0 else max(3 * max_evaluations, 10)
