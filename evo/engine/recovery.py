"""Fault recovery: what a failure of ours means, decided away from the scheduling loop.

A candidate's failures are data (a StageResult with a non-ok status, recorded like any
result); this module is about the others, and returns *decisions* the engine carries out:

- a stage raised, or its worker died (:class:`Breaker`): an
  :class:`~evaluators.base.InfrastructureError` anywhere behind the error stops the run at
  once (:class:`StopRun`); other errors stop it after :data:`BREAKER_THRESHOLD` in a row of
  one kind (a success of that stage resets the count). A worker death counts only when the
  recovery below gives up on the candidate (it died twice and is recorded as a crash): a
  death that is retried or re-queued is recovered, and a killed GPU actor takes its queued
  requests down with it, which must not stop the run. The engine then marks the run
  ``failed`` (resumable) and raises :class:`SearchFailed`;
- a compile worker died (:func:`compile_worker_died`): compile again once (:class:`Retry`),
  then record a ``crash`` (:class:`RecordCrash`);
- a GPU actor died (:class:`GpuFaults`): the GPU gets no new work until a cheap probe call
  answers (Ray restarts the actor); the request that was running is re-queued once, then
  recorded as a ``crash``; requests that were only queued behind it are re-queued without
  being charged (:class:`Requeue`); a GPU whose actor is gone for good is dropped
  (:class:`GpuLost`), and with every GPU gone the run stops;
- an island actor died (:func:`island_died`): rebuild it from the store
  (:class:`RestoreIsland`; :meth:`evo.engine.islands.IslandSet.restore` rebuilds it), at most
  :data:`MAX_ISLAND_RESTORES` times per island;
- the lineage database is full (:func:`store_full_message`): stop at the first failed
  write with :class:`StoreFullError`, nothing committed lost;
- any stop of ours (:func:`fail_run`): the run is marked ``failed`` with a ``failed`` event
  naming the cause and the pending candidates, and :class:`SearchFailed` carries the one
  line (cause, fix, resume command).

Nothing here calls the engine: functions read the error, the attempt counts and what the
runtime answers (:class:`evo.engine.seams.ClusterRuntime`), and keep only their own state (the
breaker's count, which GPUs are down). docs/SECURITY.md ("faults") and docs/engine.md say
what a user sees; tests/test_faults.py and tests/test_user_tasks.py run every path on Ray.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from evo.engine.bookkeeping import Pending
from evo.core.records import Candidate, StageResult, Status
from evo.store import StoreError

__all__ = [
    "SearchError", "SearchFailed", "StoreFullError", "BREAKER_THRESHOLD", "MAX_ISLAND_RESTORES",
    "StopRun", "Retry", "Requeue", "RecordCrash", "GpuLost", "RestoreIsland",
    "Breaker", "GpuFaults", "compile_worker_died", "island_died", "store_full_message", "fail_run",
    "infra_cause", "is_stage_exception", "is_store_full",
]

log = logging.getLogger(__name__)

#: Consecutive evaluator failures of one kind (an exception from a stage or a dead worker,
#: not a candidate's verdict) after which the run stops (InfrastructureError stops at once).
BREAKER_THRESHOLD = 3

#: Island actors restored from the store at most this many times per island (a crash loop
#: is a bug to report, not something to retry forever).
MAX_ISLAND_RESTORES = 3

#: Failed probes of a restarting GPU actor (0.1 s apart) after which it counts as gone.
MAX_PROBE_FAILS = 300


class SearchError(RuntimeError):
    """The search cannot start or continue (unknown run to resume, no GPUs, ...)."""


class SearchFailed(SearchError):
    """The run stopped on a failure of ours (not a candidate's): a harness bug, a task the
    GPU process cannot load, a missing toolchain, repeated evaluator failures of one kind.

    The run is marked ``failed`` in the store with this message; nothing evaluated is lost
    and candidates in flight stay pending, so ``evo search CONFIG --resume RUN`` continues
    once the cause is fixed. ``str(err)`` is one line: the cause and the fix.
    """


class StoreFullError(StoreError, SearchError):
    """The lineage database could not grow (disk full, quota, or SQLite's max_page_count).

    The engine stops at the first failed write: every committed row is intact (each write is
    one transaction), candidates in flight stay pending, and ``--resume`` continues the run
    once there is space again.
    """


# ---------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class StopRun:
    """Stop the run on a failure of ours: ``message`` is the one line (cause and fix),
    ``detail`` the long form for the log (a traceback)."""

    message: str
    detail: str = ""


@dataclass(frozen=True)
class Retry:
    """Compile the candidate again (its worker died; one more attempt)."""


@dataclass(frozen=True)
class Requeue:
    """Put the candidate back at the front of the GPU queue. ``charged=False``: it was not
    running when its actor died, so the attempt does not count."""

    charged: bool = True


@dataclass(frozen=True)
class RecordCrash:
    """Record the candidate as failed with ``stage`` (a ``crash``): its worker died again."""

    stage: StageResult


@dataclass(frozen=True)
class GpuLost:
    """GPU ``gpu``'s actor is gone for good: dispatch nothing to it again. ``error`` names
    why (for the ``gpu_lost`` event); ``stop``: a message when no GPU is left ("" else);
    ``cause``: the probe's exception."""

    gpu: int
    error: str
    stop: str = ""
    cause: BaseException | None = None


@dataclass(frozen=True)
class RestoreIsland:
    """Rebuild the dead island actor from the store; ``restores`` is its new count.
    ``give_up``: a message instead when it died too often (the run stops)."""

    restores: int
    give_up: str = ""


# ---------------------------------------------------------------------- reading errors


def infra_cause(err: BaseException | None):
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


def is_stage_exception(err: BaseException) -> bool:
    """Whether a remote error is an exception the stage function raised (our code failed),
    as opposed to its worker or actor dying or being unreachable (RayActorError and its
    kind, WorkerCrashedError: the recovery paths handle those, with their own bounds).
    The in-process runtime's (evo.engine.local_runtime) are LocalTaskError and LocalActorError."""
    names = {c.__name__ for c in type(err).__mro__}
    if names & {"RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError", "LocalActorError"}:
        return False
    return bool(names & {"RayTaskError", "LocalTaskError"}) or type(err).__name__.startswith("RayTaskError")


def is_store_full(err: BaseException | None) -> bool:
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


def store_full_message(err: BaseException, run_id: str, n_pending: int) -> str | None:
    """The one line for a run stopped by a full lineage database, or None when ``err`` is
    something else."""
    if not is_store_full(err):
        return None
    return (f"the lineage database is full ({type(err).__name__}: {err}); the search stopped at the "
            f"first write that failed. Nothing committed was lost; {n_pending} candidate(s) in flight "
            f"stay pending. Free disk space (or raise the quota), then continue with "
            f"`evo search CONFIG --resume {run_id}`.")


def fail_run(store, run_id: str, message: str, detail: str, pending: list[str]) -> SearchFailed:
    """Mark ``run_id`` failed for ``message`` (a ``failed`` event with ``detail`` and the
    ``pending`` candidate ids, then the status; resumable) and return the
    :class:`SearchFailed` to raise: one line naming the cause, the fix and the resume."""
    line = f"{message}. The run {run_id} is marked failed; fix the cause, then continue it with " \
           f"`evo search CONFIG --resume {run_id}`"
    if detail:
        log.debug("failure detail: %s", detail)
    log.error("%s", line)
    try:
        store.log_event(run_id, "failed", {"reason": message[:2000], "detail": detail[-8000:], "pending": pending})
        store.set_run_status(run_id, "failed", reason=message[:2000])
    except Exception as e:  # noqa: BLE001 - the original failure is what the user must see
        log.error("could not mark run %s failed: %s", run_id, e)
    return SearchFailed(line)


# ---------------------------------------------------------------------- the breaker


class Breaker:
    """Counts evaluator failures (not candidate verdicts) of one kind in a row."""

    def __init__(self, threshold: int = BREAKER_THRESHOLD) -> None:
        self.threshold = threshold
        self.kind, self.count = "", 0

    def failed(self, where: str, candidate: Candidate, err: BaseException,
               decision: "Retry | Requeue | RecordCrash | None" = None) -> StopRun | None:
        """A ``where`` stage ("compile", "GPU evaluation") raised or its worker died on
        ``candidate``, and recovery decided ``decision`` for it: :class:`StopRun` now (an
        InfrastructureError, or the threshold reached), else None (the decision stands).
        A worker death whose candidate is tried again (:class:`Retry`, :class:`Requeue`)
        does not count."""
        infra = infra_cause(err)
        if infra is not None:
            return StopRun(f"{where} of {candidate.short_id} ({candidate.task}) failed: {infra.one_line()}",
                           getattr(infra, "detail", "") or str(err))
        if not is_stage_exception(err) and isinstance(decision, (Retry, Requeue)):
            return None
        if not is_stage_exception(err):
            return None  # a dead or unreachable worker: the recovery paths bound those
        name = type(getattr(err, "cause", None) or err).__name__
        kind = f"{where}: {name}"
        self.count = self.count + 1 if kind == self.kind else 1
        self.kind = kind
        if self.count < self.threshold:
            return None
        first = (str(getattr(err, "cause", None) or err).strip().splitlines() or [type(err).__name__])[-1]
        fix = "the stage itself raised: a bug of ours or a broken machine; the traceback is in the log"
        return StopRun(f"{self.count} {where}s in a row failed with {name} (last on {candidate.short_id}): "
                       f"{first[:300]}; {fix}", str(err))

    def ok(self, where: str) -> None:
        """A ``where`` stage returned: its failures are no longer in a row."""
        if self.kind.startswith(where + ":"):
            self.kind, self.count = "", 0


# ---------------------------------------------------------------------- workers


def compile_worker_died(pending: Pending, err: BaseException) -> Retry | RecordCrash:
    """A compile worker process died on ``pending``: once more, then a ``crash``."""
    if pending.compile_attempts < 2:
        log.warning("compile worker died on %s (%s); retrying once", pending.candidate.short_id, err)
        return Retry()
    return RecordCrash(StageResult("compile", Status.CRASH,
                                   reason=f"compile worker died twice: {type(err).__name__}: {err}"[:2000]))


class GpuFaults:
    """Which GPU actors are down (probed until they answer) or lost, and which requests
    were bystanders of a death (queued behind the one that was running)."""

    def __init__(self) -> None:
        self.seq = 0
        self.down: dict[int, Any] = {}  # GPU -> reference of its pending probe (None: none)
        self.probe_fails: dict[int, int] = {}
        self.lost: set[int] = set()
        self.bystanders: set[int] = set()

    def next_seq(self) -> int:
        """The next GPU submission's sequence number."""
        self.seq += 1
        return self.seq

    def is_down(self, g: int) -> bool:
        return g in self.down

    def probes(self) -> dict[Any, int]:
        """Pending probe references -> their GPU (for the engine's wait)."""
        return {ref: g for g, ref in self.down.items() if ref is not None}

    def finished(self, pending: Pending) -> None:
        """``pending`` came back from its GPU (it was no bystander, whatever happened)."""
        self.bystanders.discard(pending.gpu_seq)

    def worker_died(self, rt, g: int, pending: Pending, err: BaseException,
                    gpu_refs: dict[Any, tuple[int, Pending]]) -> Requeue | RecordCrash:
        """GPU ``g``'s actor died while ``pending`` was on it. ``gpu_refs``: every other
        request in flight (reference -> (GPU, pending)). Starts a probe of ``g``."""
        if g not in self.down and g not in self.lost:
            self.probe(rt, g)
        if pending.gpu_seq in self.bystanders or self._queued_behind(rt, g, pending, gpu_refs):
            # Not running when its actor died: not this candidate's fault.
            self.bystanders.discard(pending.gpu_seq)
            log.info("GPU evaluator %d died while %s waited in its queue; re-queued", g, pending.candidate.short_id)
            return Requeue(charged=False)
        self.bystanders.update(p.gpu_seq for gg, p in gpu_refs.values() if gg == g)
        if pending.gpu_attempts < 2:
            log.warning("GPU evaluator died on %s (%s); re-queued once", pending.candidate.short_id, err)
            return Requeue()
        log.warning("GPU evaluator died again on %s (%s); recorded as crash", pending.candidate.short_id, err)
        return RecordCrash(StageResult("correctness", Status.CRASH,
                                       reason=f"GPU evaluator died twice on this candidate: {type(err).__name__}: {err}"[:2000]))

    @staticmethod
    def _queued_behind(rt, g: int, pending: Pending, gpu_refs: dict[Any, tuple[int, Pending]]) -> bool:
        """Whether ``pending`` was still waiting in actor ``g``'s queue when it died: an
        earlier request on ``g`` had not finished well (an actor runs one request at a time)."""
        for ref, (gg, p) in list(gpu_refs.items()):
            if gg != g or p.gpu_seq >= pending.gpu_seq:
                continue
            if not rt.wait([ref], 1.0):
                return True  # still not done: it was running, not this one
            try:
                rt.get(ref)
            except rt.remote_errors():
                return True  # the earlier one died with the actor: it was the one running
        return False

    def probe(self, rt, g: int) -> None:
        """Ask GPU actor ``g`` a cheap question; it gets work again once it answers."""
        ref = rt.probe_gpu(g)
        if ref is None:  # a runtime without an actor to ask: nothing to probe
            return
        self.down[g] = ref

    def probe_answered(self, rt, g: int, ref, *, n_gpus: int) -> GpuLost | None:
        """The probe of ``g`` (one of ``n_gpus``) came back: up again (None), probe again
        (None), or lost."""
        try:
            rt.get(ref)
        except rt.remote_errors() as e:
            n = self.probe_fails[g] = self.probe_fails.get(g, 0) + 1
            if type(e).__name__ == "ActorDiedError" or n > MAX_PROBE_FAILS:  # dead for good (restarts spent)
                self.down.pop(g, None)
                self.lost.add(g)
                log.error("GPU evaluator %d is gone for good (%s: %s)", g, type(e).__name__, str(e)[:300])
                stop = ("every GPU evaluator died and could not be restarted; see the Ray logs of the "
                        "GpuEvaluator actors, then resume with --resume") if len(self.lost) == n_gpus else ""
                return GpuLost(g, f"{type(e).__name__}: {e}"[:500], stop, e)
            time.sleep(0.1)
            self.probe(rt, g)
            return None
        self.down.pop(g, None)
        self.probe_fails.pop(g, None)
        log.info("GPU evaluator %d answers again", g)
        return None


# ---------------------------------------------------------------------- islands


def island_died(island, err: BaseException) -> RestoreIsland:
    """Island actor ``island`` (an :class:`evo.engine.islands.IslandHandle`) died with ``err``."""
    restores = island.restores + 1
    if restores > MAX_ISLAND_RESTORES:
        return RestoreIsland(restores, f"island {island.index} ({island.task}) died {restores} times "
                                       f"(last: {type(err).__name__}: {err}); giving up rather than looping")
    log.warning("island actor %d (%s) died (%s: %s); restoring it from the store",
                island.index, island.task, type(err).__name__, str(err)[:200])
    return RestoreIsland(restores)
