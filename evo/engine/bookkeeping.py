"""What the engine counts and carries: live :class:`Progress`, the end-of-run
:class:`SearchSummary`, :class:`Pending` (a candidate's record while it is in flight) and
:func:`member_of` (an evaluated candidate as the member its islands receive).

Plain data, no I/O: the engine (:mod:`evo.engine.engine`) updates them, its helpers
(:mod:`evo.engine.recovery`, :mod:`evo.engine.survivors`) read them, ``on_progress`` callbacks (the live
view, tests) get :class:`Progress`.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from evo.core.records import Candidate, Evaluation, Member, StageResult

__all__ = ["Progress", "SearchSummary", "Pending", "member_of"]


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

    @classmethod
    def of(cls, run_id: str, p: "Progress", best: dict[str, tuple[float, Candidate]], stop_reason: str) -> "SearchSummary":
        """The summary of a run from its progress and each task's best ``(fitness, candidate)``."""
        return cls(
            run_id=run_id, evaluations=p.evaluations, correct=p.correct, stop_reason=stop_reason,
            best={t: {"id": c.id, "fitness": f, "operator": c.operator} for t, (f, c) in best.items()},
            gpu_busy=p.gpu_busy, gpu_busy_steady=p.gpu_busy_steady,
            evals_per_hour=3600.0 * p.evaluations / p.elapsed, wall_seconds=p.elapsed, failures=dict(p.failures),
        )


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
    #: seconds of the correctness and timing stages (the harness's own GPU-time accounting)
    gpu_stage_s: float = 0.0
    #: per GPU, the actor's latest (mean NVML utilisation, samples); absent: not measured
    gpu_activity_by_gpu: dict = field(default_factory=dict)
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
    def gpu_activity(self) -> float | None:
        """The GPUs' measured activity: the mean of each actor's sampled NVML utilisation
        (0..1); None when no GPU could be sampled ("not measured")."""
        vals = [a for a, _n in self.gpu_activity_by_gpu.values()]
        return sum(vals) / len(vals) if vals else None

    @property
    def gpu_stage_share(self) -> float:
        """Correctness + timing stage seconds over wall time x GPUs (concurrent correctness
        processes each count, so it can exceed slot occupancy)."""
        return self.gpu_stage_s / (self.elapsed * max(self.n_gpus, 1))

    @property
    def gpu_busy(self) -> float:
        """Slot occupancy: time inside GPU actor calls over wall time x GPUs, since the
        search started (not the GPU's activity: see :attr:`gpu_activity`)."""
        return min(1.0, self.gpu_busy_s / (self.elapsed * max(self.n_gpus, 1)))

    @property
    def gpu_busy_steady(self) -> float:
        """The same over the window from the first GPU evaluation's start to the last's end
        (excludes the start-up ramp: worker start, seed compiles)."""
        if self.first_gpu_start is None or self.last_gpu_end is None:
            return 0.0
        window = max(self.last_gpu_end - self.first_gpu_start, 1e-9)
        return min(1.0, self.gpu_busy_s / (window * max(self.n_gpus, 1)))

    def gpu_ran(self, started: float, finished: float, stage_s: float = 0.0,
                activity: tuple[float, int] | None = None, gpu: int = 0) -> None:
        """Count one GPU evaluation that ran from ``started`` to ``finished`` (wall clock),
        whose GPU stages took ``stage_s``; ``activity``: its actor's sampled utilisation."""
        self.gpu_stage_s += max(0.0, stage_s)
        if activity is not None:
            self.gpu_activity_by_gpu[gpu] = tuple(activity)
        # slot occupancy: concurrent calls of one actor each count (gpu_busy caps at 1)
        self.gpu_busy_s += max(0.0, finished - started)
        self.first_gpu_start = started if self.first_gpu_start is None else min(self.first_gpu_start, started)
        self.last_gpu_end = finished if self.last_gpu_end is None else max(self.last_gpu_end, finished)

    def as_event(self) -> dict[str, Any]:
        return {
            "evaluations": self.evaluations, "correct": self.correct, "proposed": self.proposed,
            "evals_per_min": round(self.evals_per_min, 3), "gpu_busy": round(self.gpu_busy, 4),
            "gpu_busy_steady": round(self.gpu_busy_steady, 4),
            "gpu_activity": None if self.gpu_activity is None else round(self.gpu_activity, 4),
            "gpu_stage_share": round(self.gpu_stage_share, 4),
            "compile_queue": self.compile_queue, "gpu_queue": self.gpu_queue,
            "in_flight": self.in_flight, "failures": dict(self.failures),
            "elapsed_s": round(self.elapsed, 2),
            "islands": [{k: v for k, v in isl.items()} for isl in self.islands],
        }


@dataclass
class Pending:
    """A candidate between proposal and its recorded evaluation.

    ``pre_stages``: the driver-side verdicts so far (policy, then compile). ``so_bytes``:
    the built shared object once compiled. ``compile_attempts`` / ``gpu_attempts``: how
    often it was sent (a worker death costs one retry, see :mod:`evo.engine.recovery`).
    ``gpu_seq``: order of submission to the GPU actors (finds who was running at a death).
    """

    candidate: Candidate
    pre_stages: tuple[StageResult, ...] = ()
    so_bytes: bytes | None = None
    gpu_attempts: int = 0
    gpu_seq: int = 0
    compile_attempts: int = 0


def member_of(cand: Candidate, ev: Evaluation, descriptor: Callable[[dict[str, str]], tuple]) -> Member:
    """The island member for an evaluated candidate (incorrect ones carry their error)."""
    failed = ev.failed_stage
    return Member(candidate=cand, fitness=ev.fitness if ev.correct else None, status=ev.status,
                  descriptor=descriptor(cand.params_dict), error=(failed.reason if failed else ""))
