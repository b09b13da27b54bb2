"""The cascade for one candidate: policy -> compile -> correctness + timing (isolated GPU process).

Two entry points:

- :func:`check_kernel` — ``evo check``: a source file in, every stage's result out. Without
  a CUDA GPU the GPU stages come back ``skipped`` with :data:`NO_GPU_REASON`.
- :func:`evaluate_built` — the engine's GPU actor: a candidate that already passed policy and
  compile (``so_bytes`` from a CPU compile worker) in, an :class:`~evo.records.Evaluation` out.

Neither initialises CUDA in the calling process: the GPU work happens in the child spawned
by :func:`evaluators.isolation.run_isolated`, and :func:`gpu_available` asks ``nvidia-smi``
and a throwaway subprocess, never ``torch.cuda`` here.
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess
import sys
from typing import Any, Mapping

from evaluators.base import CompileSettings, HarnessSettings
from evaluators.isolation import HarnessJob, HarnessReport, run_isolated
from evo.records import Candidate, Evaluation, Operator, StageResult, Status

__all__ = ["check_kernel", "evaluate_built", "gpu_available", "NO_GPU_REASON", "STAGES"]

log = logging.getLogger(__name__)

STAGES = ("policy", "compile", "correctness", "timing")
NO_GPU_REASON = (
    "no CUDA GPU on this machine: compile-only check (run on a GPU machine for correctness "
    "and timing)"
)


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """True when a child process could run CUDA work here (checked without touching CUDA).

    ``nvidia-smi -L`` must list a GPU, and a throwaway interpreter must report
    ``torch.cuda.device_count() > 0`` (a CPU-only torch build would fail the harness).
    Cached for the process lifetime.
    """
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if out.returncode != 0 or "GPU" not in out.stdout:
        return False
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
            capture_output=True, text=True, timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    try:
        return probe.returncode == 0 and int(probe.stdout.strip().splitlines()[-1]) > 0
    except (ValueError, IndexError):
        return False


def _skipped(names: tuple[str, ...], reason: str) -> tuple[StageResult, ...]:
    return tuple(StageResult(n, Status.SKIPPED, reason) for n in names)


def _mode(settings: HarnessSettings) -> str:
    return "check" if settings.check_only else "check+time"


def check_kernel(
    source: str,
    task: str,
    params: Mapping[str, Any] | None = None,
    *,
    compile_settings: CompileSettings,
    harness_settings: HarnessSettings,
    gpu: bool | None = None,
    task_files: tuple[str, ...] = (),
    shapes: tuple[int, ...] | None = None,
) -> tuple[StageResult, ...]:
    """Run every stage on one kernel source; always returns four results (policy, compile,
    correctness, timing), later ones ``skipped`` with the reason when an earlier one failed.

    ``gpu``: ``None`` = detect (:func:`gpu_available`); ``True`` forces the GPU stages (a
    child without CUDA then raises :class:`~evaluators.isolation.HarnessError`); ``False``
    skips them. ``shapes``: indices of the task's shapes to check (``None``: all).
    """
    from evaluators.compile import compile_candidate
    from evaluators.policy import check_policy

    cand = Candidate.create(task, source, params, operator=Operator.USER)
    pol = check_policy(source)
    if not pol.passed:
        return (pol,) + _skipped(STAGES[1:], f"not run: policy {pol.status.value}")
    outcome = compile_candidate(cand, compile_settings)
    comp = outcome.result
    if not comp.passed or not outcome.so_bytes:
        return (pol, comp) + _skipped(STAGES[2:], f"not run: compile {comp.status.value}")
    use_gpu = gpu_available() if gpu is None else gpu
    if not use_gpu:
        return (pol, comp) + _skipped(STAGES[2:], NO_GPU_REASON)
    report = run_isolated(
        HarnessJob(task=task, candidate_id=cand.id, so_bytes=outcome.so_bytes,
                   params=cand.params, mode=_mode(harness_settings), task_files=task_files,
                   shapes=shapes),
        harness_settings,
    )
    return (pol, comp) + report.stages


def evaluate_built(
    candidate: Candidate,
    so_bytes: bytes,
    settings: HarnessSettings,
    *,
    prior: tuple[StageResult, ...] = (),
    mode: str | None = None,
    task_files: tuple[str, ...] = (),
) -> Evaluation:
    """Correctness + timing of a built candidate in a fresh isolated process.

    ``prior``: the policy/compile results to put in front (the engine may pass them).
    ``mode``: ``"time-only"`` re-times an already-correct candidate (champion
    re-confirmation); default ``check`` or ``check+time`` from ``settings.check_only``.
    Fitness is set only when every stage passed.
    """
    report: HarnessReport = run_isolated(
        HarnessJob(task=candidate.task, candidate_id=candidate.id, so_bytes=so_bytes,
                   params=candidate.params, mode=mode or _mode(settings), task_files=task_files),
        settings,
    )
    stages = tuple(prior) + report.stages
    ok = all(s.status in (Status.OK, Status.SKIPPED) for s in stages)
    timed = any(s.stage == "timing" and s.status is Status.OK for s in stages)
    return Evaluation(
        candidate_id=candidate.id,
        stages=stages,
        fitness=report.fitness if (ok and timed) else None,
        gpu=report.env.get("gpu", ""),
        env=dict(report.env),
    )
