// gemm_f32_3xtf32.cu -- strict-fp32 GEMM by error-compensated TF32 tensor-core maths (3xTF32).
//
// STATUS. Both paths are VALIDATED on an H200. mma.sync (WGMMA = 0): every strict-fp32 task
// passed its checks on every shape (benchmarks/lab/probes/f32_3xtf32.json, kb01 ~1.2x cuBLAS fp32).
// WGMMA = 1 (benchmarks/lab/probes/f32_3xtf32_producer_split.json, 2026-12-01): kb01/02/10/13
// 2.30-2.35x, kb16/18 (M-major A) 2.07-2.13x, kb07 (K = 64) 1.38x, kb09 (K = 32) 1.02x torch
// fp32, every strict-fp32 check passed, with BM = BN = 128 and 4 stages.
// History: the first Hopper design (2026-11-30) had the consumers split B themselves and meet
// at a named barrier every k-tile (1.46-1.79x); with BN = 64 or 5 stages its output changed
// between calls (single wrong rows of C; cause not found, SASS checks ruled out register
// hazards). The current design (the producer warpgroup splits B, mbarrier hand-off) ran
// deterministically in those configurations too (benchmarks/lab/repeat.py, 0 of 16 calls differ),
// so the constraint admits them again; the harness's nondeterminism checks stay the guard.
// The likely cause surfaced later the same day: kb09 with PERSIST = 1 showed the same pattern
// (8 rows of one tile wrong) until the consumers put fence.proxy.async between their A loads
// from a stage and its release (the refill is a TMA write, another proxy); with the fence it
// passed every check and 0 of 8 calls differed.
//
// WGMMA = 1 (tunable; all of its device code sits in `#if WGMMA`): a second kernel, picked on
// the host per call. Eligible calls (K >= 1, A and B 16-byte aligned, contiguous extents K or
// M of A and N or K of B multiples of 4 floats: what TMA needs) go to the Hopper kernel,
// including triu/tril epilogues (tiles in the zeroed triangle skip the main loop) and split-K
// (SPLIT_K CTAs per tile in a cluster, DSMEM reduction in rank order; 16 is a non-portable
// cluster size, Hopper kernel only). PAD = 1 (default; only matters with WGMMA = 1): a call
// with K >= 1 whose A or B is not TMA-legal (odd strides such as kb08's K = 2949, N = 5921, or
// misaligned pointers) asks for a workspace (evo_workspace_bytes) holding a row-padded copy of
// each such operand -- its contiguous extent rounded up to a multiple of PAD_LD floats (32:
// 128-byte rows; 4, the TMA minimum, leaves box rows straddling 128-byte lines, which cost the
// bf16 template 29% of its GEMM time), 256-byte
// aligned, batch strides following -- made by pad_rows_kernel on `stream`; the Hopper kernel
// then reads the copies (logical extents unchanged, padded strides). Workspace bytes: the sum
// over the padded operands of round_up(rows * round_up(cols, PAD_LD) * 4, 256), rows = L * (M or K)
// for A, L * (K or N) for B, cols the contiguous extent. On an H200 (2026-12-01,
// benchmarks/lab/probes/f32_3xtf32_pad.json): kb08 2.81 ms, 2.31x torch fp32 (mma.sync: 1.17x),
// PAD_LD = 4 2.83 ms; nine Hopper seeds passed every check shape with it. With PAD = 0 such calls, and with any PAD calls with K = 0, run the
// mma.sync kernel below (workspace 0, as before PAD existed). Any M, N >= 1 and any K >= 1: TMA
// zero-fills boxes past M, N and K, the epilogue stores only rows < M, columns < N. Batch
// (bmm, gridDim.y) and folded leading dims use a rank-3 TMA view (M, K, L); all four transpose
// combinations are handled. Constraint: BK = 32, BM, BN in {64, 128}, its shared memory fits.
// Hopper kernel: warp-specialised CTA of 1 + BM / 64 warpgroups. Producer warpgroup: one
// elected thread issues TMA loads of raw fp32 A and B tiles into a STAGES-deep ring
// (full/empty mbarriers); all 128 threads split each B stage (and, for an N-contiguous B,
// transpose it) into double-buffered K-major SW128 tf32 tiles B_big / B_small, and for an
// M-major A transpose the A stage into a K-major copy; bfull/bempty mbarriers hand the
// buffers to the consumers, so the consumer warpgroups never wait for each other (one's split
// and promotion overlap the other's wgmmas). A goes through registers (RS wgmma): each
// consumer thread loads its raw fragment (four 16-byte loads from the K-major SW128 stage or
// copy) and splits it into tf32 big/small fragments. Per k-block of 8 three tf32 wgmmas
// (small*big, big*small, big*big) into a fresh per-k-tile accumulator, promoted into the fp32
// total with FADDs after each k-tile (as PROMOTE = 1 does). The k-slots of a tile are permuted
// (slot 8 j + 4 h + t holds k = 8 t + 4 h + j, the same for A and B) so a thread's four
// k-blocks of a fragment row are one float4. Epilogue: 8-byte column-pair stores straight from
// the accumulator (scalar at the N edge or for odd N / 4-byte aligned C). EPI_SMEM, WARPS_M/N,
// MIN_BLOCKS and PROMOTE only affect the mma.sync kernel. PERSIST = 1 (SPLIT_K = 1): one CTA
// per SM loops over the tiles (batch included), the ring positions carrying over, so the
// producer loads and splits the next tile while the consumers store this one (store-bound
// small-K shapes). TMA_STORE = 1 (SPLIT_K = 1): the consumers write the finished tile into
// its own shared-memory buffer (BM x BN fp32, 32-column 128-byte-swizzled blocks), fence the
// async proxy, meet at a named barrier, and one thread issues the TMA bulk store; the buffer is
// reused once that store has read it (cp.async.bulk.wait_group.read before the next tile's
// writes), so with PERSIST the next tile computes while the TMA engine drains this one (H200:
// kb09 1.63x -> 1.94x, kb07 1.69x -> 2.23x torch fp32; kb01 and triangular kb14 gain nothing).
// C must be TMA-legal (N % 4 == 0, 16-byte aligned), else the register stores run.
// A consumer releases an A stage only after fence.proxy.async: the refill is
// a TMA (async-proxy) write, and without the fence one warp's fragment rows of a tile came out
// wrong (kb09 with PERSIST = 1). SPLIT_WS = 1 (SPLIT_K = 1, PERSIST = 0): a call whose tiles
// fill at most half of the SMs splits K over floor(SMs / tiles) independent CTAs per tile (no
// slice under 4 k-tiles); each writes its partial tile into the workspace and
// splitk_reduce_kernel then sums them in slice order (kb06: 4 tiles x 33 slices, 1.09x -> 2.11x
// torch fp32 on an H200 against the 16-CTA cluster split, which fills only 64 SMs).
// No allocation, no atomics, one launch (two with SPLIT_WS's reduction): deterministic.
//
// Verified on the CPU for both paths (tests/test_gemm_3xtf32.py): for every seed of
// evo.tasks.gemm_seeds.F32_3XTF32_SEEDS the rendered source passes the static policy, its
// tunable defaults satisfy every @constraint, and a real nvcc 13.0 build for sm_90a succeeds
// with ptxas reporting no spills and no stack frame; extreme tunable combinations build without
// spills too; the PTX holds `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32` (3 per atom
// per k-block); host-only programs check the CuTe layouts of both kernels.
//
// Computes, per batch l:  C[l] = epilogue(op(A[l]) @ op(B[l])), all fp32, with the same
// task-config defines and host-side tensor handling as gemm_f32.cu:
//   TRANS_A = 0: A is [..., M, K]  (leading dims of a 3+-D A fold into M when B is 2-D)
//   TRANS_A = 1: A is [K, M] or [L, K, M]          (the task computes A.T @ B)
//   TRANS_B = 0: B is [K, N] or [L, K, N]
//   TRANS_B = 1: B is [N, K] or [L, N, K]          (the task computes A @ B.T)
//   A 3-D with a 3-D B is a batched product (bmm) over the leading dim L (gridDim.y).
//   EPILOGUE = 0 plain, 1 triu (C[m][n] = 0 for n < m), 2 tril (C[m][n] = 0 for n > m);
//   tiles wholly in the zeroed triangle skip the main loop and only write zeros.
// All inputs contiguous row-major, 4-byte aligned, any M, N, K >= 0 (K = 0 writes zeros).
//
// Maths. Each fp32 operand x is split at the register level into
//   big   = tf32_rna(x)            (cvt.rna.tf32.f32: 10 explicit mantissa bits)
//   small = tf32_rna(x - big)      (the next ~11 bits; x - big is exact in fp32)
// and every k-block of 8 issues three TF32 tensor-core MMAs into ONE fp32 accumulator, in the
// order small*big, big*small, big*big (the small cross terms first, as CUTLASS's FastF32
// operator does). The dropped small*small term is ~2^-22 relative. Inputs with Inf/NaN give
// NaN where the reference may give Inf (x - big is NaN for x = Inf); the tasks use finite
// inputs.
//
// Structure. One CTA computes a BM x BN tile with WARPS_M x WARPS_N warps; the CuTe TiledMMA
// repeats SM80_16x8x8_F32TF32TF32F32_TN over (BM, BN). Global -> shared by cp.async, STAGES
// deep, zero-filled outside the matrix; copy threads run along each operand's contiguous mode.
// 16-byte copies when both operands' contiguous extents (K or M for A, N or K for B) are
// multiples of 4 and A, B are 16-byte aligned, otherwise 4-byte copies (a second kernel
// instantiation, picked on the host). Shared memory holds raw fp32, padded so the scalar
// fragment loads are bank-conflict free. Fragment pattern of the atom (g = lane / 4,
// t = lane % 4): A values (m, k) = (g | g+8, t | t+4), B values (n, k) = (g, t | t+4).
//   K-major operand (A with TRANS_A = 0, B with TRANS_B = 1): (X, BK) with stride (BK + 4, 1).
//     bank = (g * (BK + 4) + t) % 32; BK % 8 == 0 makes (BK + 4) / 4 odd, so g * (BK + 4)
//     hits the 8 distinct multiples of 4 and + t fills the 32 banks.
//   X-major operand (A with TRANS_A = 1, B with TRANS_B = 0): (X, BK) with stride (1, X + 8).
//     bank = (g + t * (X + 8)) % 32 = g + 8 t when X % 32 == 0 (X in {64, 128, 256}).
//   Both paddings keep rows 16-byte aligned for the vector cp.async.
// Shared -> registers: scalar 32-bit loads per k-block of 8, then the big/small split and the
// three MMAs.
// Epilogue. SPLIT_K = 1 and EPI_SMEM = 0: predicated stores straight from the accumulators
// (8-byte column-pair stores for full tiles when N is even). EPI_SMEM = 1: the tile goes
// through shared memory (rows padded to BN + 8 floats) and leaves as 16-byte row-contiguous
// stores when N % 4 == 0 (full 128-byte lines; store-bound shapes such as K = 32). SPLIT_K > 1
// launches a (SPLIT_K, 1, 1) thread-block cluster per tile: each CTA multiplies one K slice,
// writes its partial tile to its own shared memory, and CTA r sums rows [r*BM/S, (r+1)*BM/S)
// of all partials in rank order through distributed shared memory (ld.shared::cluster.v4),
// then stores them: deterministic without a workspace. Grouped rasterisation over GROUP_M
// tile rows.
//
// No allocation, no atomics, one launch on `stream` (plus PAD's copies and SPLIT_WS's
// reduction, all on `stream`, through the caller's workspace): bitwise deterministic by
// construction.
// ABI: evo_abi.h. Returns cudaErrorInvalidValue for inputs outside the contract above, and for
// a missing, extra, too small or misaligned workspace tensor; evo_workspace_bytes and
// evo_launch share one host-side plan (make_plan), so the former says -1 exactly where the
// latter rejects the inputs.
#include <cute/tensor.hpp>
#include <cute/arch/cluster_sm90.hpp>
#include "evo_abi.h"

// @evo:task-config

#ifndef TRANS_A
#define TRANS_A 0
#endif
#ifndef TRANS_B
#define TRANS_B 0
#endif
#ifndef EPILOGUE
#define EPILOGUE 0
#endif

