"""Input generators: deterministic, seeded, adversarial tensors for the harness.

Every task's ``make_inputs`` is a :class:`TensorInputs` (a frozen, picklable callable):

    make_inputs(shape, generator, dist, device) -> tuple[Tensor, ...]

It returns the reference's arguments in order, contiguous and row-major, in the task's dtype,
created directly on ``device`` with ``generator``. **The generator must live on the same
device** (``torch.Generator(device="cuda").manual_seed(s)`` for CUDA tensors): torch draws
CUDA random numbers only from a CUDA generator, and mixing them raises a clear
:class:`ValueError` here rather than torch's obscure one. The same generator state, shape,
distribution and device give bit-identical tensors.

Distributions (EVALUATION.md, "mixed distributions that cover every branch"):

``normal``       zero-mean, std 1 (the main accuracy probe: sums cancel, so tf32/bf16
                 shortcuts show up in fp32 GEMMs).
``wide``         zero-mean, std 10: 3 sigma = 30 crosses every activation threshold (|x| > 1
                 HardTanh, > 3 HardSigmoid, > 20 Softplus).
``uniform``      uniform [-1, 1).
``logits``       zero-mean, std 30: large-magnitude logits for softmax / log-softmax, where a
                 missing max-subtraction overflows and tiny outputs must still be right.
``kernelbench``  uniform [0, 1), the task's own KernelBench generator (all positive: kept for
                 fidelity, never sufficient on its own).

Structured inputs (:class:`InputSpec.structure`): ``symmetric`` = (X + X^T) / 2,
``upper`` = triu(X), ``lower`` = tril(X), applied to the last two dimensions after sampling.
Values are sampled in float32 and then rounded to the task dtype, so a bf16 tensor holds the
nearest bf16 of a float32 sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Union

from evo.tasks.lazy_torch import torch

__all__ = [
    "DISTRIBUTIONS",
    "STRUCTURES",
    "DTYPES",
    "InputSpec",
    "TensorInputs",
    "sample",
    "torch_dtype",
    "resolve_dims",
    "check_generator_device",
]

#: Every distribution name a task may declare.
DISTRIBUTIONS: tuple[str, ...] = ("normal", "wide", "uniform", "logits", "kernelbench")
#: Structures an input may have.
STRUCTURES: tuple[str, ...] = ("dense", "symmetric", "upper", "lower")
#: Task dtypes (names as in :attr:`evo.tasks.base.Task.dtype`, which are torch's own attribute
#: names: :func:`torch_dtype`) and their sizes in bytes (read without importing torch).
DTYPES: dict[str, int] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float64": 8,
}

Dim = Union[str, int]


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``; unknown names raise listing the known ones."""
    return getattr(torch, known_dtype(name))


def known_dtype(name: str) -> str:
    """``name`` when it is one of :data:`DTYPES` (checked without importing torch); else
    ValueError listing the known ones."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}")
    return name


def resolve_dims(dims: tuple[Dim, ...], shape: Mapping[str, int]) -> tuple[int, ...]:
    """Concrete sizes of ``dims`` (names looked up in ``shape``, ints kept as they are)."""
    out = []
    for d in dims:
        if isinstance(d, int):
            out.append(d)
            continue
        try:
            out.append(int(shape[d]))
        except KeyError:
            raise KeyError(
                f"shape {dict(shape)} has no dimension {d!r} (needed for dims {dims})"
            ) from None
    return tuple(out)


def check_generator_device(generator: torch.Generator, device: torch.device | str) -> None:
    """Raise ValueError unless ``generator`` can create tensors on ``device``."""
    dev = torch.device(device)
    gdev = generator.device
    if gdev.type != dev.type or (
        dev.index is not None and gdev.index is not None and gdev.index != dev.index
    ):
        raise ValueError(
            f"make_inputs: generator is on {gdev} but tensors are requested on {dev}; "
            f"create the generator on the same device: "
            f"torch.Generator(device={str(dev)!r}).manual_seed(seed)"
        )


def sample(
    size: tuple[int, ...],
    generator: torch.Generator,
    dist: str,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """A float32 tensor of ``size`` drawn from ``dist`` (see the module docstring)."""
    kw = dict(generator=generator, device=device, dtype=torch.float32)
    if dist == "normal":
        return torch.randn(size, **kw)
    if dist == "wide":
        return torch.randn(size, **kw).mul_(10.0)
    if dist == "logits":
        return torch.randn(size, **kw).mul_(30.0)
    if dist == "uniform":
        return torch.rand(size, **kw).mul_(2.0).sub_(1.0)
    if dist == "kernelbench":
        return torch.rand(size, **kw)
    raise ValueError(f"unknown distribution {dist!r}; known: {', '.join(DISTRIBUTIONS)}")


def _sample_into(out: torch.Tensor, generator: torch.Generator, dist: str) -> None:
    """:func:`sample` drawn into the float32 tensor ``out`` in place (the same draws: torch's
    ``randn`` and ``rand`` are ``normal_`` and ``uniform_`` on a new tensor)."""
    if dist in ("normal", "wide", "logits"):
        out.normal_(generator=generator)
        if dist != "normal":
            out.mul_(10.0 if dist == "wide" else 30.0)
    elif dist == "uniform":
        out.uniform_(generator=generator).mul_(2.0).sub_(1.0)
    elif dist == "kernelbench":
        out.uniform_(generator=generator)
    else:
        raise ValueError(f"unknown distribution {dist!r}; known: {', '.join(DISTRIBUTIONS)}")


@dataclass(frozen=True)
class InputSpec:
    """One input tensor: its dims (names of the task's shape dict, or literal ints) and
    structure (``dense``, ``symmetric``, ``upper``, ``lower``; the last three need >= 2 dims).
    """

    dims: tuple[Dim, ...]
    structure: str = "dense"

    def __post_init__(self) -> None:
        if self.structure not in STRUCTURES:
            raise ValueError(
                f"InputSpec structure {self.structure!r}; known: {', '.join(STRUCTURES)}"
            )
        if self.structure != "dense" and len(self.dims) < 2:
            raise ValueError(f"structure {self.structure!r} needs at least 2 dims, got {self.dims}")

    def size(self, shape: Mapping[str, int]) -> tuple[int, ...]:
        return resolve_dims(self.dims, shape)

    def numel(self, shape: Mapping[str, int]) -> int:
        return math.prod(self.size(shape))

    def stored_numel(self, shape: Mapping[str, int]) -> int:
        """Elements a kernel must read: a triangular matrix's zero half need not be read."""
        size = self.size(shape)
        if self.structure in ("upper", "lower"):
            *batch, r, c = size
            m = min(r, c)
            # entries on or above (below) the diagonal of an r x c matrix
            tri = m * (m + 1) // 2 + m * (max(r, c) - m) if (
                (self.structure == "upper" and c >= r) or (self.structure == "lower" and r >= c)
            ) else m * (m + 1) // 2
            return math.prod(batch) * tri
        return math.prod(size)


