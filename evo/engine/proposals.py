"""Proposing children for the engine: on its loop, or on a thread pool.

:class:`Proposer` is owned by :class:`evo.engine.engine.Engine` and used from its thread only.

- :meth:`Proposer.propose` starts one proposal for an island, a queued repair of the
  island's task first (the CuTeGen loop). A mutator with ``concurrency`` 1 runs on the loop
  and its outcome is handled at once. With ``concurrency`` > 1 (the LLM mutator: its models'
  concurrency) the loop prepares the call (``begin`` / ``begin_repair``: parents, model,
  prompt, in the loop's order), the job runs on the pool, and :meth:`Proposer.collect`
  (called after each wait on the cluster) takes the finished jobs in the order they started.
- The engine is reached only through the two callables it passes: ``submit(candidate,
  item)`` (True when the candidate was new and submitted) and ``stop(reason, replace)``
  (True when the run's stop reason was set: only when none was, unless ``replace``).
- A proposal on the pool is an item of :class:`evo.engine.ordering.ItemOrder` and a *claim*
  (:attr:`Proposer.claimed`) until it becomes a candidate or settles without one, so the
  engine never proposes more than the evaluation budget allows. Ordered, what an outcome
  changes (the island told of a child, a failed attempt counted) waits for its item's turn.
- ``None`` from an exhaustive mutator marks the island exhausted; from another it is a
  failed attempt (:attr:`Proposer.fill_failures` counts those since the engine last reset
  it); ``failed_attempt_cap`` of them stop the run. ``MutatorStopped`` stops proposing.
"""

from __future__ import annotations

import logging
import random
from concurrent import futures
from typing import Callable, Mapping

from evo.engine.seen import SeenView

from evo.engine.islands import IslandHandle, IslandSet
from evo.engine.ordering import ItemOrder
from evo.core.records import Candidate, Member, Operator
from mutators import base as mut

__all__ = ["Proposer", "seed_candidate"]

log = logging.getLogger(__name__)


def seed_candidate(task: str, seeds: Mapping[str, tuple[str, dict[str, str]]]) -> Candidate | None:
    """The task's seed candidate as the engine submits it (same id every time), or None
    without one. ``seeds``: task -> (source, params)."""
    if task not in seeds:
        return None
    source, params = seeds[task]
    return Candidate.create(task, source, params, operator=Operator.SEED, island=-1, notes="seed kernel")