// @tunable BM = 128 in {64, 128, 256}
// @tunable BN = 128 in {64, 128, 256}
// @tunable BK = 32 in {16, 32}
// @tunable STAGES = 3 in {2, 3, 4, 5}
// @tunable WARPS_M = 2 in {1, 2, 4}
// @tunable WARPS_N = 4 in {1, 2, 4}
// @tunable GROUP_M = 8 in {1, 4, 8, 16}
// @tunable SPLIT_K = 1 in {1, 2, 4, 8, 16}
// @tunable EPI_SMEM = 0 in {0, 1}
// @tunable MIN_BLOCKS = 1 in {1, 2}
// @tunable TF32_CVT = 0 in {0, 1}
// @tunable PROMOTE = 1 in {0, 1}
// @tunable WGMMA = 0 in {0, 1}
// @tunable PERSIST = 0 in {0, 1}
// @tunable PAD = 1 in {0, 1}
// @tunable PAD_LD = 32 in {4, 32}
// @tunable TMA_STORE = 0 in {0, 1}
// @tunable SPLIT_WS = 0 in {0, 1}
// @constraint BM % (16 * WARPS_M) == 0 && BN % (8 * WARPS_N) == 0
// @constraint BM / WARPS_M >= 32 && BM / WARPS_M <= 64 && BN / WARPS_N >= 16 && BN / WARPS_N <= 64
// @constraint (BM / WARPS_M) * (BN / WARPS_N) <= 2048
// @constraint 32 * WARPS_M * WARPS_N * MIN_BLOCKS <= 512 && ((BM / WARPS_M) * (BN / WARPS_N) <= 1024 || 32 * WARPS_M * WARPS_N * MIN_BLOCKS <= 256)
// @constraint BM * BK / 4 >= 32 * WARPS_M * WARPS_N && BN * BK / 4 >= 32 * WARPS_M * WARPS_N
// @constraint MIN_BLOCKS * (STAGES * ((1 - TRANS_A) * BM * (BK + 4) + TRANS_A * BK * (BM + 8) + TRANS_B * BN * (BK + 4) + (1 - TRANS_B) * BK * (BN + 8)) * 4 + 1024) <= 233472
// @constraint (SPLIT_K == 1 && EPI_SMEM == 0) || MIN_BLOCKS * (BM * (BN + 8) * 4 + 1024) <= 233472
// @constraint BM % SPLIT_K == 0 && (SPLIT_K == 1 || EPI_SMEM == 0) && (SPLIT_K <= 8 || WGMMA == 1)
// @constraint PERSIST == 0 || (WGMMA == 1 && SPLIT_K == 1)
// @constraint PAD == 1 || WGMMA == 1
// @constraint TMA_STORE == 0 || (WGMMA == 1 && SPLIT_K == 1)
// @constraint SPLIT_WS == 0 || (WGMMA == 1 && SPLIT_K == 1 && PERSIST == 0)
// @constraint WGMMA == 0 || (BK == 32 && BM <= 128 && BN <= 128 && STAGES * (BM + BN) * BK * 4 + TRANS_A * 2 * BM * BK * 4 + 4 * BN * BK * 4 + TMA_STORE * BM * BN * 4 + 2048 <= 232448)
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 32
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef WARPS_M
#define WARPS_M 2
#endif
#ifndef WARPS_N
#define WARPS_N 4
#endif
#ifndef GROUP_M
#define GROUP_M 8
#endif
#ifndef SPLIT_K
#define SPLIT_K 1
#endif
#ifndef EPI_SMEM
#define EPI_SMEM 0
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif
#ifndef TF32_CVT
#define TF32_CVT 0
#endif
#ifndef PROMOTE
#define PROMOTE 1
#endif
#ifndef WGMMA
#define WGMMA 0
#endif
#ifndef PERSIST
#define PERSIST 0
#endif
#ifndef PAD
#define PAD 1
#endif
#ifndef PAD_LD
#define PAD_LD 32   // padded row strides: multiples of this many floats (32: 128-byte rows)
#endif
#ifndef TMA_STORE
#define TMA_STORE 0
#endif
#ifndef SPLIT_WS
#define SPLIT_WS 0
#endif
#if WGMMA
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#endif

namespace evo_3xtf32 {
using namespace cute;

constexpr int kThreads = 32 * WARPS_M * WARPS_N;
constexpr bool kAKMajor = (TRANS_A == 0);   // A's k contiguous in global memory
constexpr bool kBKMajor = (TRANS_B == 1);   // B's k contiguous in global memory
constexpr int kPadK = 4;   // floats per K-major row (BK + 4): 16B rows, conflict-free fragments
constexpr int kPadX = 8;   // floats per X-major k-row (X + 8): same, for the X-major pattern
constexpr int kSmemA = kAKMajor ? BM * (BK + kPadK) : BK * (BM + kPadX);   // floats per stage
constexpr int kSmemB = kBKMajor ? BN * (BK + kPadK) : BK * (BN + kPadX);
constexpr int kPipeFloats = STAGES * (kSmemA + kSmemB);
constexpr int kRedStride = BN + 8;   // epilogue / split-K tile rows: 16B aligned, float2 writes
                                     // of a warp spread over all banks
// The mma.sync kernel's split: SPLIT_K = 16 is for the Hopper kernel (a non-portable 16-CTA
// cluster); the mma.sync fallback of such a build splits 8 ways.
constexpr int kSplitSync = SPLIT_K > 8 ? 8 : SPLIT_K;
constexpr bool kStaged = (kSplitSync > 1) || (EPI_SMEM != 0);
constexpr int kRedFloats = kStaged ? BM * kRedStride : 0;
constexpr int kSmemFloats = kPipeFloats > kRedFloats ? kPipeFloats : kRedFloats;

static_assert(BM % (16 * WARPS_M) == 0, "BM must be a multiple of 16 * WARPS_M");
static_assert(BN % (8 * WARPS_N) == 0, "BN must be a multiple of 8 * WARPS_N");
static_assert(BK % 8 == 0, "BK must be a multiple of the MMA k (8)");
static_assert(BM % 32 == 0 && BN % 32 == 0, "X-major smem padding is conflict-free only for X % 32 == 0");
static_assert(BM * BK / 4 >= kThreads && BN * BK / 4 >= kThreads, "a stage must hold a 16B chunk per thread");
static_assert(STAGES >= 2, "the pipeline needs at least two stages");
static_assert(kSmemFloats * 4 <= 232448, "shared memory above 227 KB");
static_assert(BM % SPLIT_K == 0, "BM must be a multiple of SPLIT_K");
// (the @constraint admits 16 only for the Hopper kernel; the mma.sync kernel would split 8 ways)
static_assert(SPLIT_K == 1 || SPLIT_K == 2 || SPLIT_K == 4 || SPLIT_K == 8 || SPLIT_K == 16,
              "SPLIT_K in {1,2,4,8,16}");
static_assert(BN % 4 == 0, "staged epilogue moves float4 chunks");

struct Params {
  const float* A;
  const float* B;
  float* C;
  int M, N, K;
  int64_t lda;      // A: row stride of [M, K] (TRANS_A = 0) or of [K, M] (TRANS_A = 1)
  int64_t ldb;      // B: row stride of [K, N] (TRANS_B = 0) or of [N, K] (TRANS_B = 1)
  int64_t a_l, b_l, c_l;   // batch strides (elements)
  int tiles_m, tiles_n;
  int c_vec2;       // 1 when 8-byte stores of column pairs to C are legal
  int c_vec4;       // 1 when 16-byte stores of 4 columns to C are legal
};

// fp32 -> tf32 bit pattern, round to nearest, ties away from zero (what cvt.rna.tf32.f32 does).
// TF32_CVT = 1 uses that PTX instruction; sm_90 has no single SASS op for it and ptxas emits
// add + Inf test + select + mask. TF32_CVT = 0 (default) rounds with integer ops only:
// add half an ulp of tf32 (0x1000) to the bit pattern and clear the 13 dropped bits. The result
// is bit-identical to cvt.rna for every finite value and for +-Inf (a carry into the exponent
// is the correct round-up, up to Inf past the largest tf32); only NaNs whose payload lies in the
// 13 dropped bits differ (they may become Inf in `big`, but then small = x - big is NaN and the
// products are NaN either way).
CUTE_DEVICE uint32_t to_tf32(float x) {
  uint32_t r;
#if TF32_CVT
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
#else
  r = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
#endif
  return r;
}

// Split every value of a fp32 fragment into big = tf32(x) and small = tf32(x - big).
template <class TF, class TB, class TS>
CUTE_DEVICE void split_fragment(TF const& f, TB& big, TS& small) {
  CUTE_UNROLL
  for (int i = 0; i < size(f); ++i) {
    const float x = f(i);
    const uint32_t hi = to_tf32(x);
    const uint32_t lo = to_tf32(x - __uint_as_float(hi));
    big(i) = cutlass::tfloat32_t::bitcast(hi);
    small(i) = cutlass::tfloat32_t::bitcast(lo);
  }
}

// Global -> shared tiled copies of an (X, BK) operand tile. kVec: 16-byte cp.async of 4
// consecutive floats along the contiguous mode (legal when that extent is a multiple of 4 and
// the base 16-byte aligned); otherwise one float per cp.async. Zero-fill outside the matrix.
template <bool kVec>
struct Copies {
  using Atom = cute::conditional_t<kVec, SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>,
                                  SM80_CP_ASYNC_CACHEALWAYS_ZFILL<uint32_t>>;
  static constexpr int kVal = kVec ? 4 : 1;
  template <bool kKMajor, int X>
  CUTE_HOST_DEVICE static auto make() {
    if constexpr (kKMajor) {   // k contiguous: threads run along k first
      constexpr int TK = BK / kVal;
      return make_tiled_copy(Copy_Atom<Atom, float>{},
                             Layout<Shape<Int<kThreads / TK>, Int<TK>>, Stride<Int<TK>, _1>>{},
                             Layout<Shape<_1, Int<kVal>>>{});
    } else {                   // x contiguous: threads run along x first
      constexpr int TX = (X / kVal) < kThreads ? (X / kVal) : kThreads;
      return make_tiled_copy(Copy_Atom<Atom, float>{},
                             Layout<Shape<Int<TX>, Int<kThreads / TX>>>{},
                             Layout<Shape<Int<kVal>, _1>>{});
    }
  }
  CUTE_HOST_DEVICE static auto copy_a() { return make<kAKMajor, BM>(); }
  CUTE_HOST_DEVICE static auto copy_b() { return make<kBKMajor, BN>(); }
};

// Layouts shared by the kernel and the host-side layout check in tests/test_gemm_3xtf32.py.
template <bool kKMajor, int X>
CUTE_HOST_DEVICE constexpr auto smem_layout() {
  if constexpr (kKMajor) {   // (X, BK, STAGES), k contiguous, rows padded to BK + 4
    return make_layout(make_shape(Int<X>{}, Int<BK>{}, Int<STAGES>{}),
                       make_stride(Int<BK + kPadK>{}, _1{}, Int<X * (BK + kPadK)>{}));
  } else {                   // (X, BK, STAGES), x contiguous, k-rows padded to X + 8
    return make_layout(make_shape(Int<X>{}, Int<BK>{}, Int<STAGES>{}),
                       make_stride(_1{}, Int<X + kPadX>{}, Int<BK * (X + kPadX)>{}));
  }
}
CUTE_HOST_DEVICE constexpr auto smem_layout_a() { return smem_layout<kAKMajor, BM>(); }
CUTE_HOST_DEVICE constexpr auto smem_layout_b() { return smem_layout<kBKMajor, BN>(); }
// Epilogue / split-K partial tile: (BM, BN) row-major, rows padded to BN + 8.
CUTE_HOST_DEVICE constexpr auto red_layout() {
  return make_layout(make_shape(Int<BM>{}, Int<BN>{}), make_stride(Int<kRedStride>{}, _1{}));
}
// WARPS_M x WARPS_N warps, each repeating the m16n8k8 TF32 atom over its share of (BM, BN).
CUTE_HOST_DEVICE auto make_mma() {
  return make_tiled_mma(MMA_Atom<SM80_16x8x8_F32TF32TF32F32_TN>{},
                        Layout<Shape<Int<WARPS_M>, Int<WARPS_N>, _1>>{});
}

// Global views of one batch: A as (M, K), B as (N, K), static unit stride on the contiguous mode.
CUTE_DEVICE auto view_a(const Params& p, const float* a) {
  if constexpr (kAKMajor) return make_tensor(make_gmem_ptr(a), make_shape(p.M, p.K), make_stride(p.lda, _1{}));
  else return make_tensor(make_gmem_ptr(a), make_shape(p.M, p.K), make_stride(_1{}, p.lda));
}
CUTE_DEVICE auto view_b(const Params& p, const float* b) {
  if constexpr (kBKMajor) return make_tensor(make_gmem_ptr(b), make_shape(p.N, p.K), make_stride(p.ldb, _1{}));
  else return make_tensor(make_gmem_ptr(b), make_shape(p.N, p.K), make_stride(_1{}, p.ldb));
}

// True when every element of the tile at (m0, n0) is in the zeroed triangle of the epilogue.
CUTE_DEVICE bool tile_is_zero(int m0, int n0) {
  if constexpr (EPILOGUE == 1) return n0 + BN - 1 < m0;   // triu: all n < m
  if constexpr (EPILOGUE == 2) return n0 > m0 + BM - 1;   // tril: all n > m
  return false;
}
CUTE_DEVICE bool keep(int m, int n) {
  if constexpr (EPILOGUE == 1) return n >= m;
  if constexpr (EPILOGUE == 2) return n <= m;
  return true;
}

// 16 bytes of CTA `rank`'s shared memory at the address `local` has in this CTA.
CUTE_DEVICE float4 dsmem_load4(const float* local, uint32_t rank) {
  const uint32_t laddr = cute::cast_smem_ptr_to_uint(local);
  uint32_t raddr;
  float4 v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(raddr) : "r"(laddr), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(raddr) : "memory");
  return v;
}

