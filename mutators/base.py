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

from evo.records import Member

__all__ = ["Proposal", "MutationContext", "Mutator", "MutatorStopped"]


class MutatorStopped(RuntimeError):
    """The mutator can make no more proposals in this run (its budget is spent, every model
    it may call is stopped). The message is one line naming the cause and the fix.

    The engine catches it around ``propose`` (and ``repair``), stops proposing, lets the work
    in flight drain and ends the run with the message as its stop reason. Subclasses:
    :class:`mutators.client.BudgetExhausted`, :class:`mutators.health.NoModelLeft`.
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

    Called by the engine's driver loop only (never concurrently with itself). ``parents``
    holds one or more members of the same task; the first is the primary parent. Return
    ``None`` when no new child can be made from these parents. Raise only for failures of
    the mutator itself (a broken template, a misconfiguration), never for a bad parent.
    """

    name: str
    # Optional class attributes the engine reads with getattr (defaults in brackets):
    #   exhaustive [False]: None from propose means these parents are exhausted;
    #   genesis [False]: propose([]) writes a first kernel for a task without a seed;
    #   wants_parents() [1]: how many parents to select; observe(candidate_id, fitness):
    #   called with each evaluated child's fitness (None if incorrect).

    def propose(
        self, parents: list[Member], context: MutationContext, rng: random.Random
    ) -> Proposal | None:  # pragma: no cover - protocol
        ...