@dataclass(frozen=True)
class TensorInputs:
    """A task's ``make_inputs``: one :class:`InputSpec` per reference argument.

    Call: ``(shape, generator, dist, device="cpu") -> tuple[Tensor, ...]``. Frozen and made
    of plain data, so it pickles by value into the harness subprocess.
    """

    specs: tuple[InputSpec, ...]
    dtype: str

    def __post_init__(self) -> None:
        known_dtype(self.dtype)  # validate early

    def sizes(self, shape: Mapping[str, int]) -> tuple[tuple[int, ...], ...]:
        """The concrete size of every input for ``shape``."""
        return tuple(s.size(shape) for s in self.specs)

    def __call__(
        self,
        shape: Mapping[str, int],
        generator: torch.Generator,
        dist: str,
        device: torch.device | str = "cpu",
    ) -> tuple[torch.Tensor, ...]:
        check_generator_device(generator, device)
        if dist not in DISTRIBUTIONS:
            raise ValueError(f"unknown distribution {dist!r}; known: {', '.join(DISTRIBUTIONS)}")
        dtype = torch_dtype(self.dtype)
        return tuple(self._one(spec, shape, generator, dist, device, dtype) for spec in self.specs)

    @staticmethod
    def _one(spec: InputSpec, shape: Mapping[str, int], generator: torch.Generator, dist: str,
             device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
        x = sample(spec.size(shape), generator, dist, device)
        if spec.structure == "symmetric":
            x = x.add(x.transpose(-1, -2)).mul_(0.5)
        elif spec.structure == "upper":
            x = torch.triu(x)
        elif spec.structure == "lower":
            x = torch.tril(x)
        return x.to(dtype).contiguous()

    def fill_(self, bufs, shape: Mapping[str, int], generator: torch.Generator, dist: str) -> None:
        """Write what ``self(shape, generator, dist, device)`` returns into ``bufs`` (one
        contiguous tensor per input, of its size and dtype, on the generator's device), bit for
        bit, drawing from ``generator`` as the call does. A dense float32 input is drawn in
        place (no second tensor of its size, no copy: what a judge refilling large inputs
        before every timed call saves); any other input is made as the call makes it and
        copied in. Raises ValueError when ``bufs`` do not match the specs."""
        check_generator_device(generator, bufs[0].device if len(bufs) else "cpu")
        if dist not in DISTRIBUTIONS:
            raise ValueError(f"unknown distribution {dist!r}; known: {', '.join(DISTRIBUTIONS)}")
        if len(bufs) != len(self.specs):
            raise ValueError(f"fill_: {len(bufs)} buffers for {len(self.specs)} inputs")
        dtype = torch_dtype(self.dtype)
        for k, (spec, b) in enumerate(zip(self.specs, bufs)):
            size = spec.size(shape)
            if tuple(b.shape) != size or b.dtype != dtype or not b.is_contiguous():
                raise ValueError(f"fill_: input {k} buffer is {tuple(b.shape)} {b.dtype} "
                                 f"(contiguous: {b.is_contiguous()}), the spec wants {size} {dtype}")
            if spec.structure == "dense" and dtype == torch.float32:
                _sample_into(b, generator, dist)
            else:
                b.copy_(self._one(spec, shape, generator, dist, b.device, dtype))