// 16 bytes at `local`, summed over the cluster's CTAs 0 .. kRanks - 1 in rank order (a fixed
// order: deterministic split-K sums).
template <int kRanks>
CUTE_DEVICE float4 cluster_sum4(const float* local) {
  float4 s = dsmem_load4(local, 0);
  CUTE_UNROLL
  for (int q = 1; q < kRanks; ++q) {
    const float4 v = dsmem_load4(local, q);
    s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
  }
  return s;
}

// Store 4 consecutive columns (m, n .. n+3) of C, masked by the epilogue and the matrix. Both
// kernels' parameter blocks carry N and c_vec4.
template <class P>
CUTE_DEVICE void store4(const P& p, float* crow, int m, int n, float4 v) {
  if constexpr (EPILOGUE != 0) {
    if (!keep(m, n)) v.x = 0.f;
    if (!keep(m, n + 1)) v.y = 0.f;
    if (!keep(m, n + 2)) v.z = 0.f;
    if (!keep(m, n + 3)) v.w = 0.f;
  }
  if (p.c_vec4 && n + 3 < p.N) {
    *reinterpret_cast<float4*>(crow + n) = v;
  } else {
    if (n < p.N) crow[n] = v.x;
    if (n + 1 < p.N) crow[n + 1] = v.y;
    if (n + 2 < p.N) crow[n + 2] = v.z;
    if (n + 3 < p.N) crow[n + 3] = v.w;
  }
}

template <bool kVec>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) gemm_3xtf32_kernel(Params p) {
  extern __shared__ __align__(128) float smem[];
  const int tid = threadIdx.x;
  const int l = blockIdx.y;
  const int tile = blockIdx.x / kSplitSync;
  const int krank = blockIdx.x % kSplitSync;   // == rank in the (kSplitSync, 1, 1) cluster

  // Grouped rasterisation: GROUP_M tile rows sweep the N tiles together (L2 reuse).
  const int group_size = GROUP_M * p.tiles_n;
  const int first_m = (tile / group_size) * GROUP_M;
  const int gm = min(p.tiles_m - first_m, GROUP_M);
  const int m_blk = first_m + (tile % group_size) % gm;
  const int n_blk = (tile % group_size) / gm;
  const int m0 = m_blk * BM, n0 = n_blk * BN;
  float* const Cl = p.C + l * p.c_l;

  if (tile_is_zero(m0, n0)) {            // same branch for every CTA of a cluster
    if (krank == 0) {
      for (int i = tid; i < BM * (BN / 4); i += kThreads) {
        const int r = i / (BN / 4), c = (i % (BN / 4)) * 4;
        if (m0 + r < p.M) store4(p, Cl + int64_t(m0 + r) * p.N, m0 + r, n0 + c, make_float4(0.f, 0.f, 0.f, 0.f));
      }
    }
    return;
  }

  // ---- global views -------------------------------------------------------------------
  Tensor mA = view_a(p, p.A + l * p.a_l);   // (M, K)
  Tensor mB = view_b(p, p.B + l * p.b_l);   // (N, K)
  Tensor mC = make_tensor(make_gmem_ptr(Cl), make_shape(p.M, p.N), make_stride(int64_t(p.N), _1{}));
  auto tileA = make_shape(Int<BM>{}, Int<BK>{});
  auto tileB = make_shape(Int<BN>{}, Int<BK>{});
  Tensor gA = local_tile(mA, tileA, make_coord(m_blk, _));   // (BM, BK, k)
  Tensor gB = local_tile(mB, tileB, make_coord(n_blk, _));   // (BN, BK, k)
  Tensor gC = local_tile(mC, make_shape(Int<BM>{}, Int<BN>{}), make_coord(m_blk, n_blk));
  Tensor cA = local_tile(make_identity_tensor(make_shape(p.M, p.K)), tileA, make_coord(m_blk, _));
  Tensor cB = local_tile(make_identity_tensor(make_shape(p.N, p.K)), tileB, make_coord(n_blk, _));
  Tensor cC = local_tile(make_identity_tensor(make_shape(p.M, p.N)), make_shape(Int<BM>{}, Int<BN>{}),
                         make_coord(m_blk, n_blk));

  // ---- shared memory: raw fp32 stages ---------------------------------------------------
  Tensor sA = make_tensor(make_smem_ptr(smem), smem_layout_a());
  Tensor sB = make_tensor(make_smem_ptr(smem + STAGES * kSmemA), smem_layout_b());

  auto copyA = Copies<kVec>::copy_a();
  auto copyB = Copies<kVec>::copy_b();
  auto thr_cA = copyA.get_slice(tid);
  auto thr_cB = copyB.get_slice(tid);
  Tensor tAgA = thr_cA.partition_S(gA);   // (CPY, CPY_M, CPY_K, k)
  Tensor tAcA = thr_cA.partition_S(cA);
  Tensor tAsA = thr_cA.partition_D(sA);   // (CPY, CPY_M, CPY_K, PIPE)
  Tensor tBgB = thr_cB.partition_S(gB);
  Tensor tBcB = thr_cB.partition_S(cB);
  Tensor tBsB = thr_cB.partition_D(sB);
  using CpAtom = Copy_Atom<typename Copies<kVec>::Atom, float>;

  // In vector mode a 4-float chunk starts at a multiple of 4 along its contiguous mode and
  // that extent is a multiple of 4, so checking the chunk's first element covers all four.
  auto load_tile = [&](int kt, int stage) {
    CUTE_UNROLL
    for (int i = 0; i < size<1>(tAsA); ++i) {
      CUTE_UNROLL
      for (int j = 0; j < size<2>(tAsA); ++j) {
        const bool ok = elem_less(tAcA(0, i, j, kt), make_coord(p.M, p.K));
        copy(CpAtom{}.with(ok), tAgA(_, i, j, kt), tAsA(_, i, j, stage));
      }
    }
    CUTE_UNROLL
    for (int i = 0; i < size<1>(tBsB); ++i) {
      CUTE_UNROLL
      for (int j = 0; j < size<2>(tBsB); ++j) {
        const bool ok = elem_less(tBcB(0, i, j, kt), make_coord(p.N, p.K));
        copy(CpAtom{}.with(ok), tBgB(_, i, j, kt), tBsB(_, i, j, stage));
      }
    }
  };

  // ---- tensor-core MMA: WARPS_M x WARPS_N warps of m16n8k8 TF32 atoms ---------------------
  auto mma = make_mma();
  auto thr_mma = mma.get_slice(tid);
  Tensor tCsA = thr_mma.partition_A(sA);   // (MMA, MMA_M, MMA_K, PIPE) fp32 in smem
  Tensor tCsB = thr_mma.partition_B(sB);   // (MMA, MMA_N, MMA_K, PIPE)
  Tensor tCgC = thr_mma.partition_C(gC);   // (MMA, MMA_M, MMA_N)
  Tensor tCcC = thr_mma.partition_C(cC);
  Tensor acc = thr_mma.make_fragment_C(tCgC);
  clear(acc);
#if PROMOTE
  // The tensor core adds into its fp32 accumulator with truncation, a bias that grows with the
  // number of MMAs: accumulating all of K = 4096 in one fragment measured rel. L2 2.9e-5 on an
  // H200, twice the strict fp32 bound (1.5e-5). With PROMOTE each k-tile (BK) is summed in a
  // fresh fragment (3 * BK / 8 MMAs) and then added to `acc` by ordinary round-to-nearest FADDs.
  Tensor accT = thr_mma.make_fragment_C(tCgC);
#endif

  // One k-block (8) of operands: fp32 staging, then tf32 big/small fragments.
  Tensor fA = make_tensor<float>(shape(tCsA(_, _, 0, 0)));   // (MMA, MMA_M)
  Tensor fB = make_tensor<float>(shape(tCsB(_, _, 0, 0)));   // (MMA, MMA_N)
  Tensor aBig = make_tensor<cutlass::tfloat32_t>(shape(fA));
  Tensor aSmall = make_tensor<cutlass::tfloat32_t>(shape(fA));
  Tensor bBig = make_tensor<cutlass::tfloat32_t>(shape(fB));
  Tensor bSmall = make_tensor<cutlass::tfloat32_t>(shape(fB));
  constexpr int kBlocks = BK / 8;
  static_assert(decltype(size<2>(tCsA))::value == kBlocks, "MMA_K must be BK / 8");

  // ---- K range of this CTA (split-K rank) -----------------------------------------------
  const int k_tiles = (p.K + BK - 1) / BK;
  const int per = (k_tiles + kSplitSync - 1) / kSplitSync;
  const int kt_begin = min(krank * per, k_tiles);
  const int nk = min(kt_begin + per, k_tiles) - kt_begin;

  // ---- main loop: STAGES-deep cp.async pipeline ------------------------------------------
  CUTE_UNROLL
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nk) load_tile(kt_begin + s, s);
    cp_async_fence();
  }
  CUTE_NO_UNROLL
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();   // stage kt landed for every thread; stage kt-1 is free to overwrite
    const int nxt = kt + STAGES - 1;
    if (nxt < nk) load_tile(kt_begin + nxt, nxt % STAGES);
    cp_async_fence();
    const int stage = kt % STAGES;
#if PROMOTE
    auto& tacc = accT;
    clear(tacc);
#else
    auto& tacc = acc;
#endif
    CUTE_UNROLL
    for (int kb = 0; kb < kBlocks; ++kb) {
      copy(tCsA(_, _, kb, stage), fA);
      copy(tCsB(_, _, kb, stage), fB);
      split_fragment(fA, aBig, aSmall);
      split_fragment(fB, bBig, bSmall);
      gemm(mma, aSmall, bBig, tacc);   // small cross terms first ...
      gemm(mma, aBig, bSmall, tacc);
      gemm(mma, aBig, bBig, tacc);     // ... then the dominant product
    }
#if PROMOTE
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) acc(i) += accT(i);
#endif
  }
  cp_async_wait<0>();

  // ---- epilogue ---------------------------------------------------------------------------
  // Accumulator values (v0, v1) of an atom are columns (n, n + 1) of one row (SM80_16x8_Row).
  if constexpr (!kStaged) {
    if (p.c_vec2 && m0 + BM <= p.M && n0 + BN <= p.N) {
      CUTE_UNROLL
      for (int mi = 0; mi < size<1>(acc); ++mi) {
        CUTE_UNROLL
        for (int ni = 0; ni < size<2>(acc); ++ni) {
          CUTE_UNROLL
          for (int v = 0; v < 4; v += 2) {
            float x0 = acc(v, mi, ni), x1 = acc(v + 1, mi, ni);
            if constexpr (EPILOGUE != 0) {
              const auto c0 = tCcC(v, mi, ni);
              if (!keep(get<0>(c0), get<1>(c0))) x0 = 0.f;
              if (!keep(get<0>(c0), get<1>(c0) + 1)) x1 = 0.f;
            }
            *reinterpret_cast<float2*>(&tCgC(v, mi, ni)) = make_float2(x0, x1);
          }
        }
      }
    } else {
      CUTE_UNROLL
      for (int i = 0; i < size(acc); ++i) {
        const auto c = tCcC(i);
        if (elem_less(c, make_coord(p.M, p.N))) tCgC(i) = keep(get<0>(c), get<1>(c)) ? acc(i) : 0.f;
      }
    }
  } else {
    // Tile -> own shared memory (the pipeline stages are dead: every cp.async group is done and
    // the barrier below orders the last fragment reads before the overwrite).
    __syncthreads();
    Tensor red = make_tensor(make_smem_ptr(smem), red_layout());
    Tensor tCred = thr_mma.partition_C(red);
    CUTE_UNROLL
    for (int mi = 0; mi < size<1>(acc); ++mi) {
      CUTE_UNROLL
      for (int ni = 0; ni < size<2>(acc); ++ni) {
        CUTE_UNROLL
        for (int v = 0; v < 4; v += 2)
          *reinterpret_cast<float2*>(&tCred(v, mi, ni)) = make_float2(acc(v, mi, ni), acc(v + 1, mi, ni));
      }
    }
    constexpr int kRows = BM / kSplitSync;   // rows this CTA reduces and stores
    constexpr int kChunks = kRows * (BN / 4);
    if constexpr (kSplitSync == 1) {
      __syncthreads();
    } else {
      cute::cluster_sync();   // every partial tile of the cluster is in shared memory
    }
    CUTE_NO_UNROLL
    for (int i = tid; i < kChunks; i += kThreads) {
      const int r = krank * kRows + i / (BN / 4), c = (i % (BN / 4)) * 4;
      float4 s;
      if constexpr (kSplitSync == 1) {
        s = *reinterpret_cast<const float4*>(&red(r, c));
      } else {
        s = cluster_sum4<kSplitSync>(&red(r, c));
      }
      const int m = m0 + r;
      if (m < p.M) store4(p, Cl + int64_t(m) * p.N, m, n0 + c, s);
    }
    if constexpr (kSplitSync > 1) cute::cluster_sync();   // keep our smem alive for the peers
  }
}

