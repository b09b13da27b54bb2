"""The ``kernelbench-l1`` family: KernelBench level 1 tasks 1-32, fp32, strict precision.

Shapes are the current upstream KernelBench shapes (TASKS.md); each task adds one or two
small checking shapes with irregular sizes (odd, prime-ish, not a multiple of any tile or
vector width) so that hard-coded shapes and missing tail predication fail.

Input layouts (the seed kernels rely on them; all contiguous row-major, in reference
argument order): plain matmuls ``A[M,K], B[K,N] -> C[M,N]``; kb16 ``A`` is stored
``[K,M]``, kb17 ``B`` is stored ``[N,K]``, kb18 both; see each task's description.

Reference functions are module-level (they pickle by reference into the harness process).
"""

from __future__ import annotations

from dataclasses import replace

from evo.tasks.lazy_torch import F, torch

from evo.tasks.base import Task
from evo.tasks.counts import ElementwiseFlops, GemmFlops, TensorBytes, TriangularGemmFlops
from evo.tasks.inputs import InputSpec, TensorInputs
from evo.tasks.tolerance import FP32_ELEMENTWISE, FP32_SOFTMAX, fp32_gemm

__all__ = ["FAMILY", "TASKS"] + [
    "matmul", "bmm", "matmul_t_a", "matmul_t_b", "matmul_t_both", "matmul_triu",
    "matmul_tril", "einsum_4d", "scalar_mul", "diag_matmul", "relu", "leaky_relu",
    "sigmoid", "tanh", "softmax_dim1", "log_softmax_dim1", "swish", "gelu", "selu",
    "hardsigmoid", "softplus", "softsign", "elu", "hardtanh",
]

FAMILY = "kernelbench-l1"
_DT = "float32"

#: Distributions for GEMMs: zero-mean (catches tf32/bf16 shortcuts), uniform, KernelBench's own.
GEMM_DISTS = ("normal", "uniform", "kernelbench")
#: Distributions for elementwise maps: "wide" crosses every activation threshold.
ELEMENTWISE_DISTS = ("normal", "wide", "uniform", "kernelbench")
#: Softmax-like row reductions also get large-magnitude logits.
SOFTMAX_DISTS = ("normal", "logits", "wide", "uniform", "kernelbench")


