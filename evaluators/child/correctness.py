"""Correctness stage (runs inside the isolated harness process): shared/EVALUATION.md, Correctness.

For EVERY shape of the task (smallest first, so a broken kernel fails in milliseconds), at
least ``trials`` trials (and at least one per declared distribution) with fresh seeds cycling
through ``task.distributions``:

1. inputs made by the trusted harness (``task.make_inputs`` with a seeded generator on the
   device), copied into the same buffers every trial of a shape (fresh values at repeated
   addresses defeat result caches keyed by pointer) and saved as copies;
2. reference computed from *cloned* inputs upcast to ``task.reference_dtype`` AFTER the
   candidate's call (from the saved copies), so no reference value exists on the device
   while the candidate runs; a first evaluation only finds the output shapes and is
   scrubbed with NaN before it is freed, so its memory holds nothing to reuse either;
3. outputs allocated fresh and poisoned (NaN for floats, a sentinel for integers) before
   every call;
4. the call, then a device-wide synchronise (errors surface as :class:`CandidateFault` or
   CUDA exceptions, which the harness maps to ``crash``);
5. inputs compared bit for bit with the saved copies;
6. every output checked with ``evo.tasks.tolerance.check`` (shape, dtype, NaN/Inf, unwritten
   poison, atol/rtol, relative L2);
7. determinism: a second call on the same inputs into a second fresh, poisoned output must
   agree within ``task.tolerance.nondeterminism``.

The first failing check ends the stage with ``incorrect`` and a reason naming the shape,
trial, distribution and worst element, written for a repair prompt.

The device-specific parts are injected (``launch``, ``sync``, ``device``), so the same code
runs on CPU tensors in the unit tests with Python fake kernels.
"""

from __future__ import annotations

import logging
import math
import random
import time
from typing import Any, Callable, Mapping, Sequence

import torch

from evo.core.records import StageResult, Status

__all__ = [
    "CandidateFault",
    "Launch",
    "check_correctness",
    "trial_seed",
    "shape_order",
    "poison_",
    "same_bits",
    "worst_element",
    "output_dtype",
]

log = logging.getLogger(__name__)

#: launch(inputs, outputs): run the candidate once; raise CandidateFault on a reported error.
Launch = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], None]

_INT_POISON = -0x5A5A5A5A