template <bool kVec>
cudaError_t launch(const Params& p, int64_t L, cudaStream_t stream) {
  const size_t smem = size_t(kSmemFloats) * sizeof(float);
  cudaError_t err = cudaFuncSetAttribute(gemm_3xtf32_kernel<kVec>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(smem));
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = evo_launch_config(dim3(unsigned(int64_t(p.tiles_m) * p.tiles_n * kSplitSync), unsigned(L), 1),
                                             dim3(kThreads, 1, 1), smem, stream, kSplitSync, &attr);
  err = cudaLaunchKernelEx(&cfg, gemm_3xtf32_kernel<kVec>, p);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

#if WGMMA
// =========================================================================================
// Hopper path (WGMMA = 1): TMA + B split in the producer warpgroup, RS tf32 wgmma consumers,
// 3xTF32 with per-k-tile promotion (see the header's STATUS).
// Everything below exists only when WGMMA = 1.
// =========================================================================================
namespace wg {
using tf32 = cutlass::tfloat32_t;

static_assert(BK == 32, "WGMMA = 1 needs BK = 32 (one 128-byte swizzle row of fp32)");
static_assert(BM == 64 || BM == 128, "WGMMA = 1: BM is 64 per consumer warpgroup (1 or 2 of them)");
static_assert(BN == 64 || BN == 128, "WGMMA = 1: BN in {64, 128} (tile + total accumulators in registers)");

constexpr int kNWG = BM / 64;                 // consumer warpgroups
constexpr int kConsumers = 128 * kNWG;
constexpr int kThreads = 128 + kConsumers;    // + one producer warpgroup
constexpr int kNBop = 2;                      // operand buffers (B big/small, transposed A)
// M-major A (TRANS_A = 1): the producer transposes each A stage into a K-major tile, so the
// consumers load their fragments with 16-byte loads as for a K-major A (H200: kb16 1.47x ->
// 2.07x torch fp32 against sixteen 2-way-conflicted 4-byte loads from the M-major stage).
constexpr bool kATrans = !kAKMajor;
// setmaxnreg budgets with two consumer warpgroups (128 * P + 256 * C <= 65536): the producer
// warpgroup splits B (and transposes A), so it keeps more than a TMA thread alone would.
constexpr int kProducerRegs = 56;
constexpr int kConsumerRegs = 224;

// A stage (m, k, stage) as TMA writes it: K-major SW128 (TRANS_A = 0, read by the consumers) or
// plain m-contiguous rows (TRANS_A = 1, transposed by the producer).
using SmemLayoutA = cute::conditional_t<
    kATrans, Layout<Shape<Int<BM>, Int<BK>, Int<STAGES>>, Stride<_1, Int<BM>, Int<BM * BK>>>,
    decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<float>{}, make_shape(Int<BM>{}, Int<BK>{}, Int<STAGES>{})))>;
// kATrans: the transposed raw A, (m, k-slot, buffer), K-major SW128 fp32.
using SmemLayoutAkm = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<float>{},
                                             make_shape(Int<BM>{}, Int<BK>{}, Int<kNBop>{})));
// B stage (n, k, stage): plain n-contiguous rows (TRANS_B = 0, from a row-major [K, N]) or
// K-major SW128 (TRANS_B = 1, from [N, K]).
using SmemLayoutBstN = Layout<Shape<Int<BN>, Int<BK>, Int<STAGES>>, Stride<_1, Int<BN>, Int<BN * BK>>>;
using SmemLayoutBstK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<float>{},
                                              make_shape(Int<BN>{}, Int<BK>{}, Int<STAGES>{})));
using SmemLayoutBst = cute::conditional_t<kBKMajor, SmemLayoutBstK, SmemLayoutBstN>;
// B_big / B_small: (n, k-slot, buffer), canonical GMMA K-major SW128 tf32 (what wgmma reads).
using SmemLayoutBop = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<tf32>{},
                                             make_shape(Int<BN>{}, Int<BK>{}, Int<kNBop>{})));

constexpr int kABytes = int(cosize_v<SmemLayoutA>) * 4;
constexpr int kAkmBytes = kATrans ? int(cosize_v<SmemLayoutAkm>) * 4 : 0;
constexpr int kBstBytes = int(cosize_v<SmemLayoutBst>) * 4;
constexpr int kBopBytes = int(cosize_v<SmemLayoutBop>) * 4;
constexpr int kStageTx = (BM + BN) * BK * 4;  // TMA bytes per stage (full boxes, OOB zero-filled)
// TMA_STORE: the finished tile goes through its own shared-memory buffer (K-major SW128 fp32,
// i.e. 32-column swizzled blocks: conflict-light scalar stores from the fragments) to a TMA
// bulk store; the consumers go on to the next tile (PERSIST) while the TMA engine drains it.
constexpr bool kTmaStore = TMA_STORE != 0 && SPLIT_K == 1;
using SmemLayoutC = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<float>{}, make_shape(Int<BM>{}, Int<BN>{})));
constexpr int kCBytes = kTmaStore ? int(cosize_v<SmemLayoutC>) * 4 : 0;
constexpr int kEpiBarrier = 1;                // named barrier of the consumer warpgroups (0: __syncthreads)
constexpr int kSmemBytes = kABytes + kAkmBytes + kBstBytes + 2 * kBopBytes + kCBytes + 2 * (STAGES + kNBop) * 8 + 1024;
static_assert(kSmemBytes <= 232448, "WGMMA = 1: shared memory above 227 KB");
static_assert(kABytes % 1024 == 0 && kAkmBytes % 1024 == 0 && kBstBytes % 1024 == 0 && kBopBytes % 1024 == 0 &&
              kCBytes % 1024 == 0,
              "swizzled tiles must stay 1024-byte aligned");

using MmaOp = cute::conditional_t<BN == 128, SM90_64x128x8_F32TF32TF32_RS_TN<>, SM90_64x64x8_F32TF32TF32_RS_TN<>>;
using TiledMma = decltype(make_tiled_mma(MmaOp{}, Layout<Shape<Int<kNWG>, _1, _1>>{}));

// Logical k-slot s = 8 j + 4 h + t of a k-tile (k-block j, half h, lane % 4 = t: what the RS
// wgmma A fragment pairs with B) -> physical k within the tile: the permutation
// k = 8 t + 4 h + j makes a thread's four k-blocks of one fragment row 4 consecutive floats
// (one 16-byte load from the K-major A stage or the producer's transposed copy).
CUTE_HOST_DEVICE constexpr int phys_k(int s) { return 8 * (s % 4) + 4 * ((s / 4) % 2) + s / 8; }

// TRANS_B = 1 transform of row n, half h: registers x[i] = physical chunk bk_src_chunk(h, i)
// (16-byte loads); output e (slot chunk bk_dst_chunk(h, e)) element i = x[bk_src_reg(e, i)]
// element bk_src_elem(e, i): a 4 x 4 register transpose (the permuted slot order).
CUTE_HOST_DEVICE constexpr int bk_src_chunk(int h, int i) { return 2 * i + h; }
CUTE_HOST_DEVICE constexpr int bk_dst_chunk(int h, int e) { return 2 * e + h; }
CUTE_HOST_DEVICE constexpr int bk_src_reg(int e, int i) { return i; }
CUTE_HOST_DEVICE constexpr int bk_src_elem(int e, int i) { return e; }

struct Params {
  float* C;
  int M, N, K, L;
  int64_t c_l;      // batch stride of C (elements)
  int tiles_m, tiles_n;
  int c_vec2;       // 1 when 8-byte stores of column pairs to C are legal
  int c_vec4;       // 1 when 16-byte stores of 4 columns (n % 4 == 0) to C are legal
  int c_tma;        // TMA_STORE and C is TMA-legal (N % 4 == 0, 16-byte aligned): tma_c is valid
  int splits;       // SPLIT_WS: K slices per tile (1: no split); > 1: partial tiles go to `part`
  float* part;      // SPLIT_WS partials: [L * tiles_m * tiles_n][splits][BM][BN] fp32 (workspace)
};

CUTE_DEVICE void split(float x, uint32_t& big, uint32_t& small) {
  big = to_tf32(x);
  small = to_tf32(x - __uint_as_float(big));
}

