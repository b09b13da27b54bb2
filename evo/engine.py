"""The asynchronous steady-state search loop (orchestration only).

The driver process runs :class:`Engine`: it keeps up to ``in_flight`` children moving
through policy -> compile (CPU workers) -> GPU evaluation, never waits for a "generation",
and is the only writer of the lineage store. Scheduling rules:

- back-pressure: a new child is proposed only while fewer than ``in_flight`` are between
  proposal and result, so the mutator (later an LLM) is never asked for more than the
  cluster can evaluate; ``in_flight`` defaults to 2 per GPU + the compile workers, which
  keeps every GPU fed while compiles run ahead;
- GPUs first: whenever a GPU actor holds fewer than two requests (one running, one queued
  in the actor so no gap opens between candidates), the oldest compiled candidate goes
  to it;
- dedupe: a child whose content id was seen in this run is never compiled again;
- budgets count evaluations (``search.max_evaluations``) plus a wall-clock safety limit;
  when one is reached no new child is proposed and in-flight work drains and is recorded;
- Ctrl-C: stop proposing, record what finished, leave unfinished candidates in the store
  (candidates without evaluation) for ``--resume``, mark the run ``interrupted``.

Resume rebuilds islands by replaying the run's evaluated candidates in insertion order and
re-submits the candidates that were proposed but never evaluated: nothing evaluated is
evaluated again.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable

from evo.records import Candidate, Evaluation, Member, Operator, StageResult, Status
from evo.store import StoreError

__all__ = ["Engine", "EngineSettings", "SearchSummary", "SearchError", "SearchFailed", "StoreFullError",
           "Progress", "BREAKER_THRESHOLD"]

log = logging.getLogger(__name__)


class SearchError(RuntimeError):
    """The search cannot start or continue (unknown run to resume, no GPUs, ...)."""


class SearchFailed(SearchError):
    """The run stopped on a failure of ours (not a candidate's): a harness bug, a task the
    GPU process cannot load, a missing toolchain, repeated evaluator failures of one kind.

    The run is marked ``failed`` in the store with this message; nothing evaluated is lost
    and candidates in flight stay pending, so ``evo search CONFIG --resume RUN`` continues
    once the cause is fixed. ``str(err)`` is one line: the cause and the fix.
    """


#: Consecutive evaluator failures of one kind (an exception from a stage or a dead worker,
#: not a candidate's verdict) after which the run stops (InfrastructureError stops at once).
BREAKER_THRESHOLD = 3


def _infra_cause(err: BaseException | None):
    """The :class:`~evaluators.base.InfrastructureError` behind ``err`` (a Ray error wraps
    the stage's exception as ``cause``), or None."""
    from evaluators.base import InfrastructureError

    seen = 0
    while err is not None and seen < 8:
        cause = getattr(err, "cause", None)
        if isinstance(cause, InfrastructureError):
            return cause
        if isinstance(err, InfrastructureError):
            return err
        err = cause if isinstance(cause, BaseException) else (err.__cause__ or err.__context__)
        seen += 1
    return None


def _is_stage_exception(err: BaseException) -> bool:
    """Whether a remote error is an exception the stage function raised (our code failed),
    as opposed to its worker process dying (which the recovery paths handle)."""
    return type(err).__name__.startswith("RayTaskError") or getattr(err, "cause", None) is not None


class StoreFullError(StoreError, SearchError):
    """The lineage database could not grow (disk full, quota, or SQLite's max_page_count).

    The engine stops at the first failed write: every committed row is intact (each write is
    one transaction), candidates in flight stay pending, and ``--resume`` continues the run
    once there is space again.
    """


#: Island actors restored from the store at most this many times per island (a crash loop
#: is a bug to report, not something to retry forever).
MAX_ISLAND_RESTORES = 3


def _is_store_full(err: BaseException | None) -> bool:
    """Whether ``err`` (or what caused it) is SQLite's SQLITE_FULL / the OS's ENOSPC."""
    import errno
    import sqlite3

    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, sqlite3.DatabaseError) and "full" in str(err).lower():
            return True
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        err = err.__cause__ or err.__context__
        seen += 1
    return False


@dataclass(frozen=True)
class EngineSettings:
    """The scheduling knobs the engine reads (from config sections [search] and [mutator])."""

    islands_per_task: int = 2
    population_size: int = 16
    max_evaluations: int = 200
    max_wall_seconds: float = 600.0
    in_flight: int = 0
    migration_every: int = 40
    migration_count: int = 2
    selection_lambda: float = 1.0
    archive: bool = True
    confirm_champions: bool = True
    progress_every: int = 10
    #: ``evaluators.profile.ProfileSettings`` (None or enabled=False: no profiling).
    profile: Any = None
    #: ``evo.tuning.TuningSettings`` (None or enabled=False: no tuning).
    tuning: Any = None
    #: Optuna storage for tuning studies (``evo.tuning.journal_path``); required with tuning.
    tuning_storage: str = ""


@dataclass(frozen=True)
class SearchSummary:
    run_id: str
    evaluations: int
    correct: int
    stop_reason: str
    best: dict[str, dict]
    gpu_busy: float
    gpu_busy_steady: float
    evals_per_hour: float
    wall_seconds: float
    failures: dict[str, int] = field(default_factory=dict)


@dataclass
class Progress:
    """Live numbers; the engine updates them and hands them to ``on_progress`` callbacks."""

    started: float
    evaluations: int = 0
    correct: int = 0
    proposed: int = 0
    compile_queue: int = 0
    gpu_queue: int = 0
    in_flight: int = 0
    gpu_busy_s: float = 0.0
    first_gpu_start: float | None = None
    last_gpu_end: float | None = None
    n_gpus: int = 1
    failures: Counter = field(default_factory=Counter)
    islands: list[dict] = field(default_factory=list)

    @property
    def elapsed(self) -> float:
        return max(time.time() - self.started, 1e-9)

    @property
    def evals_per_min(self) -> float:
        return 60.0 * self.evaluations / self.elapsed

    @property
    def gpu_busy(self) -> float:
        """Time inside GPU evaluations over wall time x GPUs, since the search started."""
        return min(1.0, self.gpu_busy_s / (self.elapsed * max(self.n_gpus, 1)))

    @property
    def gpu_busy_steady(self) -> float:
        """The same over the window from the first GPU evaluation's start to the last's end
        (excludes the start-up ramp: worker start, seed compiles)."""
        if self.first_gpu_start is None or self.last_gpu_end is None:
            return 0.0
        window = max(self.last_gpu_end - self.first_gpu_start, 1e-9)
        return min(1.0, self.gpu_busy_s / (window * max(self.n_gpus, 1)))

    def as_event(self) -> dict[str, Any]:
        return {
            "evaluations": self.evaluations, "correct": self.correct, "proposed": self.proposed,
            "evals_per_min": round(self.evals_per_min, 3), "gpu_busy": round(self.gpu_busy, 4),
            "gpu_busy_steady": round(self.gpu_busy_steady, 4),
            "compile_queue": self.compile_queue, "gpu_queue": self.gpu_queue,
            "in_flight": self.in_flight, "failures": dict(self.failures),
            "elapsed_s": round(self.elapsed, 2),
            "islands": [{k: v for k, v in isl.items()} for isl in self.islands],
        }


@dataclass
class _Pending:
    candidate: Candidate
    pre_stages: tuple[StageResult, ...] = ()
    so_bytes: bytes | None = None
    gpu_attempts: int = 0
    gpu_seq: int = 0  # order of submission to the GPU actors (finds who was running at a death)
    compile_attempts: int = 0


class Engine:
    """Steady-state search over several tasks, one group of islands per task.

    Collaborators are injected: ``store`` (the only writer), ``runtime``
    (:class:`evo.runtime.Runtime` or anything with its methods), ``mutator``
    (:class:`mutators.base.Mutator`), ``seeds`` (task -> (source, params)), ``policy``
    (source -> StageResult). ``rng`` drives every random choice of the engine and mutator.
    """

    def __init__(
        self,
        *,
        store,
        runtime,
        mutator,
        run_id: str,
        tasks: list[str],
        seeds: dict[str, tuple[str, dict[str, str]]],
        settings: EngineSettings,
        rng: random.Random,
        policy: Callable[[str], StageResult],
        descriptor: Callable[[dict[str, str]], tuple] | None = None,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.store = store
        self.rt = runtime
        self.mutator = mutator
        self.run_id = run_id
        self.tasks = list(tasks)
        self.seeds = seeds
        self.s = settings
        self.rng = rng
        self.policy = policy
        self.descriptor = descriptor or (lambda params: ())
        self.on_progress = on_progress
        self._policy_cache: dict[str, StageResult] = {}
        self.seen: set[str] = set()
        self.islands: dict[str, list] = {}
        self.island_meta: list[dict] = []
        self._exhausted: set[int] = set()
        self.compile_refs: dict[Any, _Pending] = {}
        self.gpu_refs: dict[Any, tuple[int, _Pending]] = {}
        self.gpu_queue: deque[_Pending] = deque()
        self.gpu_load: list[int] = []
        self.best: dict[str, tuple[float, Candidate]] = {}
        self.progress = Progress(started=time.time())
        self._rr = 0
        self._last_migration = 0
        self._stop_reason = ""
        self._failed_attempts = 0
        # delayed profiling and tuning (docs/profiling.md, docs/tuning.md)
        self._ranking: dict[int, list[tuple[float, str]]] = {}
        self._profile_queue: deque[tuple[Candidate, bytes, int]] = deque()
        self._profile_refs: dict[Any, tuple[int, Candidate, int]] = {}
        self._profiled: set[str] = set()
        self._tune_queue: deque[_Pending] = deque()
        self._studies: dict[str, Any] = {}
        self._trial_of: dict[str, list[tuple[Any, int]]] = {}
        self._tuned_ids: set[str] = set()  # parents whose study was opened in this session
        # GPU actor deaths (docs/SECURITY.md, "faults"): a GPU whose actor died gets no new
        # work until a cheap probe call answers; requests queued behind the one that was
        # running when it died are re-queued without being charged an attempt.
        self._gpu_seq = 0
        self._gpu_down: dict[int, Any] = {}
        self._gpu_probe_fails: dict[int, int] = {}
        self._gpu_lost: set[int] = set()
        self._bystanders: set[int] = set()
        self._fill_failures = 0
        # circuit breaker over evaluator failures (not candidate verdicts): (kind, count)
        self._breaker: tuple[str, int] = ("", 0)

    def _max_failed_attempts(self) -> int:
        cap = getattr(self.mutator, "max_failed_attempts", 0) or 0
        return cap if cap > 0 else max(3 * self.s.max_evaluations, 10)

    # ------------------------------------------------------------------ setup

    def _build_islands(self) -> None:
        from populations.island import DEFAULT_DIMS, IslandSpec

        specs, meta = [], []
        idx = 0
        for task in self.tasks:
            for _ in range(self.s.islands_per_task):
                specs.append(IslandSpec(
                    index=idx, task=task, capacity=self.s.population_size,
                    selector_options=(("lam", self.s.selection_lambda),),
                    seed=self.rng.randrange(2**31),
                    archive_dims=DEFAULT_DIMS if self.s.archive else None,
                ))
                meta.append({"index": idx, "task": task, "spec": specs[-1]})
                idx += 1
        actors = self.rt.make_islands(specs)
        for m, a in zip(meta, actors):
            self.islands.setdefault(m["task"], []).append(a)
            m["actor"] = a
        self.island_meta = meta

    @property
    def n_inflight(self) -> int:
        return len(self.compile_refs) + len(self.gpu_refs) + len(self.gpu_queue) + len(self._tune_queue)

    @property
    def max_inflight(self) -> int:
        if self.s.in_flight > 0:
            return self.s.in_flight
        # Enough to keep every GPU fed while compiles run ahead, but bounded: everything in
        # flight must drain when the budget ends (on one H200 with 16 CPUs, 2 x GPUs + workers
        # = 17 left ~2.5 minutes of queued work behind the budget).
        workers = max(1, self.rt.n_cpus - 1)
        g = self.rt.n_gpus
        return min(2 * g + workers, 6 * g)

    # ------------------------------------------------------------------ run

    def run(self, *, resume: bool = False) -> SearchSummary:
        try:
            return self._run(resume)
        except SearchFailed:
            raise
        except Exception as e:
            if not _is_store_full(e):
                raise
            pending = len(self._all_pending())
            msg = (f"the lineage database is full ({type(e).__name__}: {e}); the search stopped at the "
                   f"first write that failed. Nothing committed was lost; {pending} candidate(s) in flight "
                   f"stay pending. Free disk space (or raise the quota), then continue with "
                   f"`evo search CONFIG --resume {self.run_id}`.")
            log.error(msg)
            self._stop_reason = "lineage database full"
            raise StoreFullError(msg) from e

    def _run(self, resume: bool) -> SearchSummary:
        self.gpu_load = [0] * self.rt.n_gpus
        self.progress.n_gpus = self.rt.n_gpus
        self._build_islands()
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
                if not self._stop_reason:
                    self._fill()
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
        return self._summary()

    def _all_pending(self) -> list[_Pending]:
        return list(self.compile_refs.values()) + [p for _, p in self.gpu_refs.values()] + list(self.gpu_queue)

    # ------------------------------------------------------------------ proposing

    def _submit_seeds(self) -> None:
        for task in self.tasks:
            if task not in self.seeds:
                if not getattr(self.mutator, "genesis", False):
                    raise SearchError(f"task {task!r} has no seed kernel and mutator "
                                      f"{getattr(self.mutator, 'name', '?')!r} cannot write one (use the llm mutator)")
                continue  # its islands start from genesis
            source, params = self.seeds[task]
            cand = Candidate.create(task, source, params, operator=Operator.SEED, island=-1,
                                    notes="seed kernel")
            self._submit(cand)

    def _tuning_reserve(self) -> int:
        """Slots kept for tuning trials: at most a third of all, only while studies want them."""
        if not self._studies:
            return 0
        max_conc = int(getattr(self.s.tuning, "max_concurrent", 2))
        want = sum(max(0, max_conc - s.in_flight) for s in self._studies.values() if not s.done)
        cap = max(1, self.max_inflight // 3) - self._tuning_in_flight()
        return max(0, min(want, cap))

    def _fill(self) -> None:
        self._fill_failures = 0
        order = list(range(len(self.island_meta)))
        tries = 0
        limit = self.max_inflight - self._tuning_reserve()
        while self.n_inflight < limit and tries < len(order) and not self._stop_reason:
            if self.progress.proposed >= self.s.max_evaluations:
                return  # never propose more than the budget can evaluate
            idx = order[self._rr % len(order)]
            self._rr += 1
            if idx in self._exhausted:
                tries += 1
                continue
            if self._propose(idx):
                tries = 0
            else:
                tries += 1
        self._ask_tuning()

    def _ask_tuning(self) -> None:
        """Tuning trials take free slots, at most a third of them, after mutations."""
        if not self._studies or self._stop_reason:
            return
        cap = max(1, self.max_inflight // 3)
        max_conc = int(getattr(self.s.tuning, "max_concurrent", 2))
        for study in list(self._studies.values()):
            while (not study.done and study.in_flight < max_conc and self._tuning_in_flight() < cap
                   and self.n_inflight < self.max_inflight
                   and self.progress.proposed < self.s.max_evaluations):
                got = study.ask()
                if got is None:
                    break
                number, cand = got
                self._trial_of.setdefault(cand.id, []).append((study, number))
                if cand.id in self.seen:
                    continue  # in flight already (a mutation proposed it): told when it lands
                self._submit(cand)
            if study.done:
                self._finish_study(study)

    def _tuning_in_flight(self) -> int:
        return sum(s.in_flight for s in self._studies.values())

    def _finish_study(self, study) -> None:
        key = study.parent.id
        if key not in self._studies:
            return
        del self._studies[key]
        summ = study.summary()
        self.store.log_event(self.run_id, "tuning_done", {
            "study": summ.study, "parent": study.parent.id, "best": summ.best_id,
            "best_fitness": summ.best_fitness, "parent_fitness": summ.parent_fitness,
            "improved": summ.improved, "evaluated": summ.evaluated})

    def _propose(self, idx: int) -> bool:
        from mutators.base import MutationContext

        meta = self.island_meta[idx]
        k = self.mutator.wants_parents() if hasattr(self.mutator, "wants_parents") else 1
        # Parent selection is prefetched: the answer to the request made after this island's
        # previous proposal is usually ready, so no actor round trip sits on this path
        # (it is dropped whenever a member joins the island, so it never misses a result).
        ref = meta.pop("parents_ref", None)
        parents: list[Member] = []
        if ref is not None:
            try:
                parents = self.rt.get(ref)
            except self._actor_errors() as e:
                self._restore_island(idx, e)
        if not parents:  # nothing prefetched, or prefetched before the island had members
            parents = self._island_call(idx, "parents", k)
        meta["parents_ref"] = self.rt.ask(meta["actor"], "parents", k)
        if not parents:
            # An island of a task without a seed kernel starts from genesis (LLM only).
            if meta["task"] in self.seeds or not getattr(self.mutator, "genesis", False):
                return False
            if meta.get("genesis_pending"):
                return False
        gen = max(p.candidate.generation for p in parents) + 1 if parents else 0
        ctx = MutationContext(task=meta["task"], island=idx, generation=gen, seen=frozenset(self.seen))
        try:
            prop = self.mutator.propose(parents, ctx, self.rng)
        except _budget_errors() as e:
            log.warning("mutator budget spent: %s", e)
            self._stop_reason = f"mutator budget spent ({e})"
            return False
        if prop is None:
            if getattr(self.mutator, "exhaustive", False):
                self._exhausted.add(idx)  # None from an exhaustive mutator: nothing new here
            else:
                self._failed_attempts += 1
                self._fill_failures += 1
                if self._failed_attempts >= self._max_failed_attempts():
                    self._stop_reason = (f"{self._failed_attempts} mutation attempts produced no child "
                                         "(see llm_attempt events)")
            return False
        if not parents:
            meta["genesis_pending"] = True
        cand = Candidate.create(meta["task"], prop.source, prop.params, parents=prop.parents,
                                operator=prop.operator, island=idx, generation=gen, notes=prop.notes)
        for pid in prop.parents[:1]:
            self.rt.cast(meta["actor"], "record_child", pid)
        return self._submit(cand)

    def _submit(self, cand: Candidate) -> bool:
        if cand.id in self.seen:
            return False
        self.seen.add(cand.id)
        self.store.add_candidate(self.run_id, cand)
        self.progress.proposed += 1
        pol = self._policy_cache.get(cand.source)  # knobs children share their parent's source
        if pol is None:
            pol = self.policy(cand.source)
            self._policy_cache[cand.source] = pol
        pending = _Pending(candidate=cand, pre_stages=(pol,))
        if not pol.passed:
            self._record(pending, Evaluation(cand.id, (pol,)), gpu=None)
            return True
        self._start_compile(pending)
        return True

    def _start_compile(self, pending: _Pending) -> None:
        pending.compile_attempts += 1
        ref = self.rt.submit_compile(pending.candidate)
        self.compile_refs[ref] = pending

    # ------------------------------------------------------------------ GPU dispatch

    def _dispatch_gpus(self) -> None:
        """Mutations first, then delayed profiles, then tuning trials (lowest priority)."""
        while self.gpu_queue or self._profile_queue or self._tune_queue:
            free = [g for g, load in enumerate(self.gpu_load) if load < 2 and g not in self._gpu_down]
            if not free:
                return
            g = min(free, key=lambda i: self.gpu_load[i])
            if self.gpu_queue or (self._tune_queue and not self._profile_queue):
                pending = (self.gpu_queue or self._tune_queue).popleft()
                pending.gpu_attempts += 1
                self._gpu_seq += 1
                pending.gpu_seq = self._gpu_seq
                ref = self.rt.submit_gpu(g, pending.candidate, pending.so_bytes)
                self.gpu_refs[ref] = (g, pending)
            else:
                cand, so, shape_idx = self._profile_queue.popleft()
                ref = self.rt.submit_profile(g, cand, so, shape_idx, self.s.profile)
                self._profile_refs[ref] = (g, cand, shape_idx)
            self.gpu_load[g] += 1

    # ------------------------------------------------------------------ collecting

    def _collect(self, timeout: float) -> None:
        probes = {ref: g for g, ref in self._gpu_down.items() if ref is not None}
        refs = list(self.compile_refs) + list(self.gpu_refs) + list(self._profile_refs) + list(probes)
        ready = self.rt.wait(refs, timeout)
        errors = self.rt.remote_errors()
        for ref in ready:
            if ref in probes:
                self._probe_answered(probes[ref], ref)
                continue
            if ref in self._profile_refs:
                g, cand, shape_idx = self._profile_refs.pop(ref)
                self.gpu_load[g] -= 1
                try:
                    self._profiled_result(cand, shape_idx, self.rt.get(ref))
                except errors as e:  # ncu missing or broken: our failure, but not the search's
                    log.warning("profiling %s failed: %s", cand.short_id, e)
                    self.store.log_event(self.run_id, "profile_failed", {"id": cand.id, "error": str(e)[:2000]})
                continue
            if ref in self.compile_refs:
                pending = self.compile_refs.pop(ref)
                try:
                    outcome = self.rt.get(ref)
                except errors as e:
                    self._evaluator_failed("compile", pending, e)
                    self._compile_worker_failed(pending, e)
                    continue
                self._breaker_ok("compile")
                self._compiled(pending, outcome)
            else:
                g, pending = self.gpu_refs.pop(ref)
                self.gpu_load[g] -= 1
                try:
                    res = self.rt.get(ref)
                except errors as e:
                    self._evaluator_failed("GPU evaluation", pending, e)
                    self._gpu_worker_failed(pending, e, g)
                    continue
                self._breaker_ok("GPU evaluation")
                self._bystanders.discard(pending.gpu_seq)
                pr = self.progress
                pr.gpu_busy_s += max(0.0, res.finished - res.started)
                pr.first_gpu_start = res.started if pr.first_gpu_start is None else min(pr.first_gpu_start, res.started)
                pr.last_gpu_end = res.finished if pr.last_gpu_end is None else max(pr.last_gpu_end, res.finished)
                ev = res.evaluation
                self._record(pending, Evaluation(pending.candidate.id, pending.pre_stages + ev.stages,
                                                 fitness=ev.fitness, gpu=ev.gpu, env=ev.env), gpu=g)
        self._update_counters()

    # ------------------------------------------------------------------ our failures

    def _evaluator_failed(self, where: str, pending: _Pending, err: BaseException) -> None:
        """A stage raised or its worker died: ours, not the candidate's. An
        InfrastructureError stops the run at once; other failures trip the breaker after
        :data:`BREAKER_THRESHOLD` in a row of one kind (the recovery paths handle the rest)."""
        infra = _infra_cause(err)
        if infra is not None:
            self._fail(f"{where} of {pending.candidate.short_id} ({pending.candidate.task}) failed: "
                       f"{infra.one_line()}", detail=getattr(infra, "detail", "") or str(err), current=pending)
        kind = f"{where}: {type(getattr(err, 'cause', None) or err).__name__}"
        last, n = self._breaker
        n = n + 1 if kind == last else 1
        self._breaker = (kind, n)
        if n >= BREAKER_THRESHOLD:
            first = (str(getattr(err, "cause", None) or err).strip().splitlines() or [type(err).__name__])[-1]
            fix = ("the stage itself raised: a bug of ours or a broken machine; the traceback is in the log"
                   if _is_stage_exception(err) else "its worker process died each time: see the Ray worker "
                   "logs (memory, a crashing driver)")
            self._fail(f"{n} {where}s in a row failed with {type(getattr(err, 'cause', None) or err).__name__} "
                       f"(last on {pending.candidate.short_id}): {first[:300]}; {fix}", detail=str(err),
                       current=pending)

    def _breaker_ok(self, where: str) -> None:
        if self._breaker[0].startswith(where + ":"):
            self._breaker = ("", 0)

    def _fail(self, message: str, detail: str = "", current: "_Pending | None" = None) -> None:
        """Stop the run on a failure of ours: mark it ``failed`` (resumable), record why,
        raise :class:`SearchFailed` with one line naming the cause, the fix and the resume.
        ``current``: the candidate whose stage failed (no longer in flight, still pending)."""
        pending = [p.candidate.id for p in ([current] if current else []) + self._all_pending()]
        line = f"{message}. The run {self.run_id} is marked failed; fix the cause, then continue it with " \
               f"`evo search CONFIG --resume {self.run_id}`"
        if detail:
            log.debug("failure detail: %s", detail)
        log.error("%s", line)
        self._stop_reason = f"failed: {message}"[:500]
        try:
            self.store.log_event(self.run_id, "failed", {"reason": message[:2000], "detail": detail[-8000:],
                                                         "pending": pending})
            self.store.set_run_status(self.run_id, "failed")
        except Exception as e:  # noqa: BLE001 - the original failure is what the user must see
            log.error("could not mark run %s failed: %s", self.run_id, e)
        raise SearchFailed(line)

    def _compiled(self, pending: _Pending, outcome) -> None:
        stage = outcome.result
        pending.pre_stages = pending.pre_stages + (stage,)
        if stage.passed and outcome.so_bytes:
            pending.so_bytes = outcome.so_bytes
            (self._tune_queue if pending.candidate.id in self._trial_of else self.gpu_queue).append(pending)
        else:
            self._record(pending, Evaluation(pending.candidate.id, pending.pre_stages), gpu=None)

    def _compile_worker_failed(self, pending: _Pending, err: BaseException) -> None:
        if pending.compile_attempts < 2:
            log.warning("compile worker died on %s (%s); retrying once", pending.candidate.short_id, err)
            self._start_compile(pending)
            return
        st = StageResult("compile", Status.CRASH, reason=f"compile worker died twice: {type(err).__name__}: {err}"[:2000])
        self._record(pending, Evaluation(pending.candidate.id, pending.pre_stages + (st,)), gpu=None)

    def _gpu_worker_failed(self, pending: _Pending, err: BaseException, g: int | None = None) -> None:
        if g is not None:
            if g not in self._gpu_down and g not in self._gpu_lost:
                self._probe_gpu(g)
            if pending.gpu_seq in self._bystanders or self._queued_behind(g, pending):
                # Not running when its actor died: not this candidate's fault.
                self._bystanders.discard(pending.gpu_seq)
                pending.gpu_attempts -= 1
                log.info("GPU evaluator %d died while %s waited in its queue; re-queued", g,
                         pending.candidate.short_id)
                self.gpu_queue.appendleft(pending)
                return
            self._bystanders.update(p.gpu_seq for gg, p in self.gpu_refs.values() if gg == g)
        if pending.gpu_attempts < 2:
            log.warning("GPU evaluator died on %s (%s); re-queued once", pending.candidate.short_id, err)
            self.gpu_queue.appendleft(pending)
            return
        log.warning("GPU evaluator died again on %s (%s); recorded as crash", pending.candidate.short_id, err)
        st = StageResult("correctness", Status.CRASH,
                         reason=f"GPU evaluator died twice on this candidate: {type(err).__name__}: {err}"[:2000])
        self._record(pending, Evaluation(pending.candidate.id, pending.pre_stages + (st,)), gpu=None)

    def _queued_behind(self, g: int, pending: _Pending) -> bool:
        """Whether ``pending`` was still waiting in actor ``g``'s queue when it died: an
        earlier request on ``g`` had not finished well (an actor runs one request at a time)."""
        for ref, (gg, p) in list(self.gpu_refs.items()):
            if gg != g or p.gpu_seq >= pending.gpu_seq:
                continue
            if not self.rt.wait([ref], 1.0):
                return True  # still not done: it was running, not this one
            try:
                self.rt.get(ref)
            except self.rt.remote_errors():
                return True  # the earlier one died with the actor: it was the one running
        return False

    def _probe_gpu(self, g: int) -> None:
        """Ask GPU actor ``g`` a cheap question; it gets work again once it answers."""
        actors = getattr(self.rt, "gpu_actors", None)
        if not actors:  # a runtime without actor handles: nothing to probe
            return
        self._gpu_down[g] = self.rt.ask(actors[g], "worker")

    def _probe_answered(self, g: int, ref) -> None:
        try:
            self.rt.get(ref)
        except self.rt.remote_errors() as e:
            n = self._gpu_probe_fails[g] = self._gpu_probe_fails.get(g, 0) + 1
            if type(e).__name__ == "ActorDiedError" or n > 300:  # dead for good (restarts spent)
                self._gpu_down.pop(g, None)
                self._gpu_lost.add(g)
                self.gpu_load[g] = 2**30  # never dispatched to again
                log.error("GPU evaluator %d is gone for good (%s: %s)", g, type(e).__name__, str(e)[:300])
                self.store.log_event(self.run_id, "gpu_lost", {"gpu": g, "error": f"{type(e).__name__}: {e}"[:500]})
                if len(self._gpu_lost) == len(self.gpu_load):
                    raise SearchError("every GPU evaluator died and could not be restarted; see the Ray "
                                      "logs of the GpuEvaluator actors, then resume with --resume") from e
                return
            time.sleep(0.1)
            self._probe_gpu(g)
            return
        self._gpu_down.pop(g, None)
        self._gpu_probe_fails.pop(g, None)
        log.info("GPU evaluator %d answers again", g)

    # ------------------------------------------------------------------ recording

    def _record(self, pending: _Pending, ev: Evaluation, gpu: int | None) -> None:
        cand = pending.candidate
        self.store.add_evaluation(self.run_id, ev)
        self.progress.evaluations += 1
        failed = ev.failed_stage
        if failed is not None:
            self.progress.failures[f"{failed.stage}:{failed.status.value}"] += 1
        fitness = ev.fitness if ev.correct else None
        if fitness is not None:
            self.progress.correct += 1
        member = self._member_of(cand, ev)
        self._add_member(member)
        if hasattr(self.mutator, "observe"):
            self.mutator.observe(cand.id, fitness)
        for study, number in self._trial_of.pop(cand.id, []):
            study.tell(number, ev)
            if study.done:
                self._finish_study(study)
        if fitness is not None and pending.so_bytes:
            self._after_correct(member, pending.so_bytes)
        if 0 <= cand.island < len(self.island_meta):
            self.island_meta[cand.island].pop("genesis_pending", None)
        if fitness is not None:
            cur = self.best.get(cand.task)
            if cur is None or fitness > cur[0]:
                self.best[cand.task] = (fitness, cand)
                self.store.log_event(self.run_id, "new_best", {"task": cand.task, "id": cand.id, "fitness": fitness})
        self._maybe_migrate()
        self._emit_progress()

    def _after_correct(self, member: Member, so_bytes: bytes) -> None:
        """Delayed profiling and tuning triggers for a correct member that just landed."""
        from evo.triggers import should_profile, should_tune

        cand = member.candidate
        islands = ([m["index"] for m in self.island_meta if m["task"] == cand.task] if cand.island < 0
                   else [cand.island])
        prof, tun = self.s.profile, self.s.tuning
        ks = [int(x.top_k) for x in (prof, tun) if x is not None and getattr(x, "enabled", False)]
        if not ks:
            return
        for idx in islands:
            rank = self._ranking.setdefault(idx, [])
            rank.append((member.fitness, cand.id))
            rank.sort(key=lambda x: (-x[0], x[1]))
            del rank[max(ks):]  # only the top-k matter to the triggers
            topk = [i for _, i in rank]
            if prof is not None and getattr(prof, "enabled", False):
                from evo.tasks import get_task

                n_bench = get_task(cand.task).bench_shapes
                for shape_idx in range(n_bench):
                    key = f"{cand.id}|{shape_idx}"
                    if should_profile(member, topk, prof, done=self._profiled, shape=str(shape_idx)) \
                            and key not in self._profiled:
                        self._profiled.add(key)
                        self._profile_queue.append((cand, so_bytes, shape_idx))
            if tun is not None and getattr(tun, "enabled", False) and cand.id not in self._studies:
                tuned = set(self._studies) | self._tuned_ids
                if should_tune(member, topk, tuned, tun):
                    self._open_study(member)

    def _open_study(self, member: Member) -> None:
        from evo.tuning import TuningStudy

        cand = member.candidate
        self._tuned_ids.add(cand.id)

        def on_trial(rec) -> None:
            self.store.add_tuning_trial(self.run_id, cand.id, rec.number, rec.params, rec.value, rec.status,
                                        rec.candidate_id)

        study = TuningStudy(self.s.tuning_storage, self.run_id, cand, seed=self.rng.randrange(2**31),
                            n_trials=self.s.tuning.trials_per_survivor, parent_fitness=member.fitness,
                            lookup=lambda cid: self.store.get_evaluation(cid, self.run_id), on_trial=on_trial)
        self._studies[cand.id] = study
        self.store.log_event(self.run_id, "tuning_start", {"parent": cand.id, "study": study.name,
                                                           "fitness": member.fitness})

    def _profiled_result(self, cand: Candidate, shape_idx: int, st: StageResult) -> None:
        from evo.tasks import get_task
        from evo.tasks.registry import format_shape

        shape = format_shape(get_task(cand.task).shapes[shape_idx])
        if st.passed:
            self.store.add_profile(cand.id, shape=shape, gpu=str(st.metrics.get("gpu", "")), metrics=st.metrics)
        self.store.log_event(self.run_id, "profile", {"id": cand.id, "shape": shape, "status": st.status.value,
                                                      "reason": st.reason[:500],
                                                      "bound": st.metrics.get("bound"),
                                                      "ncu_wall_s": st.metrics.get("ncu_wall_s")})

    def _member_of(self, cand: Candidate, ev: Evaluation) -> Member:
        """The island member for an evaluated candidate (incorrect ones carry their error)."""
        failed = ev.failed_stage
        return Member(candidate=cand, fitness=ev.fitness if ev.correct else None, status=ev.status,
                      descriptor=self.descriptor(cand.params_dict), error=(failed.reason if failed else ""))

    def _add_member(self, member: Member) -> None:
        cand = member.candidate
        targets = (self.islands.get(cand.task, []) if cand.island < 0
                   else [self.island_meta[cand.island]["actor"]] if cand.island < len(self.island_meta) else [])
        for actor in targets:
            self.rt.cast(actor, "add", member)  # ordered before this driver's next call
        for m in self.island_meta:  # a prefetched parent choice predates this member: drop it
            if any(m["actor"] is a for a in targets):
                m.pop("parents_ref", None)
        if member.correct:  # a new correct member may open new neighbours to explore
            for m in self.island_meta:
                if any(m["actor"] is a for a in targets):
                    self._exhausted.discard(m["index"])

    def _maybe_migrate(self) -> None:
        every = self.s.migration_every
        n = self.progress.evaluations
        if self.s.migration_count <= 0 or n // every <= self._last_migration // every:
            return
        self._last_migration = n
        for task in list(self.islands):
            idxs = [m["index"] for m in self.island_meta if m["task"] == task]
            if len(idxs) < 2:
                continue
            # Take every island's emigrants before any island receives: one hop per round.
            outgoing = [self._island_call(i, "emigrants", self.s.migration_count) for i in idxs]
            moved = 0
            for j, emigrants in enumerate(outgoing):
                if emigrants:
                    moved += self._island_call(idxs[(j + 1) % len(idxs)], "immigrate", emigrants)
            self.store.log_event(self.run_id, "island_migration", {"task": task, "moved": moved, "at": n})
            self._exhausted.difference_update(m["index"] for m in self.island_meta if m["task"] == task)

    # ------------------------------------------------------------------ progress / end

    def _update_counters(self) -> None:
        self.progress.compile_queue = len(self.compile_refs)
        self.progress.gpu_queue = len(self.gpu_queue)
        self.progress.in_flight = self.n_inflight

    def _island_rows(self) -> list[dict]:
        try:
            sums = self.rt.call_many([m["actor"] for m in self.island_meta], "summary")
        except self._actor_errors():
            sums = [self._island_call(m["index"], "summary") for m in self.island_meta]
        return [{"island": s.index, "task": s.task, "best": s.best_fitness, "fix_mode": s.fix_mode,
                 "size": s.size, "archive_cells": s.archive_cells} for s in sums]

    def _emit_progress(self, force: bool = False) -> None:
        n = self.progress.evaluations
        if not force and (n == 0 or n % self.s.progress_every):
            if self.on_progress:
                self._update_counters()
                self.on_progress(self.progress)
            return
        self._update_counters()
        self.progress.islands = self._island_rows()
        self.store.log_event(self.run_id, "progress", self.progress.as_event())
        if self.on_progress:
            self.on_progress(self.progress)

    def _confirm_champions(self) -> None:
        """Re-time each task's best in a fresh process; store the confirmation."""
        for task, (fitness, cand) in sorted(self.best.items()):
            compiled = self.rt.submit_compile(cand)
            try:
                outcome = self.rt.get(compiled)
                if not outcome.result.passed:
                    raise RuntimeError(outcome.result.reason)
                res = self.rt.get(self.rt.submit_gpu(0, cand, outcome.so_bytes))
            except self.rt.remote_errors() + (RuntimeError,) as e:
                infra = _infra_cause(e)
                if infra is not None:
                    self._fail(f"champion confirmation of {cand.short_id} ({task}) failed: {infra.one_line()}",
                               detail=getattr(infra, "detail", ""))
                log.warning("champion confirmation of %s failed: %s", cand.short_id, e)
                self.store.set_champion(self.run_id, task, cand.id, fitness,
                                        {"confirmed": False, "error": str(e)[:500]})
                continue
            again = res.evaluation.fitness if res.evaluation.correct else None
            ok = again is not None and again >= 0.9 * fitness
            self.store.set_champion(self.run_id, task, cand.id, fitness, {
                "confirmed": ok, "fitness_confirmed": again,
                "ratio": (again / fitness) if again else None, "gpu": res.evaluation.gpu,
            })

    def _summary(self) -> SearchSummary:
        p = self.progress
        best = {t: {"id": c.id, "fitness": f, "operator": c.operator} for t, (f, c) in self.best.items()}
        return SearchSummary(
            run_id=self.run_id, evaluations=p.evaluations, correct=p.correct,
            stop_reason=self._stop_reason, best=best, gpu_busy=p.gpu_busy, gpu_busy_steady=p.gpu_busy_steady,
            evals_per_hour=3600.0 * p.evaluations / p.elapsed, wall_seconds=p.elapsed,
            failures=dict(p.failures),
        )

    # ------------------------------------------------------------------ island faults

    def _actor_errors(self) -> tuple[type[BaseException], ...]:
        """The runtime's "this actor is dead" errors (not errors raised by a method)."""
        errs = tuple(e for e in self.rt.remote_errors() if "Actor" in e.__name__)
        return errs or self.rt.remote_errors()

    def _island_call(self, idx: int, method: str, *args):
        """``rt.call`` on island ``idx``; a dead island actor is restored from the store and
        the call repeated once on its replacement."""
        try:
            return self.rt.call(self.island_meta[idx]["actor"], method, *args)
        except self._actor_errors() as e:
            self._restore_island(idx, e)
            return self.rt.call(self.island_meta[idx]["actor"], method, *args)

    def _restore_island(self, idx: int, err: BaseException) -> None:
        """Replace the dead actor of island ``idx`` by a new one rebuilt from the store.

        Like resume: the island's own evaluated candidates (and its task's seeds) are replayed
        in insertion order. What only the actor knew is lost and rebuilt over time: child
        counts (selection's novelty term) and members that had migrated in.
        """
        meta = self.island_meta[idx]
        meta["restores"] = meta.get("restores", 0) + 1
        if meta["restores"] > MAX_ISLAND_RESTORES:
            raise SearchError(f"island {idx} ({meta['task']}) died {meta['restores']} times "
                              f"(last: {type(err).__name__}: {err}); giving up rather than looping")
        old = meta["actor"]
        log.warning("island actor %d (%s) died (%s: %s); restoring it from the store",
                    idx, meta["task"], type(err).__name__, str(err)[:200])
        new = self.rt.make_islands([meta["spec"]])[0]
        evals = {ev.candidate_id: ev for ev in self.store.evaluations(self.run_id)}
        members = []
        for cand in self.store.candidates(self.run_id):
            if cand.task != meta["task"] or cand.island not in (idx, -1) or cand.id not in evals:
                continue
            members.append(self._member_of(cand, evals[cand.id]))
        if members:
            self.rt.call(new, "add_many", members)
        meta["actor"] = new
        meta.pop("parents_ref", None)
        self.islands[meta["task"]] = [new if a is old else a for a in self.islands[meta["task"]]]
        self.store.log_event(self.run_id, "island_restored", {
            "island": idx, "task": meta["task"], "members": len(members), "restores": meta["restores"],
            "error": f"{type(err).__name__}: {err}"[:500]})

    # ------------------------------------------------------------------ resume

    def _replay(self) -> None:
        """Rebuild islands and in-flight work from the store (see module docstring)."""
        cands = self.store.candidates(self.run_id)
        evals = {ev.candidate_id: ev for ev in self.store.evaluations(self.run_id)}
        pending_cands: list[Candidate] = []
        done = correct = 0
        for cand in cands:
            self.seen.add(cand.id)
            ev = evals.get(cand.id)
            if ev is None:
                pending_cands.append(cand)
                continue
            done += 1
            member = self._member_of(cand, ev)
            self._add_member(member)
            fitness = member.fitness
            if fitness is not None:
                correct += 1
                cur = self.best.get(cand.task)
                if cur is None or fitness > cur[0]:
                    self.best[cand.task] = (fitness, cand)
        self.progress.evaluations = done
        self.progress.correct = correct
        self.progress.proposed = len(cands)
        self._last_migration = done
        for cand in pending_cands:
            pol = self.policy(cand.source)
            p = _Pending(candidate=cand, pre_stages=(pol,))
            if pol.passed:
                self._start_compile(p)
            else:
                self._record(p, Evaluation(cand.id, (pol,)), gpu=None)
        pending = pending_cands
        self.store.log_event(self.run_id, "resume", {"evaluated": done, "resubmitted": len(pending)})
        log.info("resumed run %s: %d evaluated, %d resubmitted", self.run_id, done, len(pending))


# ---------------------------------------------------------------------- helpers


def _budget_errors() -> tuple[type[BaseException], ...]:
    from mutators.client import BudgetExhausted

    return (BudgetExhausted,)
