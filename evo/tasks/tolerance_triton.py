"""The tolerance check's two passes as Triton kernels: :func:`ref_stats` and :func:`out_stats`,
drop-in for :func:`evo.tasks.tolerance._ref_stats` / ``_out_stats`` (``check(fused="triton")``).

Why: the eager passes move ~25 (full) or ~13 (lean) float64 temporaries per element through
device memory; on a 1.6 G-element output that is most of a candidate's correctness time. These
kernels read the output and the reference once per pass and write one partial result per block
of :data:`BLOCK` elements, which torch then reduces: 12-20 bytes an element instead of 200-370.

The rule is the eager passes', element by element, in float64 (the same masks for NaN and Inf,
the same bound ``atol + rtol |ref|``, the same first-index tie-breaks for the first bad
non-finite element and the worst ratio). What differs is the order of the floating-point sums
(per block, then over blocks): the sums of squares, hence the RMS, the effective ``atol`` and
the relative L2 error, may differ from the eager ones in their last bits, so a verdict can
differ only for an output exactly at a bound. The counts, maxima and indices are exact.

Only for finite, non-negative ``atol`` and ``rtol`` (:func:`supported`): a degenerate bound
(NaN, Inf, negative) makes ratios NaN, whose max/argmax semantics the eager pass defines by
torch's NaN propagation; such a check stays eager. :func:`self_check` compares both passes with
the eager ones on a small crafted tensor the first time a process uses them; a mismatch (or no
Triton, no GPU) raises, and the caller checks eagerly from then on.
"""

from __future__ import annotations

import math
from typing import Any

import torch

#: Elements per Triton program.
BLOCK = 2048
_BIG = 1 << 62

_KERNELS: dict[str, Any] = {}


def supported(atol_eff: float, rtol: float) -> bool:
    """Whether the kernels implement the eager rule exactly for this bound (see module doc)."""
    return math.isfinite(atol_eff) and math.isfinite(rtol) and atol_eff >= 0 and rtol >= 0