// Shared-memory accesses in the shared state space (CuTe's smem pointers dereference as generic
// addresses). volatile keeps them in program order with the mbarrier waits and arrives.
CUTE_DEVICE float lds32(const void* p) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(cast_smem_ptr_to_uint(p)) : "memory");
  return v;
}
CUTE_DEVICE float4 lds128_at(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}
CUTE_DEVICE float4 lds128(const void* p) { return lds128_at(cast_smem_ptr_to_uint(p)); }
CUTE_DEVICE void sts128_at(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n"
               :: "r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
// Shared address of 16-byte chunk c of row n in a K-major SW128 fp32/tf32 tile (1024-byte
// aligned atoms of 8 rows x 128 bytes, Swizzle<3,4,3> on bytes): the chunk index is XORed with
// n % 8, so chunk c's address is chunk 0's XOR 16 c. Keeps one register per row instead of one
// per chunk (ptxas otherwise hoists every swizzled address out of the k loop).
CUTE_DEVICE uint32_t sw128_chunk(uint32_t chunk0, int c) { return chunk0 ^ uint32_t(16 * c); }
CUTE_DEVICE float lane_of(float4 const& q, int j) { return j == 0 ? q.x : j == 1 ? q.y : j == 2 ? q.z : q.w; }

// Raw A fragment of one k-tile: q[v] lane j = fragment value (v, 0, j) of the RS wgmma, i.e.
// row r0 + 8 (v & 1), logical slot 8 j + 4 (v >> 1) + t: one float4 per v (physical
// k = 8 t + 4 (v >> 1) + j, j = 0..3) from a K-major tile.
// Physical k (within the k-tile) of fragment value (v, 0, j) of lane t: logical slot
// 8 j + 4 (v >> 1) + t; a_frag_k(v, t, j) = a_frag_k(v, t, 0) + j.
CUTE_HOST_DEVICE constexpr int a_frag_k(int v, int t, int j) { return phys_k(8 * j + 4 * (v >> 1) + t); }

template <class SA>
CUTE_DEVICE void load_a(SA const& sA, int st, int r0, int t, float4 (&q)[4]) {
  CUTE_UNROLL
  for (int v = 0; v < 4; ++v) {
    q[v] = lds128(&sA(r0 + 8 * (v & 1), a_frag_k(v, t, 0), st));
  }
}

// Splits k-blocks [J0, J1) of the raw fragment into rA(v, 0, j, 0) = big, rA(v, 0, j, 1) = small.
template <int J0, int J1, class RA>
CUTE_DEVICE void split_a(float4 const (&q)[4], RA& rA) {
  CUTE_UNROLL
  for (int v = 0; v < 4; ++v) {
    CUTE_UNROLL
    for (int j = J0; j < J1; ++j) {
      uint32_t b, s;
      split(lane_of(q[v], j), b, s);
      rA(v, 0, j, 0) = tf32::bitcast(b);
      rA(v, 0, j, 1) = tf32::bitcast(s);
    }
  }
}

template <int J0, int J1, class RA>
CUTE_DEVICE void fence_a(RA& rA) {
  CUTE_UNROLL
  for (int v = 0; v < 4; ++v) {
    CUTE_UNROLL
    for (int j = J0; j < J1; ++j) {
      warpgroup_fence_operand(reinterpret_cast<uint32_t&>(rA(v, 0, j, 0)));
      warpgroup_fence_operand(reinterpret_cast<uint32_t&>(rA(v, 0, j, 1)));
    }
  }
}

// The three wgmmas of k-blocks [J0, J1) of the current k-tile (B buffer `buf`); the first
// k-block of the tile starts the tile accumulator afresh (scale-D = 0).
template <int J0, int J1, class Mma, class RA, class DB, class Acc>
CUTE_DEVICE void mma_kblocks(Mma& mma, RA& rA, DB const& dBig, DB const& dSmall, int buf, Acc& acc) {
  CUTE_UNROLL
  for (int j = J0; j < J1; ++j) {
    mma.accumulate_ = (j == 0) ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
    gemm(mma, rA(_, _, j, 1), dBig(_, _, j, buf), acc);      // small * big
    mma.accumulate_ = GMMA::ScaleOut::One;
    gemm(mma, rA(_, _, j, 0), dSmall(_, _, j, buf), acc);    // big * small
    gemm(mma, rA(_, _, j, 0), dBig(_, _, j, buf), acc);      // big * big
  }
}

// Rows-contiguous stage (x, k) -> K-major SW128 tile(s) (x, k-slot, buf), x in [0, kRows):
// kSplit: out0 / out1 = tf32 big / small of the B split, slot chunk c (slots 4c .. 4c+3) of row
// x holding physical k = phys_k(4c + i); !kSplit: out0 = the raw values, chunk c holding
// k = 4c + i (a plain transpose: A read back by load_a at physical k). Task (x-block of 32
// rows, chunk c); lane = x within the block (conflict-free 4-byte loads; 16-byte stores into 8
// distinct swizzled chunks per 8 lanes). Warp w takes x-block w % kNB and the kPer chunks
// c0 kPer + r (c0 = w / kNB; 0 when there are as many warps as x-blocks): with a contiguous
// block the k offsets stay one runtime base plus compile-time constants (a strided split spilled
// in the 56-register producer); batches of kBatch tasks keep their loads in flight together.
// Run by kWorkers threads (whole warps), w = 0 .. kWorkers - 1.
template <int kWorkers, int kRows, bool kSplit, class SSt, class SOut>
CUTE_DEVICE void transform_rows(SSt const& sSt, int st, SOut& out0, SOut& out1, int buf, int w) {
  static_assert(kWorkers % 32 == 0, "transformers are whole warps");
  const int warp = w / 32, lane = w % 32;
  constexpr int kNB = kRows / 32;
  constexpr int kChunks = BK / 4;
  constexpr int kWarps = kWorkers / 32;
  static_assert(kWarps % kNB == 0 && kChunks % (kWarps / kNB) == 0, "transform tasks must divide among the warps");
  constexpr int kStep = kWarps / kNB;
  constexpr int kPer = kChunks / kStep;
  constexpr int kBatch = kPer < 4 ? kPer : 4;
  static_assert(kPer % kBatch == 0, "transform batches");
  const int c0 = kStep == 1 ? 0 : warp / kNB;
  const int x = 32 * (warp % kNB) + lane;
  const uint32_t o0 = cast_smem_ptr_to_uint(&out0(x, 0, buf));
  const uint32_t o1 = cast_smem_ptr_to_uint(&out1(x, 0, buf));
  CUTE_UNROLL
  for (int r0 = 0; r0 < kPer; r0 += kBatch) {
    float v[kBatch][4];
    CUTE_UNROLL
    for (int r = 0; r < kBatch; ++r) {
      const int c = c0 * kPer + r0 + r;
      CUTE_UNROLL
      for (int i = 0; i < 4; ++i) v[r][i] = lds32(&sSt(x, kSplit ? phys_k(4 * c + i) : 4 * c + i, st));
    }
    CUTE_UNROLL
    for (int r = 0; r < kBatch; ++r) {
      const int c = c0 * kPer + r0 + r;
      if constexpr (kSplit) {
        uint4 b, s;
        split(v[r][0], b.x, s.x);
        split(v[r][1], b.y, s.y);
        split(v[r][2], b.z, s.z);
        split(v[r][3], b.w, s.w);
        sts128_at(sw128_chunk(o0, c), b);
        sts128_at(sw128_chunk(o1, c), s);
      } else {
        sts128_at(sw128_chunk(o0, c), make_uint4(__float_as_uint(v[r][0]), __float_as_uint(v[r][1]),
                                                 __float_as_uint(v[r][2]), __float_as_uint(v[r][3])));
      }
    }
  }
}

// Splits the B stage `st` into buffer `buf` of B_big / B_small (slot order, K-major SW128 tf32).
// Slot chunk c (slots 4c .. 4c+3) of row n holds physical k = phys_k(4c + i), i = 0..3. Run by
// kWorkers threads (a multiple of 32), w = 0 .. kWorkers - 1.
template <int kWorkers, class SBst, class SBop>
CUTE_DEVICE void transform_b(SBst const& sBst, int st, SBop& sBig, SBop& sSmall, int buf, int w) {
  static_assert(kWorkers % 32 == 0, "B splitters are whole warps");
  if constexpr (!kBKMajor) {
    transform_rows<kWorkers, BN, true>(sBst, st, sBig, sSmall, buf, w);
  } else {
    // K-major stage (TRANS_B = 1): task q = (row n, half h); consecutive threads take
    // consecutive rows (8 distinct swizzled chunks per 8 lanes for the 16-byte loads and stores).
    // Row n = w % BN is fixed and half h = w / BN + (kWorkers / BN) r (compile-time when
    // kWorkers == BN).
    static_assert(kWorkers % BN == 0 && (2 * BN) % kWorkers == 0, "K-major B split tasks must divide among the threads");
    constexpr int kPer = 2 * BN / kWorkers;
    CUTE_UNROLL
    for (int r = 0; r < kPer; ++r) {
      const int n = kWorkers == BN ? w : w % BN;
      const int h = kWorkers == BN ? r : w / BN + (kWorkers / BN) * r;
      float4 x[4];
      const uint32_t src0 = cast_smem_ptr_to_uint(&sBst(n, 0, st));
      const uint32_t big0 = cast_smem_ptr_to_uint(&sBig(n, 0, buf));
      const uint32_t small0 = cast_smem_ptr_to_uint(&sSmall(n, 0, buf));
      CUTE_UNROLL
      for (int i = 0; i < 4; ++i) x[i] = lds128_at(sw128_chunk(src0, bk_src_chunk(h, i)));
      CUTE_UNROLL
      for (int e = 0; e < 4; ++e) {
        uint4 b, s;
        split(lane_of(x[bk_src_reg(e, 0)], bk_src_elem(e, 0)), b.x, s.x);
        split(lane_of(x[bk_src_reg(e, 1)], bk_src_elem(e, 1)), b.y, s.y);
        split(lane_of(x[bk_src_reg(e, 2)], bk_src_elem(e, 2)), b.z, s.z);
        split(lane_of(x[bk_src_reg(e, 3)], bk_src_elem(e, 3)), b.w, s.w);
        sts128_at(sw128_chunk(big0, bk_dst_chunk(h, e)), b);
        sts128_at(sw128_chunk(small0, bk_dst_chunk(h, e)), s);
      }
    }
  }
}

// Split-K partial tile in shared memory: row-major, rows padded by 4 floats (16-byte aligned
// rows; the float2 stores of a warp's accumulator pairs spread over the banks).
using RedLayout = Layout<Shape<Int<BM>, Int<BN>>, Stride<Int<BN + 4>, _1>>;
static_assert(SPLIT_K == 1 || BM * (BN + 4) * 4 <= kABytes + kAkmBytes + kBstBytes + 2 * kBopBytes,
              "split-K partial tile must fit in the pipeline buffers");
static_assert(SPLIT_K == 1 || BM % SPLIT_K == 0, "split-K: BM rows divide among the cluster");
static_assert(PERSIST == 0 || SPLIT_K == 1, "PERSIST = 1 needs SPLIT_K = 1 (a cluster reduces one tile)");

// Split-K: rows [krank BM / SPLIT_K, ...) of the tile, summed over the cluster's partials in rank
// order (ld.shared::cluster), stored to C with 16-byte stores where the row segment allows.
CUTE_DEVICE void reduce_split_k(Params const& p, const float* red_base, int m_blk, int n_blk, int l, int krank) {
  Tensor red = make_tensor(make_smem_ptr(red_base), RedLayout{});
  constexpr int kRows = BM / SPLIT_K;
  constexpr int kChunks = kRows * (BN / 4);
  float* const Cl = p.C + l * p.c_l;
  for (int i = int(threadIdx.x) - 128; i < kChunks; i += kConsumers) {   // the consumer threads
    const int r = krank * kRows + i / (BN / 4), c = (i % (BN / 4)) * 4;
    const int m = m_blk * BM + r, n = n_blk * BN + c;
    if (m < p.M) store4(p, Cl + int64_t(m) * p.N, m, n, cluster_sum4<SPLIT_K>(&red(r, c)));
  }
}

template <class TmaA, class TmaB, class TmaC>
__global__ void __launch_bounds__(kThreads, 1)
gemm_3xtf32_wgmma_kernel(Params p, CUTE_GRID_CONSTANT TmaA const tma_a, CUTE_GRID_CONSTANT TmaB const tma_b,
                         CUTE_GRID_CONSTANT TmaC const tma_c) {
  extern __shared__ char smem_raw[];
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  float* smemA = reinterpret_cast<float*>(base);
  float* smemAkm = reinterpret_cast<float*>(base + kABytes);
  float* smemBst = reinterpret_cast<float*>(base + kABytes + kAkmBytes);
  tf32* smemBig = reinterpret_cast<tf32*>(base + kABytes + kAkmBytes + kBstBytes);
  tf32* smemSmall = reinterpret_cast<tf32*>(base + kABytes + kAkmBytes + kBstBytes + kBopBytes);
  float* smemC = reinterpret_cast<float*>(base + kABytes + kAkmBytes + kBstBytes + 2 * kBopBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(base + kABytes + kAkmBytes + kBstBytes + 2 * kBopBytes + kCBytes);
  uint64_t* empty = full + STAGES;     // stage read: producer (B, kATrans: A) + consumers (A)
  uint64_t* bfull = empty + STAGES;    // operand buffer written by the producer warpgroup
  uint64_t* bempty = bfull + kNBop;    // operand buffer read by every consumer and wgmma

  Tensor sA = make_tensor(make_smem_ptr(smemA), SmemLayoutA{});        // (BM, BK, STAGES)
  Tensor sAkm = make_tensor(make_smem_ptr(smemAkm), SmemLayoutAkm{});  // (BM, BK, kNBop), kATrans
  Tensor sBst = make_tensor(make_smem_ptr(smemBst), SmemLayoutBst{});  // (BN, BK, STAGES)
  Tensor sBig = make_tensor(make_smem_ptr(smemBig), SmemLayoutBop{});  // (BN, BK, kNBop)
  Tensor sSmall = make_tensor(make_smem_ptr(smemSmall), SmemLayoutBop{});

  const int wg = threadIdx.x / 128;
  // K slices per tile: SPLIT_K (a cluster, compile time) or p.splits (SPLIT_WS: independent
  // CTAs writing partial tiles to the workspace; 1 without it). At most one of them exceeds 1.
  const int nsplit = SPLIT_K > 1 ? SPLIT_K : (SPLIT_WS ? p.splits : 1);
  const int krank = blockIdx.x % nsplit;    // SPLIT_K: == rank in the (SPLIT_K, 1, 1) cluster
  // Work units w = l * tiles_m * tiles_n + tile. PERSIST = 0: one per CTA (blockIdx.x / SPLIT_K,
  // batch blockIdx.y); PERSIST = 1: CTA b takes w = b, b + gridDim.x, ... (gridDim.x <= #SMs),
  // so the producer loads and splits the next tile while the consumers store this one.
  const int tiles_mn = p.tiles_m * p.tiles_n;
  const int w_first = PERSIST ? int(blockIdx.x) : int(blockIdx.y) * tiles_mn + int(blockIdx.x) / nsplit;
  const int w_end = PERSIST ? tiles_mn * p.L : w_first + 1;
  const int w_step = PERSIST ? int(gridDim.x) : 1;
  // This CTA's K slice: k-tiles [kt0, kt0 + k_tiles) (split-K: slice krank of SPLIT_K; a
  // slice may be empty when K is short, then the CTA contributes zeros).
  const int k_all = (p.K + BK - 1) / BK;     // >= 1 (the host sends K = 0 to the mma.sync kernel)
  const int k_per = (k_all + nsplit - 1) / nsplit;
  const int kt0 = krank * k_per;
  const int k_slice = max(0, min(k_all, kt0 + k_per) - kt0);
  struct Work { int m_blk, n_blk, l, k_tiles; };
  auto work_of = [&](int w) {
    Work u;
    u.l = w / tiles_mn;
    const int tile = w % tiles_mn;
    const int group_size = GROUP_M * p.tiles_n;
    const int first_m = (tile / group_size) * GROUP_M;
    const int gm = min(p.tiles_m - first_m, GROUP_M);
    u.m_blk = first_m + (tile % group_size) % gm;
    u.n_blk = (tile % group_size) / gm;
    // Tiles wholly in the zeroed triangle (EPILOGUE = 1 / 2) skip the main loop: zeros out.
    u.k_tiles = tile_is_zero(u.m_blk * BM, u.n_blk * BN) ? 0 : k_slice;
    return u;
  };

  if (threadIdx.x == 0) {
    CUTE_UNROLL
    for (int s = 0; s < STAGES; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], 1);
      cutlass::arch::ClusterBarrier::init(&empty[s], kATrans ? 128 : 128 + kConsumers);
    }
    CUTE_UNROLL
    for (int b = 0; b < kNBop; ++b) {
      cutlass::arch::ClusterBarrier::init(&bfull[b], 128);
      cutlass::arch::ClusterBarrier::init(&bempty[b], kConsumers);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ------------------------------- producer ------------------------------------------
    // The whole warpgroup splits B (stage kt's raw B -> operand buffer kt % kNBop, once every
    // wgmma that read that buffer, k-tile kt - kNBop, has retired; kATrans: also transposes A
    // into it); one elected thread also issues the TMA loads, STAGES k-tiles ahead: after the
    // split of k-tile kt it refills kt's stage with k-tile kt + STAGES once the consumers have
    // read kt's A. The consumer warpgroups therefore never wait for each other.
    if constexpr (kNWG == 2) cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
    Tensor mA = tma_a.get_tma_tensor(make_shape(p.M, p.K, p.L));
    Tensor mB = tma_b.get_tma_tensor(make_shape(p.N, p.K, p.L));
    Tensor gA = local_tile(mA, make_shape(Int<BM>{}, Int<BK>{}), make_coord(_, _, _));   // (BM, BK, m, k, l)
    Tensor gB = local_tile(mB, make_shape(Int<BN>{}, Int<BK>{}), make_coord(_, _, _));   // (BN, BK, n, k, l)
    auto [tAgA, tAsA] = tma_partition(tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA), group_modes<0, 2>(gA));
    auto [tBgB, tBsB] = tma_partition(tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sBst), group_modes<0, 2>(gB));
    const bool leader = threadIdx.x / 32 == 0 && elect_one_sync();
    // The leader's issue cursor runs STAGES k-tiles ahead of the split, across work units.
    int iw = w_first, ikt = 0;
    Work iu = work_of(iw);
    auto issue = [&](int st) {
      while (iw < w_end && ikt >= iu.k_tiles) {
        iw += w_step;
        ikt = 0;
        if (iw < w_end) iu = work_of(iw);
      }
      if (iw >= w_end) return;
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[st], kStageTx);
      copy(tma_a.with(full[st]), tAgA(_, iu.m_blk, kt0 + ikt, iu.l), tAsA(_, st));
      copy(tma_b.with(full[st]), tBgB(_, iu.n_blk, kt0 + ikt, iu.l), tBsB(_, st));
      ++ikt;
    };
    if (leader) {
      for (int st = 0; st < STAGES; ++st) issue(st);
    }
    const int w = threadIdx.x;
    int stage = 0, phase = 0, b = 0, bph = 0;