class Proposer:
    """The run's proposals. ``seeds``: task -> (source, params) of the tasks that have a seed
    kernel; ``seen``: the
    engine's content ids of this run, lent read-only (:class:`evo.engine.seen.SeenView`).

    Its counters are its own and read-only outside it: :attr:`claimed`,
    :attr:`failed_attempts`, :attr:`fill_failures` (the engine starts a new count of the
    last with :meth:`new_fill`)."""

    def __init__(self, *, mutator, rng: random.Random, islands: IslandSet, seeds: Mapping[str, tuple[str, dict[str, str]]],
                 seen: SeenView,
                 items: ItemOrder, max_evaluations: int, submit: Callable[[Candidate, int | None], bool],
                 stop: Callable[[str, bool], bool]) -> None:
        self.mutator, self.rng, self.islands, self.seeds, self.seen = mutator, rng, islands, seeds, seen
        self.items, self.max_evaluations = items, max_evaluations
        self._submit, self._stop = submit, stop
        self.concurrency = mut.concurrency(mutator)
        self._pool: futures.ThreadPoolExecutor | None = None
        self._jobs: dict[futures.Future, tuple[IslandHandle, bool, int, int]] = {}
        self._claimed = 0  # proposals begun that are neither a submitted candidate nor settled yet
        self._failed_attempts = 0
        self._fill_failures = 0

    @property
    def claimed(self) -> int:
        """Proposals begun that are neither a submitted candidate nor settled yet (the engine
        never proposes more than the evaluation budget minus these)."""
        return self._claimed

    @property
    def failed_attempts(self) -> int:
        """Proposals of this run that made no child (an exhaustive mutator's None aside)."""
        return self._failed_attempts

    @property
    def fill_failures(self) -> int:
        """Failed attempts since the last :meth:`new_fill`."""
        return self._fill_failures

    def new_fill(self) -> None:
        """The engine starts filling its slots again: :attr:`fill_failures` counts from 0."""
        self._fill_failures = 0

    def __len__(self) -> int:
        """Proposals running on the pool."""
        return len(self._jobs)

    def has_room(self) -> bool:
        return len(self._jobs) < self.concurrency

    def open(self) -> None:
        """Start the pool (a mutator with ``concurrency`` > 1)."""
        if self.concurrency > 1:
            self._pool = futures.ThreadPoolExecutor(self.concurrency, thread_name_prefix="evo-propose")

    def close(self) -> None:
        if self._pool is not None:  # calls still on the wire end on their own; their answers are dropped
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` for a proposal on the pool to finish."""
        futures.wait(list(self._jobs), timeout=timeout, return_when=futures.FIRST_COMPLETED)

    def propose(self, isl: IslandHandle) -> bool:
        """Start one proposal for ``isl``: on the loop, or as a job on the pool (its result
        then arrives through :meth:`collect`). True when a slot was filled."""
        parents = self.islands.parents(isl, mut.wants_parents(self.mutator))
        if not parents and mut.builds_on_unjudged(self.mutator):
            parents = self._unjudged_seed(isl.task)
        if not parents:  # an island of a task without a seed kernel starts from genesis (LLM only)
            if isl.task in self.seeds or not mut.writes_genesis(self.mutator) or isl.genesis_pending:
                return False
        gen = max(p.candidate.generation for p in parents) + 1 if parents else 0
        ctx = mut.MutationContext(task=isl.task, island=isl.index, generation=gen, seen=frozenset(self.seen))
        try:
            if self._pool is None:
                got = self._repair_first(isl)
                prop = self.mutator.propose(parents, ctx, self.rng) if got is None else got[0]
                gen = gen if got is None else got[1]
            else:
                job, gen = self._begin(isl, parents, ctx)
        except _budget_errors() as e:
            self._mutator_stopped(e)
            return False
        if self._pool is None:
            return self._proposed(isl, not parents, gen, prop)
        isl.genesis_pending = isl.genesis_pending or not parents
        self._claimed += 1
        self._jobs[self._pool.submit(job)] = (isl, bool(parents), gen, self.items.start())
        return True

    def _unjudged_seed(self, task: str) -> list[Member]:
        """The task's seed as a parent before its verdict came back (no fitness): an island
        is empty only until then (a verdict, correct or not, makes it a member or a failure
        to repair). For a mutator whose children read the parent's source and parameters
        only (:func:`mutators.base.builds_on_unjudged`), the first children then compile
        while the seed is still being compiled and judged, and the GPU finds them queued
        when the seeds are done, instead of waiting a compile's length for them."""
        seed = seed_candidate(task, self.seeds)
        return [Member(candidate=seed, fitness=None)] if seed is not None else []

    def _begin(self, isl: IslandHandle, parents: list[Member], ctx: mut.MutationContext):
        """``(job, generation)`` of a proposal to run on the pool: a queued repair of the
        island's task first (``begin_repair``), else ``begin`` (:class:`mutators.base.Mutator`)."""
        next_repair = getattr(self.mutator, "next_repair", None)
        req = next_repair(isl.task) if next_repair is not None else None
        if req is None:
            return self.mutator.begin(parents, ctx, self.rng), ctx.generation
        gen = req.broken.candidate.generation + 1
        rctx = mut.MutationContext(task=req.task, island=isl.index, generation=gen, seen=frozenset(self.seen))
        return self.mutator.begin_repair(req, rctx, self.rng), gen

    def collect(self) -> None:
        """Take the finished proposal jobs, in the order they were started. A child is
        submitted at once; ordered, what else an outcome changes waits for its item's turn."""
        for fut in [f for f in self._jobs if f.done()]:
            isl, had_parents, gen, item = self._jobs.pop(fut)
            try:
                prop = fut.result()
            except _budget_errors() as e:
                self._settle(item, lambda e=e: self._mutator_stopped(e))
                continue
            if prop is None:
                self._settle(item, lambda isl=isl, g=not had_parents, gen=gen, item=item:
                             self._proposed(isl, g, gen, None, item=item))
            elif not self._proposed(isl, not had_parents, gen, prop, item=item):
                self._settle(item, lambda: None)  # a duplicate: no candidate

    def _settle(self, item: int, action: Callable[[], None]) -> None:
        """A proposal that made no candidate: its claim ends and ``action`` runs on its turn."""
        def done() -> None:
            self._claimed -= 1
            action()
        self.items.close(item, done)

    def _mutator_stopped(self, e: BaseException) -> None:
        if self._stop(f"mutator stopped: {e}", False):
            log.warning("mutator stopped: %s", e)

    def _proposed(self, isl: IslandHandle, genesis: bool, gen: int, prop, item: int | None = None) -> bool:
        """A proposal's outcome (``genesis``: it had no parents): None counts as a failed (or,
        for an exhaustive mutator, the last) attempt; a Proposal becomes a Candidate and is
        submitted (as ``item`` when it came from the pool)."""
        if genesis and item is not None:
            isl.genesis_pending = False  # set again below when the genesis child is submitted
        if prop is None:
            if mut.is_exhaustive(self.mutator):
                isl.exhausted = True  # None from an exhaustive mutator: nothing new here
            else:
                self._failed_attempts += 1
                self._fill_failures += 1
                if self.failed_attempts >= mut.failed_attempt_cap(self.mutator, self.max_evaluations):
                    self._stop(f"{self.failed_attempts} mutation attempts produced no child "
                               "(see llm_attempt events)", True)
            return False
        isl.genesis_pending = isl.genesis_pending or genesis
        cand = Candidate.create(isl.task, prop.source, prop.params, parents=prop.parents, operator=prop.operator,
                                island=isl.index, generation=gen, notes=prop.notes)
        if item is None or cand.id in self.seen:
            return self._record_child(isl, prop) and self._submit(cand, None)
        self._claimed -= 1  # the claim becomes a proposed candidate
        self.items.before(item, lambda: self._record_child(isl, prop) and None)  # ordered: on the item's turn
        return self._submit(cand, item)

    def _record_child(self, isl: IslandHandle, prop) -> bool:
        for pid in prop.parents[:1]:
            self.islands.record_child(isl, pid)
        return True

    def _repair_first(self, isl: IslandHandle):
        """A queued repair of this island's task, before any new proposal (the CuTeGen loop:
        every failed child is offered for repair as the engine records it). Returns
        ``(proposal, generation)`` or None when nothing is queued or the attempt produced no
        child. Mutators without a repair loop never queue anything."""
        next_repair = getattr(self.mutator, "next_repair", None)
        if next_repair is None:
            return None
        req = next_repair(isl.task)
        if req is None:
            return None
        gen = req.broken.candidate.generation + 1
        ctx = mut.MutationContext(task=req.task, island=isl.index, generation=gen, seen=frozenset(self.seen))
        prop = self.mutator.repair(req, ctx, self.rng)
        return None if prop is None else (prop, gen)


def _budget_errors() -> tuple[type[BaseException], ...]:
    """What a mutator raises when it can make no more children (budget spent, every model
    stopped): the run stops proposing and drains."""
    from mutators.base import MutatorStopped

    return (MutatorStopped,)
