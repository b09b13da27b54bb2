"""The records of the isolated harness, shared by its parent side: the job a child runs
(:class:`HarnessJob`), what it reports (:class:`HarnessReport`, :class:`ShapeTiming`), the
error for a failure of the harness itself (:class:`HarnessError`), the job directory's JSON
(``job.json``, a warm child's ``spec.json``) and the child's scrubbed environment
(:func:`child_env`). :mod:`evaluators.isolation` (``run_isolated``) and
:mod:`evaluators.child_process` (one child's life) build on it; it starts nothing.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from evaluators.base import HarnessSettings, InfrastructureError
from evaluators.child.protocol import MODES, PROTOCOL_VERSION
from evo.core.records import StageResult, Status

__all__ = ["HarnessJob", "HarnessReport", "ShapeTiming", "HarnessError", "HARNESS_FIXES", "STDERR_TAIL", "child_env",
           "spec_json", "job_json"]

log = logging.getLogger(__name__)

#: Characters of a dead child's stderr kept in its crash reason and artifacts.
STDERR_TAIL = 4000
_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL", "PASSWD")
_ENV_KEEP = {"PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "LD_LIBRARY_PATH", "PYTHONPATH",
             "USER", "LOGNAME", "SHELL", "TERM"}
# Driver / library knobs the child must see (e.g. NCCL_NVLS_ENABLE=0 on shared hosts).
_ENV_KEEP_PREFIXES = ("CUDA_", "NVIDIA_", "NCCL_", "NVSHMEM_", "TORCH_", "CUBLAS_", "OMP_")


class HarnessError(InfrastructureError):
    """The harness itself failed (not the candidate): a bug, a task the child cannot load, or
    a broken GPU environment. ``kind`` is the child's classification (``task``: the task or
    its file could not be loaded there; ``cuda``: no usable GPU; ``sandbox``: confinement
    failed; ``bug``: anything else)."""

    def __init__(self, message: str, *, fix: str = "", detail: str = "", kind: str = "bug") -> None:
        super().__init__(message, fix=fix, detail=detail)
        self.kind = kind

    def __reduce__(self):
        return (_rebuild_harness_error, (str(self), self.fix, self.detail, self.kind))


def _rebuild_harness_error(message: str, fix: str, detail: str, kind: str) -> "HarnessError":
    return HarnessError(message, fix=fix, detail=detail, kind=kind)


#: What the user can do about each kind of harness failure (the CLI prints it with the cause).
HARNESS_FIXES = {
    "task": "check the task file with `evo tasks --task-file FILE` and the seed with "
            "`evo check SEED.cu --task NAME --task-file FILE`; every file in [tasks] files is "
            "imported by the GPU process",
    "cuda": "run the GPU stages on a machine whose GPU the harness can see (nvidia-smi, and "
            "`python -c \"import torch; print(torch.cuda.is_available())\"` with the same Python)",
    "sandbox": "see docs/SECURITY.md for the sandbox's switches (EVO_SANDBOX_*)",
    "reference": "torch.compile cannot compile this task's reference: set [evaluator] reference = "
                 "\"eager\" (fitness against eager PyTorch), or make the reference compilable",
    "bug": "this is a bug in the harness: report it with the log file's traceback",
}


@dataclass(frozen=True)
class HarnessJob:
    """One candidate's GPU evaluation, as the parent hands it to the child.

    ``params``: the candidate's tunables (already compiled into ``so_bytes``; kept for the
    record). ``shapes``: indices into ``task.shapes`` to check (``None`` = all; the timing
    stage always uses the task's benchmark shapes unless ``bench_shapes`` is given).
    ``task_files``: Python files that define user tasks, imported by the child before the
    registry lookup. ``seed``: base seed of the trial inputs (``None`` = fresh random,
    recorded in the metrics so any failure can be replayed).
    """

    task: str
    candidate_id: str
    so_bytes: bytes
    params: tuple[tuple[str, str], ...] = ()
    mode: str = "check+time"
    shapes: tuple[int, ...] | None = None
    bench_shapes: tuple[int, ...] | None = None
    task_files: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"HarnessJob.mode={self.mode!r}; valid modes: {', '.join(MODES)}")
        if not isinstance(self.so_bytes, (bytes, bytearray)) or not self.so_bytes:
            raise ValueError("HarnessJob.so_bytes must be the non-empty bytes of the built .so")


@dataclass(frozen=True)
class ShapeTiming:
    """Timing of one benchmark shape: candidate and reference medians/IQRs in ms."""

    shape: dict[str, int]
    median_ms: float
    iqr_ms: float
    ref_median_ms: float
    ref_iqr_ms: float
    speedup: float
    sol_ms: float | None = None
    #: against the reference under torch.compile, when it was timed (evaluators.child.reference)
    compile_ref_median_ms: float | None = None
    compile_ref_iqr_ms: float | None = None
    compile_speedup: float | None = None

    @classmethod
    def from_row(cls, r: Mapping[str, Any]) -> "ShapeTiming":
        """One shape's row of a timing stage's ``metrics["shapes"]`` (or a report's
        ``timings``) as a record."""
        return cls(shape={str(k): int(v) for k, v in r["shape"].items()}, median_ms=float(r["median_ms"]),
                   iqr_ms=float(r["iqr_ms"]), ref_median_ms=float(r["ref_median_ms"]),
                   ref_iqr_ms=float(r["ref_iqr_ms"]), speedup=float(r["speedup"]),
                   sol_ms=None if r.get("sol_ms") is None else float(r["sol_ms"]),
                   **{k: float(r[k]) for k in ("compile_ref_median_ms", "compile_ref_iqr_ms", "compile_speedup")
                      if r.get(k) is not None})


@dataclass(frozen=True)
class HarnessReport:
    """What one isolated run produced: stage results, fitness, per-shape timings, environment.

    ``stages`` holds ``correctness`` and ``timing`` (in that order; a stage not run is
    ``skipped``). ``fitness`` is the geometric-mean speedup, ``None`` unless both passed.
    ``env`` records GPU name, driver, CUDA, torch, clocks, protocol version and reps.
    """

    stages: tuple[StageResult, ...]
    fitness: float | None = None
    timings: tuple[ShapeTiming, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    returncode: int | None = None

    @property
    def passed(self) -> bool:
        return all(s.status in (Status.OK, Status.SKIPPED) for s in self.stages) and any(
            s.status is Status.OK for s in self.stages
        )

    def stage(self, name: str) -> StageResult | None:
        for s in self.stages:
            if s.stage == name:
                return s
        return None


def spec_json(task: str, mode: str, settings: HarnessSettings, *, task_files: tuple[str, ...] = (),
              bench_shapes: tuple[int, ...] | None = None, seed: int | None = None) -> dict[str, Any]:
    """What a warm child is prepared for before its candidate exists (``JOBDIR/spec.json``):
    every key of :func:`job_json` but the candidate's own (``candidate_id``, ``params``,
    ``shapes``). ``seed`` only draws the inputs of the compiled reference's warm-up."""
    return {
        "protocol": PROTOCOL_VERSION,
        "task": task,
        "mode": mode,
        "bench_shapes": list(bench_shapes) if bench_shapes is not None else None,
        "task_files": [str(Path(f).resolve()) for f in (task_files or settings.task_files)],
        "seed": secrets.randbits(62) if seed is None else seed,
        "settings": asdict(settings),
        "so": "kernel.so",
    }