#pragma unroll 1
    for (int wu = w_first; wu < w_end; wu += w_step) {
      const int nk = work_of(wu).k_tiles;
#pragma unroll 1
      for (int kt = 0; kt < nk; ++kt) {
        cutlass::arch::ClusterBarrier::wait(&full[stage], phase);
        cutlass::arch::ClusterBarrier::wait(&bempty[b], bph ^ 1);
        transform_b<128>(sBst, stage, sBig, sSmall, b, w);
        if constexpr (kATrans) transform_rows<128, BM, false>(sA, stage, sAkm, sAkm, b, w);
        cutlass::arch::fence_view_async_shared();   // generic-proxy writes -> wgmma (async proxy)
        cutlass::arch::ClusterBarrier::arrive(&bfull[b]);
        cutlass::arch::ClusterBarrier::arrive(&empty[stage]);
        if (leader) {
          cutlass::arch::ClusterBarrier::wait(&empty[stage], phase);   // consumers read its A too
          issue(stage);
        }
        __syncwarp();
        if (++stage == STAGES) { stage = 0; phase ^= 1; }
        if (++b == kNBop) { b = 0; bph ^= 1; }
      }
    }
  } else {
    // ------------------------------- consumers -----------------------------------------
    if constexpr (kNWG == 2) cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
    const int ct = threadIdx.x - 128;          // 0 .. kConsumers - 1
    const int lane = ct % 32;
    const int t = lane % 4;
    const int r0 = 64 * (ct / 128) + 16 * ((ct % 128) / 32) + lane / 4;   // fragment row (v even)

    TiledMma mma;
    auto thr = mma.get_thread_slice(ct);
    Tensor tCsBig = thr.partition_B(sBig);        // (MMA, MMA_N, MMA_K, kNBop)
    Tensor tCsSmall = thr.partition_B(sSmall);
    Tensor tCrBig = thr.make_fragment_B(tCsBig);  // GMMA descriptors
    Tensor tCrSmall = thr.make_fragment_B(tCsSmall);
    // Register A fragment of the current k-tile: (MMA = 4, MMA_M = 1, MMA_K = BK / 8, big/small).
    Tensor sAview = make_tensor(make_smem_ptr(smemBig), make_layout(make_shape(Int<BM>{}, Int<BK>{})));
    using FragA = decltype(thr.partition_fragment_A(sAview));
    static_assert(decltype(size<0>(FragA{}))::value == 4 && decltype(size<1>(FragA{}))::value == 1 &&
                  decltype(size<2>(FragA{}))::value == BK / 8, "unexpected A fragment shape");
    Tensor rA = make_tensor<tf32>(Shape<_4, _1, Int<BK / 8>, _2>{});
    float4 qA[4];                                 // raw A fragment of the next k-tile
    constexpr int kJ = BK / 8, kJh = kJ / 2;

    // Raw A fragment of k-tile `kt` (its stage, or with kATrans its operand buffer): read, then
    // the stage is released (kATrans: the producer already did; the buffer's release is bempty).
    auto fetch_a = [&](int st, int ph, int bf, int bfph) {
      if constexpr (kATrans) {
        cutlass::arch::ClusterBarrier::wait(&bfull[bf], bfph);
        load_a(sAkm, bf, r0, t, qA);
      } else {
        cutlass::arch::ClusterBarrier::wait(&full[st], ph);
        load_a(sA, st, r0, t, qA);
      }
      if constexpr (!kATrans) {
        // The stage's next content arrives by TMA (async proxy): a proxy fence orders these
        // generic-proxy reads before that write. Without it the release let the refill land
        // while loads were still outstanding: 8 rows of one tile (one warp's fragment rows)
        // came out wrong in kb09 with PERSIST = 1 (H200, 2026-12-01), and this is the likely
        // cause of the first design's "single wrong rows" race (see History above).
        cutlass::arch::fence_view_async_shared();
        cutlass::arch::ClusterBarrier::arrive(&empty[st]);
      }
    };

    // Ring positions carry over from one work unit to the next (PERSIST): stage / phase of the
    // next k-tile to read, operand buffer / phase of the next k-tile to multiply.
    int stage = 0, phase = 0;
    int bb = 0, bph = 0;
#pragma unroll 1
    for (int wu = w_first; wu < w_end; wu += w_step) {
      const Work u = work_of(wu);
      const int k_tiles = u.k_tiles;
      float* const Cl = p.C + u.l * p.c_l;
      Tensor mC = make_tensor(make_gmem_ptr(Cl), make_shape(p.M, p.N), make_stride(int64_t(p.N), _1{}));
      Tensor gC = local_tile(mC, make_shape(Int<BM>{}, Int<BN>{}), make_coord(u.m_blk, u.n_blk));
      Tensor cC = local_tile(make_identity_tensor(make_shape(p.M, p.N)), make_shape(Int<BM>{}, Int<BN>{}),
                             make_coord(u.m_blk, u.n_blk));
      Tensor tCgC = thr.partition_C(gC);
      Tensor tCcC = thr.partition_C(cC);
      Tensor accT = thr.partition_fragment_C(gC);   // per-k-tile tensor-core accumulator
      Tensor accS = thr.partition_fragment_C(gC);   // fp32 total (promotion target)
      clear(accS);
      if (k_tiles > 0) {
        fetch_a(stage, phase, bb, bph);
        split_a<0, kJ>(qA, rA);
      }

      // Per k-tile: wait for the B operand buffer, then the wgmmas go out in two commit groups
      // (k-blocks [0, kJh), [kJh, kJ)). While they run: load the next tile's raw A fragment and
      // release its stage. When the first group retires its fragment registers take the next
      // tile's first half; when the second retires the buffer is released (bempty), the second
      // half is split and the tile accumulator promoted. One warpgroup's split and promotion
      // overlap the other's wgmmas.
#pragma unroll 1
      for (int kt = 0; kt < k_tiles; ++kt) {
        const bool next = kt + 1 < k_tiles;
        cutlass::arch::ClusterBarrier::wait(&bfull[bb], bph);
        warpgroup_fence_operand(accT);
        fence_a<0, kJ>(rA);
        warpgroup_arrive();
        mma_kblocks<0, kJh>(mma, rA, tCrBig, tCrSmall, bb, accT);
        warpgroup_commit_batch();
        mma_kblocks<kJh, kJ>(mma, rA, tCrBig, tCrSmall, bb, accT);
        warpgroup_commit_batch();
        if (++stage == STAGES) { stage = 0; phase ^= 1; }
        const int nb = bb + 1 == kNBop ? 0 : bb + 1;
        const int nbph = bb + 1 == kNBop ? bph ^ 1 : bph;
        if (next) fetch_a(stage, phase, nb, nbph);
        warpgroup_wait<1>();
        fence_a<0, kJh>(rA);
        if (next) split_a<0, kJh>(qA, rA);
        warpgroup_wait<0>();
        cutlass::arch::ClusterBarrier::arrive(&bempty[bb]);
        warpgroup_fence_operand(accT);
        fence_a<kJh, kJ>(rA);
        if (next) split_a<kJh, kJ>(qA, rA);
        CUTE_UNROLL
        for (int i = 0; i < size(accS); ++i) accS(i) += accT(i);
        bb = nb;
        bph = nbph;
      }

      // ------------------------------- epilogue ----------------------------------------
      // Accumulator values i, i+1 (i even) are columns n, n + 1 (n even) of one row m. Rows and
      // columns outside C (the TMA zero-filled them) are not stored.
      if constexpr (SPLIT_K == 1) {
        const bool full_tile = (u.m_blk + 1) * BM <= p.M && (u.n_blk + 1) * BN <= p.N;
        if constexpr (EPILOGUE != 0) {             // triu / tril: zeros outside the triangle
          CUTE_UNROLL
          for (int i = 0; i < size(accS); ++i)
            if (!keep(get<0>(tCcC(i)), get<1>(tCcC(i)))) accS(i) = 0.f;
        }
        bool stored = false;
        if constexpr (SPLIT_WS != 0) {
          if (p.splits > 1) {
            // SPLIT_WS: the whole partial tile (masked like C, zeros past M, N from the TMA
            // fill) goes to its workspace slot, row-major BM x BN; splitk_reduce sums the
            // slots of a tile in slice order after this kernel (stream order).
            float* slot = p.part + ((int64_t(u.l * p.tiles_m + u.m_blk) * p.tiles_n + u.n_blk) * nsplit + krank) *
                                       int64_t(BM * BN);
            Tensor gP = make_tensor(make_gmem_ptr(slot), make_layout(make_shape(Int<BM>{}, Int<BN>{}),
                                                                     make_stride(Int<BN>{}, _1{})));
            Tensor tCgP = thr.partition_C(gP);
            CUTE_UNROLL
            for (int i = 0; i < size(accS); i += 2)
              *reinterpret_cast<float2*>(&tCgP(i)) = make_float2(accS(i), accS(i + 1));
            stored = true;
          }
        }
        if constexpr (kTmaStore) {
          if (p.c_tma && !stored) {
            // The previous tile's bulk store has read the buffer (its issuer waits), then every
            // consumer writes its fragment, fences the async proxy, and the issuer stores the
            // tile (TMA clips rows >= M, columns >= N) without waiting for the write to land.
            Tensor sC = make_tensor(make_smem_ptr(smemC), SmemLayoutC{});   // (BM, BN)
            if (ct == 0) tma_store_wait<0>();
            cutlass::arch::NamedBarrier::sync(kConsumers, kEpiBarrier);
            // Accumulator i = v + 2 h + 4 j is (row r0 + 8 h, column 8 j + 2 t + v) of the tile
            // (the SM90 64xN fp32 fragment). SmemLayoutC puts (r, c) at (c / 32) * 32 BM + 32 r +
            // 4 (((c % 32) / 4) XOR (r % 8)) + c % 4 floats: with r % 8 == r0 % 8 for every value
            // of a thread, four chunk offsets xo[] and immediates cover all its 8-byte stores (a
            // partitioned-tensor copy made ptxas keep per-value offsets and spill).
            const int cbase = r0 * 32 + (2 * t) % 4;
            int xo[4];
            CUTE_UNROLL
            for (int q = 0; q < 4; ++q) xo[q] = (((2 * q + t / 2) ^ (r0 % 8)) * 4);
            CUTE_UNROLL
            for (int j = 0; j < BN / 8; ++j) {
              CUTE_UNROLL
              for (int h = 0; h < 2; ++h) {
                const int i = 2 * h + 4 * j;
                float* dst = smemC + cbase + xo[j % 4] + (j / 4) * (BM * 32) + h * 256;
                *reinterpret_cast<float2*>(dst) = make_float2(accS(i), accS(i + 1));
              }
            }
            cutlass::arch::fence_view_async_shared();
            cutlass::arch::NamedBarrier::sync(kConsumers, kEpiBarrier);
            if (ct == 0) {
              Tensor mCt = tma_c.get_tma_tensor(make_shape(p.M, p.N, p.L));
              Tensor gCt = local_tile(mCt, make_shape(Int<BM>{}, Int<BN>{}), make_coord(_, _, _));  // (BM, BN, m, n, l)
              auto [tCgCt, tCsCt] = tma_partition(tma_c, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sC),
                                                  group_modes<0, 2>(gCt));
              copy(tma_c, tCsCt, tCgCt(_, u.m_blk, u.n_blk, u.l));
              tma_store_arrive();
            }
            stored = true;
          }
        }
        if (!stored) {
          CUTE_UNROLL
          for (int i = 0; i < size(accS); i += 2) {
            const int m = get<0>(tCcC(i)), n = get<1>(tCcC(i));
            if (full_tile && p.c_vec2) {
              *reinterpret_cast<float2*>(&tCgC(i)) = make_float2(accS(i), accS(i + 1));
            } else if (m < p.M) {
              if (p.c_vec2 && n + 1 < p.N) {
                *reinterpret_cast<float2*>(&tCgC(i)) = make_float2(accS(i), accS(i + 1));
              } else {
                if (n < p.N) tCgC(i) = accS(i);
                if (n + 1 < p.N) tCgC(i + 1) = accS(i + 1);
              }
            }
          }
        }
      } else {
        // Split-K (one work unit per CTA): the partial tile goes to this CTA's shared memory
        // (the pipeline buffers are dead: the __syncthreads below waits for every wgmma and
        // producer write), then rank r of the cluster sums rows [r BM / SPLIT_K,
        // (r + 1) BM / SPLIT_K) of all partials in rank order through distributed shared
        // memory (deterministic) and stores them.
        __syncthreads();
        Tensor red = make_tensor(make_smem_ptr(reinterpret_cast<float*>(base)), RedLayout{});
        Tensor tCred = thr.partition_C(red);
        CUTE_UNROLL
        for (int i = 0; i < size(accS); i += 2)
          *reinterpret_cast<float2*>(&tCred(i)) = make_float2(accS(i), accS(i + 1));
      }
    }
    if constexpr (kTmaStore) {
      if (ct == 0) tma_store_wait<0>();   // the last bulk store has read shared memory before exit
    }
  }
  if constexpr (SPLIT_K > 1) {
    const Work u = work_of(w_first);
    if (wg == 0) __syncthreads();                // the producer warpgroup's half of the barrier above
    cute::cluster_sync();                        // every partial tile of the cluster is in shared memory
    if (wg != 0) reduce_split_k(p, reinterpret_cast<float*>(base), u.m_blk, u.n_blk, u.l, krank);
    cute::cluster_sync();                        // keep our partial alive until every peer read it
  }
}

