"""FLOP and compulsory-byte counts for the speed-of-light bound (frozen, picklable callables).

``Task.flops(shape)`` and ``Task.bytes(shape)`` must be *lower bounds* on the work any correct
kernel does, because a measurement faster than ``max(flops / peak, bytes / bandwidth)`` is
rejected as physically impossible (EVALUATION.md, Timing). So:

* bytes = every input read once + every output written once, in the task dtype, except that
  the known-zero half of a triangular input need not be read (:meth:`InputSpec.stored_numel`);
* GEMM flops = 2 per multiply-add that the product needs (a triangular x triangular product
  needs only the MACs inside the band, see :class:`TriangularGemmFlops`);
* elementwise / row-wise flops = a few per element (these tasks are memory-bound; the
  number only shows in reports).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from evo.tasks.inputs import DTYPES, InputSpec, known_dtype, resolve_dims

__all__ = ["GemmFlops", "TriangularGemmFlops", "ElementwiseFlops", "TensorBytes", "itemsize"]


def itemsize(dtype: str) -> int:
    """Bytes per element of a task dtype name (without importing torch)."""
    return DTYPES[known_dtype(dtype)]


@dataclass(frozen=True)
class GemmFlops:
    """``gemms * 2 * prod(batch) * m * n * k + epilogue * prod(batch) * m * n``.

    ``m``/``n``/``k``/``batch`` are dims (names in the shape dict or ints). ``epilogue`` is
    the flops per output element of a fused epilogue (bias, activation, gating).
    """

    m: str | int = "M"
    n: str | int = "N"
    k: str | int = "K"
    batch: tuple[str | int, ...] = ()
    gemms: int = 1
    epilogue: float = 0.0

    def __call__(self, shape: Mapping[str, int]) -> float:
        b = math.prod(resolve_dims(self.batch, shape))
        m, n, k = resolve_dims((self.m, self.n, self.k), shape)
        return float(self.gemms * 2 * b * m * n * k + self.epilogue * b * m * n)


@dataclass(frozen=True)
class TriangularGemmFlops:
    """Flops of triu(A) @ triu(B) (or the lower analogue) for N x N matrices.

    Output element (i, j), i <= j, needs the j - i + 1 products with i <= k <= j, so the
    total is sum_{i<=j} (j - i + 1) = N (N + 1) (N + 2) / 6 multiply-adds.
    """

    n: str = "N"

    def __call__(self, shape: Mapping[str, int]) -> float:
        (n,) = resolve_dims((self.n,), shape)
        return float(2 * n * (n + 1) * (n + 2) // 6)


@dataclass(frozen=True)
class ElementwiseFlops:
    """``per_element * prod(dims)``."""

    dims: tuple[str | int, ...]
    per_element: float

    def __call__(self, shape: Mapping[str, int]) -> float:
        return float(self.per_element * math.prod(resolve_dims(self.dims, shape)))


@dataclass(frozen=True)
class TensorBytes:
    """Compulsory DRAM traffic: inputs read once (triangular zero halves skipped), outputs
    (``outputs``: one dims tuple per output) written once, at ``dtype``'s item size."""

    inputs: tuple[InputSpec, ...]
    outputs: tuple[tuple[str | int, ...], ...]
    dtype: str

    def __call__(self, shape: Mapping[str, int]) -> float:
        elems = sum(s.stored_numel(shape) for s in self.inputs)
        elems += sum(math.prod(resolve_dims(o, shape)) for o in self.outputs)
        return float(elems * itemsize(self.dtype))
