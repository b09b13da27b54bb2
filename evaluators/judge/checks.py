"""The judge's checks of one call's outputs (shared/EVALUATION.md, Correctness): what a
correct output is, and the values that make an unwritten or stale one visible.

- :func:`ground_truth`: the task's reference on copies of the inputs upcast to
  ``task.reference_dtype`` (fp64 for fp32 tasks), computed by the judge after the call, so no
  reference value exists on the device while the candidate runs;
- :func:`poison_`: NaN for floats, a sentinel for integers, written into every output before
  every call (unwritten elements fail);
- :func:`same_bits`: the inputs-unchanged check, bit for bit;
- :func:`first_wrong_output` / :func:`worst_element`: the task's tolerance
  (``evo.tasks.tolerance.check``) and a reason naming the worst element, written for a repair
  prompt;
- :func:`trial_seed` / :func:`shape_order`: replayable per-trial seeds, smallest shape first.

Used by the correctness trials (:mod:`evaluators.judge.trials`), the timed calls' sampled
checks (:mod:`evaluators.judge.timing`) and the profiled call (:mod:`evaluators.judge.profile`);
everything here runs in the judge, on CPU or CUDA tensors alike.
"""

from __future__ import annotations

import logging
import math
import random
from typing import Any, Callable, Mapping, Sequence

import torch

__all__ = [
    "trial_seed",
    "shape_order",
    "poison_",
    "same_bits",
    "worst_element",
    "output_dtype",
    "ground_truth",
    "first_wrong_output",
]

log = logging.getLogger(__name__)

_INT_POISON = -0x5A5A5A5A


def trial_seed(base: int, shape_index: int, trial: int) -> int:
    """Deterministic per-trial seed derived from the job's base seed (replayable failures)."""
    return random.Random(f"{base}:{shape_index}:{trial}").getrandbits(62)


def shape_order(shapes: Sequence[Mapping[str, int]], indices: Sequence[int] | None = None) -> list[int]:
    """Shape indices, smallest problem first (product of the named sizes), stable."""
    idx = list(range(len(shapes))) if indices is None else list(indices)
    for i in idx:
        if not 0 <= i < len(shapes):
            raise ValueError(f"shape index {i} out of range; the task has {len(shapes)} shapes")
    return sorted(idx, key=lambda i: (math.prod(int(v) for v in shapes[i].values()), i))


def _upcast(tensors, dtype):
    """Copies of ``tensors`` with floating ones in ``dtype`` (the reference's precision)."""
    return [x.to(dtype, copy=True) if x.is_floating_point() else x.clone() for x in tensors]


