"""The timed calls' fresh inputs, drawn on the device by one Triton kernel where it applies
and is the faster.

Every timed call gets new input values (:mod:`evaluators.judge.timing`, step 1), and a checked
call's inputs are drawn again from the same seed after it returned. The task's own draw
(torch's generator, :func:`evaluators.judge.trials.draw_into`) draws a bf16 input in float32
and copies it; the Triton kernel here draws four values per Philox counter and writes each
input once, in its own dtype. Which is faster depends on the dtype and the card (on an H100,
benchmarks/judge_gpu/fill_speed.py: torch's for a 6.4 GB fp32 input, the Triton draw for a
3.2 GB bf16 one), so :func:`input_filler` measures both once per shape and takes the faster.

Contract of :func:`input_filler` (the only entry; :func:`time_shape` calls it once per shape,
before its loop): the filler it returns writes, for a seed, the same bits every time into
buffers shaped like the shape's inputs, so a checked call's inputs can be drawn again and
compared bit for bit. The Triton draw is used only where every input is a dense float tensor
(float32, bfloat16, float16) of a task whose ``make_inputs`` is a
:class:`~evo.tasks.inputs.TensorInputs`, on a CUDA device, with one of the distributions of
:data:`DISTS`, and only after its self-check passed in this process (:func:`self_check_once`:
deterministic in the seed, different across seeds, finite, the distribution's range and
moments); everything else, and a process whose self-check failed (logged once), uses the task's
own draw. The values follow the task's distribution but are not its generator's bits: the
timed calls' inputs are not the correctness trials' inputs, and need not be.

Seeds come from the judge's OS randomness (:func:`evaluators.judge.checks.trial_seed`
of a secret run seed), so the candidate cannot predict the next call's values; Philox keyed by
them is a counter-based generator of the same quality as torch's.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

__all__ = ["DISTS", "input_filler", "self_check_once", "fast_fill", "faster"]

log = logging.getLogger(__name__)

#: distribution -> (normal?, scale, shift): the values the Triton draw writes are
#: ``normal * scale + shift`` or ``uniform[0, 1) * scale + shift`` (evo.tasks.inputs.sample's).
DISTS: dict[str, tuple[bool, float, float]] = {
    "normal": (True, 1.0, 0.0),
    "wide": (True, 10.0, 0.0),
    "logits": (True, 30.0, 0.0),
    "uniform": (False, 2.0, -1.0),
    "kernelbench": (False, 1.0, 0.0),
}
#: Philox counters per program (each gives four values)
_Q = 1024
_MASK62 = (1 << 62) - 1
_KERNEL: list[Any] = []
#: this process's self-check verdicts per (device type, dtype, normal?): True passed, False failed
_CHECKED: dict[tuple[str, Any, bool], bool] = {}


def _kernel() -> Any:
    if _KERNEL:
        return _KERNEL[0]
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["n", "seed"])   # one compile per dtype and family, whatever the seed
    def _draw(out_ptr, n, seed, scale, shift, NORMAL: tl.constexpr, Q: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        i = tl.arange(0, Q).to(tl.int64)
        if NORMAL:
            a, b, c, d = tl.randn4x(seed, pid * Q + i)
        else:
            a, b, c, d = tl.rand4x(seed, pid * Q + i)
        base = pid * (4 * Q) + i
        ty = out_ptr.dtype.element_ty
        tl.store(out_ptr + base, (a * scale + shift).to(ty), mask=base < n)
        tl.store(out_ptr + base + Q, (b * scale + shift).to(ty), mask=base + Q < n)
        tl.store(out_ptr + base + 2 * Q, (c * scale + shift).to(ty), mask=base + 2 * Q < n)
        tl.store(out_ptr + base + 3 * Q, (d * scale + shift).to(ty), mask=base + 3 * Q < n)

    _KERNEL.append(_draw)
    return _draw


def _input_seed(seed: int, k: int) -> int:
    """Input ``k``'s Philox key from the call's seed (distinct inputs, distinct streams)."""
    return ((int(seed) & _MASK62) ^ ((k + 1) * 0x9E3779B97F4A7C15)) & _MASK62


def fast_fill(bufs: Sequence[Any], seed: int, dist: str) -> None:
    """Draw ``dist`` for ``seed`` into each contiguous float buffer of ``bufs`` (Triton)."""
    normal, scale, shift = DISTS[dist]
    k_fn = _kernel()
    for k, b in enumerate(bufs):
        n = b.numel()
        if n:
            grid = ((n + 4 * _Q - 1) // (4 * _Q),)
            k_fn[grid](b, n, _input_seed(seed, k), float(scale), float(shift), NORMAL=normal, Q=_Q)


def _self_check(device: Any, dtype: Any, dist: str) -> None:
    """The Triton draw of ``dist`` in ``dtype`` on ``device``: raises RuntimeError unless it
    is deterministic in the seed, different for another seed, finite, and within the
    distribution's range or near its moments (one compile: the kernel's dtype and family)."""
    import torch

    normal, scale, shift = DISTS[dist]
    n = (1 << 14) + 13
    a, b, c = (torch.empty(n, dtype=dtype, device=device) for _ in range(3))
    fast_fill([a], 12345, dist)
    fast_fill([b], 12345, dist)
    fast_fill([c], 12346, dist)
    x = a.float()
    what = f"{dist} {dtype}"
    if not torch.equal(a, b):
        raise RuntimeError(f"the Triton draw ({what}) differs for the same seed")
    if torch.equal(a, c):
        raise RuntimeError(f"the Triton draw ({what}) is the same for another seed")
    if not bool(torch.isfinite(x).all()):
        raise RuntimeError(f"the Triton draw ({what}) wrote a non-finite value")
    m, s = float(x.mean()), float(x.std())
    if normal:
        m, s = (m - shift) / scale, s / scale
        if abs(m) > 0.05 or not 0.95 < s < 1.05:
            raise RuntimeError(f"the Triton draw ({what}): mean {m:.3f}, std {s:.3f} of a standard normal")
    elif float(x.min()) < shift or float(x.max()) > shift + scale or not 0.27 < s / scale < 0.31:
        raise RuntimeError(f"the Triton draw ({what}) is not uniform on [{shift}, {shift + scale}]")


def self_check_once(device: Any, dtype: Any, dist: str) -> bool:
    """Whether the Triton draw of ``dist`` in ``dtype`` may be used on ``device``'s type in
    this process: its :func:`_self_check` the first time for the kernel variant (dtype and
    family); a failure, Triton's own included, is logged once and sticks."""
    import torch

    key = (torch.device(device).type, dtype, DISTS[dist][0])
    if key not in _CHECKED:
        try:
            _self_check(device, dtype, dist)
            _CHECKED[key] = True
        except Exception as e:  # noqa: BLE001 - any failure: the task's own draw is the same contract
            log.warning("fast input draw unavailable for %s %s (%s: %s); drawing those inputs with the "
                        "task's generator", dist, dtype, type(e).__name__,
                        str(e).splitlines()[0][:200] if str(e) else "")
            _CHECKED[key] = False
    return _CHECKED[key]


