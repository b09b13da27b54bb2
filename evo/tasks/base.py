"""What a kernel task is: the contract between the task suite, the seeds and the harness.

A :class:`Task` is frozen data plus module-level functions (so it pickles by reference for
Ray). The judge (``evaluators/judge/``) is its only caller on the GPU side; ``evo tasks`` and
the speed-of-light bound read its counts.

Kernel ABI mapping (see ``evaluators/abi/evo_abi.h``): ``evo_launch`` receives ``make_inputs``'s
tensors as ``in`` in the same order as ``reference``'s arguments, ``scalars`` as the task's
``scalars`` tuple, and one output per tensor that ``reference`` returns (the judge
allocates them with the reference's shape and dtype).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

__all__ = ["Tolerance", "Task", "Shape"]

#: A shape set entry: named problem sizes, e.g. {"M": 4096, "N": 4096, "K": 4096}.
Shape = Mapping[str, int]


@dataclass(frozen=True)
class Tolerance:
    """Pass rule, relative to the output's scale (EVALUATION.md, Correctness).

    An output passes when, elementwise, ``|out - ref| <= atol + rtol * |ref|`` and, over the
    whole tensor, ``||out - ref||_2 / ||ref||_2 <= rel_l2``. For fp32 tasks the bounds are
    calibrated so that fp32 arithmetic in any legitimate order passes and tf32/bf16 shortcuts
    fail. ``nondeterminism`` is the largest allowed max-abs difference between two calls
    on the same inputs (0 = bitwise deterministic).

    ``atol_relative``: when True, ``atol`` is in units of the reference's RMS (the output
    scale), i.e. the elementwise bound is ``atol * rms(ref) + rtol * |ref|``; every built-in
    task uses this, so one rule fits any shape and input distribution. The check itself is
    :func:`evo.tasks.tolerance.check`.
    """

    atol: float
    rtol: float
    rel_l2: float
    nondeterminism: float = 0.0
    atol_relative: bool = False


@dataclass(frozen=True)
class Task:
    """One kernel task: reference, inputs, shapes, tolerance and roofline counts.

    Fields:
      name: registry key, e.g. ``kb19_relu`` or ``gemm_bf16``.
      family: ``kernelbench-l1``, ``modern`` or ``user``.
      dtype: ``float32`` or ``bfloat16`` (the dtype of inputs and outputs).
      reference: ``reference(*inputs) -> Tensor | tuple[Tensor, ...]``; pure, no mutation.
        Called with inputs upcast to ``reference_dtype`` by the harness for the ground truth,
        and with the original inputs when it is timed as the baseline.
      make_inputs: ``make_inputs(shape, generator, dist, device) -> tuple[Tensor, ...]``,
        deterministic given the generator; ``dist`` is one of ``distributions``.
      shapes: all shapes checked for correctness; the first ``bench_shapes`` are timed.
      scalars: constants passed to the kernel (e.g. ``(3.14,)`` for matrix-scalar).
      flops / bytes: ``f(shape) -> float``: arithmetic and compulsory DRAM traffic
        (each input read once, each output written once) for the speed-of-light bound.
      seed: a ``.cu`` path (user tasks: relative to the task file), the name of a seed
        kernel in ``evo.tasks.seeds``, or empty (built-in tasks: the seed named like the
        task; user tasks: no seed, the LLM mutator writes the first kernel).
      Outputs may be floating (checked by ``tolerance``), integer or boolean (exact, or
      ``index_rule``), and 0-dim (a loss: a tensor of shape ``()``).
    """

    name: str
    family: str
    dtype: str
    description: str
    reference: Callable[..., Any]
    make_inputs: Callable[..., tuple]
    shapes: tuple[Shape, ...]
    tolerance: Tolerance
    flops: Callable[[Shape], float]
    bytes: Callable[[Shape], float]
    scalars: tuple[float, ...] = ()
    distributions: tuple[str, ...] = ("normal", "wide", "uniform")
    bench_shapes: int = 1
    reference_dtype: str = "float64"
    seed: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    #: Optional rule for integer (index) outputs, e.g. ``evo.tasks.tolerance.ArgExtremum``:
    #: called as ``rule(inputs, out, ref) -> (ok, reason, metrics)`` instead of the exact
    #: match, so a task can accept any index of an equal value. None: exact, ties as torch.
    index_rule: Callable[..., Any] | None = None

    @property
    def benchmark_shapes(self) -> tuple[Shape, ...]:
        return self.shapes[: self.bench_shapes]