// PAD = 1: the padded copy of an operand that TMA cannot read in place (a contiguous extent
// that is not a multiple of 4 floats, or a base that is not 16-byte aligned). Copies `rows`
// rows of `cols` floats (the source is contiguous: row stride `cols`, rows only 4-byte aligned)
// into rows of `ld4` 16-byte chunks (ld4 = ceil(cols / 4)) at the 16-byte aligned `dst`. Blocks
// stride over the rows, a block's threads over a row's chunks: scalar reads and 16-byte stores,
// both contiguous across a warp. The pad floats of a row's last chunk are written as zeros;
// nothing reads them (the TMA descriptors' extents are the logical ones, see launch below).
__global__ void __launch_bounds__(256) pad_rows_kernel(const float* __restrict__ src, float4* __restrict__ dst,
                                                       int64_t rows, int64_t cols, int64_t ld4) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* s = src + r * cols;
    float4* d = dst + r * ld4;
    for (int64_t c = threadIdx.x; c < ld4; c += blockDim.x) {
      const int64_t k = 4 * c;   // < cols: c < ceil(cols / 4)
      float4 v;
      v.x = s[k];
      v.y = k + 1 < cols ? s[k + 1] : 0.f;
      v.z = k + 2 < cols ? s[k + 2] : 0.f;
      v.w = k + 3 < cols ? s[k + 3] : 0.f;
      d[c] = v;
    }
  }
}

// SPLIT_WS: C tile (l, m_blk, n_blk) = the sum of its `splits` partial tiles, in slice order
// (deterministic), masked rows >= M / columns >= N not stored. Grid (BM * BN / 4 / 256,
// L * tiles_m * tiles_n): one float4 of a tile per thread, consecutive threads along a row.
__global__ void __launch_bounds__(256) splitk_reduce_kernel(Params p) {
  const int slot = blockIdx.y;
  const int q = blockIdx.x * 256 + threadIdx.x;   // float4 index within the tile
  const int r = q / (BN / 4), c = (q % (BN / 4)) * 4;
  const int n_blk = slot % p.tiles_n;
  const int m_blk = (slot / p.tiles_n) % p.tiles_m;
  const int l = slot / (p.tiles_n * p.tiles_m);
  const int m = m_blk * BM + r, n = n_blk * BN + c;
  if (m >= p.M) return;
  const float4* src = reinterpret_cast<const float4*>(p.part + int64_t(slot) * p.splits * (BM * BN)) + q;
  float4 s = src[0];
  for (int k = 1; k < p.splits; ++k) {
    const float4 v = src[int64_t(k) * (BM * BN / 4)];
    s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
  }
  store4(p, p.C + l * p.c_l + int64_t(m) * p.N, m, n, s);
}
static_assert(BM * BN % 1024 == 0, "splitk_reduce: whole 256-thread blocks per tile");
constexpr int64_t BM_BN_BYTES = int64_t(BM) * BN * 4;   // one fp32 partial tile

// SPLIT_WS: K slices per tile for a call with `work` tiles (batch included) and `k_tiles`
// k-tiles of BK on `sms` SMs: when the tiles fill at most half of the SMs, enough slices to give
// every SM one CTA (floor(sms / work)), but no slice shorter than kMinSliceKTiles k-tiles (its
// partial-tile traffic would outweigh its maths). 1: no split. Pure, so host-only tests pin it.
constexpr int64_t kMinSliceKTiles = 4;
CUTE_HOST_DEVICE constexpr int split_count(int64_t work, int64_t k_tiles, int64_t sms) {
  if (!SPLIT_WS || SPLIT_K > 1 || PERSIST || work <= 0 || 2 * work > sms) return 1;
  int64_t s = sms / work;
  if (s > k_tiles / kMinSliceKTiles) s = k_tiles / kMinSliceKTiles;
  return s >= 2 ? int(s) : 1;
}
// split_count on the current device; 1 when the device cannot be queried (evo_workspace_bytes
// and evo_launch then agree: neither splits).
inline int ws_splits(int64_t work, int64_t k_tiles) {
  if (split_count(work, k_tiles, INT64_MAX) == 1) return 1;   // no split on any device: no query
  return split_count(work, k_tiles, evo_sm_count());          // 0 SMs (no device): no split
}

constexpr int kPadThreads = 256;
constexpr int64_t kPadMaxBlocks = 2048;   // ~2 waves of 8 blocks per SM on 132 SMs; rows beyond loop

// Enqueues the padded copy of one operand (rows x cols, contiguous) into `dst` with row stride
// ld (a multiple of 4 floats) on `stream`.
inline cudaError_t pad_rows(const float* src, float* dst, int64_t rows, int64_t cols, int64_t ld,
                            cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const unsigned blocks = unsigned(rows < kPadMaxBlocks ? rows : kPadMaxBlocks);
  pad_rows_kernel<<<blocks, kPadThreads, 0, stream>>>(src, reinterpret_cast<float4*>(dst), rows, cols, ld / 4);
  return cudaGetLastError();
}

// TMA descriptors over the 3-D views (M, K, L) of A and (N, K, L) of B (batch strides a_l, b_l;
// L = 1 for a plain or folded GEMM), then one launch: grid (tiles_m * tiles_n * SPLIT_K, L),
// clusters of SPLIT_K CTAs (the K slices of one tile). The views' extents are the logical M, N,
// K, L whatever the row strides lda / ldb: with a padded copy (PAD) the pad columns lie outside
// them, and TMA zero-fills boxes past K exactly as for the original operand.
inline cudaError_t launch(const float* A, const float* B, int64_t lda, int64_t ldb, int64_t a_l, int64_t b_l,
                          Params p, cudaStream_t stream) {
  auto tileA = make_shape(Int<BM>{}, Int<BK>{});
  auto tileB = make_shape(Int<BN>{}, Int<BK>{});
  auto shA = make_shape(p.M, p.K, p.L);
  auto shB = make_shape(p.N, p.K, p.L);
  auto make_a = [&]() {
    if constexpr (kAKMajor)
      return make_tma_atom(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(A), shA, make_stride(lda, _1{}, a_l)),
                           SmemLayoutA{}(_, _, 0), tileA);
    else
      return make_tma_atom(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(A), shA, make_stride(_1{}, lda, a_l)),
                           SmemLayoutA{}(_, _, 0), tileA);
  };
  auto make_b = [&]() {
    if constexpr (kBKMajor)
      return make_tma_atom(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(B), shB, make_stride(ldb, _1{}, b_l)),
                           SmemLayoutBst{}(_, _, 0), tileB);
    else
      return make_tma_atom(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(B), shB, make_stride(_1{}, ldb, b_l)),
                           SmemLayoutBst{}(_, _, 0), tileB);
  };
  auto tma_a = make_a();
  auto tma_b = make_b();
  // TMA_STORE: a store descriptor over C (M, N, L) when C is TMA-legal (p.c_tma); otherwise
  // (and without TMA_STORE) an unused placeholder, the kernel then stores from registers.
  auto make_c = [&]() {
    if constexpr (kTmaStore)
      return make_tma_atom(SM90_TMA_STORE{}, make_tensor(make_gmem_ptr(p.C), make_shape(p.M, p.N, p.L),
                                                         make_stride(int64_t(p.N), _1{}, p.c_l)),
                           SmemLayoutC{}, make_shape(Int<BM>{}, Int<BN>{}));
    else
      return 0;
  };
  using TmaC = decltype(make_c());
  TmaC tma_c{};
  if constexpr (kTmaStore) {
    if (p.c_tma) tma_c = make_c();
  }
  auto kernel = gemm_3xtf32_wgmma_kernel<decltype(tma_a), decltype(tma_b), TmaC>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  if constexpr (SPLIT_K > 8) {   // 16-CTA clusters are beyond the portable 8
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (err != cudaSuccess) return err;
  }
  dim3 grid(unsigned(int64_t(p.tiles_m) * p.tiles_n * SPLIT_K * p.splits), unsigned(p.L), 1);
  if constexpr (PERSIST) {   // one CTA per SM (1 CTA fits per SM), each looping over tiles
    const int sms = evo_sm_count();
    if (sms < 1) return cudaErrorNoDevice;
    const int64_t work = int64_t(p.tiles_m) * p.tiles_n * p.L;
    grid = dim3(unsigned(work < sms ? work : sms), 1, 1);
  }
  cudaLaunchAttribute attr;   // split-K: a (SPLIT_K, 1, 1) cluster holds the K slices of a tile
  cudaLaunchConfig_t cfg = evo_launch_config(grid, dim3(kThreads, 1, 1), kSmemBytes, stream, SPLIT_K, &attr);
  err = cudaLaunchKernelEx(&cfg, kernel, p, tma_a, tma_b, tma_c);
  if (err != cudaSuccess) return err;
  err = cudaGetLastError();
  if (err != cudaSuccess || p.splits <= 1) return err;
  const dim3 rgrid(unsigned(BM * BN / 4 / 256), unsigned(int64_t(p.L) * p.tiles_m * p.tiles_n), 1);
  splitk_reduce_kernel<<<rgrid, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace wg