def _kernels() -> dict[str, Any]:
    if _KERNELS:
        return _KERNELS
    import triton
    import triton.language as tl

    @triton.jit
    def _ref_kernel(r_ptr, n, sq_ptr, fin_ptr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        rc = tl.load(r_ptr + offs, mask=m, other=0.0).to(tl.float64)
        fin = ((rc - rc) == 0) & m
        tl.store(sq_ptr + pid, tl.sum(tl.where(fin, rc * rc, 0.0), axis=0))
        tl.store(fin_ptr + pid, tl.sum(fin.to(tl.int64), axis=0))

    @triton.jit
    def _out_kernel(o_ptr, r_ptr, atol_ptr, rtol_ptr, n, cnt_ptr, first_ptr, sq_ptr, mx_ptr, viol_ptr,
                    rmax_ptr, rarg_ptr, BIG: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        idx = offs.to(tl.int64)
        oc = tl.load(o_ptr + offs, mask=m, other=0.0).to(tl.float64)
        rc = tl.load(r_ptr + offs, mask=m, other=0.0).to(tl.float64)
        atol = tl.load(atol_ptr)
        rtol = tl.load(rtol_ptr)
        rfin = (rc - rc) == 0
        ofin = (oc - oc) == 0
        same = ((rc != rc) & (oc != oc)) | (rc == oc)
        bad = ((rfin & (ofin == 0)) | ((rfin == 0) & (same == 0))) & m
        both = rfin & ofin & m
        d = tl.where(both, tl.abs(oc - rc), 0.0)
        allowed = atol + rtol * tl.abs(rc)
        viol = both & (d > allowed)
        ratio = tl.where(both & (d > 0), d / allowed, 0.0)
        tl.store(cnt_ptr + pid, tl.sum(bad.to(tl.int64), axis=0))
        tl.store(first_ptr + pid, tl.min(tl.where(bad, idx, BIG), axis=0))
        tl.store(sq_ptr + pid, tl.sum(d * d, axis=0))
        tl.store(mx_ptr + pid, tl.max(d, axis=0))
        tl.store(viol_ptr + pid, tl.sum(viol.to(tl.int64), axis=0))
        rmax = tl.max(ratio, axis=0)
        tl.store(rmax_ptr + pid, rmax)
        tl.store(rarg_ptr + pid, tl.min(tl.where(ratio == rmax, idx, BIG), axis=0))

    _KERNELS.update(ref=_ref_kernel, out=_out_kernel, cdiv=triton.cdiv)
    return _KERNELS


def ref_stats(rc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`evo.tasks.tolerance._ref_stats` of one contiguous 1-D chunk: (sum of squares of
    its finite entries, their count), as 0-dim tensors on its device."""
    k = _kernels()
    rc = rc.contiguous()
    n = rc.numel()
    g = k["cdiv"](n, BLOCK)
    sq = torch.empty(g, dtype=torch.float64, device=rc.device)
    fin = torch.empty(g, dtype=torch.int64, device=rc.device)
    k["ref"][(g,)](rc, n, sq, fin, BLOCK=BLOCK)
    return sq.sum(), fin.sum()


def out_stats(oc: torch.Tensor, rc: torch.Tensor, atol: torch.Tensor,
              rtol: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """:func:`evo.tasks.tolerance._out_stats` of one chunk (output and reference contiguous
    1-D, same length and device; ``atol``/``rtol`` 0-dim float64 tensors there): (bad
    non-finite count, first such index or -1, sum of squared errors, max abs error,
    elementwise violations, worst ratio, its first index), as 0-dim tensors."""
    k = _kernels()
    oc, rc = oc.contiguous(), rc.contiguous()
    n = oc.numel()
    g = k["cdiv"](n, BLOCK)
    dev = oc.device
    cnt, first, viol, rarg = (torch.empty(g, dtype=torch.int64, device=dev) for _ in range(4))
    sq, mx, rmax = (torch.empty(g, dtype=torch.float64, device=dev) for _ in range(3))
    k["out"][(g,)](oc, rc, atol, rtol, n, cnt, first, sq, mx, viol, rmax, rarg, BIG=_BIG, BLOCK=BLOCK)
    c = cnt.sum()
    j = rmax.argmax()
    return (c, torch.where(c > 0, first.min(), -1), sq.sum(), mx.max(), viol.sum(), rmax.max(),
            torch.take(rarg, j))


_CHECKED: set[str] = set()


def self_check_once(device: torch.device | str) -> None:
    """:func:`self_check` on ``device``'s type the first time this process asks."""
    kind = torch.device(device).type
    if kind not in _CHECKED:
        self_check(device)
        _CHECKED.add(kind)


def self_check(device: torch.device | str) -> None:
    """Both kernels against the eager passes on a crafted chunk on ``device`` (three blocks,
    NaN and Inf in either tensor, matching and not, violations, exact elements, a zero bound):
    counts, indices and maxima equal, sums within 1e-12 relative. Raises ``RuntimeError`` on a
    mismatch (and whatever Triton raises when it cannot compile or launch)."""
    from evo.tasks.tolerance import _out_stats, _ref_stats

    g = torch.Generator().manual_seed(7)
    n = 2 * BLOCK + 37
    r = torch.randn(n, generator=g, dtype=torch.float64)
    o = (r + 1e-7 * torch.randn(n, generator=g, dtype=torch.float64)).to(torch.float32)
    o[5] = r[5].item() + 1.0                       # a violation
    o[BLOCK + 3] = float("nan")                    # a bad non-finite output
    r[BLOCK + 9], o[BLOCK + 9] = float("inf"), float("inf")    # matching special values
    r[2 * BLOCK + 1] = float("nan")                # a NaN reference the output does not match
    o[2 * BLOCK + 2] = r[2 * BLOCK + 2].item()     # exact
    r[17], o[17] = 0.0, 0.0
    r, o = r.to(device), o.to(device)
    for atol, rtol in ((1e-5, 1e-5), (0.0, 0.0)):
        a = torch.tensor(atol, dtype=torch.float64, device=device)
        b = torch.tensor(rtol, dtype=torch.float64, device=device)
        want = [x.item() for x in (*_ref_stats(r), *_out_stats(o, r, a, b))]
        got = [x.item() for x in (*ref_stats(r), *out_stats(o, r, a, b))]
        for i, (w, h) in enumerate(zip(want, got)):
            exact = i not in (0, 4)   # the two sums of squares
            same = (w == h) or (w != w and h != h) or (not exact and math.isclose(w, h, rel_tol=1e-12))
            if not same:
                raise RuntimeError(f"the Triton tolerance check disagrees with the eager one (atol {atol}, "
                                   f"rtol {rtol}, value {i}: {h!r} against {w!r})")
