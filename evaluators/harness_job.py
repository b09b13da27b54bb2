"""The records of one GPU evaluation as its callers see them: the job
(:class:`HarnessJob`), the judge's report (:class:`HarnessReport`, :class:`ShapeTiming`), and
the error for a failure of ours (:class:`HarnessError`). The judge
(:meth:`evaluators.judge.judge.Judge.evaluate`) takes the one and returns or raises the others;
this module starts nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from evaluators.base import InfrastructureError
from evaluators.protocol import Mode
from evo.core.records import StageResult, Status

__all__ = ["HarnessJob", "HarnessReport", "ShapeTiming", "HarnessError", "HARNESS_FIXES"]

#: The modes a job may name (:class:`evaluators.protocol.Mode`).
MODES = tuple(m.value for m in Mode)


class HarnessError(InfrastructureError):
    """Our failure, not the candidate's, as the judge (which never runs candidate code) saw it:
    a bug, a task it cannot load, a broken GPU environment. ``kind`` says which (``task``: the
    task or its file could not be loaded; ``cuda``: no usable GPU; ``sandbox``: confinement
    failed; ``runner``: the runner would not start or map the buffers before the candidate was
    loaded; ``memory``: the judge's own device memory; ``reference``: the compiled reference;
    ``bug``: anything else)."""

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
    """One candidate's GPU evaluation, as its caller hands it to the judge.

    ``params``: the candidate's tunables (already compiled into ``so_bytes``; kept for the
    record). ``shapes``: indices into ``task.shapes`` to check (``None`` = all; the timing
    stage always uses the task's benchmark shapes unless ``bench_shapes`` is given).
    ``task_files``: Python files that define user tasks, imported by the judge before the
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
    #: mode ``paired`` only: the baseline's id and built .so (timed beside the candidate)
    baseline_id: str = ""
    baseline_so: bytes = b""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"HarnessJob.mode={self.mode!r}; valid modes: {', '.join(MODES)}")
        if not isinstance(self.so_bytes, (bytes, bytearray)) or not self.so_bytes:
            raise ValueError("HarnessJob.so_bytes must be the non-empty bytes of the built .so")
        paired = self.mode == Mode.PAIRED.value
        if paired != bool(self.baseline_so) or (paired and not self.baseline_id):
            raise ValueError(f"HarnessJob.baseline_so and baseline_id: required with mode 'paired', "
                             f"and only with it (mode={self.mode!r})")


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
    #: against the reference under torch.compile, when it was timed (evaluators.judge.reference)
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
    """What the judge decided: stage results, fitness, per-shape timings, environment.

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
