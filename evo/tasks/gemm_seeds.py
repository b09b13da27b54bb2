"""Seed kernels of the GEMM tasks: two CuTe templates instantiated per task by ``#define``.

Templates (``evo/tasks/kernels/``):

``gemm_f32`` -- strict fp32 (plain FFMA, no TF32): CuTe SIMT tiled MMA (UniversalFMA) fed by a
  ``STAGES``-deep ``cp.async`` pipeline with zero-fill predication, so any shape and any 4-byte
  alignment work. Task-config defines: ``TRANS_A`` (A stored ``[K, M]``), ``TRANS_B``
  (B stored ``[N, K]``), ``EPILOGUE`` (0 plain, 1 triu, 2 tril). Tunables: ``BM BN BK STAGES
  THR_M THR_N SPLIT_K GROUP_M``; ``SPLIT_K > 1`` reduces K-slices across a thread-block cluster
  through distributed shared memory (deterministic, no workspace, no atomics).

``gemm_bf16_sm90`` -- bf16 in/out, fp32 accumulation, sm_90a: warp-specialised wgmma kernel
  (one producer warpgroup, one or two consumer warpgroups), TMA loads when all strides are
  16-byte aligned, otherwise a predicated ``ld.global`` producer that writes the same swizzled
  shared-memory layout (handles e.g. 8205 x 2949 x 5921). Task-config define: ``EPILOGUE``
  (0 plain, 1 bias + exact GELU with inputs ``(A, B, bias)``, 2 SwiGLU dual GEMM
  ``silu(A @ W1) * (A @ W3)`` with inputs ``(A, W1, W3)``). Tunables: ``TILE_M TILE_N TILE_K
  STAGES GROUP_M`` for the TMA path and ``FB_TILE_N FB_STAGES`` for the fallback path.

``gemm_f32_3xtf32`` -- strict fp32 by error-compensated TF32 tensor-core maths (3xTF32:
  big/small split, three MMAs per k-block), same task-config defines and tensor handling as
  ``gemm_f32`` plus ``SPLIT_K`` / ``EPI_SMEM`` / ``TF32_CVT`` / ``PROMOTE`` / ``WGMMA`` tunables:
  ``WGMMA = 1`` adds a Hopper kernel (TMA, warp-specialised, RS tf32 wgmma) that the host picks
  for TMA-eligible calls, the ``mma.sync.m16n8k8`` kernel taking the rest. Its seeds
  :data:`F32_3XTF32_SEEDS` are the strict-fp32 seeds (validated on an H200 with
  ``benchmarks/lab/probes/f32_3xtf32.json``, ``f32_3xtf32_sm90*.json`` and
  ``f32_3xtf32_producer_split.json``); the FFMA ones stay
  available as :data:`F32_FFMA_SEEDS`.

All read every shape from the tensor descriptors at run time (batch from a 3-D B, leading
dims of A folded into M when B is 2-D) and return ``cudaErrorInvalidValue`` for inputs
outside their contract. ``docs/kernels.md`` ("GEMM seed templates") is the user-facing
description; ``benchmarks/lab/probe.py`` and ``evo bench`` check and time them on a GPU.
"""

from __future__ import annotations

import functools

from evo.tasks.seedspec import SeedSpec

__all__ = [
    "GEMM_F32_TEMPLATE",
    "GEMM_BF16_TEMPLATE",
    "GEMM_SEEDS",
    "GEMM_F32_3XTF32_TEMPLATE",
    "F32_3XTF32_SEEDS",
    "F32_FFMA_SEEDS",
    "BF16_GEMM_SEEDS",
    "FP32_GEMM_TASKS",
    "BF16_GEMM_TASKS",
    "gemm_seed",
]

GEMM_F32_TEMPLATE = "gemm_f32"
GEMM_BF16_TEMPLATE = "gemm_bf16_sm90"
GEMM_F32_3XTF32_TEMPLATE = "gemm_f32_3xtf32"

# Epilogue codes of the templates (kept in one place so tests and docs agree with the .cu).
F32_EPILOGUES = {"none": 0, "triu": 1, "tril": 2}
BF16_EPILOGUES = {"none": 0, "bias_gelu": 1, "silu_mul": 2}


