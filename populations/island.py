"""An island: a pure-Python population of kernels for ONE task.

What an island holds
  * up to ``capacity`` *elites*: the fittest correct members it has seen;
  * optionally a MAP-Elites :class:`~populations.archive.Archive`, whose cell elites are kept
    even when they fall out of the top ``capacity`` (so the held population is at most
    ``capacity + archive cells``);
  * the *champion*: the best member ever added (first to reach the top fitness). It always
    sits among the elites and is never evicted;
  * a bounded list of the most recent *failures* (incorrect members), kept only to drive
    repair prompts, and the *seeds* (members whose operator is ``seed``), the fallback
    parents of last resort;
  * per-member child counts, which the selector uses to damp parents that had many children.

Selection
  :meth:`Island.parents` hands the island's correct members (best first, ties by id) and their
  child counts to the injected :class:`~populations.selection.Selector` with the island's own
  ``random.Random``. With no correct member the island is in *fix mode*: ``parents`` returns
  the most recent failures (newest first) so the mutator can repair them, or the seeds if
  there are no failures, or ``[]`` if the island holds nothing at all (the engine then asks
  for a genesis kernel).

Resume
  :meth:`Island.state` returns a frozen, picklable :class:`IslandState` with everything,
  including the RNG state; :meth:`Island.from_state` rebuilds an island that makes the same
  future choices as the original given the same calls.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Iterable

from evo.core.records import Member, Operator

from .archive import DEFAULT_DIMS, Archive
from .selection import Selector, make_selector

__all__ = ["Island", "IslandState", "IslandSpec", "IslandSummary", "island_seed", "STATE_VERSION"]

log = logging.getLogger(__name__)

STATE_VERSION = 1

_COUNTERS = ("added", "correct", "failed", "duplicates", "evicted", "immigrated", "children")


def island_seed(run_seed: int, task: str, index: int) -> int:
    """A stable 63-bit seed for island ``index`` of ``task`` derived from the run seed.

    Uses sha256 (not ``hash()``, which is salted per process), so the same run seed gives the
    same islands on every machine and after a resume.
    """
    h = hashlib.sha256(f"island\0{int(run_seed)}\0{task}\0{int(index)}".encode("utf-8"))
    return int.from_bytes(h.digest()[:8], "big") >> 1


@dataclass(frozen=True)
class IslandSpec:
    """Everything needed to build a fresh island (in-process or inside an ``IslandActor``).

    ``selector_options`` are keyword arguments for :func:`~populations.selection.make_selector`
    as sorted pairs (hashable, picklable). ``archive_dims=None`` disables the archive.
    """

    index: int
    task: str
    capacity: int = 16
    selector: str = "sigmoid"
    selector_options: tuple[tuple[str, Any], ...] = (("lam", 1.0),)
    seed: int = 0
    archive_dims: tuple[str, ...] | None = DEFAULT_DIMS
    failure_limit: int = 8
    seed_limit: int = 8

    def build(self) -> "Island":
        return Island(
            self.index,
            self.task,
            self.capacity,
            make_selector(self.selector, **dict(self.selector_options)),
            random.Random(self.seed),
            Archive(self.archive_dims) if self.archive_dims is not None else None,
            failure_limit=self.failure_limit,
            seed_limit=self.seed_limit,
        )


@dataclass(frozen=True)
class IslandState:
    """A full, picklable snapshot of an island (see :meth:`Island.state`).

    ``elites`` keep insertion order (eviction ties depend on it); ``failures`` are oldest
    first; ``rng_state`` is ``random.Random.getstate()``; ``selector`` records the selector's
    registry name and options, so a state alone can rebuild an equivalent island.
    """

    index: int
    task: str
    capacity: int
    elites: tuple[Member, ...]
    champion_id: str | None
    failures: tuple[Member, ...]
    failure_limit: int
    seeds: tuple[Member, ...]
    seed_limit: int
    children: tuple[tuple[str, int], ...]
    archive_dims: tuple[str, ...] | None
    archive_cells: tuple[tuple[tuple[str, ...], Member], ...]
    rng_state: tuple
    counters: tuple[tuple[str, int], ...]
    selector: tuple[str, tuple[tuple[str, Any], ...]] = ("sigmoid", ())
    version: int = STATE_VERSION


@dataclass(frozen=True)
class IslandSummary:
    """A small, cheap view of an island for progress displays and the events table."""

    index: int
    task: str
    size: int
    best_id: str | None
    best_fitness: float | None
    fix_mode: bool
    failures: int
    archive_cells: int
    counters: dict[str, int] = field(default_factory=dict)


def _rank_key(m: Member) -> tuple[float, str]:
    return (-float(m.fitness), m.id)  # type: ignore[arg-type]


class Island:
    """A population of members of one task; see the module docstring for the rules.

    Not thread-safe: one owner (the engine in-process, or one ``IslandActor``) calls it.
    """

    def __init__(
        self,
        index: int,
        task: str,
        capacity: int,
        selector: Selector,
        rng: random.Random,
        archive: Archive | None = None,
        *,
        failure_limit: int = 8,
        seed_limit: int = 8,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"island capacity = {capacity}: must be >= 1 (config search.population_size)")
        if failure_limit < 1:
            raise ValueError(f"island failure_limit = {failure_limit}: must be >= 1")
        if seed_limit < 1:
            raise ValueError(f"island seed_limit = {seed_limit}: must be >= 1")
        if not isinstance(rng, random.Random):
            raise TypeError(f"island rng must be a random.Random (seeded by the run), got {type(rng).__name__}")
        if not task:
            raise ValueError("island task must be a non-empty task name")
        self.index = int(index)
        self.task = task
        self.capacity = int(capacity)
        self.selector = selector
        self.rng = rng
        self.archive = archive
        self.failure_limit = int(failure_limit)
        self.seed_limit = int(seed_limit)
        self._elites: dict[str, Member] = {}
        self._champion: Member | None = None
        self._failures: collections.deque[Member] = collections.deque(maxlen=self.failure_limit)
        self._seeds: list[Member] = []
        self._children: dict[str, int] = {}
        self._counters: dict[str, int] = {c: 0 for c in _COUNTERS}

    def __repr__(self) -> str:
        best = self._champion.fitness if self._champion else None
        return (f"Island(index={self.index}, task={self.task!r}, size={len(self)}, "
                f"best={best}, fix_mode={self.fix_mode})")

    def __len__(self) -> int:
        return len(self._held_ids())

    # ------------------------------------------------------------------ queries

    @property
    def fix_mode(self) -> bool:
        """True while the island holds no correct member (parents are failures to repair)."""
        return self._champion is None

    def best(self) -> Member | None:
        """The champion: the best member ever added (never evicted), or None."""
        return self._champion

    def members(self) -> list[Member]:
        """All correct members held (elites and archive elites), best first, ties by id."""
        held: dict[str, Member] = dict(self._elites)
        if self.archive is not None:
            for m in self.archive.elites():
                held.setdefault(m.id, m)
        return sorted(held.values(), key=_rank_key)

    def elites(self) -> list[Member]:
        """The top-``capacity`` members only (no archive-only members), best first."""
        return sorted(self._elites.values(), key=_rank_key)

    def failures(self) -> list[Member]:
        """The most recent incorrect members, newest first (at most ``failure_limit``)."""
        return list(reversed(self._failures))

    def seeds(self) -> list[Member]:
        return list(self._seeds)

    def children(self, member_id: str) -> int:
        return self._children.get(member_id, 0)

    def counters(self) -> dict[str, int]:
        return dict(self._counters)

    def summary(self) -> IslandSummary:
        b = self._champion
        return IslandSummary(
            index=self.index,
            task=self.task,
            size=len(self),
            best_id=b.id if b else None,
            best_fitness=b.fitness if b else None,
            fix_mode=self.fix_mode,
            failures=len(self._failures),
            archive_cells=len(self.archive) if self.archive is not None else 0,
            counters=dict(self._counters),
        )

    # ------------------------------------------------------------------ updates

    def _check_task(self, member: Member) -> None:
        if member.candidate.task != self.task:
            raise ValueError(
                f"island {self.index} holds task {self.task!r} but got member "
                f"{member.candidate.short_id} of task {member.candidate.task!r}; "
                "the engine must route members (and migrants) to islands of their own task"
            )

    def _held_ids(self) -> set[str]:
        ids = set(self._elites)
        if self.archive is not None:
            ids |= self.archive.ids()
        return ids

    def _note_seed(self, member: Member) -> None:
        if member.candidate.operator != Operator.SEED.value:
            return
        if any(s.id == member.id for s in self._seeds):
            return
        if len(self._seeds) < self.seed_limit:
            self._seeds.append(member)

    def seed(self, members: Iterable[Member]) -> None:
        """Register fallback parents for fix mode (e.g. seed kernels not yet evaluated).

        Unlike :meth:`add`, the members need not be evaluated; they are only used when the
        island has neither correct members nor failures. At most ``seed_limit`` are kept.
        """
        for m in members:
            self._check_task(m)
            if any(s.id == m.id for s in self._seeds):
                continue
            if len(self._seeds) < self.seed_limit:
                self._seeds.append(m)

    def add(self, member: Member) -> bool:
        """Offer an evaluated member; True when the island now holds it as an elite.

        * Incorrect members (``not member.correct``) go to the bounded failures list and
          return False.
        * A member whose candidate id is already held is ignored (False).
        * A correct member enters the archive (if any) when it beats its cell, and the elites;
          then the lowest-fitness non-champion elite is evicted while there are more than
          ``capacity`` (ties: the most recently added goes). The return value says whether
          the member survived in the elites or the archive.
        """
        self._check_task(member)
        self._counters["added"] += 1
        self._note_seed(member)
        if not member.correct:
            self._counters["failed"] += 1
            if all(f.id != member.id for f in self._failures):
                self._failures.append(member)
            return False
        if member.id in self._elites or (self.archive is not None and member.id in self.archive):
            self._counters["duplicates"] += 1
            return False
        self._counters["correct"] += 1
        in_archive = self.archive.add(member) if self.archive is not None else False
        self._elites[member.id] = member
        if self._champion is None or float(member.fitness) > float(self._champion.fitness):  # type: ignore[arg-type]
            if self._champion is not None:
                log.info("island %d (%s): new champion %s fitness %.4g (was %.4g)", self.index,
                         self.task, member.candidate.short_id, member.fitness, self._champion.fitness)
            self._champion = member
        self._evict()
        self._prune_children()
        return member.id in self._elites or in_archive

    def _evict(self) -> None:
        champ = self._champion.id if self._champion is not None else None
        while len(self._elites) > self.capacity:
            victim: Member | None = None
            for m in self._elites.values():  # insertion order: `<=` picks the newest on ties
                if m.id == champ:
                    continue
                if victim is None or float(m.fitness) <= float(victim.fitness):  # type: ignore[arg-type]
                    victim = m
            if victim is None:  # only the champion left; capacity >= 1 makes this unreachable
                break
            del self._elites[victim.id]
            self._counters["evicted"] += 1

    def _prune_children(self) -> None:
        keep = self._held_ids() | {f.id for f in self._failures} | {s.id for s in self._seeds}
        for cid in [c for c in self._children if c not in keep]:
            del self._children[cid]

    def record_child(self, parent_id: str) -> bool:
        """Count one more child of ``parent_id`` (call once per proposed child).

        Returns False (and counts nothing) when the island no longer holds that parent.
        """
        held = (parent_id in self._elites
                or (self.archive is not None and parent_id in self.archive)
                or any(f.id == parent_id for f in self._failures)
                or any(s.id == parent_id for s in self._seeds))
        if not held:
            log.debug("island %d: record_child for %s which is no longer held", self.index, parent_id[:12])
            return False
        self._children[parent_id] = self._children.get(parent_id, 0) + 1
        self._counters["children"] += 1
        return True

    # ------------------------------------------------------------------ selection

    def parents(self, k: int = 1) -> list[Member]:
        """Up to ``k`` distinct parents.

        Normal mode: the selector's choice among the correct members (consumes the island's
        RNG). Fix mode: the ``k`` most recent failures, newest first, else the first ``k``
        seeds, else ``[]`` (no RNG use).
        """
        if k <= 0:
            return []
        if self.fix_mode:
            if self._failures:
                return self.failures()[:k]
            return self._seeds[:k]
        pool = self.members()
        counts = [self._children.get(m.id, 0) for m in pool]
        return self.selector.select(pool, counts, k, self.rng)

    # ------------------------------------------------------------------ migration

    def emigrants(self, n: int) -> list[Member]:
        """The best ``n`` correct members (copies travel; the island keeps its own)."""
        return self.members()[: max(0, n)]

    def immigrate(self, members: Iterable[Member]) -> int:
        """Add migrants; returns how many are now held. Duplicates (by candidate id) and
        incorrect members are ignored; migrants start with zero children here."""
        accepted = 0
        for m in members:
            self._check_task(m)
            if not m.correct:
                continue
            if self.add(m):
                accepted += 1
                self._counters["immigrated"] += 1
        return accepted

    # ------------------------------------------------------------------ resume

    def state(self) -> IslandState:
        """Everything needed to rebuild this island exactly (frozen, picklable)."""
        return IslandState(
            index=self.index,
            task=self.task,
            capacity=self.capacity,
            elites=tuple(self._elites.values()),
            champion_id=self._champion.id if self._champion is not None else None,
            failures=tuple(self._failures),
            failure_limit=self.failure_limit,
            seeds=tuple(self._seeds),
            seed_limit=self.seed_limit,
            children=tuple(sorted(self._children.items())),
            archive_dims=self.archive.dims if self.archive is not None else None,
            archive_cells=self.archive.to_cells() if self.archive is not None else (),
            rng_state=self.rng.getstate(),
            counters=tuple(self._counters.items()),
            selector=(
                str(getattr(self.selector, "name", type(self.selector).__name__)),
                tuple(sorted(dict(getattr(self.selector, "options", {}) or {}).items())),
            ),
        )

    @classmethod
    def from_state(cls, state: IslandState, selector: Selector | None = None) -> "Island":
        """Rebuild an island from :meth:`state`. ``selector=None`` rebuilds the recorded one.

        Raises ``ValueError`` for a state of an unknown version or one whose champion is not
        among its elites (a corrupted snapshot).
        """
        if state.version != STATE_VERSION:
            raise ValueError(
                f"island state version {state.version} is not supported (this code reads "
                f"version {STATE_VERSION}); resume with the version of cute-evo that wrote it"
            )
        if selector is None:
            name, opts = state.selector
            selector = make_selector(name, **dict(opts))
        rng = random.Random()
        rng.setstate(state.rng_state)
        archive = (Archive.from_cells(state.archive_dims, state.archive_cells)
                   if state.archive_dims is not None else None)
        isl = cls(state.index, state.task, state.capacity, selector, rng, archive,
                  failure_limit=state.failure_limit, seed_limit=state.seed_limit)
        isl._elites = {m.id: m for m in state.elites}
        if state.champion_id is not None:
            if state.champion_id not in isl._elites:
                raise ValueError(
                    f"island state {state.index} ({state.task}): champion {state.champion_id[:12]} "
                    "is not among its elites; the snapshot is corrupted"
                )
            isl._champion = isl._elites[state.champion_id]
        isl._failures.extend(state.failures)
        isl._seeds = list(state.seeds)
        isl._children = dict(state.children)
        isl._counters.update(dict(state.counters))
        return isl
