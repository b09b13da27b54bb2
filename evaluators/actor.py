"""The GPU evaluator actor: one per GPU, the host of that GPU's judge.

For every candidate the actor calls the injected ``evaluate_fn`` (by default
:func:`evaluators.pipeline.evaluate_built`), which has this process's judge
(:mod:`evaluators.judge`, pinned to the GPU Ray assigned to this actor: Ray sets
``CUDA_VISIBLE_DEVICES``) decide it through a sandboxed runner of its own. The candidate's code
runs only in that runner: a kernel that faults, hangs or segfaults takes down only the runner;
the actor and its judge survive and the next candidate gets a fresh runner.

Several calls may wait at once (Ray threads, ``max_concurrency`` =
:meth:`GpuEvaluator.concurrency`): the judge evaluates one candidate at a time (its lock) and
starts the next one's runner while the current one is checked, so a queued call costs no GPU
time. The actor's creator says whether ``evaluate_fn`` may be called so
(``concurrent``, from :attr:`evo.engine.seams.Stages.evaluate_concurrent`); one that may not
(a stand-in) is called one call at a time.

Each result carries its wall-clock start and end (slot occupancy), the seconds its
correctness and timing stages took (the judge's own GPU-time accounting) and the GPU's
sampled activity so far (:mod:`evaluators.activity`; ``None`` where NVML cannot be read).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

from evaluators.activity import ActivitySampler
from evaluators.base import HarnessSettings
from evo.core.records import Candidate, Evaluation

__all__ = ["GpuEvaluator", "GpuResult", "EvaluateFn"]

log = logging.getLogger(__name__)

#: (candidate, so_bytes, settings[, mode=]) -> Evaluation
EvaluateFn = Callable[..., Evaluation]

#: Calls a concurrent actor runs at once: the one the judge evaluates, the next one waiting
#: for the judge's lock (its runner started meanwhile), and a profile or re-timing beside them.
CONCURRENT_CALLS = 3
#: Requests the engine keeps on one actor: the one evaluated and the next, queued.
SLOTS = 2

#: the stages whose seconds are GPU time (the judge's own accounting)
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
                 profile_fn: Callable | None = None, *, concurrent: bool) -> None:
        self._profile = profile_fn
        init_t0 = time.time()
        default_evaluate = evaluate_fn is None
        if evaluate_fn is None:
            from evaluators.pipeline import evaluate_built

            evaluate_fn = evaluate_built
        self._evaluate = evaluate_fn
        #: the evaluate function takes ``mode`` and ``baseline`` (evaluate_built does; a
        #: stand-in need not)
        self._takes_mode = default_evaluate or {"mode", "baseline"} <= set(inspect.signature(evaluate_fn).parameters)
        self._settings = settings
        #: held around every call of a function that may not be called concurrently, and
        #: around a stand-in profiler (the judge serialises its own work)
        self._one_at_a_time = None if concurrent else threading.Lock()
        self._profile_lock = threading.Lock()
        if settings.task_files and profile_fn is None:
            # The profiler looks the task up in this process from the same files as the judge;
            # a file that fails here fails there too.
            from evo.tasks.registry import BUILTIN_TASKS

            BUILTIN_TASKS.with_files(settings.task_files)
        self._worker = f"{socket.gethostname()}:gpu{os.environ.get('CUDA_VISIBLE_DEVICES', '?')}"
        self.activity = ActivitySampler.for_visible_gpu()
        if default_evaluate:
            # the judge's CUDA context and check kernels, made while the first kernels compile
            threading.Thread(target=_warm_judge, args=(settings,), name="evo-judge-warm", daemon=True).start()
        self._init = (init_t0, time.time())

    @staticmethod
    def concurrency(*, concurrent: bool) -> int:
        """Calls the actor runs at once (``max_concurrency`` in Ray): :data:`CONCURRENT_CALLS`
        when the evaluate function may be called concurrently, else one."""
        return CONCURRENT_CALLS if concurrent else 1

    @staticmethod
    def slots() -> int:
        """Requests the engine keeps on one actor (a runtime's ``gpu_slots``): :data:`SLOTS`,
        the running call and one queued so that no gap opens between candidates."""
        return SLOTS

    def evaluate(self, candidate: Candidate, so_bytes: bytes, mode: str | None = None,
                 baseline: Candidate | None = None, baseline_so: bytes | None = None) -> GpuResult:
        """``mode``: None (correctness, then timing), ``"time-only"`` (a re-timing) or
        ``"paired"`` (champion confirmation: timed call by call with ``baseline``, whose built
        binary is ``baseline_so``); :meth:`evo.engine.seams.ClusterRuntime.submit_gpu`. An
        evaluate function without modes evaluates fully."""
        t0 = time.time()
        kw: dict = {}
        if mode is not None and self._takes_mode:
            kw["mode"] = mode
            if baseline is not None and baseline_so is not None:
                kw["baseline"] = (baseline, baseline_so)
        if self._one_at_a_time is None:
            ev = self._evaluate(candidate, so_bytes, self._settings, **kw)
        else:
            with self._one_at_a_time:
                ev = self._evaluate(candidate, so_bytes, self._settings, **kw)
        t1 = time.time()
        log.debug("%s evaluated %s in %.2fs: %s", self._worker, candidate.short_id, t1 - t0, ev.status.value)
        gpu_s = sum(s.seconds for s in ev.stages if s.stage in GPU_STAGES)
        return GpuResult(evaluation=ev, started=t0, finished=t1, worker=self._worker,
                         gpu_stage_s=gpu_s, activity=self.activity.mean(), actor_init=self._init)

    def profile(self, candidate: Candidate, so_bytes: bytes, shape_idx: int, settings):
        """Delayed ncu profile of one benchmark shape (``evaluators.profile``); raises
        ``ProfileError`` when the profiler itself cannot run. The actor's judge profiles it
        through a sandboxed runner (:mod:`evaluators.judge.profile`), holding its lock: ncu
        measures with nothing else of the judge's on the GPU."""
        if self._profile is not None:
            with self._profile_lock, (self._one_at_a_time or contextlib.nullcontext()):
                return self._profile(candidate, so_bytes, shape_idx, settings)
        from evaluators.profile import profile_candidate

        return profile_candidate(candidate, so_bytes, candidate.task, shape_idx, settings=settings,
                                 task_files=self._settings.task_files, harness=self._settings)

    def close(self) -> None:
        """Stop sampling the GPU's activity."""
        self.activity.stop()

    def worker(self) -> str:
        return self._worker