def _f32(
    description: str,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
    epilogue: str = "none",
    tunables: tuple[tuple[str, str], ...] = (),
    template: str = GEMM_F32_TEMPLATE,
) -> SeedSpec:
    """A strict-fp32 seed: both fp32 templates take the same task-config defines."""
    defines = (
        ("TRANS_A", str(int(trans_a))),
        ("TRANS_B", str(int(trans_b))),
        ("EPILOGUE", str(F32_EPILOGUES[epilogue])),
    )
    return SeedSpec(template, defines, description, tunable_defaults=tunables)


def _bf16(description: str, *, epilogue: str = "none", tunables: tuple[tuple[str, str], ...] = ()) -> SeedSpec:
    defines = (("EPILOGUE", str(BF16_EPILOGUES[epilogue])),)
    return SeedSpec(GEMM_BF16_TEMPLATE, defines, description, tunable_defaults=tunables)


#: kb06_large_k's FFMA tiling: 64x64 tiles, an 8-CTA split-K cluster, an 8x16 thread grid
#: (docs/kernels.md, "Seed defaults").
_LARGE_K = (("BM", "64"), ("BN", "64"), ("BK", "16"), ("SPLIT_K", "8"), ("THR_M", "8"), ("THR_N", "16"))

#: The plain-FFMA strict-fp32 seeds, superseded by F32_3XTF32_SEEDS on 2026-11-30 (docs/kernels.md,
#: "Seed defaults"). Kept as a template the search and tests can still use.
F32_FFMA_SEEDS: dict[str, SeedSpec] = {
    "kb01_square": _f32("C = A @ B, fp32 FFMA, cp.async pipeline"),
    "kb02_standard": _f32("C = A @ B, fp32 FFMA, cp.async pipeline"),
    "kb03_bmm": _f32("C[l] = A[l] @ B[l] (batch on gridDim.y), fp32 FFMA"),
    "kb06_large_k": _f32("C = A @ B with K split over an 8-CTA cluster, DSMEM reduction", tunables=_LARGE_K),
    "kb07_small_k": _f32("C = A @ B, K = 64: store-bound, 16-byte vector stores"),
    "kb08_irregular": _f32("C = A @ B on unaligned shapes: zero-filled 4-byte cp.async"),
    "kb09_tall_skinny": _f32("C = A @ B, K = 32: store-bound, 16-byte vector stores"),
    "kb10_3d": _f32("[B, M, K] @ [K, N]: leading dims of A fold into M"),
    "kb11_4d": _f32("einsum bijl,lk->bijk: leading dims of A fold into M"),
    "kb13_symmetric": _f32("C = A @ B (symmetry not exploited)"),
    "kb14_upper": _f32("C = triu(A @ B); tiles below the diagonal only write zeros", epilogue="triu"),
    "kb15_lower": _f32("C = tril(A @ B); tiles above the diagonal only write zeros", epilogue="tril"),
    "kb16_trans_a": _f32("C = A.T @ B with A stored [K, M]", trans_a=True),
    "kb17_trans_b": _f32("C = A @ B.T with B stored [N, K]", trans_b=True),
    "kb18_trans_both": _f32("C = A.T @ B.T with A [K, M], B [N, K]", trans_a=True, trans_b=True),
}

#: PERSIST: one CTA per SM loops over the tiles (docs/kernels.md, "Seed defaults").
_BF16_PERSIST = (("PERSIST", "1"),)
#: EPI_DEFER: each tile's epilogue runs in slices under the next tile's wgmmas (docs/kernels.md,
#: "Seed defaults").
_BF16_DEFER = (("EPI_DEFER", "1"),)
#: bmm_bf16: 2-CTA clusters along M multicasting the B tiles (docs/kernels.md, "Seed defaults").
_BMM_CLUSTER = (("CLUSTER_M", "2"),)
#: SwiGLU: 2-CTA clusters along M multicasting the W1 / W3 tiles (docs/kernels.md, "Seed defaults").
_SWIGLU_CLUSTER = (("CLUSTER_M", "2"),)
#: bias+GELU: EPI_BF16X2 (bias added by one packed bf16x2 FMA), without clusters (docs/kernels.md,
#: "Seed defaults").
_BIAS_GELU_X2 = (("EPI_BF16X2", "1"),)
#: SwiGLU: DUAL_MMA, one 64 x 256 wgmma per k-step for both accumulators
#: (docs/kernels.md, "Seed defaults").
_SWIGLU_DUAL = (("DUAL_MMA", "1"),)