# ---------------------------------------------------------------- references (module level)
def matmul(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """A @ B (also 3-D @ 2-D and matrix-vector)."""
    return torch.matmul(A, B)


def bmm(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Batched A[b] @ B[b]."""
    return torch.bmm(A, B)


def matmul_t_a(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """A.T @ B with A stored [K, M]."""
    return torch.matmul(A.T, B)


def matmul_t_b(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """A @ B.T with B stored [N, K]."""
    return torch.matmul(A, B.T)


def matmul_t_both(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """A.T @ B.T with A stored [K, M] and B stored [N, K]."""
    return torch.matmul(A.T, B.T)


def matmul_triu(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """triu(A @ B) for upper-triangular A, B."""
    return torch.triu(torch.matmul(A, B))


def matmul_tril(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """tril(A @ B) for lower-triangular A, B."""
    return torch.tril(torch.matmul(A, B))


def einsum_4d(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """einsum('bijl,lk->bijk')."""
    return torch.einsum("bijl,lk->bijk", A, B)


def scalar_mul(A: torch.Tensor) -> torch.Tensor:
    """A * 3.14 (the kernel gets 3.14 as scalars[0])."""
    return A * 3.14


def diag_matmul(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """diag(A) @ B computed as a row scale (KernelBench v0.2 reference)."""
    return A.unsqueeze(1) * B


def relu(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x)


def leaky_relu(x: torch.Tensor) -> torch.Tensor:
    return F.leaky_relu(x, negative_slope=0.01)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x)


def tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x)


def softmax_dim1(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=1)


def log_softmax_dim1(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x, dim=1)


def swish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU."""
    return F.gelu(x)


def selu(x: torch.Tensor) -> torch.Tensor:
    return torch.selu(x)


def hardsigmoid(x: torch.Tensor) -> torch.Tensor:
    return F.hardsigmoid(x)


def softplus(x: torch.Tensor) -> torch.Tensor:
    """Softplus(beta=1, threshold=20): x itself where x > 20."""
    return F.softplus(x)


def softsign(x: torch.Tensor) -> torch.Tensor:
    return F.softsign(x)


def elu(x: torch.Tensor) -> torch.Tensor:
    return F.elu(x, alpha=1.0)


def hardtanh(x: torch.Tensor) -> torch.Tensor:
    return F.hardtanh(x, min_val=-1.0, max_val=1.0)


# ---------------------------------------------------------------- shapes
def _mnk(m: int, n: int, k: int) -> dict[str, int]:
    return {"M": m, "N": n, "K": k}


#: Small checking shapes for 2-D GEMMs: nothing a multiple of a tile or vector width, and a
#: longer K so multi-stage pipelines wrap around.
GEMM_CHECKS = (_mnk(129, 383, 97), _mnk(257, 520, 1031))
#: Checking shapes for row-wise / elementwise [R, C] tasks (odd numel; a long row).
ROW_CHECKS = ({"R": 129, "C": 1031}, {"R": 3, "C": 65537})


# ---------------------------------------------------------------- builders
def _gemm(
    name: str,
    description: str,
    reference,
    a: InputSpec,
    b: InputSpec,
    out: tuple,
    shapes: tuple[dict, ...],
    flops,
    k_dim: str = "K",
    tags: tuple[str, ...] = ("gemm",),
) -> Task:
    specs = (a, b)
    max_k = max(s[k_dim] for s in shapes)
    return Task(
        name=name,
        family=FAMILY,
        dtype=_DT,
        description=description,
        reference=reference,
        make_inputs=TensorInputs(specs, _DT),
        shapes=shapes,
        tolerance=fp32_gemm(max_k),
        flops=flops,
        bytes=TensorBytes(specs, (out,), _DT),
        distributions=GEMM_DISTS,
        reference_dtype="float64",
        seed=name,
        tags=tags,
    )


def _plain_gemm(name: str, what: str, bench: dict, checks=GEMM_CHECKS) -> Task:
    return _gemm(
        name,
        f"{what}: C[M,N] = A[M,K] @ B[K,N], fp32 row-major, fp32-accurate (no tf32/bf16).",
        matmul,
        InputSpec(("M", "K")),
        InputSpec(("K", "N")),
        ("M", "N"),
        (bench,) + tuple(checks),
        GemmFlops(),
    )


_ACTIVATIONS = (
    # (number, short name, reference, what, flops/elem, scalars)
    (19, "relu", relu, "ReLU: max(x, 0)", 1, ()),
    (20, "leaky_relu", leaky_relu, "LeakyReLU: x if x > 0 else 0.01 * x (scalars[0] = 0.01)", 2, (0.01,)),
    (21, "sigmoid", sigmoid, "Sigmoid: 1 / (1 + exp(-x))", 4, ()),
    (22, "tanh", tanh, "Tanh", 5, ()),
    (25, "swish", swish, "Swish: x * sigmoid(x)", 5, ()),
    (26, "gelu", gelu, "GELU (exact, erf): 0.5 x (1 + erf(x / sqrt 2))", 8, ()),
    (27, "selu", selu, "SELU: scale * (max(0,x) + min(0, alpha (exp(x) - 1))), "
     "alpha = 1.6732632423543772, scale = 1.0507009873554805", 5, ()),
    (28, "hardsigmoid", hardsigmoid, "HardSigmoid: clamp(x / 6 + 1/2, 0, 1)", 3, ()),
    (29, "softplus", softplus, "Softplus: log(1 + exp(x)), x itself for x > 20", 4, ()),
    (30, "softsign", softsign, "Softsign: x / (1 + |x|)", 3, ()),
    (31, "elu", elu, "ELU: x if x > 0 else alpha (exp(x) - 1), alpha = scalars[0] = 1.0", 4, (1.0,)),
    (32, "hardtanh", hardtanh, "HardTanh: clamp(x, scalars[0] = -1, scalars[1] = 1)", 2, (-1.0, 1.0)),
)


def _rowwise(name: str, description: str, reference, per_elem: float, scalars=(),
             dists=ELEMENTWISE_DISTS, tol=FP32_ELEMENTWISE, tags=("elementwise",)) -> Task:
    spec = InputSpec(("R", "C"))
    return Task(
        name=name,
        family=FAMILY,
        dtype=_DT,
        description=description,
        reference=reference,
        make_inputs=TensorInputs((spec,), _DT),
        shapes=({"R": 4096, "C": 393216},) + ROW_CHECKS,
        tolerance=tol,
        flops=ElementwiseFlops(("R", "C"), per_elem),
        bytes=TensorBytes((spec,), (("R", "C"),), _DT),
        scalars=tuple(scalars),
        distributions=dists,
        reference_dtype="float64",
        seed=name,
        tags=tags,
    )


def _build() -> tuple[Task, ...]:
    t: list[Task] = []
    t.append(_plain_gemm("kb01_square", "Square matmul", _mnk(4096, 4096, 4096)))
    t.append(_plain_gemm("kb02_standard", "Standard matmul", _mnk(2048, 4096, 8192)))
    t.append(_gemm(
        "kb03_bmm",
        "Batched matmul: C[B,M,N] = A[B,M,K] @ B[B,K,N], fp32, fp32-accurate.",
        bmm, InputSpec(("B", "M", "K")), InputSpec(("B", "K", "N")), ("B", "M", "N"),
        ({"B": 128, "M": 512, "N": 2048, "K": 1024},
         {"B": 3, "M": 129, "N": 383, "K": 97}, {"B": 2, "M": 257, "N": 520, "K": 1031}),
        GemmFlops(batch=("B",)),
    ))
    t.append(_gemm(
        "kb04_matvec",
        "Matrix-vector: C[M,1] = A[M,K] @ B[K,1], fp32, fp32-accurate.",
        matmul, InputSpec(("M", "K")), InputSpec(("K", 1)), ("M", 1),
        ({"M": 2048, "K": 1048576}, {"M": 129, "K": 1031}, {"M": 33, "K": 65537}),
        GemmFlops(n=1),
        tags=("gemv",),
    ))
    t.append(replace(
        _rowwise(
            "kb05_scalar",
            "Matrix-scalar: C[R,C] = A[R,C] * s with s = scalars[0] = 3.14, fp32.",
            scalar_mul, 1, scalars=(3.14,),
        ),
        shapes=({"R": 65536, "C": 16384}, {"R": 257, "C": 1031}, {"R": 3, "C": 13}),
    ))
    t.append(_plain_gemm("kb06_large_k", "Large-K matmul", _mnk(256, 256, 524288),
                         checks=(_mnk(129, 383, 97), _mnk(65, 33, 65543))))
    t.append(_plain_gemm("kb07_small_k", "Small-K matmul", _mnk(32768, 32768, 64),
                         checks=(_mnk(1031, 517, 64), _mnk(129, 383, 33))))
    t.append(_plain_gemm("kb08_irregular", "Irregular-shape matmul", _mnk(8205, 5921, 2949)))
    t.append(_plain_gemm("kb09_tall_skinny", "Tall-skinny matmul", _mnk(32768, 32768, 32),
                         checks=(_mnk(1031, 517, 32), _mnk(129, 383, 17))))
    t.append(_gemm(
        "kb10_3d",
        "3-D tensor-matrix: C[B,M,N] = A[B,M,K] @ B[K,N] (B shared across the batch), fp32.",
        matmul, InputSpec(("B", "M", "K")), InputSpec(("K", "N")), ("B", "M", "N"),
        ({"B": 16, "M": 1024, "N": 768, "K": 2048},
         {"B": 3, "M": 129, "N": 383, "K": 97}, {"B": 2, "M": 65, "N": 257, "K": 1031}),
        GemmFlops(batch=("B",)),
    ))
    t.append(_gemm(
        "kb11_4d",
        "4-D tensor-matrix: C[b,i,j,k] = einsum('bijl,lk->bijk', A[b,i,j,l], B[l,k]), fp32.",
        einsum_4d, InputSpec(("b", "i", "j", "l")), InputSpec(("l", "k")), ("b", "i", "j", "k"),
        ({"b": 8, "i": 256, "j": 512, "l": 256, "k": 768},
         {"b": 2, "i": 3, "j": 67, "l": 97, "k": 383}, {"b": 1, "i": 5, "j": 33, "l": 515, "k": 129}),
        GemmFlops(m="j", n="k", k="l", batch=("b", "i")),
        k_dim="l",
    ))
    # kb12: a row scale, i.e. elementwise accuracy (one rounding per element).
    a12, b12 = InputSpec(("N",)), InputSpec(("N", "M"))
    t.append(Task(
        name="kb12_diag",
        family=FAMILY,
        dtype=_DT,
        description="Diagonal matmul diag(A) @ B as a row scale: C[N,M] = A[N][:, None] * B[N,M].",
        reference=diag_matmul,
        make_inputs=TensorInputs((a12, b12), _DT),
        shapes=({"N": 4096, "M": 4096}, {"N": 257, "M": 1031}, {"N": 3, "M": 13}),
        tolerance=FP32_ELEMENTWISE,
        flops=ElementwiseFlops(("N", "M"), 1),
        bytes=TensorBytes((a12, b12), (("N", "M"),), _DT),
        distributions=ELEMENTWISE_DISTS,
        seed="kb12_diag",
        tags=("elementwise", "broadcast"),
    ))
    sq = ({"N": 4096}, {"N": 129}, {"N": 383})
    t.append(_gemm(
        "kb13_symmetric",
        "Symmetric matmul: C[N,N] = A @ B with A, B symmetric N x N (stored full), fp32.",
        matmul, InputSpec(("N", "N"), "symmetric"), InputSpec(("N", "N"), "symmetric"),
        ("N", "N"), sq, GemmFlops(m="N", n="N", k="N"), k_dim="N",
    ))
    t.append(_gemm(
        "kb14_upper",
        "Upper-triangular matmul: C = triu(A @ B), A, B upper-triangular N x N (stored full, "
        "zeros below the diagonal); C's lower triangle must be written as zeros. fp32.",
        matmul_triu, InputSpec(("N", "N"), "upper"), InputSpec(("N", "N"), "upper"),
        ("N", "N"), sq, TriangularGemmFlops(), k_dim="N", tags=("gemm", "structured"),
    ))
    t.append(_gemm(
        "kb15_lower",
        "Lower-triangular matmul: C = tril(A @ B), A, B lower-triangular N x N (stored full, "
        "zeros above the diagonal); C's upper triangle must be written as zeros. fp32.",
        matmul_tril, InputSpec(("N", "N"), "lower"), InputSpec(("N", "N"), "lower"),
        ("N", "N"), sq, TriangularGemmFlops(), k_dim="N", tags=("gemm", "structured"),
    ))
    tshapes = (_mnk(2048, 4096, 8192),) + GEMM_CHECKS
    t.append(_gemm(
        "kb16_trans_a",
        "Transposed A: C[M,N] = A.T @ B with A stored [K,M], B [K,N], fp32.",
        matmul_t_a, InputSpec(("K", "M")), InputSpec(("K", "N")), ("M", "N"), tshapes, GemmFlops(),
    ))
    t.append(_gemm(
        "kb17_trans_b",
        "Transposed B: C[M,N] = A @ B.T with A [M,K], B stored [N,K], fp32.",
        matmul_t_b, InputSpec(("M", "K")), InputSpec(("N", "K")), ("M", "N"), tshapes, GemmFlops(),
    ))
    t.append(_gemm(
        "kb18_trans_both",
        "Transposed both: C[M,N] = A.T @ B.T with A stored [K,M], B stored [N,K], fp32.",
        matmul_t_both, InputSpec(("K", "M")), InputSpec(("N", "K")), ("M", "N"), tshapes,
        GemmFlops(),
    ))
    acts = {num: (short, ref, what, fl, sc) for num, short, ref, what, fl, sc in _ACTIVATIONS}
    for num in range(19, 33):
        if num == 23:
            t.append(_rowwise(
                "kb23_softmax",
                "Softmax over dim 1 of x[R,C]: exp(x - max) / sum exp(x - max), per row.",
                softmax_dim1, 5, dists=SOFTMAX_DISTS, tol=FP32_SOFTMAX, tags=("reduction", "softmax"),
            ))
        elif num == 24:
            t.append(_rowwise(
                "kb24_log_softmax",
                "LogSoftmax over dim 1 of x[R,C]: x - max - log(sum exp(x - max)), per row.",
                log_softmax_dim1, 5, dists=SOFTMAX_DISTS, tol=FP32_SOFTMAX,
                tags=("reduction", "softmax"),
            ))
        else:
            short, ref, what, fl, sc = acts[num]
            t.append(_rowwise(
                f"kb{num}_{short}",
                f"{what}, elementwise on x[R,C] fp32, fp32-accurate (a few ulps).",
                ref, fl, scalars=sc,
            ))
    return tuple(t)


TASKS: tuple[Task, ...] = _build()
