"""A timing stage's verdict from raw samples (shared/EVALUATION.md, Timing): medians, IQRs,
the speed-of-light and side-stream checks, fitness.

:func:`summarize` turns one :class:`ShapeSamples` per benchmark shape into the ``timing``
StageResult: per shape the candidate's and every timed reference's median and IQR (all samples
kept), then, in this order, ``invalid`` when device work outlasted the end event
(:func:`side_stream_verdict`), when a median is not positive, or when it beats the
speed-of-light bound (the measurement cannot be real). fitness = geometric mean over shapes of
``ref_median / candidate_median`` against the basis the config names (eager, or the reference
under ``torch.compile``: :mod:`evaluators.judge.reference`); a speedup above
:data:`RECONFIRM_SPEEDUP` sets ``metrics["needs_reconfirm"]``, a flag for readers of the record
(every champion is evaluated again before it is stored: :mod:`evo.engine.champions`). The samples themselves are taken by :mod:`evaluators.judge.timing`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Sequence

from evaluators.judge.reference import COMPILE_MODE
from evo.core.records import StageResult, Status

__all__ = [
    "ShapeSamples",
    "median",
    "iqr",
    "geomean",
    "summarize",
    "side_stream_verdict",
    "RECONFIRM_SPEEDUP",
    "LEFTOVER_MIN_MS",
]

log = logging.getLogger(__name__)

#: Speedups above this are re-measured in a fresh process before becoming champion.
RECONFIRM_SPEEDUP = 10.0
#: Median device work left after the end event (beyond the bare synchronize cost) above this,
#: and above half the kernel's own median, means work on an untimed stream.
LEFTOVER_MIN_MS = 0.05


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        raise ValueError("median of no samples")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _quantile(s: list[float], q: float) -> float:
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def iqr(xs: Sequence[float]) -> float:
    s = sorted(xs)
    if not s:
        raise ValueError("IQR of no samples")
    return _quantile(s, 0.75) - _quantile(s, 0.25)


def geomean(xs: Sequence[float]) -> float:
    if not xs or any(x <= 0 or not math.isfinite(x) for x in xs):
        raise ValueError(f"geometric mean needs positive finite values, got {list(xs)}")
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


@dataclass(frozen=True)
class ShapeSamples:
    """Raw samples of one shape (ms) and what the checks need."""

    shape: dict[str, int]
    cand_ms: tuple[float, ...]
    ref_ms: tuple[float, ...]
    leftover_ms: tuple[float, ...]
    copies: int
    sol_ms: float | None
    sync_ms: tuple[float, ...] = ()
    #: the compiled reference's samples (:mod:`evaluators.judge.reference`); empty when not timed
    compile_ref_ms: tuple[float, ...] = ()


def side_stream_verdict(shape: dict[str, int], cand_median_ms: float, leftover_ms: float) -> str | None:
    """The ``invalid`` reason when device work outlasts the stream's end event."""
    if leftover_ms > LEFTOVER_MIN_MS and leftover_ms > 0.5 * cand_median_ms:
        return (
            f"shape {shape}: device work continued {leftover_ms:.3f} ms (median) after the "
            f"stream's end event while the timed call took {cand_median_ms:.3f} ms: the "
            "kernel launches on another stream; launch every kernel on the `stream` argument"
        )
    return None


def summarize(samples: Sequence[ShapeSamples], basis: str = "eager") -> StageResult:
    """Turn raw samples into the timing StageResult (medians, IQRs, SOL and side-stream checks).

    ``speedup`` / ``ref_*`` are against the eager reference, ``compile_*`` against the
    compiled one when it was timed (every shape or none). ``metrics["fitness"]`` is against
    ``basis`` (``eager`` or ``compile``); ``fitness_eager`` and, when timed,
    ``fitness_compile`` are both kept, with ``reference`` naming the basis.
    """
    rows: list[dict[str, Any]] = []
    speedups: list[float] = []
    compile_speedups: list[float] = []
    if basis == "compile" and any(not s.compile_ref_ms for s in samples):
        raise ValueError("fitness against the compiled reference needs its samples on every shape")
    for s in samples:
        cm, rm = median(s.cand_ms), median(s.ref_ms)
        lo = median(s.leftover_ms) if s.leftover_ms else 0.0
        lo -= median(s.sync_ms) if s.sync_ms else 0.0
        row = {
            "shape": s.shape,
            "median_ms": cm,
            "iqr_ms": iqr(s.cand_ms),
            "ref_median_ms": rm,
            "ref_iqr_ms": iqr(s.ref_ms),
            "speedup": rm / cm if cm > 0 else float("inf"),
            "sol_ms": s.sol_ms,
            "pct_sol": (100.0 * s.sol_ms / cm) if (s.sol_ms and cm > 0) else None,
            "leftover_median_ms": lo,
            "input_copies": s.copies,
            "samples_ms": list(s.cand_ms),
            "ref_samples_ms": list(s.ref_ms),
        }
        if s.compile_ref_ms:
            km = median(s.compile_ref_ms)
            row.update({
                "compile_ref_median_ms": km,
                "compile_ref_iqr_ms": iqr(s.compile_ref_ms),
                "compile_speedup": km / cm if cm > 0 else float("inf"),
                "compile_ref_samples_ms": list(s.compile_ref_ms),
            })
        rows.append(row)
        side = side_stream_verdict(s.shape, cm, lo)
        if side:
            return StageResult("timing", Status.INVALID, side, {"shapes": rows})
        if cm <= 0:
            return StageResult("timing", Status.INVALID,
                               f"shape {s.shape}: non-positive median time {cm}", {"shapes": rows})
        if s.sol_ms is not None and cm < s.sol_ms:
            return StageResult(
                "timing", Status.INVALID,
                f"shape {s.shape}: median {cm:.4f} ms beats the speed-of-light bound "
                f"{s.sol_ms:.4f} ms (compulsory bytes / peak bandwidth, FLOPs / peak rate); "
                "the measurement cannot be real (skipped work, another stream, cached results)",
                {"shapes": rows},
            )
        speedups.append(row["speedup"])
        if "compile_speedup" in row:
            compile_speedups.append(row["compile_speedup"])
    fitness_eager = geomean(speedups) if speedups else None
    timed_compile = bool(compile_speedups) and len(compile_speedups) == len(speedups)
    fitness_compile = geomean(compile_speedups) if timed_compile else None
    basis_speedups = compile_speedups if basis == "compile" else speedups
    metrics: dict[str, Any] = {
        "shapes": rows,
        "fitness": fitness_compile if basis == "compile" else fitness_eager,
        "reference": basis,
        "fitness_eager": fitness_eager,
        "needs_reconfirm": bool(basis_speedups) and max(basis_speedups) > RECONFIRM_SPEEDUP,
    }
    if timed_compile:
        metrics["fitness_compile"] = fitness_compile
        metrics["compile_mode"] = COMPILE_MODE
    return StageResult("timing", Status.OK, "", metrics)
