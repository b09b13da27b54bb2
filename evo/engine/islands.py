"""The driver's side of the islands: one :class:`IslandHandle` per island, and the
:class:`IslandSet` through which the engine talks to their actors.

The population itself lives in an island actor (:class:`populations.actor.IslandActor`,
its state :class:`populations.island.IslandState`); the handle holds what the driver needs
around it: which actor, its spec (to rebuild a dead actor), a prefetched parent choice, and
the scheduling flags. The set makes the islands through the runtime
(:class:`evo.engine.seams.ClusterRuntime`) and calls each through its typed proxy
(:class:`evo.engine.seams.IslandProxy`): results to the islands of their task, parent
selection with prefetching, ring migration, summaries, and the restore of an actor that
died (:func:`evo.engine.recovery.island_died` decides, the set rebuilds it from the store with
:func:`evo.engine.resume.island_members` and logs an ``island_restored`` event).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

from evo.engine import recovery
from evo.core.records import Candidate, Member
from evo.engine.resume import island_members
from evo.engine.seams import IslandProxy

__all__ = ["IslandHandle", "IslandSet", "island_specs"]

T = TypeVar("T")


@dataclass(eq=False)
class IslandHandle:
    """One island as the driver tracks it.

    ``actor``: the island's typed proxy (:class:`evo.engine.seams.IslandProxy`; replaced
    when its actor died and was restored). ``spec``: the
    :class:`populations.island.IslandSpec` it was built from. ``parents_ref``: a reference
    to a ``parents`` request made after the island's last proposal (None: nothing
    prefetched; dropped whenever a member joins the island, so it never predates a result).
    ``genesis_pending``: a genesis child of this island is in flight (a task without a
    seed asks for one first kernel at a time). ``exhausted``: the exhaustive mutator had
    nothing new for this island's parents (cleared when a correct member joins it and
    after each migration round of its task). ``restores``: how often its actor was rebuilt
    from the store.
    """

    index: int
    task: str
    spec: Any
    actor: IslandProxy | None = None
    parents_ref: Any = None
    genesis_pending: bool = False
    exhausted: bool = False
    restores: int = 0


def island_specs(tasks: list[str], *, per_task: int, capacity: int, selection_lambda: float, archive: bool,
                 rng: random.Random) -> list:
    """``per_task`` island specs per task, numbered in order; each draws its seed from ``rng``."""
    from populations.island import DEFAULT_DIMS, IslandSpec

    specs = []
    for task in tasks:
        for _ in range(per_task):
            specs.append(IslandSpec(
                index=len(specs), task=task, capacity=capacity,
                selector_options=(("lam", selection_lambda),),
                seed=rng.randrange(2**31),
                archive_dims=DEFAULT_DIMS if archive else None,
            ))
    return specs


class IslandSet:
    """The run's islands, indexed by island number (``islands[i]`` is an :class:`IslandHandle`).

    ``rt``: the runtime; ``store`` / ``run_id``: where a dead actor's members are read back
    from and its restore is logged; ``descriptor``: tunables -> archive descriptor.
    """

    def __init__(self, rt, store, run_id: str, descriptor: Callable[[dict[str, str]], tuple]) -> None:
        self.rt, self.store, self.run_id, self.descriptor = rt, store, run_id, descriptor
        self.handles: list[IslandHandle] = []

    def build(self, specs: list) -> None:
        """One actor per spec (the run's islands, in order)."""
        self.handles = [IslandHandle(s.index, s.task, s, a) for s, a in zip(specs, self.rt.make_islands(specs))]

    def __len__(self) -> int:
        return len(self.handles)

    def __getitem__(self, idx: int) -> IslandHandle:
        return self.handles[idx]

    def __iter__(self) -> Iterator[IslandHandle]:
        return iter(self.handles)

    def targets(self, cand: Candidate) -> list[int]:
        """The islands a candidate's result goes to: all of its task's for a seed (island -1)."""
        if cand.island < 0:
            return [i.index for i in self.handles if i.task == cand.task]
        return [cand.island] if cand.island < len(self.handles) else []

    # ---- calls

    def actor_errors(self) -> tuple[type[BaseException], ...]:
        """The runtime's "this actor is dead" errors (not errors raised by a method)."""
        errs = tuple(e for e in self.rt.remote_errors() if "Actor" in e.__name__)
        return errs or self.rt.remote_errors()

    def call(self, idx: int, method: Callable[[IslandProxy], T]) -> T:
        """``method(proxy)`` on island ``idx``'s proxy (e.g. ``lambda i: i.summary()``); a
        dead island actor is restored from the store and the call repeated once on its
        replacement."""
        try:
            return method(self.handles[idx].actor)
        except self.actor_errors() as e:
            self.restore(idx, e)
            return method(self.handles[idx].actor)

    def restore(self, idx: int, err: BaseException) -> None:
        """Replace the dead actor of island ``idx`` by a new one holding its evaluated
        members from the store (:mod:`evo.engine.resume`), or stop the run after too many deaths."""
        isl = self.handles[idx]
        decision = recovery.island_died(isl, err)
        isl.restores = decision.restores
        if decision.give_up:
            raise recovery.SearchError(decision.give_up)
        new = self.rt.make_islands([isl.spec])[0]
        members = island_members(self.store, self.run_id, isl.task, idx, self.descriptor)
        if members:
            new.add_many(members)
        isl.actor, isl.parents_ref = new, None
        self.store.log_event(self.run_id, "island_restored", {
            "island": idx, "task": isl.task, "members": len(members), "restores": isl.restores,
            "error": f"{type(err).__name__}: {err}"[:500]})

    def parents(self, isl: IslandHandle, k: int) -> list[Member]:
        """``k`` parents selected by island ``isl``, then the next choice is prefetched.

        The answer to the request made after this island's previous proposal is usually
        ready, so no actor round trip sits on the proposal path (it is dropped whenever a
        member joins the island, so it never misses a result).
        """
        ref, isl.parents_ref = isl.parents_ref, None
        parents: list[Member] = []
        if ref is not None:
            try:
                parents = self.rt.get(ref)
            except self.actor_errors() as e:
                self.restore(isl.index, e)
        if not parents:  # nothing prefetched, or prefetched before the island had members
            parents = self.call(isl.index, lambda i: i.parents(k))
        isl.parents_ref = isl.actor.ask_parents(k)
        return parents

    def record_child(self, isl: IslandHandle, parent_id: str) -> None:
        """Tell island ``isl`` that ``parent_id`` made a child (fire-and-forget)."""
        isl.actor.record_child(parent_id)

    def add(self, member: Member) -> None:
        """Send an evaluated member to its islands (a fire-and-forget call, ordered before
        this driver's next call to them)."""
        for idx in self.targets(member.candidate):
            isl = self.handles[idx]
            isl.actor.add(member)
            isl.parents_ref = None  # a prefetched parent choice predates this member: drop it
            isl.exhausted = isl.exhausted and not member.correct  # a correct member may open new neighbours

    def migrate(self, count: int) -> Iterator[tuple[str, int]]:
        """One ring migration round per task with two or more islands: ``(task, moved)``."""
        for task in dict.fromkeys(i.task for i in self.handles):
            idxs = [i.index for i in self.handles if i.task == task]
            if len(idxs) < 2:
                continue
            # Take every island's emigrants before any island receives: one hop per round.
            outgoing = [self.call(i, lambda isl: isl.emigrants(count)) for i in idxs]
            moved = sum(self.call(idxs[(j + 1) % len(idxs)], lambda isl, em=em: isl.immigrate(em))
                        for j, em in enumerate(outgoing) if em)
            yield task, moved
            for i in idxs:
                self.handles[i].exhausted = False

    def summaries(self) -> list[dict]:
        """Each island's summary as a progress row."""
        try:
            sums = [self.rt.get(ref) for ref in [i.actor.ask_summary() for i in self.handles]]
        except self.actor_errors():
            sums = [self.call(i.index, lambda isl: isl.summary()) for i in self.handles]
        return [{"island": s.index, "task": s.task, "best": s.best_fitness, "fix_mode": s.fix_mode,
                 "size": s.size, "archive_cells": s.archive_cells} for s in sums]