def job_json(job: HarnessJob, settings: HarnessSettings, seed: int) -> dict[str, Any]:
    return {
        "protocol": PROTOCOL_VERSION,
        "task": job.task,
        "candidate_id": job.candidate_id,
        "params": [list(p) for p in job.params],
        "mode": job.mode,
        "shapes": list(job.shapes) if job.shapes is not None else None,
        "bench_shapes": list(job.bench_shapes) if job.bench_shapes is not None else None,
        "task_files": [str(Path(f).resolve()) for f in (job.task_files or settings.task_files)],
        "seed": seed,
        "settings": asdict(settings),
        "so": "kernel.so",
    }


# ----------------------------------------------------------------------------- env


def _project_root() -> Path:
    return Path(__file__).resolve().parent.parent


def child_env(device: int, jobdir: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: a whitelist of the parent's, minus anything secret-looking.

    ``CUDA_VISIBLE_DEVICES`` pins the child to ``device``, an index into the parent's own
    visible devices when the parent is itself restricted (e.g. a Ray GPU actor).
    """
    base = dict(os.environ if base is None else base)
    env: dict[str, str] = {}
    for k, v in base.items():
        if any(m in k.upper() for m in _SECRET_MARKERS):
            continue
        if k in _ENV_KEEP or k.startswith(_ENV_KEEP_PREFIXES):
            env[k] = v
    visible = base.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [x.strip() for x in visible.split(",") if x.strip()]
        if not 0 <= device < len(ids):
            raise HarnessError(
                f"device {device} is not among the parent's CUDA_VISIBLE_DEVICES={visible!r}; "
                f"use an index in 0..{len(ids) - 1}"
            )
        env["CUDA_VISIBLE_DEVICES"] = ids[device]
    else:
        env["CUDA_VISIBLE_DEVICES"] = str(device)
    root = str(_project_root())
    pp = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = root + (os.pathsep + pp if pp else "")
    tmp = jobdir / "tmp"
    tmp.mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("PATH", os.defpath)
    return env
