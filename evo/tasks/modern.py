"""The ``modern`` family: bf16 GEMMs, fused epilogues and bf16 row-wise ops (TASKS.md).

The ground truth is the reference evaluated on the bf16 inputs upcast to float32
(``reference_dtype="float32"``) and compared with the kernel's bf16 output; the baseline is
the same reference called on the bf16 inputs (torch's own bf16 path). References therefore
return their input's dtype.

Checking shapes: the aligned GEMM tasks (``gemm_bf16``, ``bmm_bf16``, the fused GEMMs) keep
N and K multiples of 8 (16-byte rows, as TMA needs and as real models have) but not of any
tile size, and M odd, so tails are exercised; ``gemm_bf16_irregular`` and the row-wise tasks
use fully odd sizes.
"""

from __future__ import annotations

from evo.tasks.lazy_torch import F, torch

from evo.tasks.base import Task
from evo.tasks.counts import ElementwiseFlops, GemmFlops, TensorBytes
from evo.tasks.inputs import InputSpec, TensorInputs
from evo.tasks.tolerance import BF16_ELEMENTWISE, BF16_GEMM

__all__ = [
    "FAMILY", "TASKS", "RMSNORM_EPS", "matmul", "bmm", "gemm_bias_gelu", "gemm_silu_mul",
    "gelu", "silu", "softmax_last", "rmsnorm",
]

FAMILY = "modern"
_DT = "bfloat16"
RMSNORM_EPS = 1e-6

GEMM_DISTS = ("normal", "uniform", "kernelbench")
ELEMENTWISE_DISTS = ("normal", "wide", "uniform", "kernelbench")
SOFTMAX_DISTS = ("normal", "logits", "wide", "uniform", "kernelbench")