BF16_GEMM_SEEDS: dict[str, SeedSpec] = {
    "gemm_bf16": _bf16("C = A @ B: TMA + wgmma 128x256x64, warp-specialised, 4 stages, persistent, "
                       "each epilogue under the next tile's wgmmas",
                       tunables=(*_BF16_PERSIST, *_BF16_DEFER)),
    "gemm_bf16_irregular": _bf16(
        "C = A @ B with unaligned K/N: operands padded into the workspace, then TMA + wgmma"
    ),
    "bmm_bf16": _bf16("C[l] = A[l] @ B[l]: rank-3 TMA, persistent over (batch, tile) work units, "
                      "2-CTA clusters multicasting B, each epilogue under the next tile's wgmmas",
                      tunables=(*_BF16_PERSIST, *_BF16_DEFER, *_BMM_CLUSTER)),
    "gemm_bias_gelu_bf16": _bf16("C = gelu_erf(A @ B + bias), fused epilogue, persistent, epilogue under "
                                 "the next tile's wgmmas, bias added by a packed bf16x2 FMA",
                                 epilogue="bias_gelu", tunables=(*_BF16_PERSIST, *_BF16_DEFER, *_BIAS_GELU_X2)),
    "gemm_silu_mul_bf16": _bf16(
        "C = silu(A @ W1) * (A @ W3): dual GEMM, one 64x256 wgmma per k-step computes both "
        "accumulators from each A tile, persistent, 2-CTA clusters multicasting W1 / W3, epilogue "
        "under the next tile's wgmmas",
        epilogue="silu_mul",
        tunables=(("TILE_N", "128"), ("FB_TILE_N", "64"), *_BF16_PERSIST, *_SWIGLU_CLUSTER, *_SWIGLU_DUAL,
                  *_BF16_DEFER),
    ),
}


# ---- 3xTF32 seeds of the strict-fp32 tasks (issue 8) ---------------------------------------
# Same task-config defines and host-side tensor handling as gemm_f32 (TRANS_A, TRANS_B,
# EPILOGUE; batch from a 3-D B, leading dims of A folded into M), but error-compensated TF32
# tensor-core maths (mma.sync m16n8k8, three MMAs per k-block, per-k-tile promotion). Why they
# replaced the FFMA seeds, and each tunable default below: docs/kernels.md, "Seed defaults".

_f32_3xtf32 = functools.partial(_f32, template=GEMM_F32_3XTF32_TEMPLATE)


#: kb06_large_k on the Hopper kernel: 128 x 128 tiles, K split over one wave of CTAs through the
#: workspace (SPLIT_WS); WARPS 4 x 4 keep its mma.sync fallback free of spills (docs/kernels.md,
#: "Seed defaults").
_3X_LARGE_K = (("BM", "128"), ("BN", "128"), ("WARPS_M", "4"), ("WARPS_N", "4"), ("STAGES", "4"),
               ("SPLIT_WS", "1"), ("WGMMA", "1"))
#: K = 64 / 32 (store-bound): the persistent Hopper kernel with TMA stores (PERSIST, TMA_STORE);
#: EPI_SMEM stages the mma.sync fallback's tile for full 128-byte row stores
#: (docs/kernels.md, "Seed defaults").
_3X_SMALL_K = (("STAGES", "3"), ("EPI_SMEM", "1"), ("WGMMA", "1"), ("PERSIST", "1"), ("TMA_STORE", "1"))
#: The Hopper kernel (TMA + producer-side B split + RS tf32 wgmma, warp-specialised), 4 stages;
#: operands TMA cannot read in place get row-padded workspace copies (PAD = 1, the default)
#: (docs/kernels.md, "Seed defaults").
_3X_WG = (("STAGES", "4"), ("WGMMA", "1"))

