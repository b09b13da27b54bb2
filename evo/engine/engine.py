"""The asynchronous steady-state search loop (orchestration only).

The driver process runs :class:`Engine`: it keeps up to ``in_flight`` children moving
through policy -> compile (CPU workers) -> GPU evaluation, never waits for a "generation",
and is the only writer of the lineage store. Scheduling rules:

- back-pressure: a new child is proposed only while fewer than ``in_flight`` are between
  proposal and result, so the mutator (later an LLM) is never asked for more than the
  cluster can evaluate; ``in_flight`` = 0 follows the measured compile and GPU rates
  (:func:`evo.engine.inflight.inflight_bound`), which keeps the slower pool busy;
- GPUs first: whenever a GPU actor has a free slot, the oldest compiled candidate goes to
  it, with one turn in three for a waiting tuning trial and one in six for a delayed profile
  (:mod:`evo.engine.dispatch`, which also compiles);
- proposals off the loop: a mutator with ``concurrency`` > 1 has up to that many proposals
  on a thread pool, collected as they come between short waits on the cluster, so a slow
  model never holds a GPU result uncollected (:mod:`evo.engine.proposals`); others propose on the loop;
- ordered (``search.ordered``, off by default): finished proposals and candidates are taken
  in the order they started and the engine proposes only right after taking one, so parent
  choices, repair queues and migrations do not depend on timing and a replay of an ordered
  run makes the same children (:mod:`evo.engine.ordering`); a slow item holds back those behind it;
- dedupe: a child whose content id was seen in this run is never compiled again;
- budgets count evaluations (``search.max_evaluations``) plus a wall-clock safety limit;
  when one is reached no new child is proposed and in-flight work drains and is recorded;
- Ctrl-C: stop proposing, record what finished, leave unfinished candidates in the store
  (candidates without evaluation) for ``--resume``, mark the run ``interrupted``.

What is not scheduling lives beside it and answers with decisions (or, for the proposer,
through two callbacks) that the loop carries out: :mod:`evo.engine.proposals` (proposing, on the loop
or a pool), :mod:`evo.engine.dispatch` (compiles, the GPU queues), :mod:`evo.engine.recovery` (failures of ours),
:mod:`evo.engine.survivors` (profiling, tuning, champion confirmation), :mod:`evo.engine.resume` (a run
rebuilt from the store), :mod:`evo.engine.islands` (island state, the actor calls),
:mod:`evo.engine.bookkeeping` (progress, the summary). The seams are :mod:`evo.engine.seams` and
:class:`mutators.base.Mutator`; docs/architecture.md shows how they fit.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from typing import Any, Callable

from evo.engine import recovery
from evo.engine.bookkeeping import Pending, Progress, SearchSummary, member_of
from evo.engine.dispatch import (TRIAL_EVERY, CompileDone, CompileFailed, Dispatch, GpuDone, GpuFailed, ProfileDone,
                                 ProfileFailed)
from evo.engine.engine_settings import EngineSettings
from evo.engine.inflight import RateMeter, build_seconds, inflight_bound, throughput
from evo.engine.pacing import Pacing
from evo.engine.islands import IslandSet, island_specs
from evo.engine.ordering import ItemOrder
from evo.engine.proposals import Proposer, seed_candidate
from evo.engine.recovery import (BREAKER_THRESHOLD, MAX_ISLAND_RESTORES, RecordCrash, Retry, SearchError, SearchFailed,
                          StoreFullError)
from evo.core.records import Candidate, Evaluation, StageResult
from evo.engine.resume import plan_replay
from evo.engine.seen import SeenIds
from evo.engine.seams import ClusterRuntime, StoreWriter
from evo.engine.champions import Confirmation, confirm_champion
from evo.engine.confirming import Confirmations, settled_tasks
from evo.engine.survivors import Survivors
from mutators import base as mut

__all__ = ["Engine", "EngineSettings", "SearchSummary", "SearchError", "SearchFailed", "StoreFullError",
           "Progress", "BREAKER_THRESHOLD", "MAX_ISLAND_RESTORES"]

log = logging.getLogger(__name__)

#: The stop reason when ``max_wall_minutes`` ran out.
WALL_CLOCK_STOP = "wall-clock limit reached"


class Engine:
    """Steady-state search over several tasks, one group of islands per task.

    Collaborators are injected: ``store`` (:class:`evo.engine.seams.StoreWriter`, the only writer),
    ``runtime`` (:class:`evo.engine.seams.ClusterRuntime`), ``mutator``
    (:class:`mutators.base.Mutator`), ``seeds`` (task -> (source, params)), ``policy``
    (source -> StageResult), ``task_registry`` (where ``tasks`` are looked up: shapes to
    profile; the search's :class:`evo.tasks.TaskRegistry`, None: the built-in tasks). ``rng``
    drives every random choice of the engine and mutator. ``clock``: the wall clock that
    ``max_wall_minutes`` is measured on (tests pass a fake).
    """

    def __init__(self, *, store: StoreWriter, runtime: ClusterRuntime, mutator, run_id: str, tasks: list[str],
                 seeds: dict[str, tuple[str, dict[str, str]]], settings: EngineSettings, rng: random.Random,
                 policy: Callable[[str], StageResult], descriptor: Callable[[dict[str, str]], tuple] | None = None,
                 on_progress: Callable[[Progress], None] | None = None, task_registry: Any = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.rt, self.mutator = store, runtime, mutator
        self._clock = clock
        self.run_id, self.tasks, self.seeds = run_id, list(tasks), seeds
        self.s, self.rng, self.policy = settings, rng, policy
        self.descriptor = descriptor or (lambda params: ())
        self.on_progress = on_progress
        self._policy_cache: dict[str, StageResult] = {}
        self.seen = SeenIds()  # the engine's alone; helpers get seen.view() (read-only)
        self.islands = IslandSet(runtime, store, run_id, self.descriptor)
        self.best: dict[str, tuple[float, Candidate]] = {}
        self.progress = Progress(started=time.time())
        self.rates = RateMeter()  # compile and GPU rates: the auto in-flight bound (evo.engine.inflight)
        #: which island proposes next: slow tasks' proposals run ahead (evo.engine.pacing)
        self.pacing = Pacing(enabled=not settings.ordered)
        self._rr = self._last_migration = 0
        self._first_compiled = False
        self._stop_reason = ""
        self.survivors = Survivors(store=store, run_id=run_id, profile=settings.profile, tuning=settings.tuning,
                                   tuning_storage=settings.tuning_storage, rng=rng, task_registry=task_registry,
                                   profile_survivors=mut.reads_profiles(mutator), budget_left=self._budget_left,
                                   trial_every=TRIAL_EVERY)
        self.breaker = recovery.Breaker()
        self.gpu_faults = recovery.GpuFaults()
        self.work = Dispatch(runtime, self.gpu_faults, settings.profile)
        self.items = ItemOrder(settings.ordered, on_taken=lambda: None if self._stop_reason else self._fill())
        self._filling = False
        self._abandoned = False  # the wall-clock limit passed: only the GPUs' work is awaited
        #: each task's champion confirmation, started once the task is settled (evo.engine.confirming)
        self.confirmations = Confirmations(self._confirm)
        self.proposer = Proposer(mutator=mutator, rng=rng, islands=self.islands, seeds=seeds, seen=self.seen.view(),
                                 items=self.items, max_evaluations=settings.max_evaluations,
                                 submit=self._submit, stop=self._stop)

    @property
    def n_inflight(self) -> int:
        if self.items.ordered:
            return len(self.items)
        return len(self.work) + len(self.proposer)

    def _budget_left(self) -> int:
        """Evaluations the run can still propose: the budget less what was proposed or is being proposed."""
        return self.s.max_evaluations - self.progress.proposed - self.proposer.claimed

    @property
    def max_inflight(self) -> int:
        if self.s.in_flight > 0:
            return self.s.in_flight
        # From the measured compile and GPU rates (evo.engine.inflight): enough to keep the slower
        # pool busy, at most a minute of work queued behind the budget.
        g = self.rt.n_gpus
        return inflight_bound(self.rates.rates(g), workers=self._workers, n_gpus=g,
                              gpu_slots=self.rt.gpu_slots)

    # ------------------------------------------------------------------ run

    def run(self, *, resume: bool = False) -> SearchSummary:
        self.proposer.open()
        try:
            return self._run(resume)
        except SearchFailed:
            raise
        except Exception as e:
            msg = recovery.store_full_message(e, self.run_id, len(self.work.pending()))
            if msg is None:
                raise
            log.error(msg)
            self._stop_reason = "lineage database full"
            raise StoreFullError(msg) from e
        finally:
            self.proposer.close()

    def _run(self, resume: bool) -> SearchSummary:
        self.work.start(self.rt.n_gpus)
        self.progress.n_gpus = self.rt.n_gpus
        specs = island_specs(self.tasks, per_task=self.s.islands_per_task, capacity=self.s.population_size,
                             selection_lambda=self.s.selection_lambda, archive=self.s.archive, rng=self.rng)
        self.islands.build(specs)
        if resume:
            self._replay()
        else:
            self._submit_seeds()
        deadline = self._clock() + self.s.max_wall_seconds
        interrupted = False
        try:
            while True:
                if not self._stop_reason:
                    if self.progress.evaluations >= self.s.max_evaluations:
                        self._stop_reason = "evaluation budget spent"
                    elif self._clock() > deadline:
                        self._stop_reason = WALL_CLOCK_STOP
                        self._abandon_at_deadline()
                if self._abandoned:
                    if not self.work.on_gpus():
                        break
                    self._collect(timeout=1.0)
                    continue
                if not self._stop_reason and not (self.items.ordered and len(self.items)):
                    self._fill()  # ordered: right after each item is taken (evo.engine.ordering)
                self.work.fill_gpus()
                if not self.n_inflight:
                    if not self._stop_reason and self.proposer.fill_failures:
                        # The mutator failed (e.g. the LLM endpoint is flapping), not the search
                        # space: ask again; max_failed_attempts bounds this.
                        continue
                    if not self._stop_reason:
                        self._stop_reason = "search space exhausted (no new child could be proposed)"
                    break
                self._collect(timeout=1.0)
                self._confirm_settled()
        except KeyboardInterrupt:
            interrupted = True
            self._stop_reason = "interrupted (Ctrl-C)"
            pending = [p.candidate.id for p in self.work.pending()]
            log.warning("interrupted: %d candidates in flight stay pending for --resume", len(pending))
            self.store.log_event(self.run_id, "interrupted", {"pending": pending})
        except BaseException:
            self.confirmations.close(wait=False)
            raise
        self.survivors.close()
        if not interrupted and self.s.confirm_champions:
            self._confirm_champions()
        self.confirmations.close(wait=not interrupted)
        self.store.set_run_status(self.run_id, "interrupted" if interrupted else "finished")
        self._emit_progress(force=True)
        self.store.log_event(self.run_id, "finish", {"reason": self._stop_reason, **self.progress.as_event()})
        return SearchSummary.of(self.run_id, self.progress, self.best, self._stop_reason)

    # ------------------------------------------------------------------ proposing

    def _seed(self, task: str) -> Candidate | None:
        """The task's seed candidate as submitted (same id every time), or None without one."""
        return seed_candidate(task, self.seeds)

    def _submit_seeds(self) -> None:
        for task in self.tasks:
            if task not in self.seeds:
                if not mut.writes_genesis(self.mutator):
                    raise SearchError(f"task {task!r} has no seed kernel and mutator "
                                      f"{getattr(self.mutator, 'name', '?')!r} cannot write one (use the llm mutator)")
                continue  # its islands start from genesis
            self._submit(self._seed(task))

    def _fill(self) -> None:
        if self._filling:
            return
        self._filling = True
        try:
            self._fill_slots()
        finally:
            self._filling = False

    def _fill_slots(self) -> None:
        self.proposer.new_fill()
        self._propose_mutations()
        if self.survivors.studies and not self._stop_reason:  # trials take free slots after mutations
            owed, submitted = self.survivors.owed(), 0
            for cand in self.survivors.trials(self.max_inflight, seen=self.seen.view(), room=lambda: (
                    self.n_inflight < self.max_inflight and self.progress.proposed < self.s.max_evaluations)):
                submitted += self._submit(cand)
            if self.survivors.owed() < owed - submitted:  # told or done without an evaluation: back to the mutations
                self._propose_mutations()

    def _propose_mutations(self) -> None:
        """Propose children while slots are free and the budget has room: what the open
        studies are owed (:meth:`Survivors.owed`) is kept for their trials, so a study opened
        within the budget finishes before the mutations spend it."""
        n, failed = len(self.islands), set()
        bound = self.max_inflight
        limit = bound - self.survivors.reserve(bound)
        islands, x = [(i.index, i.task) for i in self.islands], self._throughput()  # fixed for this fill
        # ordered: the pool queues what it cannot run yet (its load would make fills depend on timing)
        while self.n_inflight < limit and len(failed) < n and not self._stop_reason and \
                (self.items.ordered or self.proposer.has_room()):
            remaining = self._budget_left() - self.survivors.owed()
            if remaining <= 0:
                return  # never propose more than the budget can evaluate, less the studies' trials
            order = self.pacing.order(islands, throughput=x, inflight=bound, remaining=remaining, start=self._rr % n)
            isl = self.islands[next(i for i in order if i not in failed)]
            self._rr += 1
            if not isl.exhausted and self.proposer.propose(isl):
                failed.clear()
                self.pacing.proposed(isl.task, isl.index)
            else:
                failed.add(isl.index)

    def _throughput(self) -> float:
        """Evaluations a second the run sustains (0 until measured): :mod:`evo.engine.pacing`'s X."""
        g = self.rt.n_gpus
        rates = self.rates.rates(g)
        return throughput(rates, workers=self._workers, n_gpus=g) if rates else 0.0

    @property
    def _workers(self) -> int:
        """Compile workers the rates are read against: every CPU but the engine's own."""
        return max(1, self.rt.n_cpus - 1)

    def _stop(self, reason: str, replace: bool = False) -> bool:
        """Set the run's stop reason unless one is set (``replace``: even then)."""
        if self._stop_reason and not replace:
            return False
        self._stop_reason = reason
        return True

    def _submit(self, cand: Candidate, item: int | None = None) -> bool:
        if not self.seen.add(cand.id):
            return False
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
            self.work.compile(pending)
        else:
            self._record(pending, Evaluation(pending.candidate.id, pending.pre_stages), gpu=None)

    # ------------------------------------------------------------------ collecting

    def _collect(self, timeout: float) -> None:
        probes = self.gpu_faults.probes()
        refs = self.work.waiting() + list(probes)
        if len(self.proposer):  # answers are collected as they come, between short waits on the cluster
            if refs:
                timeout = min(timeout, 0.05)
            else:
                self.proposer.wait(timeout)
        ready = self.rt.wait(refs, timeout)
        for ref in ready:
            if ref in probes:
                lost = self.gpu_faults.probe_answered(self.rt, probes[ref], ref, n_gpus=self.work.n_gpus)
                if lost is not None:
                    self.work.lost(lost.gpu)
                    self.store.log_event(self.run_id, "gpu_lost", {"gpu": lost.gpu, "error": lost.error})
                    if lost.stop:
                        raise SearchError(lost.stop) from lost.cause
                continue
            match self.work.take(ref):  # a tagged record (evo.engine.dispatch.Completion)
                case ProfileDone(job=job, stage=stage):
                    self.survivors.profiled(job, stage)
                    self._profiling_health()
                case ProfileFailed(job=job, error=e):  # ncu missing or broken: our failure, but not the search's
                    self.survivors.profile_failed(job, e)
                    self._profiling_health()
                case CompileDone(pending=pending, outcome=outcome):
                    self.breaker.ok("compile")
                    self._compiled(pending, outcome)
                case CompileFailed(pending=pending, error=e):
                    self._failed("compile", pending, e, recovery.compile_worker_died(pending, e))
                case GpuDone() as done:
                    self._gpu_done(done)
                case GpuFailed(gpu=g, pending=pending, error=e):
                    self._failed("GPU evaluation", pending, e,
                                 self.gpu_faults.worker_died(self.rt, g, pending, e, self.work.on_gpus()))
        self.proposer.collect()
        self._update_counters()

    def _abandon_at_deadline(self) -> None:
        """The wall-clock limit bounds the run, not only its proposals: what has not reached a
        GPU (compiling, queued, trials, queued profiles) stays pending for ``--resume``, and the
        run ends once the evaluations already on the GPUs are in; without this a run overshot
        its limit by the whole queue (GEMM compiles of 30-40 s, profiles, trials). Ordered runs
        (replays) drain as before: what they evaluate must not depend on when the clock ran out."""
        if self.items.ordered:
            return
        self._abandoned = True
        left = [p.candidate.id for p in self.work.abandon_unstarted()]
        if left:
            log.info("wall-clock limit: %d candidates not on a GPU yet stay pending for --resume", len(left))
        self.store.log_event(self.run_id, "deadline", {"pending": left, "on_gpus": len(self.work.on_gpus())})

    def _profiling_health(self) -> None:
        """Profiling switched off (the profiler is blind here): the queued profiles go too."""
        if self.survivors.profiling_off is not None:
            self.work.drop_profiles()

    def _gpu_done(self, done: GpuDone) -> None:
        pending, res, g = done.pending, done.result, done.gpu
        if not self.progress.evaluations:   # the run's start-up, read from its events
            self.store.log_event(self.run_id, "first_gpu_result", {
                "gpu": g, "actor_init": list(res.actor_init or ()),
                "started": res.started, "finished": res.finished})
        self.breaker.ok("GPU evaluation")
        self.gpu_faults.finished(pending)
        self.progress.gpu_ran(res.started, res.finished, res.gpu_stage_s, res.activity, g)
        self.rates.gpu_done(res.started, res.finished, res.gpu_stage_s)
        self.pacing.judged(pending.candidate.task, res.finished - res.started)
        ev = res.evaluation
        self._record(pending, Evaluation(pending.candidate.id, pending.pre_stages + ev.stages,
                                         fitness=ev.fitness, gpu=ev.gpu, env=ev.env), gpu=g)

    def _compiled(self, pending: Pending, outcome) -> None:
        stage = outcome.result
        if not self._first_compiled:
            self._first_compiled = True
            self.store.log_event(self.run_id, "first_compiled", {"task": pending.candidate.task,
                                                                 "seconds": stage.seconds})
        pending.pre_stages = pending.pre_stages + (stage,)
        built = build_seconds(stage.seconds, stage.metrics, outcome.cached)   # a cache hit: its build's cost
        if built is not None:
            self.rates.compiled(built)
            self.pacing.compiled(pending.candidate.task, built)
        if stage.passed and outcome.so_bytes:
            pending.so_bytes = outcome.so_bytes
            self.work.compiled(pending, trial=self.survivors.is_trial(pending.candidate.id))
        else:
            self._record(pending, Evaluation(pending.candidate.id, pending.pre_stages), gpu=None)

    # ------------------------------------------------------------------ failures of ours

    def _failed(self, where: str, pending: Pending, err: BaseException, decision) -> None:
        """A stage raised or its worker died: stop the run if the breaker says so, else carry
        out recovery's ``decision`` for ``pending`` (:mod:`evo.engine.recovery`)."""
        stop = self.breaker.failed(where, pending.candidate, err, decision)
        if stop is not None:
            self._fail(stop.message, detail=stop.detail, current=pending)
        if isinstance(decision, RecordCrash):
            self._record(pending, Evaluation(pending.candidate.id, pending.pre_stages + (decision.stage,)), gpu=None)
        elif isinstance(decision, Retry):
            self.work.compile(pending)
        else:  # Requeue
            if not decision.charged:
                pending.gpu_attempts -= 1
            self.work.requeue(pending)

    def _fail(self, message: str, detail: str = "", current: Pending | None = None) -> None:
        """Stop the run on a failure of ours (:func:`evo.engine.recovery.fail_run`); ``current``: the
        candidate whose stage failed (no longer in flight, still pending)."""
        pending = [p.candidate.id for p in ([current] if current else []) + self.work.pending()]
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
            self.work.add_profiles(self.survivors.triggered(member, pending.so_bytes, islands))
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
        """Rebuild islands and in-flight work from the store (:mod:`evo.engine.resume`)."""
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
        self.progress.compile_queue = self.work.compiling()
        self.progress.gpu_queue = self.work.queued()
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

    def _confirm(self, task: str, cand: Candidate, fitness: float, profiles: tuple = ()) -> Confirmation:
        """One champion's confirmation (runtime calls only, no store: it may run on the
        confirmations' worker thread; ``profiles`` were read from the store by the caller)."""
        return confirm_champion(self.rt, task, cand, fitness, baseline=self._seed(task), profiles=profiles)

    def _confirm_settled(self) -> None:
        """Start the confirmation of each settled task's champion (evo.engine.confirming): the
        run proposes nothing more and none of the task's candidates is in flight. A champion
        that still lacks profiles, and an ordered run (its finished items wait in order before
        they are recorded), wait for the end."""
        if not self.s.confirm_champions or self.items.ordered:
            return
        if not (self._stop_reason or (self._budget_left() <= 0 and not len(self.proposer))):
            return   # the run may still propose: no task is settled (and the loop stays cheap)
        for task in settled_tasks(self.best, self.work.tasks(), proposing_done=True):
            fitness, cand = self.best[task]
            if self.confirmations.started(task) or self.survivors.champion_profiles(cand):
                continue
            profiles = tuple(self.store.profiles(cand.id))
            self.confirmations.start(task, cand, fitness, profiles)
            self.store.log_event(self.run_id, "confirm_start", {"task": task, "candidate": cand.id,
                                                                  "evaluations": self.progress.evaluations})

    def _confirm_champions(self) -> None:
        """Profile each task's best where it lacks a profile, re-time it in a fresh process
        (ncu's time corroborating the re-timing) and store the confirmation; a confirmation
        started while the run drained (:meth:`_confirm_settled`) is awaited instead."""
        for task, (fitness, cand) in sorted(self.best.items()):
            if not self.confirmations.started(task):
                self._profile_champion(cand)
            c = self.confirmations.take(task, cand, fitness, tuple(self.store.profiles(cand.id)))
            if c.stop:
                self._fail(c.stop, detail=c.detail)
            self.store.set_champion(self.run_id, task, *c.champion(cand, fitness), c.record)


    def _profile_champion(self, cand: Candidate) -> None:
        """The champion's missing profiles (:meth:`Survivors.champion_profiles`), one at a
        time on GPU 0 as the run ends; a failing profiler is logged, as during the run."""
        jobs = self.survivors.champion_profiles(cand)
        if not jobs:
            return
        errors = self.rt.remote_errors()
        try:
            built = self.rt.get(self.rt.submit_compile(cand))
        except errors as e:
            log.warning("champion %s not profiled: its build failed (%s)", cand.short_id, e)
            return
        if not built.result.passed:
            return
        for job in jobs:
            job = dataclasses.replace(job, so_bytes=built.so_bytes)
            try:
                stage = self.rt.get(self.rt.submit_profile(0, cand, built.so_bytes, job.shape_idx, self.s.profile))
            except errors as e:
                self.survivors.profile_failed(job, e)
                continue
            self.survivors.profiled(job, stage)