#endif  // WGMMA

// ---------------------------------------------------------------------------------------
// Host-side planning, shared by evo_workspace_bytes and evo_launch: validation, which kernel
// runs, and (WGMMA = 1, PAD = 1) the padded operand copies in the workspace.
// ---------------------------------------------------------------------------------------

enum RunPath { kNothing = 0, kSync = 1, kHopper = 2 };

// How the chosen kernel reads an operand (A: [.., M, K] or [.., K, M]; B: [.., K, N] or [.., N, K]).
struct Operand {
  int64_t rows;     // stored rows of all batches together (L * (M or K) for A, L * (K or N) for B)
  int64_t cols;     // contiguous extent: K or M for A, N or K for B
  int64_t ld;       // row stride the kernel uses: cols, or the padded copy's round_up(cols, PAD_LD)
  int64_t batch;    // batch stride the kernel uses (elements)
  int64_t ws_off;   // byte offset of the padded copy in the workspace; -1: read in place
};

struct Plan {
  Params p;         // the mma.sync kernel's parameters (unpadded operands)
  int64_t L;
  int path;         // RunPath
  bool vec;         // 16-byte copies legal on the operands as given (== TMA-legal in place)
  Operand a, b;
  int64_t ws_bytes; // workspace bytes (0: none)
  int splits;       // SPLIT_WS: K slices per tile (1: none)
  int64_t part_off; // SPLIT_WS: byte offset of the partial tiles in the workspace (-1: none)
};

constexpr int64_t kWsAlign = 256;   // each padded copy starts on a 256-byte boundary
inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }


// Validates the call (inputs `in`, the output C = `c`) and plans it. cudaErrorInvalidValue for
// inputs outside the contract (evo_workspace_bytes: -1), else cudaSuccess with `pl` filled.
inline int make_plan(const EvoTensor* in, int n_in, const EvoTensor& c, Plan& pl) {
  if (in == nullptr || n_in != 2) return cudaErrorInvalidValue;
  const EvoTensor& a = in[0];
  const EvoTensor& b = in[1];
  if (a.dtype != EVO_F32 || b.dtype != EVO_F32 || c.dtype != EVO_F32) return cudaErrorInvalidValue;
  if (a.ndim < 2 || b.ndim < 2 || b.ndim > 3 || c.ndim < 2) return cudaErrorInvalidValue;
  if (!evo_is_contiguous(a) || !evo_is_contiguous(b) || !evo_is_contiguous(c))
    return cudaErrorInvalidValue;
  const uintptr_t pa = reinterpret_cast<uintptr_t>(a.data), pb = reinterpret_cast<uintptr_t>(b.data),
                  pc = reinterpret_cast<uintptr_t>(c.data);
  if ((pa | pb | pc) & 3) return cudaErrorInvalidValue;

  int64_t L = 1, M, K, N, Kb;
  if (b.ndim == 3) {                      // bmm: A [L, ., .], B [L, ., .]
    if (a.ndim != 3 || a.shape[0] != b.shape[0]) return cudaErrorInvalidValue;
    L = a.shape[0];
  } else if (a.ndim > 2 && TRANS_A) {
    return cudaErrorInvalidValue;         // folding leading dims needs M-rows of A
  }
  const int64_t a0 = a.shape[a.ndim - 2], a1 = a.shape[a.ndim - 1];
  if (TRANS_A) { K = a0; M = a1; }
  else {
    K = a1;
    M = a0;
    if (b.ndim == 2)                      // fold the leading dims of A into M
      for (int i = 0; i < a.ndim - 2; ++i) M *= a.shape[i];
  }
  const int64_t b0 = b.shape[b.ndim - 2], b1 = b.shape[b.ndim - 1];
  if (TRANS_B) { N = b0; Kb = b1; } else { Kb = b0; N = b1; }
  if (Kb != K) return cudaErrorInvalidValue;
  if (c.shape[c.ndim - 1] != N || evo_numel(c) != L * M * N) return cudaErrorInvalidValue;
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || L > 65535) return cudaErrorInvalidValue;
  pl = Plan{};
  pl.L = L;
  pl.path = kNothing;
  pl.ws_bytes = 0;
  pl.splits = 1;
  pl.part_off = -1;
  if (M == 0 || N == 0 || L == 0) return cudaSuccess;   // K == 0 runs: the epilogue writes zeros

  Params& p = pl.p;
  p.A = static_cast<const float*>(a.data);
  p.B = static_cast<const float*>(b.data);
  p.C = static_cast<float*>(c.data);
  p.M = int(M); p.N = int(N); p.K = int(K);
  p.lda = TRANS_A ? M : K;
  p.ldb = TRANS_B ? K : N;
  p.a_l = M * K;
  p.b_l = K * N;
  p.c_l = M * N;
  p.tiles_m = int((M + BM - 1) / BM);
  p.tiles_n = int((N + BN - 1) / BN);
  p.c_vec2 = (N % 2 == 0) && ((pc & 7) == 0);
  p.c_vec4 = (N % 4 == 0) && ((pc & 15) == 0);
  if (int64_t(p.tiles_m) * p.tiles_n * SPLIT_K > INT32_MAX) return cudaErrorInvalidValue;

  // 16-byte copies need each operand's contiguous extent to be a multiple of 4 floats (rows,
  // and batch strides, stay 16-byte aligned) and 16-byte aligned bases.
  const int64_t a_contig = TRANS_A ? M : K;
  const int64_t b_contig = TRANS_B ? K : N;
  const bool a_ok = (a_contig % 4 == 0) && ((pa & 15) == 0);
  const bool b_ok = (b_contig % 4 == 0) && ((pb & 15) == 0);
  pl.vec = a_ok && b_ok;
  pl.a = Operand{L * (TRANS_A ? K : M), a_contig, a_contig, M * K, -1};
  pl.b = Operand{L * (TRANS_B ? N : K), b_contig, b_contig, K * N, -1};
  pl.path = kSync;
#if WGMMA
  // Hopper path: TMA needs 16-byte aligned bases and row strides (== `vec`); PAD = 1 gives an
  // operand that has neither a padded copy in the workspace (row stride round_up(cols, PAD_LD),
  // 256-byte aligned), so such calls run it too. K = 0 stays on the mma.sync kernel (it writes
  // the zeros); M, N edges and a K tail are TMA zero fill plus the predicated epilogue (masked
  // to the triangle for EPILOGUE = 1 / 2).
  if (PAD || pl.vec) {
    Operand qa = pl.a, qb = pl.b;
    int64_t ws = 0;
    if (!a_ok) {
      qa.ld = round_up(qa.cols, PAD_LD);
      qa.batch = (TRANS_A ? K : M) * qa.ld;
      qa.ws_off = ws;
      ws += round_up(qa.rows * qa.ld * 4, kWsAlign);
    }
    if (!b_ok) {
      qb.ld = round_up(qb.cols, PAD_LD);
      qb.batch = (TRANS_B ? N : K) * qb.ld;
      qb.ws_off = ws;
      ws += round_up(qb.rows * qb.ld * 4, kWsAlign);
    }
    if (K > 0 && qa.rows * qa.ld < (int64_t(1) << 37) && qb.rows * qb.ld < (int64_t(1) << 37)) {
      if (int64_t(p.tiles_m) * p.tiles_n * (PERSIST ? L : int64_t(SPLIT_K)) > INT32_MAX)
        return cudaErrorInvalidValue;
      pl.path = kHopper;
      pl.a = qa;
      pl.b = qb;
      const int64_t work = int64_t(p.tiles_m) * p.tiles_n * L;
      pl.splits = wg::ws_splits(work, (K + BK - 1) / BK);
      if (pl.splits > 1) {          // the partial tiles follow the padded copies
        pl.part_off = ws;
        ws += round_up(work * pl.splits * wg::BM_BN_BYTES, kWsAlign);
      }
      pl.ws_bytes = ws;
    }
  }
#endif
  return cudaSuccess;
}

// Runs a plan on `stream`; `ws`: the workspace (pl.ws_bytes > 0; checked by the caller).
inline int run_plan(const Plan& pl, const EvoTensor* ws, cudaStream_t stream) {
  if (pl.path == kNothing) return cudaSuccess;
#if WGMMA
  if (pl.path == kHopper) {
    const Params& p = pl.p;
    wg::Params q;
    q.C = p.C;
    q.M = p.M; q.N = p.N; q.K = p.K; q.L = int(pl.L);
    q.c_l = p.c_l;
    q.tiles_m = p.tiles_m;
    q.tiles_n = p.tiles_n;
    q.c_vec2 = p.c_vec2;
    q.c_vec4 = p.c_vec4;
    q.c_tma = TMA_STORE && p.c_vec4;   // N % 4 == 0 and a 16-byte aligned C: what TMA needs
    q.splits = pl.splits;
    q.part = pl.splits > 1 ? reinterpret_cast<float*>(static_cast<char*>(ws->data) + pl.part_off) : nullptr;
    const float* A = p.A;
    const float* B = p.B;
    // Padded copies first, on the same stream (PAD = 1 and an operand TMA cannot read in place).
    if (pl.a.ws_off >= 0 || pl.b.ws_off >= 0) {
      char* w = static_cast<char*>(ws->data);
      if (pl.a.ws_off >= 0) {
        float* dst = reinterpret_cast<float*>(w + pl.a.ws_off);
        const cudaError_t err = wg::pad_rows(p.A, dst, pl.a.rows, pl.a.cols, pl.a.ld, stream);
        if (err != cudaSuccess) return err;
        A = dst;
      }
      if (pl.b.ws_off >= 0) {
        float* dst = reinterpret_cast<float*>(w + pl.b.ws_off);
        const cudaError_t err = wg::pad_rows(p.B, dst, pl.b.rows, pl.b.cols, pl.b.ld, stream);
        if (err != cudaSuccess) return err;
        B = dst;
      }
    }
    return wg::launch(A, B, pl.a.ld, pl.b.ld, pl.a.batch, pl.b.batch, q, stream);
  }
#endif
  return pl.vec ? launch<true>(pl.p, pl.L, stream) : launch<false>(pl.p, pl.L, stream);
}

}  // namespace evo_3xtf32

// Workspace bytes of a call (evo_abi.h): `out` is C alone (the caller appends the workspace
// afterwards; a second tensor is ignored). 0 unless WGMMA = 1, PAD = 1 and an operand needs a
// padded copy; -1 where evo_launch returns cudaErrorInvalidValue for these tensors.
EVO_EXPORT int64_t evo_workspace_bytes(const EvoTensor* in, int n_in, const EvoTensor* out, int n_out,
                                       const double* scalars, int n_scalars) {
  using namespace evo_3xtf32;
  (void)scalars;
  (void)n_scalars;
  if (out == nullptr || n_out < 1 || n_out > 2) return -1;
  Plan pl;
  if (make_plan(in, n_in, out[0], pl) != cudaSuccess) return -1;
  return pl.ws_bytes;
}

EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  using namespace evo_3xtf32;
  (void)scalars;
  (void)n_scalars;
  if (out == nullptr || n_out < 1) return cudaErrorInvalidValue;
  Plan pl;
  const int err = make_plan(in, n_in, out[0], pl);
  if (err != cudaSuccess) return err;
  // The workspace: present exactly when the plan asks for one (16-byte aligned suffices: the
  // copies start at 256-byte offsets into it).
  if (!evo_workspace_ok(out, n_out, 1, pl.ws_bytes, 16)) return cudaErrorInvalidValue;
  return run_plan(pl, pl.ws_bytes > 0 ? &out[1] : nullptr, stream);
}