def output_dtype(ref: torch.Tensor, task_dtype: torch.dtype) -> torch.dtype:
    """The candidate's output dtype: the task dtype for floating outputs, else the reference's."""
    return task_dtype if ref.is_floating_point() else ref.dtype


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with a value no correct kernel leaves there: NaN for floats, a sentinel for ints."""
    if t.is_floating_point() or t.is_complex():
        return t.fill_(float("nan"))
    if t.dtype == torch.bool:  # a byte that is neither False (0) nor True (1)
        t.view(torch.uint8).fill_(0xA5)
        return t
    return t.fill_(_INT_POISON)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN-safe): the inputs-unchanged check."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return bool(torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                            b.contiguous().reshape(-1).view(torch.uint8)))


def _fmt_index(flat: int, shape: Sequence[int]) -> str:
    idx = []
    for s in reversed(list(shape)):
        idx.append(flat % s if s else 0)
        flat = flat // s if s else 0
    return "(" + ", ".join(str(i) for i in reversed(idx)) + ")"


#: Elements compared at a time by :func:`worst_element` (bounds its float64 temporaries).
WORST_CHUNK = 1 << 24


def worst_element(out: torch.Tensor, ref: torch.Tensor, *, chunk: int = WORST_CHUNK) -> str:
    """Human-readable worst element: first unexpected NaN/Inf, else the largest |out - ref|.
    Taken ``chunk`` elements at a time in float64 (outputs may be several GB)."""
    if out.shape != ref.shape or out.numel() == 0:
        return f"output shape {tuple(out.shape)} vs reference {tuple(ref.shape)}"
    o_all = out.detach().reshape(-1)
    r_all = ref.detach().reshape(-1)
    n = o_all.numel()
    chunk = max(int(chunk), 1)
    n_bad, first_bad = 0, -1
    best, best_i = -1.0, 0
    for s in range(0, n, chunk):
        o = o_all[s:s + chunk].double()
        r = r_all[s:s + chunk].to(o.device).double()
        bad = ~torch.isfinite(o) & torch.isfinite(r)
        nb = int(bad.sum())
        if nb and first_bad < 0:
            first_bad = s + int(torch.nonzero(bad)[0])
        n_bad += nb
        if not n_bad:
            d = (o - r).abs()
            d = torch.where(torch.isnan(d), torch.zeros_like(d), d)
            j = int(torch.argmax(d))
            if float(d[j]) > best:
                best, best_i = float(d[j]), s + j
    if n_bad:
        i = first_bad
        return (f"{n_bad} of {n} elements non-finite (NaN = unwritten poison or computed NaN), "
                f"first at {_fmt_index(i, out.shape)}: out={float(o_all[i])!r}, ref={float(r_all[i]):.6g}")
    i = best_i
    return (f"worst |out - ref| = {best:.3g} at {_fmt_index(i, out.shape)}: "
            f"out={float(o_all[i]):.6g}, ref={float(r_all[i]):.6g}")


def _tolerance_fns() -> tuple[Callable[..., tuple[bool, str, dict]], Callable[..., tuple[bool, str, float]]]:
    from evo.tasks.tolerance import check, check_deterministic

    return check, check_deterministic


def _as_tuple(x: Any) -> tuple[torch.Tensor, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def ground_truth(task: Any, inputs: Sequence[torch.Tensor], *,
                 host_fallback: bool = False) -> tuple[torch.Tensor, ...]:
    """The task's reference on copies of ``inputs`` upcast to ``task.reference_dtype`` (fp64
    for fp32 tasks), TF32 as the caller set it: what every candidate output is checked against.

    ``host_fallback``: when the device runs out of memory computing it (a float64 reference
    over a GB-sized input needs several times the input's bytes), compute it on host copies
    instead, so the truth is on the host; :func:`~evo.tasks.tolerance.check` and
    :func:`worst_element` compare it chunk by chunk on the output's device. Without it, the
    out-of-memory error propagates (a caller that owns the device may retry)."""
    dt = getattr(torch, task.reference_dtype)
    try:
        return _as_tuple(task.reference(*_upcast(inputs, dt)))
    except torch.OutOfMemoryError:
        if not host_fallback:
            raise
    # outside the handler: the failed attempt's temporaries are released before the host copy
    torch.cuda.empty_cache()
    host = [x.cpu() if isinstance(x, torch.Tensor) else x for x in inputs]
    return _as_tuple(task.reference(*_upcast(host, dt)))


def first_wrong_output(task: Any, outputs: Sequence[torch.Tensor], truth: Sequence[torch.Tensor],
                       fused: str | None = None) -> str | None:
    """``None`` when every output passes the task's tolerance against ``truth``, else
    "output k: why; worst element" for the first that does not. ``fused``: the
    :func:`~evo.tasks.tolerance.check` backend (a long-lived judge on a GPU)."""
    check, _ = _tolerance_fns()
    task_dtype = getattr(torch, task.dtype)
    for k, (o, r) in enumerate(zip(outputs, truth)):
        ok, why, _m = check(o, r, task.tolerance, dtype=output_dtype(r, task_dtype), fused=fused)
        if not ok:
            return f"output {k}: {why}; {worst_element(o, r)}"
    return None


def _jsonable(m: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in m.items():
        if isinstance(v, (bool, int, str)) or v is None:
            out[str(k)] = v
        elif isinstance(v, float):
            out[str(k)] = v if math.isfinite(v) else str(v)
        elif isinstance(v, torch.Tensor) and v.numel() == 1:
            f = float(v)
            out[str(k)] = f if math.isfinite(f) else str(f)
        else:
            out[str(k)] = str(v)
    return out
