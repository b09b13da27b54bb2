"""The buffers of one shape: where a call's inputs and outputs live, as the judge sees them
(tensor views) and as the runner is told them (:class:`~evaluators.protocol.TensorArg`).

A shape's slots are made once per (task, shape) from a probe of the task (its inputs' and
reference outputs' shapes and dtypes) and reused by every trial and every timed call of that
shape: fresh values at the same addresses, which also defeats a result cache keyed by pointer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from evaluators.judge.exchange import Buffer, Exchange
from evaluators.protocol import TensorArg

__all__ = ["TensorSpec", "ShapeSlots", "make_slots", "free_slots", "probe_specs"]


@dataclass(frozen=True)
class TensorSpec:
    """Shape, strides (elements) and dtype (torch name) of one tensor of a call."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str

    @property
    def extent(self) -> int:
        """Elements the strided view spans (0 for an empty tensor)."""
        if any(s == 0 for s in self.shape):
            return 0
        return 1 + sum((s - 1) * st for s, st in zip(self.shape, self.strides))

    @classmethod
    def of(cls, t: Any, dtype: Any = None) -> "TensorSpec":
        """The spec of tensor ``t`` (contiguous strides when ``dtype`` re-types it)."""
        shape = tuple(int(s) for s in t.shape)
        if dtype is None:
            return cls(shape, tuple(int(s) for s in t.stride()), str(t.dtype).replace("torch.", ""))
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= max(s, 1)
        return cls(shape, tuple(reversed(strides)), str(dtype).replace("torch.", ""))


@dataclass
class ShapeSlots:
    """The judge's views of one shape's buffers and the runner's arguments for them."""

    ins: list[Any]
    outs: list[Any]
    in_args: list[TensorArg]
    out_args: list[TensorArg]
    buffers: list[Buffer]
    in_specs: tuple[TensorSpec, ...]
    out_specs: tuple[TensorSpec, ...]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)


def _view(buf: Buffer, spec: TensorSpec) -> Any:
    import torch

    dtype = getattr(torch, spec.dtype)
    flat = buf.view(dtype, (max(spec.extent, 1),))
    return flat.as_strided(spec.shape, spec.strides)


def make_slots(ex: Exchange, in_specs: Sequence[TensorSpec], out_specs: Sequence[TensorSpec]) -> ShapeSlots:
    """One buffer per tensor, sized to its strided extent (at least one byte)."""
    import torch

    bufs: list[Buffer] = []
    try:
        views, args = [], []
        for spec in (*in_specs, *out_specs):
            item = torch.empty((), dtype=getattr(torch, spec.dtype)).element_size()
            b = ex.alloc(max(spec.extent, 1) * item)
            bufs.append(b)
            views.append(_view(b, spec))
            args.append(TensorArg(b.buf, 0, spec.dtype, spec.shape, spec.strides))
    except BaseException:
        for b in bufs:
            ex.free(b)
        raise
    n = len(in_specs)
    return ShapeSlots(views[:n], views[n:], args[:n], args[n:], bufs, tuple(in_specs), tuple(out_specs))


def free_slots(ex: Exchange, slots: ShapeSlots) -> None:
    slots.ins.clear()
    slots.outs.clear()
    for b in slots.buffers:
        ex.free(b)
    slots.buffers.clear()


def probe_specs(task: Any, shape: dict[str, int], device: Any) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The input and output specs of one shape: inputs as ``make_inputs`` makes them, outputs
    as the reference returns them (floating outputs in the task's dtype, contiguous)."""
    import torch

    from evaluators.judge.checks import _as_tuple, output_dtype

    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    dist = task.distributions[0] if task.distributions else "normal"
    with torch.no_grad():
        ins = tuple(task.make_inputs(dict(shape), gen, dist, device))
        refs = _as_tuple(task.reference(*ins))
    task_dtype = getattr(torch, task.dtype)
    in_specs = tuple(TensorSpec.of(x) for x in ins)
    out_specs = tuple(TensorSpec.of(r, output_dtype(r, task_dtype)) for r in refs)
    return in_specs, out_specs
