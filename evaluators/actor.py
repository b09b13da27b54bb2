"""The GPU evaluator actor: one per GPU, a small scheduler over its GPU.

The actor itself never touches CUDA: for every candidate it calls the injected
``evaluate_fn`` (by default :func:`evaluators.pipeline.evaluate_built`), which runs the
candidate's correctness and timing each in a fresh isolated process pinned to the GPU Ray
assigned to this actor (Ray sets ``CUDA_VISIBLE_DEVICES``). A kernel that faults, hangs or
segfaults therefore takes down only that child process; the actor survives and the next
candidate runs on a clean context.

Several calls run at once (Ray threads, ``max_concurrency`` = :meth:`GpuEvaluator.concurrency`):
the actor's :class:`~evaluators.warm.WarmPool` keeps harness children started before their
candidates (off the critical path), and its :class:`~evaluators.gpu_schedule.GpuSchedule`
lets up to ``check_concurrency`` correctness processes share the GPU while a timing
process (or an ncu profile) has it alone. The actor's creator says whether ``evaluate_fn``
takes the pool (``pooled``, from :attr:`evo.engine.seams.Stages.evaluate_takes_pool`); one that
does not knows nothing of the schedule: its calls run one at a time, each with the GPU to itself.

Each result carries its wall-clock start and end (slot occupancy), the seconds its
correctness and timing stages took (the harness's own GPU-time accounting) and the GPU's
sampled activity so far (:mod:`evaluators.activity`; ``None`` where NVML cannot be read).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

from evaluators.activity import ActivitySampler
from evaluators.base import HarnessSettings
from evaluators.gpu_schedule import GpuSchedule
from evaluators.warm import WarmPool
from evo.core.records import Candidate, Evaluation

__all__ = ["GpuEvaluator", "GpuResult", "EvaluateFn"]

log = logging.getLogger(__name__)

#: (candidate, so_bytes, settings[, pool=WarmPool]) -> Evaluation
EvaluateFn = Callable[..., Evaluation]

#: the stages whose seconds are GPU time (the harness's own accounting)
GPU_STAGES = ("correctness", "timing")


@dataclass(frozen=True)
class GpuResult:
    """An evaluation plus where and when it ran.

    ``started``/``finished``: wall clock of the call (slot occupancy). ``gpu_stage_s``: the
    seconds of its correctness and timing stages. ``activity``: the GPU's mean sampled
    utilisation (0..1) since the actor started and the number of samples, ``None`` when
    not measured.
    """

    evaluation: Evaluation
    started: float
    finished: float
    worker: str
    gpu_stage_s: float = 0.0
    activity: tuple[float, int] | None = None
    #: when the actor's set-up began and ended (epoch seconds): the run's start-up, in its events
    actor_init: tuple[float, float] | None = None


def _warm_judge(settings: HarnessSettings) -> None:
    """The first candidate's runner started (:meth:`evaluators.judge.judge.Judge.start_runner`:
    its process comes up meanwhile), the GPU actor's judge warmed
    (:meth:`~evaluators.judge.judge.Judge.warm`), then the run's tasks prepared
    (:meth:`~evaluators.judge.judge.Judge.prepare`); a failure is only logged: the first
    evaluation meets it again, and reports it as ours."""
    try:
        import torch

        if not torch.cuda.is_available():
            return
        from evaluators.judge import judge_for

        judge = judge_for("cuda")
        judge.start_runner(settings)
        judge.warm()
        judge.prepare(settings.warm_tasks, settings)
    except Exception as e:  # noqa: BLE001 - the first evaluation raises it for real
        log.warning("warming the judge failed (the first evaluation will try again): %s", e)


class GpuEvaluator:
    """Plain class; ``evo.engine.runtime`` wraps it with ``ray.remote(num_gpus=1, max_concurrency=...)``.

    Contract: ``evaluate`` is called by the engine's driver only, with a candidate that
    passed policy and compile, possibly from several threads at once; it returns a
    :class:`GpuResult` for every candidate (failures included) and raises only when the
    evaluation machinery itself is broken.
    """

    def __init__(self, evaluate_fn: EvaluateFn | None, settings: HarnessSettings,
                 profile_fn: Callable | None = None, *, pooled: bool) -> None:
        self._profile = profile_fn
        init_t0 = time.time()
        default_evaluate = evaluate_fn is None
        if evaluate_fn is None:
            from evaluators.pipeline import evaluate_built

            evaluate_fn = evaluate_built
        self._evaluate = evaluate_fn
        #: the evaluate function takes ``mode`` (evaluate_built does; a stand-in need not)
        self._takes_mode = default_evaluate
        #: the function takes the pool (and obeys its schedule) itself
        self._pooled = pooled
        self._settings = settings
        self.schedule = GpuSchedule(check_concurrency=settings.check_concurrency)
        self.pool = WarmPool(self.schedule, warm_children=settings.warm_children)
        from evaluators.timeouts import TimeoutBudget

        #: per-task timeouts from this GPU's passing evaluations: a hang costs seconds
        self._timeouts = TimeoutBudget()
        self._lock = threading.Lock()   # the budget is shared by the actor's threads
        if settings.task_files and profile_fn is None:
            # The profiler looks the task up in this process from the same files (the harness
            # child loads them itself from the job); a file that fails here fails there too.
            from evo.tasks.registry import BUILTIN_TASKS

            BUILTIN_TASKS.with_files(settings.task_files)
        self._worker = f"{socket.gethostname()}:gpu{os.environ.get('CUDA_VISIBLE_DEVICES', '?')}"
        self.activity = ActivitySampler.for_visible_gpu()
        if settings.isolation == "judge" and default_evaluate:
            # the judge's CUDA context and check kernels, made while the first kernels compile
            threading.Thread(target=_warm_judge, args=(settings,), name="evo-judge-warm", daemon=True).start()
        self._init = (init_t0, time.time())

    @staticmethod
    def concurrency(settings: HarnessSettings, *, pooled: bool) -> int:
        """Calls the actor runs at once (``max_concurrency`` in Ray): pooled, every correctness
        slot, one timing, and one more waiting so that no gap opens between candidates;
        unpooled, one."""
        return settings.check_concurrency + 2 if pooled else 1

    @staticmethod
    def slots(settings: HarnessSettings, *, pooled: bool) -> int:
        """Requests the engine keeps on one actor (a runtime's ``gpu_slots``): pooled, each
        correctness slot and one queued; unpooled, the running call and one queued."""
        return settings.check_concurrency + 1 if pooled else 2

    def evaluate(self, candidate: Candidate, so_bytes: bytes, mode: str | None = None) -> GpuResult:
        """``mode``: None (correctness, then timing) or ``"time-only"`` (a re-timing;
        :meth:`evo.engine.seams.ClusterRuntime.submit_gpu`)."""
        t0 = time.time()
        with self._lock:
            settings = self._timeouts.settings_for(candidate.task, self._settings)
        kw = {"mode": mode} if mode is not None and self._takes_mode else {}
        if self._pooled:
            ev = self._evaluate(candidate, so_bytes, settings, pool=self.pool, **kw)
        else:
            with self.schedule.exclusive("time"):
                ev = self._evaluate(candidate, so_bytes, settings, **kw)
        with self._lock:
            self._timeouts.record(candidate.task, ev.env or {}, passed=ev.correct)
        t1 = time.time()
        log.debug("%s evaluated %s in %.2fs: %s", self._worker, candidate.short_id, t1 - t0, ev.status.value)
        gpu_s = sum(s.seconds for s in ev.stages if s.stage in GPU_STAGES)
        return GpuResult(evaluation=ev, started=t0, finished=t1, worker=self._worker,
                         gpu_stage_s=gpu_s, activity=self.activity.mean(), actor_init=self._init)

    def profile(self, candidate: Candidate, so_bytes: bytes, shape_idx: int, settings):
        """Delayed ncu profile of one benchmark shape (``evaluators.profile``); raises
        ``ProfileError`` when the profiler itself cannot run. With the evaluations'
        ``isolation = "judge"`` the actor's judge profiles it through a sandboxed runner
        (:mod:`evaluators.judge.profile`), else ncu runs around the harness's profile child."""
        with self.schedule.exclusive("profile"):   # ncu measures: nothing else on the GPU
            if self._profile is not None:
                return self._profile(candidate, so_bytes, shape_idx, settings)
            from evaluators.profile import profile_candidate

            return profile_candidate(candidate, so_bytes, candidate.task, shape_idx, settings=settings,
                                     task_files=self._settings.task_files, isolation=self._settings.isolation,
                                     harness=self._settings)

    def close(self) -> None:
        """Kill the warm children (their directories go too) and stop sampling."""
        self.pool.close()
        self.activity.stop()

    def worker(self) -> str:
        return self._worker