def _applies(task: Any, like: Sequence[Any], dist: str) -> bool:
    import torch

    from evo.tasks.inputs import TensorInputs

    mk = getattr(task, "make_inputs", None)
    if not isinstance(mk, TensorInputs) or dist not in DISTS or not like:
        return False
    if any(s.structure != "dense" for s in mk.specs):
        return False
    floats = (torch.float32, torch.bfloat16, torch.float16)
    return all(x.device.type == "cuda" and x.dtype in floats and x.is_contiguous() for x in like)


def input_filler(task: Any, like: Sequence[Any], shape: dict[str, int], dist: str,
                 fused: str | None) -> Callable[[Sequence[Any], int], None]:
    """``fill(bufs, seed)`` for one shape's timed calls (module docstring): where the Triton
    draw applies to inputs shaped ``like`` (``fused == "triton"``) and passed its self-check,
    the faster of it and the task's own draw on this device, measured once per task, shape,
    distribution and dtypes in this process (:func:`faster`; torch's draw was the faster for a
    6.4 GB fp32 input on an H100, the Triton draw for bf16); else the task's own draw. Both
    write fresh values for a seed, the same bits every time."""
    from evaluators.judge.trials import draw_into

    def own(bufs: Sequence[Any], seed: int) -> None:
        draw_into(task, list(bufs), shape, seed, dist)

    def triton(bufs: Sequence[Any], seed: int) -> None:
        fast_fill(bufs, seed, dist)

    if fused == "triton" and _applies(task, like, dist) and \
            all(self_check_once(x.device, x.dtype, dist) for x in like):
        key = (task.name, tuple(sorted(shape.items())), dist, tuple(str(x.dtype) for x in like))
        if key not in _CHOSEN:
            _CHOSEN[key] = faster({"triton": lambda: triton(like, 1), "task": lambda: own(like, 1)}, _device_ms)
            log.info("timed calls' input draw for %s %s (%s): %s", task.name, shape, dist, _CHOSEN[key])
        return triton if _CHOSEN[key] == "triton" else own
    return own


#: the input draw chosen per (task, shape, distribution, dtypes) in this process (input_filler)
_CHOSEN: dict[tuple, str] = {}


def faster(draws: dict[str, Callable[[], None]], time_ms: Callable[[Callable[[], None]], float],
           rounds: int = 3) -> str:
    """The name of the fastest of ``draws``: each timed ``rounds`` times by ``time_ms`` (ms of
    one call, after a warm one), the least of its times compared; a tie goes to the first."""
    best = {name: min(time_ms(fn) for _ in range(rounds)) for name, fn in draws.items()}
    return min(best, key=best.__getitem__)   # min keeps the first of equal ones


def _device_ms(fn: Callable[[], None]) -> float:
    """Milliseconds of one call of ``fn`` on the current CUDA stream, after a warm call."""
    import torch

    fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)
