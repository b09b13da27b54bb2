"""The asynchronous steady-state search loop (orchestration only).

The driver process runs :class:`Engine`: it keeps up to ``in_flight`` children moving
through policy -> compile (CPU workers) -> GPU evaluation, never waits for a "generation",
and is the only writer of the lineage store. Scheduling rules:

- back-pressure: a new child is proposed only while fewer than ``in_flight`` are between
  proposal and result, so the mutator (later an LLM) is never asked for more than the
  cluster can evaluate; ``in_flight`` = 0 follows the measured compile and GPU rates
  (:func:`evo.inflight.inflight_bound`), which keeps the slower pool busy;
- GPUs first: whenever a GPU actor holds fewer than ``rt.gpu_slots`` requests (its
  correctness slots plus one queued so no gap opens between candidates), the oldest
  compiled candidate goes to it;
- proposals off the loop: a mutator with ``concurrency`` > 1 (the LLM mutator: its models'
  concurrency) has up to that many proposals in flight on a thread pool; the loop prepares
  each one (``begin``: parents, model, prompt, in the loop's order) and collects answers as
  they come while it keeps collecting compile and GPU results, so a slow model never holds
  a GPU result uncollected. Other mutators propose on the loop;
- ordered (``search.ordered``, off by default): every proposal and candidate is an item
  numbered when it starts; finished items are taken in that order (one that finishes early
  waits for the older ones) and the engine proposes only right after taking one. Parent
  choices, repair queues and migrations then depend on the order of the items, not on which
  compile, GPU result or model answer came first, so a replay (answers keyed by attempt,
  :class:`mutators.cassette.ReplayClient`) of an ordered run makes the same children
  whatever the number of islands and proposals in flight. It costs throughput: a slow item
  holds back the feedback of those behind it (the GPUs still run them);
- dedupe: a child whose content id was seen in this run is never compiled again;
- budgets count evaluations (``search.max_evaluations``) plus a wall-clock safety limit;
  when one is reached no new child is proposed and in-flight work drains and is recorded;
- Ctrl-C: stop proposing, record what finished, leave unfinished candidates in the store
  (candidates without evaluation) for ``--resume``, mark the run ``interrupted``.

What is not scheduling lives beside it and answers with decisions the loop carries out:
:mod:`evo.recovery` (failures of ours: worker deaths, GPU probes, island restores, the
circuit breaker), :mod:`evo.survivors` (delayed profiling, tuning studies, champion
confirmation), :mod:`evo.resume` (rebuilding islands and in-flight work from the store:
nothing evaluated is evaluated again), :mod:`evo.islands` (each island's state and the calls
to its actor), :mod:`evo.bookkeeping` (progress, the summary, a candidate in flight). The
collaborators are the seams of :mod:`evo.seams` (runtime, store writer, stage callables) and
:class:`mutators.base.Mutator`; docs/architecture.md shows how they fit.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from concurrent import futures
from typing import Any, Callable

from evo import recovery
from evo.bookkeeping import Pending, Progress, SearchSummary, member_of
from evo.engine_settings import EngineSettings
from evo.inflight import RateMeter, inflight_bound
from evo.islands import IslandHandle, IslandSet, island_specs
from evo.ordering import ItemOrder
from evo.recovery import (BREAKER_THRESHOLD, MAX_ISLAND_RESTORES, RecordCrash, Retry, SearchError, SearchFailed,
                          StoreFullError)
from evo.records import Candidate, Evaluation, Member, Operator, StageResult
from evo.resume import plan_replay
from evo.seams import ClusterRuntime, StoreWriter
from evo.survivors import ProfileJob, Survivors, confirm_champion
from mutators import base as mut

__all__ = ["Engine", "EngineSettings", "SearchSummary", "SearchError", "SearchFailed", "StoreFullError",
           "Progress", "BREAKER_THRESHOLD", "MAX_ISLAND_RESTORES"]

log = logging.getLogger(__name__)


class Engine:
    """Steady-state search over several tasks, one group of islands per task.

    Collaborators are injected: ``store`` (:class:`evo.seams.StoreWriter`, the only writer),
    ``runtime`` (:class:`evo.seams.ClusterRuntime`), ``mutator``
    (:class:`mutators.base.Mutator`), ``seeds`` (task -> (source, params)), ``policy``
    (source -> StageResult). ``rng`` drives every random choice of the engine and mutator.
    """

    def __init__(self, *, store: StoreWriter, runtime: ClusterRuntime, mutator, run_id: str, tasks: list[str],
                 seeds: dict[str, tuple[str, dict[str, str]]], settings: EngineSettings, rng: random.Random,
                 policy: Callable[[str], StageResult], descriptor: Callable[[dict[str, str]], tuple] | None = None,
                 on_progress: Callable[[Progress], None] | None = None) -> None:
        self.store, self.rt, self.mutator = store, runtime, mutator
        self.run_id, self.tasks, self.seeds = run_id, list(tasks), seeds
        self.s, self.rng, self.policy = settings, rng, policy
        self.descriptor = descriptor or (lambda params: ())
        self.on_progress = on_progress
        self._policy_cache: dict[str, StageResult] = {}
        self.seen: set[str] = set()
        self.islands = IslandSet(runtime, store, run_id, self.descriptor)
        self.compile_refs: dict[Any, Pending] = {}
        self.gpu_refs: dict[Any, tuple[int, Pending]] = {}
        self.gpu_queue: deque[Pending] = deque()
        self.gpu_load: list[int] = []
        self.best: dict[str, tuple[float, Candidate]] = {}
        self.progress = Progress(started=time.time())
        self.rates = RateMeter()  # compile and GPU rates: the auto in-flight bound (evo.inflight)
        self._rr = self._last_migration = self._failed_attempts = self._fill_failures = 0
        self._stop_reason = ""
        self.survivors = Survivors(store=store, run_id=run_id, profile=settings.profile, tuning=settings.tuning,
                                   tuning_storage=settings.tuning_storage, rng=rng)
        self._profile_queue: deque[ProfileJob] = deque()
        self._profile_refs: dict[Any, tuple[int, ProfileJob]] = {}
        self._tune_queue: deque[Pending] = deque()
        self.breaker = recovery.Breaker()
        self.gpu_faults = recovery.GpuFaults()
        self._n_proposers = mut.concurrency(mutator)
        self._pool: futures.ThreadPoolExecutor | None = None
        self._proposals: dict[futures.Future, tuple[IslandHandle, bool, int, int]] = {}
        self._claimed = 0  # proposals begun that are neither a submitted candidate nor settled yet
        self.items = ItemOrder(settings.ordered, on_taken=lambda: None if self._stop_reason else self._fill())
        self._filling = False

    @property
    def island_meta(self) -> list[IslandHandle]:
        """The island handles (``islands[i]`` reads the same; the former name)."""
        return self.islands.handles

    @property
    def n_inflight(self) -> int:
        if self.items.ordered:
            return len(self.items)
        return (len(self.compile_refs) + len(self.gpu_refs) + len(self.gpu_queue) + len(self._tune_queue)
                + len(self._proposals))

    @property
    def max_inflight(self) -> int:
        if self.s.in_flight > 0:
            return self.s.in_flight
        # From the measured compile and GPU rates (evo.inflight): enough to keep the slower
        # pool busy, at most a minute of work queued behind the budget.
        g = self.rt.n_gpus
        return inflight_bound(self.rates.rates(g), workers=max(1, self.rt.n_cpus - 1), n_gpus=g,
                              gpu_slots=self.rt.gpu_slots)

    # ------------------------------------------------------------------ run

    def run(self, *, resume: bool = False) -> SearchSummary:
        if self._n_proposers > 1:
            self._pool = futures.ThreadPoolExecutor(self._n_proposers, thread_name_prefix="evo-propose")
        try:
            return self._run(resume)
        except SearchFailed:
            raise
        except Exception as e:
            msg = recovery.store_full_message(e, self.run_id, len(self._all_pending()))
            if msg is None:
                raise
            log.error(msg)
            self._stop_reason = "lineage database full"
            raise StoreFullError(msg) from e
        finally:
            if self._pool is not None:  # calls still on the wire end on their own; their answers are dropped
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None

    def _run(self, resume: bool) -> SearchSummary:
        self.gpu_load = [0] * self.rt.n_gpus
        self.progress.n_gpus = self.rt.n_gpus
        specs = island_specs(self.tasks, per_task=self.s.islands_per_task, capacity=self.s.population_size,
                             selection_lambda=self.s.selection_lambda, archive=self.s.archive, rng=self.rng)
        self.islands.build(specs)
        if resume:
            self._replay()
        else:
            self._submit_seeds()
        deadline = time.time() + self.s.max_wall_seconds
        interrupted = False
        try:
            while True:
                if not self._stop_reason:
                    if self.progress.evaluations >= self.s.max_evaluations:
                        self._stop_reason = "evaluation budget spent"
                    elif time.time() > deadline:
                        self._stop_reason = "wall-clock limit reached"
                if not self._stop_reason and not (self.items.ordered and len(self.items)):
                    self._fill()  # ordered: right after each item is taken (evo.ordering)
                self._dispatch_gpus()
                if not self.n_inflight:
                    if not self._stop_reason and self._fill_failures:
                        # The mutator failed (e.g. the LLM endpoint is flapping), not the search
                        # space: ask again; max_failed_attempts bounds this.
                        continue
                    if not self._stop_reason:
                        self._stop_reason = "search space exhausted (no new child could be proposed)"
                    break
                self._collect(timeout=1.0)
        except KeyboardInterrupt:
            interrupted = True
            self._stop_reason = "interrupted (Ctrl-C)"
            pending = [p.candidate.id for p in self._all_pending()]
            log.warning("interrupted: %d candidates in flight stay pending for --resume", len(pending))
            self.store.log_event(self.run_id, "interrupted", {"pending": pending})
        if not interrupted and self.s.confirm_champions:
            self._confirm_champions()
        self.store.set_run_status(self.run_id, "interrupted" if interrupted else "finished")
        self._emit_progress(force=True)
        self.store.log_event(self.run_id, "finish", {"reason": self._stop_reason, **self.progress.as_event()})
        return SearchSummary.of(self.run_id, self.progress, self.best, self._stop_reason)

    def _all_pending(self) -> list[Pending]:
        return list(self.compile_refs.values()) + [p for _, p in self.gpu_refs.values()] + list(self.gpu_queue)

    # ------------------------------------------------------------------ proposing

    def _submit_seeds(self) -> None:
        for task in self.tasks:
            if task not in self.seeds:
                if not mut.writes_genesis(self.mutator):
                    raise SearchError(f"task {task!r} has no seed kernel and mutator "
                                      f"{getattr(self.mutator, 'name', '?')!r} cannot write one (use the llm mutator)")
                continue  # its islands start from genesis
            source, params = self.seeds[task]
            self._submit(Candidate.create(task, source, params, operator=Operator.SEED, island=-1, notes="seed kernel"))

    def _fill(self) -> None:
        if self._filling:
            return
        self._filling = True
        try:
            self._fill_slots()
        finally:
            self._filling = False

    def _fill_slots(self) -> None:
        self._fill_failures = 0
        tries, n = 0, len(self.islands)
        limit = self.max_inflight - self.survivors.reserve(self.max_inflight)
        # ordered: the pool queues what it cannot run yet (its load would make fills depend on timing)
        while self.n_inflight < limit and tries < n and not self._stop_reason and \
                (self.items.ordered or len(self._proposals) < self._n_proposers):
            if self.progress.proposed + self._claimed >= self.s.max_evaluations:
                return  # never propose more than the budget can evaluate
            isl = self.islands[self._rr % n]
            self._rr += 1
            tries = 0 if not isl.exhausted and self._propose(isl) else tries + 1
        if self.survivors.studies and not self._stop_reason:  # trials take free slots after mutations
            for cand in self.survivors.trials(self.max_inflight, seen=self.seen, room=lambda: (
                    self.n_inflight < self.max_inflight and self.progress.proposed < self.s.max_evaluations)):
                self._submit(cand)

    def _propose(self, isl: IslandHandle) -> bool:
        """Start one proposal for ``isl``: on the loop, or as a job on the pool (its result
        then arrives through :meth:`_collect_proposals`). True when a slot was filled."""
        parents = self.islands.parents(isl, mut.wants_parents(self.mutator))
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
        self._proposals[self._pool.submit(job)] = (isl, bool(parents), gen, self.items.start())
        return True

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

    def _collect_proposals(self) -> None:
        """Take the finished proposal jobs, in the order they were started. A child is
        submitted at once; ordered, what else an outcome changes waits for its item's turn."""
        for fut in [f for f in self._proposals if f.done()]:
            isl, had_parents, gen, item = self._proposals.pop(fut)
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
        if not self._stop_reason:
            log.warning("mutator stopped: %s", e)
            self._stop_reason = f"mutator stopped: {e}"

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
                if self._failed_attempts >= mut.failed_attempt_cap(self.mutator, self.s.max_evaluations):
                    self._stop_reason = (f"{self._failed_attempts} mutation attempts produced no child "
                                         "(see llm_attempt events)")
            return False
        isl.genesis_pending = isl.genesis_pending or genesis
        cand = Candidate.create(isl.task, prop.source, prop.params, parents=prop.parents, operator=prop.operator,
                                island=isl.index, generation=gen, notes=prop.notes)
        if item is None or cand.id in self.seen:
            return self._record_child(isl, prop) and self._submit(cand)
        self._claimed -= 1  # the claim becomes a proposed candidate
        self.items.before(item, lambda: self._record_child(isl, prop) and None)  # ordered: on the item's turn
        return self._submit(cand, item=item)

    def _record_child(self, isl: IslandHandle, prop) -> bool:
        for pid in prop.parents[:1]:
            self.rt.cast(isl.actor, "record_child", pid)
        return True

    def _repair_first(self, isl: IslandHandle):
        """A queued repair of this island's task, before any new proposal (the CuTeGen loop:
        every failed child is offered for repair as it is recorded, see :meth:`_record`).
        Returns ``(proposal, generation)`` or None when nothing is queued or the attempt
        produced no child. Mutators without a repair loop never queue anything."""
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

    def _submit(self, cand: Candidate, item: int | None = None) -> bool:
        if cand.id in self.seen:
            return False
        self.seen.add(cand.id)
        if item is None:
            self.items.start(cand.id)
        else:
            self.items.bind(cand.id, item)
        self.store.add_candidate(self.run_id, cand)
        self.progress.proposed += 1
        pol = self._policy_cache.get(cand.source)  # knobs children share their parent's source
        if pol is None:
            pol = self._policy_cache[cand.source] = self.policy(cand.source)
        self._start(Pending(candidate=cand, pre_stages=(pol,)))
        return True

    def _start(self, pending: Pending) -> None:
        """Compile a candidate that passed policy (its only stage so far); record one that did not."""
        if pending.pre_stages[-1].passed:
            self._compile(pending)
        else:
            self._record(pending, Evaluation(pending.candidate.id, pending.pre_stages), gpu=None)

    def _compile(self, pending: Pending) -> None:
        pending.compile_attempts += 1
        self.compile_refs[self.rt.submit_compile(pending.candidate)] = pending

    # ------------------------------------------------------------------ GPU dispatch and collecting

    def _dispatch_gpus(self) -> None:
        """Mutations first, then delayed profiles, then tuning trials (lowest priority)."""
        while self.gpu_queue or self._profile_queue or self._tune_queue:
            slots = self.rt.gpu_slots
            free = [g for g, load in enumerate(self.gpu_load) if load < slots and not self.gpu_faults.is_down(g)]
            if not free:
                return
            g = min(free, key=lambda i: self.gpu_load[i])
            if self.gpu_queue or (self._tune_queue and not self._profile_queue):
                pending = (self.gpu_queue or self._tune_queue).popleft()
                pending.gpu_attempts += 1
                pending.gpu_seq = self.gpu_faults.next_seq()
                self.gpu_refs[self.rt.submit_gpu(g, pending.candidate, pending.so_bytes)] = (g, pending)
            else:
                job = self._profile_queue.popleft()
                ref = self.rt.submit_profile(g, job.candidate, job.so_bytes, job.shape_idx, self.s.profile)
                self._profile_refs[ref] = (g, job)
            self.gpu_load[g] += 1

    def _collect(self, timeout: float) -> None:
        probes = self.gpu_faults.probes()
        refs = list(self.compile_refs) + list(self.gpu_refs) + list(self._profile_refs) + list(probes)
        if self._proposals:  # answers are collected as they come, between short waits on the cluster
            if refs:
                timeout = min(timeout, 0.05)
            else:
                futures.wait(list(self._proposals), timeout=timeout, return_when=futures.FIRST_COMPLETED)
        ready = self.rt.wait(refs, timeout)
        errors = self.rt.remote_errors()
        for ref in ready:
            if ref in probes:
                lost = self.gpu_faults.probe_answered(self.rt, probes[ref], ref, n_gpus=len(self.gpu_load))
                if lost is not None:
                    self.gpu_load[lost.gpu] = 2**30  # never dispatched to again
                    self.store.log_event(self.run_id, "gpu_lost", {"gpu": lost.gpu, "error": lost.error})
                    if lost.stop:
                        raise SearchError(lost.stop) from lost.cause
            elif ref in self._profile_refs:
                g, job = self._profile_refs.pop(ref)
                self.gpu_load[g] -= 1
                try:
                    self.survivors.profiled(job, self.rt.get(ref))
                except errors as e:  # ncu missing or broken: our failure, but not the search's
                    self.survivors.profile_failed(job, e)
            elif ref in self.compile_refs:
                pending = self.compile_refs.pop(ref)
                try:
                    outcome = self.rt.get(ref)
                except errors as e:
                    self._failed("compile", pending, e, recovery.compile_worker_died(pending, e))
                    continue
                self.breaker.ok("compile")
                self._compiled(pending, outcome)
            else:
                g, pending = self.gpu_refs.pop(ref)
                self.gpu_load[g] -= 1
                try:
                    res = self.rt.get(ref)
                except errors as e:
                    self._failed("GPU evaluation", pending, e,
                                 self.gpu_faults.worker_died(self.rt, g, pending, e, self.gpu_refs))
                    continue
                self.breaker.ok("GPU evaluation")
                self.gpu_faults.finished(pending)
                self.progress.gpu_ran(res.started, res.finished, res.gpu_stage_s, res.activity, g)
                self.rates.gpu_done(res.started, res.finished)
                ev = res.evaluation
                self._record(pending, Evaluation(pending.candidate.id, pending.pre_stages + ev.stages,
                                                 fitness=ev.fitness, gpu=ev.gpu, env=ev.env), gpu=g)
        self._collect_proposals()
        self._update_counters()

    def _compiled(self, pending: Pending, outcome) -> None:
        stage = outcome.result
        pending.pre_stages = pending.pre_stages + (stage,)
        self.rates.compiled(stage.seconds)
        if stage.passed and outcome.so_bytes:
            pending.so_bytes = outcome.so_bytes
            (self._tune_queue if self.survivors.is_trial(pending.candidate.id) else self.gpu_queue).append(pending)
        else:
            self._record(pending, Evaluation(pending.candidate.id, pending.pre_stages), gpu=None)

    # ------------------------------------------------------------------ failures of ours

    def _failed(self, where: str, pending: Pending, err: BaseException, decision) -> None:
        """A stage raised or its worker died: stop the run if the breaker says so, else carry
        out recovery's ``decision`` for ``pending`` (:mod:`evo.recovery`)."""
        stop = self.breaker.failed(where, pending.candidate, err, decision)
        if stop is not None:
            self._fail(stop.message, detail=stop.detail, current=pending)
        if isinstance(decision, RecordCrash):
            self._record(pending, Evaluation(pending.candidate.id, pending.pre_stages + (decision.stage,)), gpu=None)
        elif isinstance(decision, Retry):
            self._compile(pending)
        else:  # Requeue
            if not decision.charged:
                pending.gpu_attempts -= 1
            self.gpu_queue.appendleft(pending)

    def _fail(self, message: str, detail: str = "", current: Pending | None = None) -> None:
        """Stop the run on a failure of ours (:func:`evo.recovery.fail_run`); ``current``: the
        candidate whose stage failed (no longer in flight, still pending)."""
        pending = [p.candidate.id for p in ([current] if current else []) + self._all_pending()]
        self._stop_reason = f"failed: {message}"[:500]
        raise recovery.fail_run(self.store, self.run_id, message, detail, pending)

    # ------------------------------------------------------------------ recording

    def _record(self, pending: Pending, ev: Evaluation, gpu: int | None) -> None:
        self.items.close(self.items.of(pending.candidate.id), lambda: self._record_now(pending, ev, gpu))

    def _record_now(self, pending: Pending, ev: Evaluation, gpu: int | None) -> None:
        cand = pending.candidate
        self.store.add_evaluation(self.run_id, ev)
        self.progress.evaluations += 1
        failed = ev.failed_stage
        if failed is not None:
            self.progress.failures[f"{failed.stage}:{failed.status.value}"] += 1
        member = member_of(cand, ev, self.descriptor)
        if member.fitness is not None:
            self.progress.correct += 1
        self.islands.add(member)
        mut.observe(self.mutator, cand.id, member.fitness)
        offer = getattr(self.mutator, "offer_repair", None)
        if offer is not None and member.fitness is None and not self._stop_reason:
            offer(member, island=cand.island if cand.island >= 0 else None)  # queued, served first
        self.survivors.told(cand.id, ev)
        if member.fitness is not None and pending.so_bytes:
            islands = self.islands.targets(cand) if cand.island < 0 else [cand.island]
            self._profile_queue.extend(self.survivors.triggered(member, pending.so_bytes, islands))
        if 0 <= cand.island < len(self.islands):
            self.islands[cand.island].genesis_pending = False
        if member.fitness is not None and self._better(cand, member.fitness):
            self.store.log_event(self.run_id, "new_best", {"task": cand.task, "id": cand.id, "fitness": member.fitness})
        self._maybe_migrate()
        self._emit_progress()

    def _better(self, cand: Candidate, fitness: float) -> bool:
        """Make ``cand`` its task's best if it beats the current one."""
        cur = self.best.get(cand.task)
        if cur is None or fitness > cur[0]:
            self.best[cand.task] = (fitness, cand)
            return True
        return False

    def _maybe_migrate(self) -> None:
        every, n = self.s.migration_every, self.progress.evaluations
        if self.s.migration_count <= 0 or n // every <= self._last_migration // every:
            return
        self._last_migration = n
        for task, moved in self.islands.migrate(self.s.migration_count):
            self.store.log_event(self.run_id, "island_migration", {"task": task, "moved": moved, "at": n})

    def _replay(self) -> None:
        """Rebuild islands and in-flight work from the store (:mod:`evo.resume`)."""
        plan = plan_replay(self.store, self.run_id)
        self.seen.update(plan.ids)
        for cand, ev in plan.evaluated:
            self.islands.add(member_of(cand, ev, self.descriptor))
        self.best = plan.best()
        done = len(plan.evaluated)
        self.progress.evaluations, self.progress.correct, self.progress.proposed = done, plan.correct, plan.proposed
        self._last_migration = done
        for cand in plan.pending:
            self.items.start(cand.id)
            self._start(Pending(candidate=cand, pre_stages=(self.policy(cand.source),)))
        self.store.log_event(self.run_id, "resume", {"evaluated": done, "resubmitted": len(plan.pending)})
        log.info("resumed run %s: %d evaluated, %d resubmitted", self.run_id, done, len(plan.pending))

    # ------------------------------------------------------------------ progress / end

    def _update_counters(self) -> None:
        self.progress.compile_queue = len(self.compile_refs)
        self.progress.gpu_queue = len(self.gpu_queue)
        self.progress.in_flight = self.n_inflight

    def _emit_progress(self, force: bool = False) -> None:
        n = self.progress.evaluations
        if force or (n and not n % self.s.progress_every):
            self._update_counters()
            self.progress.islands = self.islands.summaries()
            self.store.log_event(self.run_id, "progress", self.progress.as_event())
        elif self.on_progress:
            self._update_counters()
        if self.on_progress:
            self.on_progress(self.progress)

    def _confirm_champions(self) -> None:
        """Re-time each task's best in a fresh process; store the confirmation."""
        for task, (fitness, cand) in sorted(self.best.items()):
            c = confirm_champion(self.rt, task, cand, fitness)
            if c.stop:
                self._fail(c.stop, detail=c.detail)
            self.store.set_champion(self.run_id, task, *c.champion(cand, fitness), c.record)


def _budget_errors() -> tuple[type[BaseException], ...]:
    """What a mutator raises when it can make no more children (budget spent, every model
    stopped): the run stops proposing and drains."""
    from mutators.base import MutatorStopped

    return (MutatorStopped,)