# ---------------------------------------------------------------- references (module level)
def matmul(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return torch.matmul(A, B)


def bmm(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return torch.bmm(A, B)


def gemm_bias_gelu(A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(A @ B + bias), exact (erf) GELU."""
    return F.gelu(torch.addmm(bias, A, B))


def gemm_silu_mul(A: torch.Tensor, W1: torch.Tensor, W3: torch.Tensor) -> torch.Tensor:
    """SwiGLU up-projection: silu(A @ W1) * (A @ W3)."""
    return F.silu(A @ W1) * (A @ W3)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU."""
    return F.gelu(x)


def silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x)


def softmax_last(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x * rsqrt(mean(x^2, -1) + 1e-6) * weight, computed in (at least) fp32, returned in
    x's dtype (eps = scalars[0])."""
    # torch's own fused op (fp32 maths inside for bf16): the baseline a user would call. The
    # hand-written fp32 formula ran 11x slower than this on the H200 and inflated speedups.
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight.to(x.dtype), RMSNORM_EPS)


# ---------------------------------------------------------------- builders
def _mnk(m: int, n: int, k: int) -> dict[str, int]:
    return {"M": m, "N": n, "K": k}


ALIGNED_GEMM_CHECKS = (_mnk(129, 392, 136), _mnk(257, 520, 1032))
IRREGULAR_GEMM_CHECKS = (_mnk(129, 383, 97), _mnk(257, 520, 1031))
ROW_CHECKS = ({"R": 129, "C": 1031}, {"R": 3, "C": 65537})


def _task(name, description, reference, specs, outs, shapes, flops, tol, dists, tags,
          scalars=(), bench_shapes=1) -> Task:
    return Task(
        name=name,
        family=FAMILY,
        dtype=_DT,
        description=description,
        reference=reference,
        make_inputs=TensorInputs(tuple(specs), _DT),
        shapes=tuple(shapes),
        tolerance=tol,
        flops=flops,
        bytes=TensorBytes(tuple(specs), tuple(outs), _DT),
        scalars=tuple(scalars),
        distributions=dists,
        bench_shapes=bench_shapes,
        reference_dtype="float32",
        seed=name,
        tags=tags,
    )


def _build() -> tuple[Task, ...]:
    a, b = InputSpec(("M", "K")), InputSpec(("K", "N"))
    mm = "C[M,N] = A[M,K] @ B[K,N], bf16 in/out, fp32 accumulation"
    rows = InputSpec(("R", "C"))
    return (
        _task("gemm_bf16", f"bf16 GEMM: {mm}.", matmul, (a, b), (("M", "N"),),
              (_mnk(8192, 8192, 8192), _mnk(4096, 4096, 4096)) + ALIGNED_GEMM_CHECKS,
              GemmFlops(), BF16_GEMM, GEMM_DISTS, ("gemm",), bench_shapes=2),
        _task("gemm_bf16_irregular",
              f"bf16 GEMM at irregular sizes (rows not 16-byte aligned): {mm}.",
              matmul, (a, b), (("M", "N"),),
              (_mnk(8205, 5921, 2949),) + IRREGULAR_GEMM_CHECKS,
              GemmFlops(), BF16_GEMM, GEMM_DISTS, ("gemm",)),
        _task("bmm_bf16",
              "bf16 batched GEMM: C[B,M,N] = A[B,M,K] @ B[B,K,N], fp32 accumulation.",
              bmm, (InputSpec(("B", "M", "K")), InputSpec(("B", "K", "N"))), (("B", "M", "N"),),
              ({"B": 128, "M": 512, "N": 2048, "K": 1024},
               {"B": 3, "M": 129, "N": 392, "K": 136}, {"B": 2, "M": 257, "N": 264, "K": 520}),
              GemmFlops(batch=("B",)), BF16_GEMM, GEMM_DISTS, ("gemm",)),
        _task("gemm_bias_gelu_bf16",
              "Fused GEMM + bias + exact GELU: C[M,N] = gelu(A[M,K] @ B[K,N] + bias[N]), "
              "bf16 in/out, fp32 accumulation and epilogue.",
              gemm_bias_gelu, (a, b, InputSpec(("N",))), (("M", "N"),),
              (_mnk(8192, 8192, 8192),) + ALIGNED_GEMM_CHECKS,
              GemmFlops(epilogue=9), BF16_GEMM, GEMM_DISTS, ("gemm", "fused")),
        _task("gemm_silu_mul_bf16",
              "SwiGLU up-projection: C[T,F] = silu(A[T,d] @ W1[d,F]) * (A @ W3[d,F]), "
              "bf16 in/out, fp32 accumulation (two GEMMs sharing A, fused gate).",
              gemm_silu_mul,
              (InputSpec(("T", "d")), InputSpec(("d", "F")), InputSpec(("d", "F"))), (("T", "F"),),
              ({"T": 8192, "d": 4096, "F": 14336},
               {"T": 129, "d": 136, "F": 392}, {"T": 65, "d": 1032, "F": 264}),
              GemmFlops(m="T", n="F", k="d", gemms=2, epilogue=6), BF16_GEMM, GEMM_DISTS,
              ("gemm", "fused")),
        _task("gelu_bf16", "Exact (erf) GELU, elementwise on x[R,C] bf16.", gelu,
              (rows,), (("R", "C"),), ({"R": 4096, "C": 393216},) + ROW_CHECKS,
              ElementwiseFlops(("R", "C"), 8), BF16_ELEMENTWISE, ELEMENTWISE_DISTS,
              ("elementwise",)),
        _task("silu_bf16", "SiLU x * sigmoid(x), elementwise on x[R,C] bf16.", silu,
              (rows,), (("R", "C"),), ({"R": 4096, "C": 393216},) + ROW_CHECKS,
              ElementwiseFlops(("R", "C"), 5), BF16_ELEMENTWISE, ELEMENTWISE_DISTS,
              ("elementwise",)),
        _task("softmax_bf16", "Softmax over the last dim of x[R,C] bf16 (fp32 internally).",
              softmax_last, (rows,), (("R", "C"),), ({"R": 32768, "C": 4096},) + ROW_CHECKS,
              ElementwiseFlops(("R", "C"), 5), BF16_ELEMENTWISE, SOFTMAX_DISTS,
              ("reduction", "softmax")),
        _task("rmsnorm_bf16",
              "RMSNorm: y[R,H] = x * rsqrt(mean(x^2 over H) + eps) * weight[H], eps = "
              "scalars[0] = 1e-6, fp32 internally, bf16 in/out.",
              rmsnorm, (InputSpec(("R", "H")), InputSpec(("H",))), (("R", "H"),),
              ({"R": 32768, "H": 4096}, {"R": 129, "H": 1031}, {"R": 3, "H": 16387}),
              ElementwiseFlops(("R", "H"), 4), BF16_ELEMENTWISE, ELEMENTWISE_DISTS,
              ("reduction", "norm"), scalars=(RMSNORM_EPS,)),
    )


TASKS: tuple[Task, ...] = _build()