F32_3XTF32_SEEDS: dict[str, SeedSpec] = {
    "kb01_square": _f32_3xtf32("C = A @ B, 3xTF32: TMA + RS tf32 wgmma, warp-specialised, 4-stage mbarrier ring", tunables=_3X_WG),
    "kb02_standard": _f32_3xtf32("C = A @ B, 3xTF32: TMA + RS tf32 wgmma, warp-specialised, 4-stage mbarrier ring", tunables=_3X_WG),
    "kb03_bmm": _f32_3xtf32("C[l] = A[l] @ B[l] (batch on gridDim.y), 3xTF32", tunables=_3X_WG),
    "kb06_large_k": _f32_3xtf32(
        "C = A @ B, 3xTF32 wgmma, K split over one wave of CTAs (partials in the workspace, "
        "then an ordered reduction)", tunables=_3X_LARGE_K
    ),
    "kb07_small_k": _f32_3xtf32("C = A @ B, K = 64, 3xTF32 wgmma, persistent, TMA-store epilogue: store-bound, the next tile computes during the stores",
                                tunables=_3X_SMALL_K),
    "kb08_irregular": _f32_3xtf32("C = A @ B on unaligned shapes, 3xTF32 wgmma: A and B copied into row-padded "
                                  "workspace buffers, then TMA", tunables=_3X_WG),
    "kb09_tall_skinny": _f32_3xtf32("C = A @ B, K = 32, 3xTF32 wgmma, persistent, TMA-store epilogue: store-bound, the next tile computes during the stores",
                                    tunables=_3X_SMALL_K),
    "kb10_3d": _f32_3xtf32("[B, M, K] @ [K, N], 3xTF32: leading dims of A fold into M", tunables=_3X_WG),
    "kb11_4d": _f32_3xtf32("einsum bijl,lk->bijk, 3xTF32: leading dims of A fold into M", tunables=_3X_WG),
    "kb13_symmetric": _f32_3xtf32("C = A @ B, 3xTF32 (symmetry not exploited)", tunables=_3X_WG),
    "kb14_upper": _f32_3xtf32("C = triu(A @ B), 3xTF32 wgmma; tiles below the diagonal only write zeros",
                              epilogue="triu", tunables=_3X_WG),
    "kb15_lower": _f32_3xtf32("C = tril(A @ B), 3xTF32 wgmma; tiles above the diagonal only write zeros",
                              epilogue="tril", tunables=_3X_WG),
    "kb16_trans_a": _f32_3xtf32("C = A.T @ B with A stored [K, M], 3xTF32 (M-major A tile)", trans_a=True, tunables=_3X_WG),
    "kb17_trans_b": _f32_3xtf32("C = A @ B.T with B stored [N, K], 3xTF32 (K-major B tile)", trans_b=True, tunables=_3X_WG),
    "kb18_trans_both": _f32_3xtf32("C = A.T @ B.T with A [K, M], B [N, K], 3xTF32", trans_a=True, trans_b=True, tunables=_3X_WG),
}

#: The seeds: 3xTF32 for the strict-fp32 tasks, the wgmma template for bf16.
GEMM_SEEDS: dict[str, SeedSpec] = {**F32_3XTF32_SEEDS, **BF16_GEMM_SEEDS}

FP32_GEMM_TASKS: tuple[str, ...] = tuple(F32_3XTF32_SEEDS)
BF16_GEMM_TASKS: tuple[str, ...] = tuple(k for k, v in GEMM_SEEDS.items() if v.template == GEMM_BF16_TEMPLATE)


def gemm_seed(task: str) -> SeedSpec:
    """The seed of a GEMM task; ``KeyError`` lists the valid task names."""
    try:
        return GEMM_SEEDS[task]
    except KeyError:
        raise KeyError(f"no GEMM seed for task {task!r}; GEMM seeds: {sorted(GEMM_SEEDS)}") from None
