"""One profile run: ``ncu`` around ``python -m evaluators.child.profile JOBDIR`` in its own
process group with a wall-clock timeout (:func:`profile_candidate`), and what its failures
mean (the candidate's: a non-ok stage result; the profiler's: :class:`ProfileError`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from evaluators.profile.cache import ProfileCache, profile_key
from evaluators.profile.report import classify_roofline, parse_ncu_csv, summarize
from evaluators.profile.settings import NVTX_RANGE, STAGE, NcuNotFoundError, ProfileError, ProfileSettings
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


def build_ncu_command(ncu: str, settings: ProfileSettings, jobdir: Path, log_file: Path,
                      metrics: Sequence[str], python: str | None = None) -> list[str]:
    """The ncu command line (:mod:`evaluators.profile`)."""
    return [
        ncu, "--clock-control", "none", "--target-processes", "all",
        "--nvtx", "--nvtx-include", f"{NVTX_RANGE}/",
        "--launch-count", str(settings.launch_count),
        "--csv", "--page", "raw", "--print-units", "base",
        "--metrics", ",".join(metrics),
        "--log-file", str(log_file),
        python or sys.executable, "-m", "evaluators.child.profile", str(jobdir),
    ]


_PERM_MARKERS = ("ERR_NVGPUCTRPERM", "permission to access NVIDIA GPU Performance Counters")


def _shape_dict(task: Any, shape: int | Mapping[str, int]) -> dict[str, int]:
    if isinstance(shape, int):
        shapes = task.shapes
        if not 0 <= shape < len(shapes):
            raise ValueError(f"shape index {shape} out of range: task {task.name} has {len(shapes)} shapes")
        return {str(k): int(v) for k, v in shapes[shape].items()}
    return {str(k): int(v) for k, v in shape.items()}


def _run_group(argv: list[str], env: dict[str, str], cwd: Path, timeout: float,
               stdout: Path, stderr: Path) -> tuple[int | None, float]:
    """Run ``argv`` in its own session; kill the whole group on timeout. (rc or None, wall s)."""
    t0 = time.monotonic()
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        proc = subprocess.Popen(argv, cwd=str(cwd), env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err, start_new_session=True, close_fds=True)
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    return rc, time.monotonic() - t0


def _tail(path: Path, n: int = 3000) -> str:
    try:
        t = path.read_text(errors="replace")
    except OSError:
        return ""
    return t[-n:].strip()


def profile_candidate(
    candidate: Candidate,
    so_bytes: bytes,
    task: Any,
    shape: int | Mapping[str, int],
    *,
    settings: ProfileSettings,
    gpu: str | None = None,
    task_files: Sequence[str] = (),
    python: str | None = None,
    keep_dir: bool = False,
    isolation: str = "harness",
    harness: Any = None,
) -> StageResult:
    """Profile one built candidate on one shape under ncu; a StageResult named ``profile``.

    ``task``: a :class:`~evo.tasks.base.Task` (or its name: a built-in task or one of
    ``task_files``); ``shape``: an index
    into ``task.shapes`` or the shape dict. ``gpu``: the GPU's name for the cache key
    (default: asked of nvidia-smi). Metrics: :func:`summarize`'s dict plus ``shape``,
    ``gpu``, ``cached``, ``ncu_wall_s``. Raises :class:`ProfileError` when the profiler
    itself cannot run (:mod:`evaluators.profile`).

    ``isolation`` (the evaluation's ``HarnessSettings.isolation``): ``"harness"`` runs ncu
    around the profile child below (which loads the candidate unsandboxed); ``"judge"`` has
    this process's judge profile it through a sandboxed runner
    (:func:`evaluators.judge.profile.profile_with_runner`; ``harness``: the
    :class:`~evaluators.base.HarnessSettings`, default one with ``task_files``; ``python`` and
    ``keep_dir`` do not apply). Its profiles are cached under keys of their own, so a profile
    the harness path made is never served as the judge's.
    """
    if isolation not in ("harness", "judge"):
        raise ValueError(f"isolation {isolation!r}: expected 'harness' or 'judge'")
    if not isinstance(task, str) and not hasattr(task, "shapes"):
        raise TypeError(f"task must be a Task or a task name, not {type(task).__name__}")
    if isinstance(task, str):
        from evo.tasks.registry import BUILTIN_TASKS

        task = BUILTIN_TASKS.with_files(task_files).get(task)
    shp = _shape_dict(task, shape)
    sha = hashlib.sha256(bytes(so_bytes)).hexdigest()
    gpu = gpu if gpu is not None else gpu_name(settings.device)
    metrics = list(dict.fromkeys(settings.metrics))
    cache = ProfileCache(settings.cache_dir) if settings.cache_dir and gpu else None
    key = profile_key(sha, shp, gpu, metrics if isolation == "harness" else [*metrics, "profiled_by=judge"])
    if cache is not None:
        hit = cache.get(key)
        if hit is not None and (isolation == "harness" or hit.get("profiled_by") == "judge"):
            log.debug("profile cache hit for %s on %s", candidate.short_id, shp)
            return StageResult(STAGE, Status.OK, metrics={**hit, "cached": True})
    if isolation == "judge":
        from evaluators.base import HarnessSettings
        from evaluators.judge import judge_for
        from evaluators.judge.profile import profile_with_runner

        hs = harness if harness is not None else HarnessSettings(task_files=tuple(task_files), isolation="judge")
        res = profile_with_runner(judge_for("cuda"), candidate.id, bytes(so_bytes), task.name, shp,
                                  settings=settings, harness=hs, task_files=tuple(task_files), gpu=gpu)
        if cache is not None and res.status is Status.OK:
            cache.put(key, {k: v for k, v in res.metrics.items() if k != "cached"})
        return res
    ncu = find_ncu(settings.ncu)
    from evaluators.isolation import child_env

    jobdir = Path(tempfile.mkdtemp(prefix="evo-profile-"))
    t0 = time.monotonic()
    try:
        (jobdir / "kernel.so").write_bytes(bytes(so_bytes))
        os.chmod(jobdir / "kernel.so", 0o700)
        (jobdir / "job.json").write_text(json.dumps({
            "task": task.name, "task_files": [str(Path(f).resolve()) for f in task_files],
            "candidate_id": candidate.id, "shape": shp, "seed": settings.seed,
            "warmup": settings.warmup, "nvtx_range": NVTX_RANGE, "so": "kernel.so",
        }))
        env = child_env(settings.device, jobdir)
        # ncu keeps its own temp / lock files; give it the job's private tmp.
        env.setdefault("HOME", str(jobdir))
        log_file = jobdir / "ncu.csv"
        argv = build_ncu_command(ncu, settings, jobdir, log_file, metrics, python)
        rc, wall = _run_group(argv, env, jobdir, settings.timeout_s, jobdir / "stdout.log",
                              jobdir / "stderr.log")
        out_text = _tail(log_file, 400_000) if log_file.exists() else ""
        err_text = _tail(jobdir / "stderr.log") + "\n" + _tail(jobdir / "stdout.log")
        if rc is None:
            return StageResult(STAGE, Status.TIMEOUT,
                               f"ncu run timed out after {settings.timeout_s:g}s (process group killed)",
                               metrics={"shape": shp, "gpu": gpu},
                               artifacts={"stderr": err_text[-2000:]}, seconds=time.monotonic() - t0)
        both = out_text + "\n" + err_text
        if any(m in both for m in _PERM_MARKERS):
            raise ProfileError(
                "ncu has no permission to read the GPU performance counters (ERR_NVGPUCTRPERM); "
                "run as root or set the driver option NVreg_RestrictProfilingToAdminUsers=0, or "
                "disable profiling with profile.enabled = false"
            )
        result = _read_child_result(jobdir)
        if result is not None and not result.get("ok", False):
            return StageResult(STAGE, Status.CRASH,
                               f"candidate failed under ncu: {result.get('error', 'unknown error')}",
                               metrics={"shape": shp, "gpu": gpu},
                               artifacts={"stderr": err_text[-2000:]}, seconds=time.monotonic() - t0)
        try:
            rows = [] if "No kernels were profiled" in both else parse_ncu_csv(out_text)
        except ValueError as e:
            why = "the profiled program died" if result is None else "ncu printed no CSV"
            if "==ERROR==" in both and result is not None:
                raise ProfileError(f"ncu failed (exit {rc}): {_first_error(both)}") from e
            return StageResult(STAGE, Status.CRASH, f"{why} (ncu exit {rc}): {_first_error(both)}",
                               metrics={"shape": shp, "gpu": gpu},
                               artifacts={"stderr": err_text[-2000:], "ncu": out_text[-2000:]},
                               seconds=time.monotonic() - t0)
        if not rows:
            return StageResult(STAGE, Status.CRASH,
                               f"ncu captured no kernel inside the '{NVTX_RANGE}' NVTX range: the "
                               "candidate launched nothing on this shape (or launched it from another thread)",
                               metrics={"shape": shp, "gpu": gpu},
                               artifacts={"ncu": out_text[-2000:]}, seconds=time.monotonic() - t0)
        summary = summarize(rows, metrics)
        summary.update({"shape": shp, "gpu": gpu or (result or {}).get("gpu", ""), "so_sha256": sha,
                        "ncu_wall_s": round(wall, 3),
                        "child_wall_s": (result or {}).get("seconds")})
        try:
            summary["bound"] = classify_roofline(summary, task, shp, _gpu_spec(summary["gpu"]))
        except ValueError:
            summary["bound"] = "unknown"
        if cache is not None:
            cache.put(key, summary)
        return StageResult(STAGE, Status.OK, metrics={**summary, "cached": False},
                           seconds=time.monotonic() - t0)
    finally:
        if keep_dir:
            log.info("kept profile job dir %s", jobdir)
        else:
            shutil.rmtree(jobdir, ignore_errors=True)


def _gpu_spec(name: str) -> Any:
    try:
        from evo.tasks.gpus import match_gpu

        return match_gpu(name) if name else None
    except ImportError:  # pragma: no cover - evo.tasks imports torch
        return None


def _first_error(text: str) -> str:
    for ln in text.splitlines():
        if "==ERROR==" in ln or "Error" in ln:
            return ln.strip()[:500]
    return text.strip().splitlines()[-1][:500] if text.strip() else "no output"


def _read_child_result(jobdir: Path) -> dict[str, Any] | None:
    p = jobdir / "result.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None