class CandidateFault(Exception):
    """The candidate failed at run time (e.g. evo_launch returned an error code)."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


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


def check_correctness(
    task: Any,
    launch: Launch,
    *,
    device: str | torch.device,
    trials: int,
    seed: int,
    shape_indices: Sequence[int] | None = None,
    sync: Callable[[], None] = lambda: None,
    release: Callable[[], None] = lambda: None,
    progress: Callable[[dict[str, Any]], None] = lambda p: None,
    tolerance_check: Callable[..., tuple[bool, str, dict]] | None = None,
) -> StageResult:
    """Run the correctness protocol; return an ``ok`` or ``incorrect`` StageResult.

    Raises :class:`CandidateFault` (or the device's own error, e.g. a CUDA RuntimeError)
    when the candidate faults; the caller maps those to ``crash``. ``release`` is called
    between shapes (free cached memory, re-poison the allocator). ``progress`` receives a
    small dict before each candidate call so a crash or timeout can say where it happened.
    """
    check, determinism = _tolerance_fns()
    if tolerance_check is not None:
        check = tolerance_check
    t_start = time.monotonic()
    dists = tuple(task.distributions) or ("normal",)
    n_trials = max(int(trials), len(dists), 1)
    task_dtype = getattr(torch, task.dtype)
    ref_dtype = getattr(torch, task.reference_dtype)
    tol = task.tolerance
    order = shape_order(task.shapes, shape_indices)
    per_shape: list[dict[str, Any]] = []
    calls = 0
    worst_l2 = 0.0

    def fail(reason: str, artifacts: dict[str, str] | None = None) -> StageResult:
        return StageResult(
            stage="correctness",
            status=Status.INCORRECT,
            reason=reason,
            metrics={"seed": seed, "calls": calls, "shapes": per_shape, "trials": n_trials},
            artifacts=artifacts or {},
            seconds=time.monotonic() - t_start,
        )

    for si in order:
        shape = dict(task.shapes[si])
        shape_metrics: dict[str, Any] = {"shape": shape, "index": si}
        bufs: tuple[torch.Tensor, ...] | None = None
        for t in range(n_trials):
            dist = dists[t % len(dists)]
            where = f"shape {shape} (index {si}), trial {t} ({dist} inputs)"
            gen = torch.Generator(device=device)
            gen.manual_seed(trial_seed(seed, si, t))
            with torch.no_grad():
                fresh = tuple(task.make_inputs(shape, gen, dist, device))
                if bufs is None or [b.shape for b in bufs] != [f.shape for f in fresh]:
                    bufs = fresh
                else:
                    # New values at the same addresses: a result cache keyed by pointer
                    # returns stale results and fails.
                    for b, f in zip(bufs, fresh):
                        b.copy_(f)
                del fresh
                inputs = bufs
                saved = [x.clone() for x in inputs]
                # The reference's output shapes come from a first evaluation whose results are
                # scrubbed (NaN) before they are freed: while the candidate runs, no reference
                # value exists anywhere on the device for it to find (tests/fixtures/bad/
                # reads_reference.cu scans its allocation segments for one).
                specs = []
                for r in _as_tuple(task.reference(*_upcast(inputs, ref_dtype))):
                    specs.append((r.shape, output_dtype(r, task_dtype)))
                    if r.is_floating_point():
                        r.fill_(float("nan"))
                    del r
                outs = [poison_(torch.empty(shp, dtype=dt, device=device)) for shp, dt in specs]
            sync()
            progress({"stage": "correctness", "shape": shape, "trial": t, "dist": dist, "step": "call"})
            calls += 1
            launch(inputs, outs)
            sync()
            with torch.no_grad():  # the ground truth, from the saved copies of the inputs
                refs = ground_truth(task, saved)
            for k, (x, s) in enumerate(zip(inputs, saved)):
                if not same_bits(x, s):
                    n = int((x.reshape(-1) != s.reshape(-1)).sum()) if x.shape == s.shape else -1
                    return fail(
                        f"{where}: the kernel modified input {k} ({n} elements changed); "
                        "inputs are read-only (write only into `out`)"
                    )
            rule = getattr(task, "index_rule", None)
            for k, (o, r) in enumerate(zip(outs, refs)):
                if rule is not None and not r.is_floating_point():
                    ok, why, m = rule(_upcast(saved, ref_dtype), o, r)
                else:
                    ok, why, m = check(o, r, tol, dtype=output_dtype(r, task_dtype))
                m = _jsonable(m or {})
                if isinstance(m.get("rel_l2"), float):
                    worst_l2 = max(worst_l2, m["rel_l2"])
                if not ok:
                    shape_metrics.update({f"out{k}": m})
                    per_shape.append(shape_metrics)
                    detail = worst_element(o, r)
                    return fail(
                        f"{where}, output {k}: {why}; {detail}",
                        {"failing_check": f"{where}, output {k}", "worst": detail},
                    )
                shape_metrics[f"out{k}"] = m
            # Determinism: same inputs, a second fresh poisoned output.
            with torch.no_grad():
                outs2 = [poison_(torch.empty_like(o)) for o in outs]
            sync()
            progress({"stage": "correctness", "shape": shape, "trial": t, "dist": dist,
                      "step": "determinism call"})
            calls += 1
            launch(inputs, outs2)
            sync()
            for k, (o1, o2) in enumerate(zip(outs, outs2)):
                same, why, _diff = determinism(o1, o2, tol)
                if not same:
                    detail = worst_element(o2, o1)
                    return fail(
                        f"{where}, output {k}: {why}; the kernel is nondeterministic, keeps "
                        f"state between calls, or leaves elements unwritten (second call vs "
                        f"first: {detail})",
                        {"failing_check": f"{where}, output {k}, determinism", "worst": detail},
                    )
            del inputs, saved, refs, outs, outs2
        del bufs
        per_shape.append(shape_metrics)
        release()
    return StageResult(
        stage="correctness",
        status=Status.OK,
        reason="",
        metrics={"seed": seed, "calls": calls, "trials": n_trials, "shapes": per_shape,
                 "max_rel_l2": worst_l2, "distributions": list(dists)},
        seconds=time.monotonic() - t_start,
    )
