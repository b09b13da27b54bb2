"""One profile: the cache, then this process's judge profiling the candidate's runner under
ncu (:func:`profile_candidate`); where ncu is (:func:`find_ncu`) and the GPU's name for the
cache key (:func:`gpu_name`). What a failure means: the candidate's, a non-ok stage result;
the profiler's, :class:`~evaluators.profile.settings.ProfileError`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from typing import Any, Mapping, Sequence

from evaluators.profile.cache import ProfileCache, profile_key
from evaluators.profile.settings import STAGE, NcuNotFoundError, ProfileSettings
from evo.core.records import Candidate, StageResult, Status

log = logging.getLogger(__name__)


def find_ncu(ncu: str = "ncu") -> str:
    """Path of the ncu executable: ``ncu`` as given (path or PATH name), else the CUDA
    toolkit's ``/usr/local/cuda/bin/ncu``; :class:`NcuNotFoundError` if none exists."""
    if os.sep in ncu and os.access(ncu, os.X_OK):
        return ncu
    found = shutil.which(ncu)
    if found:
        return found
    for cand in (os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "ncu"),
                 "/usr/local/cuda/bin/ncu"):
        if os.access(cand, os.X_OK):
            return cand
    raise NcuNotFoundError(
        f"Nsight Compute (ncu) not found as {ncu!r}, on PATH, or in $CUDA_HOME/bin; install it "
        "(it ships with the CUDA toolkit) or set profile.ncu to its path, or disable profiling "
        "with profile.enabled = false"
    )


def gpu_name(device: int = 0) -> str:
    """The name nvidia-smi gives GPU ``device`` (among visible devices), without touching
    CUDA here; ``""`` when unknown (then nothing is cached)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [x.strip() for x in visible.split(",") if x.strip()]
    target = ids[device] if device < len(ids) else str(device)
    try:
        out = subprocess.run(["nvidia-smi", f"--id={target}", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip().splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else ""


def _shape_dict(task: Any, shape: int | Mapping[str, int]) -> dict[str, int]:
    if isinstance(shape, int):
        shapes = task.shapes
        if not 0 <= shape < len(shapes):
            raise ValueError(f"shape index {shape} out of range: task {task.name} has {len(shapes)} shapes")
        return {str(k): int(v) for k, v in shapes[shape].items()}
    return {str(k): int(v) for k, v in shape.items()}



def profile_candidate(
    candidate: Candidate,
    so_bytes: bytes,
    task: Any,
    shape: int | Mapping[str, int],
    *,
    settings: ProfileSettings,
    gpu: str | None = None,
    task_files: Sequence[str] = (),
    harness: Any = None,
) -> StageResult:
    """Profile one built candidate on one shape under ncu; a StageResult named ``profile``.

    This process's judge profiles it through a sandboxed runner
    (:func:`evaluators.judge.profile.profile_with_runner`). ``task``: a
    :class:`~evo.tasks.base.Task` (or its name: a built-in task or one of ``task_files``);
    ``shape``: an index into ``task.shapes`` or the shape dict. ``gpu``: the GPU's name for
    the cache key (default: asked of nvidia-smi). ``harness``: the evaluations'
    :class:`~evaluators.base.HarnessSettings` (default: one with ``task_files``). Metrics:
    :func:`~evaluators.profile.report.summarize`'s dict plus ``shape``, ``gpu``, ``cached``,
    ``ncu_wall_s``, ``ncu_kernel_ms`` and ``profiled_by``. Raises :class:`~evaluators.profile.settings.ProfileError` when
    the profiler itself cannot run (:mod:`evaluators.profile`). Profiles are cached under keys
    that name the judge, and a cached entry is served only when the judge made it.
    """
    if not isinstance(task, str) and not hasattr(task, "shapes"):
        raise TypeError(f"task must be a Task or a task name, not {type(task).__name__}")
    if isinstance(task, str):
        from evo.tasks.registry import BUILTIN_TASKS

        task = BUILTIN_TASKS.with_files(task_files).get(task)
    shp = _shape_dict(task, shape)
    sha = hashlib.sha256(bytes(so_bytes)).hexdigest()
    gpu = gpu if gpu is not None else gpu_name()
    metrics = list(dict.fromkeys(settings.metrics))
    cache = ProfileCache(settings.cache_dir) if settings.cache_dir and gpu else None
    key = profile_key(sha, shp, gpu, [*metrics, "profiled_by=judge"])
    if cache is not None:
        hit = cache.get(key)
        if hit is not None and hit.get("profiled_by") == "judge":
            log.debug("profile cache hit for %s on %s", candidate.short_id, shp)
            return StageResult(STAGE, Status.OK, metrics={**hit, "cached": True})
    from evaluators.base import HarnessSettings
    from evaluators.judge import judge_for
    from evaluators.judge.profile import profile_with_runner

    hs = harness if harness is not None else HarnessSettings(task_files=tuple(task_files))
    res = profile_with_runner(judge_for("cuda"), candidate.id, bytes(so_bytes), task.name, shp,
                              settings=settings, harness=hs, task_files=tuple(task_files), gpu=gpu)
    if cache is not None and res.status is Status.OK:
        cache.put(key, {k: v for k, v in res.metrics.items() if k != "cached"})
    return res
