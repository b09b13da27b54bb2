"""The GPU evaluator actor: one per GPU, evaluates built candidates one at a time.

The actor itself never touches CUDA: for every candidate it calls the injected
``evaluate_fn`` (by default :func:`evaluators.pipeline.evaluate_built`), which spawns a fresh
isolated process pinned to the GPU Ray assigned to this actor (Ray sets
``CUDA_VISIBLE_DEVICES``). A kernel that faults, hangs or segfaults therefore takes down
only that child process; the actor survives and the next candidate runs on a clean
context. The actor reports wall-clock start/end of each evaluation so the engine can
compute the GPU busy fraction honestly (time actually spent evaluating).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Callable

from evaluators.base import HarnessSettings
from evo.records import Candidate, Evaluation

__all__ = ["GpuEvaluator", "GpuResult", "EvaluateFn"]

log = logging.getLogger(__name__)

#: (candidate, so_bytes, settings) -> Evaluation
EvaluateFn = Callable[[Candidate, bytes, HarnessSettings], Evaluation]


@dataclass(frozen=True)
class GpuResult:
    """An evaluation plus where and when it ran (for busy-time accounting)."""

    evaluation: Evaluation
    started: float
    finished: float
    worker: str


class GpuEvaluator:
    """Plain class; ``evo.runtime`` wraps it with ``ray.remote(num_gpus=1)``.

    Contract: ``evaluate`` is called by the engine's driver only, with a candidate that
    passed policy and compile; it returns a :class:`GpuResult` for every candidate
    (failures included) and raises only when the evaluation machinery itself is broken.
    """

    def __init__(self, evaluate_fn: EvaluateFn | None, settings: HarnessSettings,
                 profile_fn: Callable | None = None) -> None:
        self._profile = profile_fn
        if evaluate_fn is None:
            from evaluators.pipeline import evaluate_built

            evaluate_fn = evaluate_built
        self._evaluate = evaluate_fn
        self._settings = settings
        from evaluators.timeouts import TimeoutBudget

        #: per-task timeouts from this GPU's passing evaluations: a hang costs seconds
        self._timeouts = TimeoutBudget()
        if settings.task_files and profile_fn is None:
            # The profiler looks the task up in this process (the harness child loads the
            # files itself from the job); a file that fails here fails the same way there.
            from evo.tasks.user import load_task_file

            for f in settings.task_files:
                load_task_file(f)
        self._worker = f"{socket.gethostname()}:gpu{os.environ.get('CUDA_VISIBLE_DEVICES', '?')}"

    def evaluate(self, candidate: Candidate, so_bytes: bytes) -> GpuResult:
        t0 = time.time()
        settings = self._timeouts.settings_for(candidate.task, self._settings)
        ev = self._evaluate(candidate, so_bytes, settings)
        self._timeouts.record(candidate.task, ev.env or {}, passed=ev.correct)
        t1 = time.time()
        log.debug("%s evaluated %s in %.2fs: %s", self._worker, candidate.short_id, t1 - t0, ev.status.value)
        return GpuResult(evaluation=ev, started=t0, finished=t1, worker=self._worker)

    def profile(self, candidate: Candidate, so_bytes: bytes, shape_idx: int, settings):
        """Delayed ncu profile of one benchmark shape (``evaluators.profile``); raises
        ``ProfileError`` when the profiler itself cannot run."""
        if self._profile is not None:
            return self._profile(candidate, so_bytes, shape_idx, settings)
        from evaluators.profile import profile_candidate

        return profile_candidate(candidate, so_bytes, candidate.task, shape_idx, settings=settings,
                                 task_files=self._settings.task_files)

    def worker(self) -> str:
        return self._worker
