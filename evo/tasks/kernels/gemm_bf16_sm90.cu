// gemm_bf16_sm90.cu -- bf16 GEMM seed template for Hopper (sm_90a): wgmma, TMA, mbarriers.
//
// Computes, per batch l:  C[l] = epilogue(A[l] @ B[l])  with bf16 operands, fp32 accumulation
// and a bf16 result.  Inputs are contiguous row-major bf16:
//   A [M, K] (3+-D A folds its leading dims into M when B is 2-D) or [L, M, K] with B [L, K, N];
//   B [K, N] or [L, K, N].
//   EPILOGUE = 0: C = A @ B
//   EPILOGUE = 1: inputs (A, B, bias[N]);  C = gelu_erf(A @ B + bias)
//   EPILOGUE = 2: inputs (A, W1, W3);      C = silu(A @ W1) * (A @ W3)   (dual GEMM: two
//                 accumulators share every A tile)
//
// Structure: warp-specialised CTA. Warpgroup 0 is the producer, warpgroups 1..NWG are
// consumers that issue wgmma (SS: both operands from swizzled shared memory; A K-major,
// B N-major) on a BM x BN tile, STAGES-deep ring of shared-memory stages guarded by
// "full"/"empty" mbarriers. Consumers keep one wgmma batch in flight (wait<1>) and release a
// stage once the batch that read it has retired.
// Two producer paths, chosen per call by the host:
//   TMA path (all strides 16-byte aligned: K % 8 == 0, N % 8 == 0, 16-byte aligned pointers):
//     one elected thread issues cp.async.bulk.tensor loads; out-of-range boxes are zero-filled
//     by the hardware. Producer registers are handed to the consumers with setmaxnreg.
//   Padded path (PAD = 1, the default, whenever the TMA path is not legal): the call asks for a
//     workspace (evo_abi.h), copies A and B(s) into it with row strides rounded up to PAD_LD
//     elements (64: 128-byte rows; 8, the TMA minimum, leaves TMA box rows straddling 128-byte
//     lines: 0.576 vs 0.446 ms for 8205 x 5928 x 2952 vs 8192 x 5888 x 2944 on an H200) by one
//     coalesced copy kernel per operand on `stream`, and runs the TMA kernel on
//     the copies with the original logical extents: TMA zero-fills every element past them, so
//     the pad columns are never read as data (and need no zeroing). Costs one read + one write
//     of the operands to run the GEMM at TMA speed.
//   Fallback path (PAD = 0; any shape/alignment, e.g. 8205 x 2949 x 5921 where a row of A is 5898
//     bytes): the 128 producer threads read 8-element runs as aligned 32-bit words, realign
//     them with byte permutes, zero outside the matrix, store them as 16-byte packets into the
//     same swizzled layout, fence the async proxy and arrive on the stage's mbarrier. It uses its
//     own tile width FB_TILE_N and depth FB_STAGES.
//     Measured on an H200 (2026-11-30): 0.70x cuBLAS on 8205 x 2949 x 5921 (its producer, 128
//     threads of word loads and permutes, is the bottleneck). A rewrite that read B by TMA
//     through a k-permuted "super-row" view (commit 581ac72) crashed there with an illegal
//     instruction, and its all-manual path ran 0.44x; it was reverted.
// PERSIST = 1 (TMA kernel only): min(tiles x L, #SMs) CTAs loop over the work units (grouped
// raster, batch folded in), ring positions carrying over; the consumers release a tile's last
// stage before its epilogue, so the producer fills the ring with the next tile meanwhile
// (H200: SwiGLU 1.08x -> 1.12x torch, gemm_bf16 8192^3 0.960x -> 0.969x cuBLAS).
// CLUSTER_M = 2 (TMA kernel): 2-CTA clusters along M share the B tile(s): each CTA loads its
// own A and one slice of B multicast into both CTAs' stages; every stage's empty barrier counts
// the consumer warpgroups of both CTAs (one local and one remote arrive per warpgroup). H200:
// validated on every check shape of gemm_bf16 / bias+GELU / SwiGLU / irregular / bmm; +1-3% on
// the fused GEMMs (inside the run-to-run spread); which seeds use it: evo/tasks/gemm_seeds.py.
// CLUSTER_N = 2 (TMA kernel): the same along N for the A tile; with CLUSTER_M = 2, 2 x 2 clusters
// in which each CTA loads half its A and half its B tile(s), multicast, and each empty barrier
// counts the consumers of the CTA and of its peers along M and N. Validated on an H200 (every
// check passed); slower there (only 30 clusters of 4 fit: 120 of 132 SMs busy; docs/kernels.md),
// so no seed uses it.
// PINGPONG = 1 (TMA kernel, PERSIST = 1, CLUSTER_M = CLUSTER_N = 1): each consumer warpgroup owns whole
// tiles (the CTA's work units alternate between the two), main loops take turns through an
// order barrier, one warpgroup's epilogue runs under the other's maths. Validated on an H200;
// slower than the cooperative tiles on every task shape here (docs/kernels.md), so no seed uses it.
// STREAMK = 1 (TMA kernel, PERSIST = 1, CLUSTER_M = CLUSTER_N = 1, PINGPONG = 0, not the dual GEMM): when
// the work units do not divide evenly among the persistent CTAs, the last two rounds are shared
// out by k-iterations (stream-K; split units fixed up through fp32 partial tiles and flags in
// the workspace; comment in the kernel). Validated on an H200 (every check passed); no faster
// on the task shapes here (4096^3: 0.85x against 0.905x), so no seed uses it (docs/kernels.md).
// DUAL_MMA = 1 (dual GEMM, TILE_N <= 128): W1's and W3's tiles side by side in each stage, one
// 64 x 2 TILE_N wgmma per k-step for both accumulators (A read from shared memory once, not
// twice); H200: SwiGLU 1.147-1.151x -> 1.157-1.160x torch; the SwiGLU seed uses it.
// B_KFIRST = 1: B's swizzle atoms k-block first (64 x 64 TMA boxes instead of 64 x 8); every
// check passed, no measurable change, so no seed uses it (docs/kernels.md).
// EPI_DEFER = 1 (persistent cooperative TMA kernel): a tile wholly inside C is packed to bf16
// pairs when its main loop ends and stored in slices between the next tile's first wgmma
// issues and waits (activation included), so the tensor pipe keeps working through every
// epilogue; H200: SwiGLU 1.16x -> 1.20x torch, bias+GELU ~1.02x -> ~1.04x, gemm_bf16 4096^3
// 0.91x -> 0.96x cuBLAS; which seeds use it: evo/tasks/gemm_seeds.py (docs/kernels.md).
// EPI_BF16X2 = 1 (bias+GELU with EPI_DEFER): each deferred value pair gets its bias from one
// packed bf16x2 FMA that also halves it, and GELU runs from x / 2 (4 FP32 instructions + the
// tanh); H200: 1.058-1.064x torch without clusters, against 1.028-1.055x for the previous seed
// (CLUSTER_M = 2, FP32 bias add); the bias+GELU seed uses it (docs/kernels.md).
// TILE_N = 320 (TILE_M = 128, one B operand): a 64 x 256 and a 64 x 64 wgmma per k-step (160
// accumulators), B loaded as 64 x 64 TMA boxes; every check passed on an H200, slower than
// 128 x 256 on the task shapes (the second wgmma re-reads A), so no seed uses it.
// Epilogue: straight from the accumulators to global memory. Tiles wholly inside C (bf16x2
// stores legal, bias 4-byte aligned) take a straight-line path (bias loaded up front, no
// predicates: EPI_FAST); edge tiles predicate every store, so any M, N, K works.
//
// ABI: evo_abi.h. Returns cudaErrorInvalidValue for inputs outside the contract above.
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cute/arch/cluster_sm90.hpp>
#include "evo_abi.h"

// @evo:task-config

#ifndef EPILOGUE
#define EPILOGUE 0
#endif

// @tunable TILE_M = 128 in {64, 128, 256}
// @tunable TILE_N = 256 in {64, 128, 256, 320}
// @tunable TILE_K = 64 in {64}
// @tunable STAGES = 4 in {2, 3, 4, 5, 6, 7}
// @tunable GROUP_M = 8 in {1, 4, 8, 16}
// @tunable FB_TILE_N = 128 in {64, 128, 256}
// @tunable FB_STAGES = 4 in {2, 3, 4, 5, 6}
// @tunable GELU_FAST = 2 in {0, 1, 2}
// @tunable SILU_FAST = 1 in {0, 1}
// @tunable PAD = 1 in {0, 1}
// @tunable PAD_LD = 64 in {8, 64}
// @tunable PERSIST = 0 in {0, 1}
// @tunable CLUSTER_M = 1 in {1, 2}
// @tunable CLUSTER_N = 1 in {1, 2}
// @tunable PINGPONG = 0 in {0, 1}
// @tunable STREAMK = 0 in {0, 1}
// @tunable DUAL_MMA = 0 in {0, 1}
// @tunable B_KFIRST = 0 in {0, 1}
// @tunable EPI_DEFER = 0 in {0, 1}
// @tunable EPI_BF16X2 = 0 in {0, 1}
// @constraint TILE_M * TILE_N * (1 + (EPILOGUE == 2)) <= 32768 || TILE_N == 320
// @constraint TILE_N != 320 || (TILE_M == 128 && EPILOGUE != 2 && PINGPONG == 0 && STREAMK == 0)
// @constraint TILE_M * FB_TILE_N * (1 + (EPILOGUE == 2)) <= 16384
// @constraint STAGES * (TILE_M + TILE_N * (1 + (EPILOGUE == 2))) * TILE_K * 2 + 2048 <= 232448
// @constraint FB_STAGES * (TILE_M + FB_TILE_N * (1 + (EPILOGUE == 2))) * TILE_K * 2 + 2048 <= 232448
// @constraint PINGPONG == 0 || (PERSIST == 1 && CLUSTER_M == 1 && CLUSTER_N == 1 && TILE_M * TILE_N * (1 + (EPILOGUE == 2)) <= 16384)
// @constraint STREAMK == 0 || (PERSIST == 1 && CLUSTER_M == 1 && CLUSTER_N == 1 && PINGPONG == 0 && EPILOGUE != 2)
// @constraint DUAL_MMA == 0 || (EPILOGUE == 2 && TILE_N <= 128)
// @constraint EPI_DEFER == 0 || (PERSIST == 1 && PINGPONG == 0 && STREAMK == 0 && TILE_N != 320)
// @constraint EPI_BF16X2 == 0 || (EPILOGUE == 1 && EPI_DEFER == 1)
#ifndef TILE_M
#define TILE_M 128
#endif
#ifndef TILE_N
#define TILE_N 256
#endif
#ifndef TILE_K
#define TILE_K 64
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef GROUP_M
#define GROUP_M 8
#endif
#ifndef FB_TILE_N
#define FB_TILE_N 128
#endif
#ifndef FB_STAGES
#define FB_STAGES 4
#endif
#ifndef PAD
#define PAD 1
#endif
#ifndef PAD_LD
#define PAD_LD 64   // padded row strides are multiples of this many elements (64: 128-byte rows)
#endif
#ifndef PERSIST
#define PERSIST 0
#endif
#ifndef CLUSTER_M
#define CLUSTER_M 1   // TMA kernel: CTAs per cluster along M sharing (multicasting) the B tile
#endif
#ifndef CLUSTER_N
#define CLUSTER_N 1   // TMA kernel: CTAs per cluster along N sharing (multicasting) the A tile
#endif
#ifndef PINGPONG
#define PINGPONG 0    // TMA kernel with PERSIST: each consumer warpgroup owns whole tiles, alternately
#endif
#ifndef STREAMK
#define STREAMK 0     // TMA kernel with PERSIST: the last two rounds of tiles split along K evenly
#endif
#ifndef B_KFIRST
#define B_KFIRST 0    // B's shared-memory atoms k-block first: 64 x 64 TMA boxes instead of 64 x 8
#endif
#ifndef DUAL_MMA
#define DUAL_MMA 0    // dual GEMM: W1 and W3 tiles side by side, one 64 x 2BN wgmma for both
#endif
#ifndef EPI_DEFER
#define EPI_DEFER 0   // persistent kernel: a tile's activation and stores run under the next tile's wgmmas
#endif
#ifndef EPI_BF16X2
#define EPI_BF16X2 0   // EPI_DEFER bias+GELU: bias added by one packed bf16x2 FMA (comment at the flush)
#endif

namespace evo_bf16 {
using namespace cute;
using bf16 = cutlass::bfloat16_t;

constexpr int kNB = (EPILOGUE == 2) ? 2 : 1;   // B operands sharing the A tile
// DUAL_MMA (dual GEMM only): each stage holds the W1 and W3 tiles side by side as one
// 2BN-column B tile, and one m64 n(2BN) wgmma per k-step computes both accumulators, so every
// A tile is read from shared memory once per k-step instead of twice (shared-memory reads per
// MAC: 2 (64 + 2BN) / (64 * 2BN) against 2 (64 + BN) / (64 * BN): -17% for BN = 128, the
// ratio of the plain GEMM's 128 x 256 tile).
constexpr bool kDual = DUAL_MMA != 0 && kNB == 2;
static_assert(!kDual || TILE_N <= 128, "DUAL_MMA needs TILE_N <= 128 (a wgmma is at most 256 wide)");
static_assert(TILE_K == 64, "TILE_K must be 64 (one 128-byte swizzle atom of bf16)");

struct Params {
  const bf16* A;
  const bf16* B[2];
  const bf16* bias;
  bf16* C;
  int M, N, K, L;
  int64_t lda, ldb;        // row strides (elements) of A [M, K] and B [K, N]
  int64_t a_l, b_l, c_l;   // batch strides (elements); 0 when B is shared
  int tiles_m, tiles_n;
  int c_vec;               // bf16x2 stores legal
  int bias_vec;            // bias 4-byte aligned: its column pairs load as one 32-bit word
  // STREAMK: work units >= sk_first are shared out as k-iteration ranges, CTA c taking
  // sk_base + (c < sk_rem) of them; no stream-K region: sk_first = INT32_MAX, sk_base = sk_rem = 0.
  int sk_first, sk_base, sk_rem;
  float* sk_partial;       // per CTA: one BM x BN fp32 partial tile (workspace)
  int* sk_flags;           // per CTA: its partial is ready (zeroed before each launch)
};

// PINGPONG applies to the TMA kernel only (the fallback kernel is never persistent).
template <bool kTMA>
constexpr bool kPingPong = kTMA && PINGPONG != 0;

// One operand's N-major B tile of W x TILE_K elements per stage in 64 x 8 swizzle atoms, k-block
// first (each 64 x 64 block contiguous), with stages kStageStride elements apart: the wgmma's
// view of part of a stage that holds more than this tile (DUAL_MMA: W1's or W3's tile of the
// 2BN-column stage; TILE_N = 320: columns [0, 256) or [256, 320)).
template <int W, int kStageStride, int NSTAGE>
struct StagedB {
  using One = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<bf16>{}, make_shape(Int<W>{}, Int<TILE_K>{}), Step<_2, _1>{}));
  using LB = decltype(One{}.layout_b());
  using type = decltype(composition(One{}.layout_a(), One{}.offset(),
                                    make_layout(make_shape(get<0>(shape(LB{})), get<1>(shape(LB{})), Int<NSTAGE>{}),
                                                make_stride(get<0>(stride(LB{})), get<1>(stride(LB{})),
                                                            Int<kStageStride>{}))));
};

// kPP (kPingPong): two consumer warpgroups, each computing whole BM x BN tiles (one wgmma
// warpgroup per tile); otherwise the kNWG consumer warpgroups split one tile by rows.
template <int BM, int BN, int NSTAGE, bool kPP = false>
struct Config {
  static constexpr int kNWG = (kPP || BM != 64) ? 2 : 1;   // consumer warpgroups
  static constexpr int kMmaWG = kPP ? 1 : kNWG;            // consumer warpgroups sharing one tile
  static constexpr int kThreads = 128 * (kNWG + 1);
  using SmemLayoutA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bf16>{},
                                             make_shape(Int<BM>{}, Int<TILE_K>{}, Int<NSTAGE>{})));
  // B (N-major): one BN x TILE_K tile per operand and stage, in 64 x 8 swizzle atoms. B_KFIRST
  // = 0: atoms ordered n-block first, so a contiguous run of shared memory is one 8-row slab of
  // the tile and CuTe cuts the TMA load into 64 x 8 boxes (1 KB: 32 instructions per stage for
  // a 256 x 64 tile); 1 (and kDual): k-block first, as CUTLASS lays out N-major B: each 64 x 64
  // block is contiguous, one 8 KB box. kDual: a stage holds W1's tile, then W3's: the
  // 2BN x TILE_K tile SmemLayoutBB (the wgmma's view) has uniform atom strides across the two,
  // and each operand's view is SmemLayoutB with a stage stride of 2 tiles (W3's view starts one
  // tile, BN x TILE_K elements, later).
  using BAtom = GMMA::Layout_MN_SW128_Atom<bf16>;
  using SmemLayoutBB = decltype(tile_to_shape(BAtom{}, make_shape(Int<kNB * BN>{}, Int<TILE_K>{}, Int<NSTAGE>{}),
                                              Step<_2, _1, _3>{}));
  // BN = 320 (TILE_N): a wgmma is at most 256 wide, so each k-step issues a 64 x 256 wgmma on
  // columns [0, 256) and a 64 x 64 one on [256, 320), both reading the same A tile: 160 fp32
  // accumulators per consumer thread. kBN1: the first wgmma's width, kBN2: the second's (0: none).
  // A stage then holds five 64 x 64 blocks, k-block first (block j of the ring at 4096 j
  // elements: SmemLayoutBBlk), each loaded by its own TMA box; SmemLayoutB is the wgmma's view
  // of columns [0, 256) and SmemLayoutB2 of [256, 320) (starting 256 x TILE_K elements in).
  static constexpr int kBN1 = BN > 256 ? 256 : BN;
  static constexpr int kBN2 = BN - kBN1;
  static constexpr bool kSplitB = kBN2 > 0;
  static constexpr int kBN2w = kSplitB ? kBN2 : 64;   // the second wgmma's width (64: unused placeholder)
  static constexpr int kBoxN = kSplitB ? 64 : BN;     // columns of one TMA box of B
  static_assert(!kSplitB || (kBN2 == 64 && BM == 128 && !kPP && kNB == 1),
                "TILE_N = 320 needs TILE_M = 128, no PINGPONG and one B operand");
  using SmemLayoutB = cute::conditional_t<
      kDual, typename StagedB<BN, kNB * BN * TILE_K, NSTAGE>::type,
      cute::conditional_t<
          kSplitB, typename StagedB<kBN1, BN * TILE_K, NSTAGE>::type,
          cute::conditional_t<
              B_KFIRST != 0,
              decltype(tile_to_shape(BAtom{}, make_shape(Int<BN>{}, Int<TILE_K>{}, Int<NSTAGE>{}), Step<_2, _1, _3>{})),
              decltype(tile_to_shape(BAtom{}, make_shape(Int<BN>{}, Int<TILE_K>{}, Int<NSTAGE>{})))>>>;
  using SmemLayoutB2 = typename StagedB<64, BN * TILE_K, NSTAGE>::type;
  using SmemLayoutBBlk = decltype(tile_to_shape(BAtom{}, make_shape(_64{}, Int<TILE_K>{}, Int<(BN / 64) * NSTAGE>{}),
                                                Step<_2, _1, _3>{}));
  static constexpr int kABytes = int(cosize_v<SmemLayoutA>) * 2;
  static constexpr int kBBytes = BN * TILE_K * NSTAGE * 2;           // per B operand, all stages
  static constexpr int kB1Offset = kDual ? BN * TILE_K : BN * TILE_K * NSTAGE;   // elements
  static constexpr int kStageBytes = (BM + kNB * BN) * TILE_K * 2;   // TMA bytes per stage
  static constexpr int kSmemBytes = kABytes + kNB * kBBytes + 2 * NSTAGE * 8 + 1024;  // +align slack
  using MmaAtom = decltype(SM90::GMMA::ss_op_selector<bf16, bf16, float, Shape<_64, Int<kBN1>, Int<TILE_K>>,
                                                      GMMA::Major::K, GMMA::Major::MN>());
  using MmaAtom2 = decltype(SM90::GMMA::ss_op_selector<bf16, bf16, float, Shape<_64, Int<kBN2w>, Int<TILE_K>>,
                                                       GMMA::Major::K, GMMA::Major::MN>());
  using MmaAtomBB = decltype(SM90::GMMA::ss_op_selector<bf16, bf16, float, Shape<_64, Int<kDual ? kNB * BN : 64>, Int<TILE_K>>,
                                                        GMMA::Major::K, GMMA::Major::MN>());
  // TiledMmaC: the BM x kBN1 output tile (epilogue partition); TiledMma: the main loop's wgmma
  // (kDual: BM x 2BN, gate columns then up columns); TiledMma2: kSplitB's BM x kBN2 wgmma.
  using TiledMmaC = decltype(make_tiled_mma(MmaAtom{}, Layout<Shape<Int<kMmaWG>, _1, _1>>{}));
  using TiledMma = cute::conditional_t<kDual, decltype(make_tiled_mma(MmaAtomBB{}, Layout<Shape<Int<kMmaWG>, _1, _1>>{})),
                                       TiledMmaC>;
  using TiledMma2 = decltype(make_tiled_mma(MmaAtom2{}, Layout<Shape<Int<kMmaWG>, _1, _1>>{}));   // kBN2 columns
  static_assert(cosize_v<SmemLayoutBB> * 2 <= kNB * kBBytes || !kDual, "B views overrun the B region");
};

#ifndef GELU_FAST
#define GELU_FAST 2
#endif
// GELU of the EPILOGUE 1 task. The epilogue of this (non-persistent) kernel is not overlapped
// with a mainloop, so its instruction count shows in the time (erff: ~0.12 ms of 1.74 ms at
// 8192^3 on an H200). GELU_FAST 0: erff; 1: erfc by Abramowitz & Stegun 7.1.26 (abs. error
// <= 1.5e-7) with the fast exp; 2: the tanh form on the hardware tanh (<= 1.3e-3 from the erf
// form: below a bf16 ulp of the output; CPU check against BF16_GEMM-sized bounds: worst ratio
// 0.23 of the bound at input scales 0.01..100).
// GELU_FAST 2 is written for the fewest instructions (5 + the tanh: h = x / 2, then
// gelu_from_half): under EPI_DEFER these run beside the wgmmas, and each one showed in the time
// (GELU_FAST 1, ~2x the instructions: 1.03x -> 0.99x torch on an H200).
// GELU of x = 2 h from h (EPI_BF16X2 gets h from its packed FMA): the tanh form
// h (1 + tanh(h (2 c0 + 8 c0 0.044715 h^2))) in 4 instructions + the tanh.
CUTE_DEVICE float gelu_from_half(float h) {
  const float u = h * fmaf(0.2854192650904008f, h * h, 1.5957691216057308f);
  float th;
  asm("tanh.approx.f32 %0, %1;" : "=f"(th) : "f"(u));
  return fmaf(h, th, h);
}
CUTE_DEVICE float gelu_erf(float x) {
#if GELU_FAST == 2
  return gelu_from_half(0.5f * x);
#elif GELU_FAST == 1
  const float z = fabsf(x) * 0.70710678118654752f;
  const float t = __fdividef(1.0f, fmaf(0.3275911f, z, 1.0f));
  const float poly = t * fmaf(t, fmaf(t, fmaf(t, fmaf(t, 1.061405429f, -1.453152027f), 1.421413741f),
                                      -0.284496736f), 0.254829592f);
  const float hc = 0.5f * x * poly * __expf(-z * z);
  return x >= 0.f ? x - hc : hc;
#else
  return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
#endif
}
#ifndef SILU_FAST
#define SILU_FAST 1
#endif
// x sigmoid(x) of the EPILOGUE 2 task. SILU_FAST 0: the fast exp and division (two MUFU ops:
// ex2, rcp); __fdividef(x, y) is 0 for y > 2^126 (x very negative, exp overflowing to Inf), the
// correct limit; an IEEE division cost ~20 instructions per value in an epilogue that is not
// overlapped with any maths. 1 (default): x/2 (1 + tanh(x/2)) on the hardware tanh (one MUFU
// op; its absolute error, ~2^-11 of the tanh, is below a bf16 ulp of the output's scale;
// passed the SwiGLU checks on an H200, 1.107x -> 1.128-1.138x torch, 2026-12-01).
CUTE_DEVICE float silu(float x) {
#if SILU_FAST == 1
  const float h = 0.5f * x;
  float th;
  asm("tanh.approx.f32 %0, %1;" : "=f"(th) : "f"(h));
  return fmaf(h, th, h);
#else
  return __fdividef(x, 1.f + __expf(-x));
#endif
}

#ifndef EPI_FAST
#define EPI_FAST 1
#endif

// bf16x2 word of (lo, hi), round to nearest (lo in the low half: the lower column / address),
// and back (exact). Plain 32-bit registers: a __nv_bfloat162 reinterpreted through a reference
// was kept in local memory.
CUTE_DEVICE uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
CUTE_DEVICE float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
CUTE_DEVICE float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
// Packed bf16x2 arithmetic (one rounding per half; mul.bf16x2 needs sm_90).
CUTE_DEVICE uint32_t bf16x2_fma(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
CUTE_DEVICE uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
constexpr uint32_t kBf16x2Half = 0x3f003f00u;   // (0.5, 0.5)
#ifndef EMPTY_ARRIVE_ALL
#define EMPTY_ARRIVE_ALL 0
#endif

// Fallback producer, for operands whose rows are only 2-byte aligned (TMA and 16-byte loads
// impossible). g/c/s are (8, I, J) thread partitions of one (X, TILE_K) tile whose mode 0 runs
// 8 elements along the contiguous dim. Each 8-element run is read as the five aligned 32-bit
// words that cover it (words holding no valid element are not read), realigned with byte
// permutes, zeroed past the matrix edge, and written as one 16-byte packet into the swizzled
// stage. All loads of the tile are issued before the first store (one memory latency per
// tile, not one per run).
template <class TG, class TC, class TS, class Ext>
CUTE_DEVICE void ldg_tile(TG const& g, TC const& c, TS&& s, Ext const& ext) {
  constexpr int I = decltype(size<1>(g))::value;
  constexpr int J = decltype(size<2>(g))::value;
  uint32_t w[I * J][5];
  int nvalid[I * J];
  uint32_t shift[I * J];
  CUTE_UNROLL
  for (int i = 0; i < I; ++i) {
    CUTE_UNROLL
    for (int j = 0; j < J; ++j) {
      const int q = i * J + j;
      // the valid elements of a run form a prefix of it (one row, increasing column)
      int nv = 0;
      CUTE_UNROLL
      for (int v = 0; v < 8; ++v) nv += elem_less(c(v, i, j), ext) ? 1 : 0;
      nvalid[q] = nv;
      const uintptr_t addr = reinterpret_cast<uintptr_t>(&g(0, i, j));
      const uint32_t* wp = reinterpret_cast<const uint32_t*>(addr & ~uintptr_t(3));
      const uint32_t sh = uint32_t(addr & 2);
      shift[q] = sh;
      CUTE_UNROLL
      for (int k = 0; k < 5; ++k) {
        // word k holds elements 2k, 2k+1 (sh == 0) or 2k-1, 2k (sh == 2)
        const int first = sh ? (k == 0 ? 0 : 2 * k - 1) : 2 * k;
        const bool need = first < nv && (sh || k < 4);
        w[q][k] = need ? __ldg(wp + k) : 0u;
      }
    }
  }
  CUTE_UNROLL
  for (int i = 0; i < I; ++i) {
    CUTE_UNROLL
    for (int j = 0; j < J; ++j) {
      const int q = i * J + j;
      Tensor r = make_tensor<bf16>(Shape<_8>{});
      uint32_t* rw = reinterpret_cast<uint32_t*>(r.data());
      CUTE_UNROLL
      for (int k = 0; k < 4; ++k) {
        uint32_t o = shift[q] ? __byte_perm(w[q][k], w[q][k + 1], 0x5432) : w[q][k];
        const int e = 2 * k;   // elements e (low half) and e + 1 (high half)
        if (e >= nvalid[q]) o = 0u;
        else if (e + 1 >= nvalid[q]) o &= 0xffffu;
        rw[k] = o;
      }
      copy(Copy_Atom<UniversalCopy<uint128_t>, bf16>{}, r, s(_, i, j));
    }
  }
}

// The (work unit, k-tile range) pieces one CTA (or one PINGPONG warpgroup) runs, in order:
// data-parallel units w, w + step, ... below w_end, whole; then (STREAMK) the k-iterations
// [g, g1) of the stream-K region, numbered unit by unit from unit sk_first on, cut at unit
// boundaries. Producer and consumers walk the same sequence.
// Only the cursor lives in registers; the loop-invariant bounds are recomputed from the
// kernel parameters at each step (the producer runs with 56 registers).
struct PieceIter {
  int w, g;
  CUTE_DEVICE bool next(int w_end, int step, int g1, int sk_first, int k_tiles, int& wo, int& kb, int& ke) {
    if (w < w_end) {
      wo = w; kb = 0; ke = k_tiles;
      w += step;
      return true;
    }
    if (g < g1) {
      wo = sk_first + g / k_tiles;
      kb = g % k_tiles;
      ke = min(k_tiles, kb + (g1 - g));
      g += ke - kb;
      return true;
    }
    return false;
  }
};

template <int BM, int BN, int NSTAGE, bool kTMA, class TmaA, class TmaB>
__global__ void __launch_bounds__(Config<BM, BN, NSTAGE, kPingPong<kTMA>>::kThreads, 1)
gemm_bf16_kernel(Params p, CUTE_GRID_CONSTANT TmaA const tma_a, CUTE_GRID_CONSTANT TmaB const tma_b0,
                 CUTE_GRID_CONSTANT TmaB const tma_b1) {
  constexpr bool kPP = kPingPong<kTMA>;
  using Cfg = Config<BM, BN, NSTAGE, kPP>;
  extern __shared__ char smem_raw[];
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  bf16* smemA = reinterpret_cast<bf16*>(base);
  bf16* smemB = reinterpret_cast<bf16*>(base + Cfg::kABytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(base + Cfg::kABytes + kNB * Cfg::kBBytes);
  uint64_t* empty = full + NSTAGE;

  Tensor sA = make_tensor(make_smem_ptr(smemA), typename Cfg::SmemLayoutA{});            // (BM, BK, P)
  Tensor sB0 = make_tensor(make_smem_ptr(smemB), typename Cfg::SmemLayoutB{});           // (BN, BK, P)
  Tensor sB1 = make_tensor(make_smem_ptr(smemB + (kNB - 1) * Cfg::kB1Offset), typename Cfg::SmemLayoutB{});
  Tensor sBB = make_tensor(make_smem_ptr(smemB), typename Cfg::SmemLayoutBB{});          // kDual: (2BN, BK, P)
  // kSplitB (TILE_N = 320): columns [256, 320) of each stage, and the ring as 64 x 64 blocks
  Tensor sB2 = make_tensor(make_smem_ptr(smemB + Cfg::kBN1 * TILE_K), typename Cfg::SmemLayoutB2{});   // (64, BK, P)
  Tensor sBblk = make_tensor(make_smem_ptr(smemB), typename Cfg::SmemLayoutBBlk{});      // (64, BK, 5 P)

  const int wg = threadIdx.x / 128;
  // CLUSTER_M = 2 (TMA kernel): clusters of 2 CTAs along M, tiles (2 i, n) and (2 i + 1, n);
  // each CTA loads its own A tile and one half of the shared B tile(s), multicast into both
  // CTAs' stages, so B crosses L2 -> SM once per pair. A stage is refilled only when the
  // consumers of both CTAs have released it (each CTA's empty barrier counts both).
  // CLUSTER_N = 2 likewise along N for the A tile; both: 2 x 2 clusters, each CTA loading one
  // half of its A tile (multicast along N) and one half of its B tile(s) (multicast along M),
  // so A and B each cross L2 -> SM once per pair. Cluster rank r = blockIdx.x % kCS: rm = r %
  // kCM (position along M), rn = r / kCM (along N).
  constexpr int kCM = kTMA ? CLUSTER_M : 1;
  constexpr int kCN = kTMA ? CLUSTER_N : 1;
  constexpr int kCS = kCM * kCN;
  static_assert(kCM == 1 || kCM == 2, "CLUSTER_M in {1, 2}");
  static_assert(kCN == 1 || kCN == 2, "CLUSTER_N in {1, 2}");
  // (functions, not values: nothing computed here may stay live across the setmaxnreg below)
  auto cl_rm = [] { return kCM > 1 ? int(blockIdx.x) % kCS % kCM : 0; };
  auto cl_rn = [] { return kCN > 1 ? int(blockIdx.x) % kCS / kCM : 0; };
  // Work units w = l * tiles_mc * tiles_n + tile over the cluster tiles (tiles_mc = tile rows /
  // kCM rounded up; a cluster tile is kCM CTA tiles stacked along M), in grouped raster order
  // (GROUP_M cluster-tile rows per group). One per cluster (grid (tiles x kCM, L)), or with
  // PERSIST (TMA kernel) cluster c takes w = c, c + #clusters, ... (#clusters: what fits at
  // once): the ring positions carry over, so the producer loads the next tile's first stages
  // while the consumers store this one.
  constexpr bool kPersist = PERSIST != 0 && kTMA;
  // Registers per thread after setmaxnreg: consumers 224 / producer 56, or 232 / 40 (the most
  // the launch's 168 x 384 allow) when the consumers hold more: TILE_N = 320 (160 accumulators)
  // and EPI_DEFER (128 + 64 packed). With CLUSTER_N = 2 a 40-register producer spilled (its
  // multicast state) while EPI_DEFER's consumers fit in 224, so those builds keep 224 / 56; so
  // do EPI_BF16X2 builds (bias+GELU): its shorter slices fit in 224, and with 40 the producer of
  // the CLUSTER_M = 1 build spilled 12 bytes (ptxas 13.0).
  constexpr bool kWideRegs = Cfg::kSplitB || (EPI_DEFER != 0 && kPersist && !kPP && kCN == 1 &&
                                              !(EPILOGUE == 1 && EPI_BF16X2 != 0));
  static_assert(!kPP || (kPersist && kCS == 1), "PINGPONG needs PERSIST = 1 and CLUSTER_M = CLUSTER_N = 1");
  // (evaluated by each role after its setmaxnreg: values computed before it and live across
  // it were spilled around the register reallocation)
  struct Sched { int first, end, step; };
  auto sched = [&]() {
    const int tiles_mn = ((p.tiles_m + kCM - 1) / kCM) * ((p.tiles_n + kCN - 1) / kCN);
    const int cid = int(blockIdx.x) / kCS;
    Sched q;
    q.first = kPersist ? cid : int(blockIdx.y) * tiles_mn + cid;
    q.end = kPersist ? tiles_mn * p.L : q.first + 1;
    q.step = kPersist ? int(gridDim.x) / kCS : 1;
    return q;
  };
  struct Work { int m_blk, n_blk, l; };
  auto work_of = [&](int w) {
    const int tiles_mc = (p.tiles_m + kCM - 1) / kCM;
    const int tiles_nc = (p.tiles_n + kCN - 1) / kCN;
    const int tiles_mn = tiles_mc * tiles_nc;
    Work u;
    u.l = w / tiles_mn;
    const int tile = w % tiles_mn;
    const int group_size = GROUP_M * tiles_nc;
    const int first_m = (tile / group_size) * GROUP_M;
    const int gm = min(tiles_mc - first_m, GROUP_M);
    // (CTA rank in the cluster == blockIdx.x % kCS: the cluster spans consecutive x)
    u.m_blk = (first_m + (tile % group_size) % gm) * kCM + cl_rm();
    u.n_blk = ((tile % group_size) / gm) * kCN + cl_rn();
    return u;
  };
  const int k_tiles = (p.K + TILE_K - 1) / TILE_K;
  // STREAMK (persistent TMA kernel, one CTA per cluster, cooperative tiles, one accumulator):
  // the host leaves the last two rounds of units, (#units - sk_first) in [#CTAs, 2 #CTAs), to
  // stream-K: their k-iterations are shared out evenly, CTA c taking one contiguous range, so no
  // CTA idles in a last, partial round. A range covers at least one unit's worth, so a unit is
  // split between at most two CTAs: the tail (k-tiles j..end) starts CTA c + 1's range and is
  // published as an fp32 partial tile (workspace slot c + 1, then its flag, release); the head
  // (0..j) ends CTA c's range, which waits for the flag (acquire), adds the partial to its own
  // accumulators and runs the epilogue. The tail is published early in c + 1's stream-K phase
  // and read at the end of c's, so the wait is normally already satisfied; the order of the
  // sum is fixed, so results are deterministic for a given grid. It relies on all CTAs being
  // resident at once, which the persistent grid (one CTA per SM) provides.
  constexpr bool kSK = STREAMK != 0 && kPersist && kCS == 1 && !kPP && kNB == 1;
  // CTA c's stream-K iterations are [sk_begin(c), sk_begin(c + 1)). Without a stream-K region
  // the host leaves sk_first at INT32_MAX and sk_base = sk_rem = 0: an empty range.
  auto sk_begin = [&](int c) { return kSK ? c * p.sk_base + min(c, p.sk_rem) : 0; };
  auto make_pieces = [&](int start) {
    PieceIter it;
    it.w = start;
    it.g = sk_begin(int(blockIdx.x));
    return it;
  };
  // next piece of `it` (step: the distance between one role's data-parallel units); k_tiles is
  // recomputed rather than kept live across the main loop
  auto next_piece = [&](PieceIter& it, int step, int& w, int& kb, int& ke) {
    const Sched sc = sched();
    const int kt = (p.K + TILE_K - 1) / TILE_K;
    return it.next(kSK ? min(sc.end, p.sk_first) : sc.end, step, sk_begin(int(blockIdx.x) + 1), p.sk_first, kt,
                   w, kb, ke);
  };

  if (threadIdx.x == 0) {
    CUTE_UNROLL
    for (int s = 0; s < NSTAGE; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], kTMA ? 1 : 128);
      // One arrive per consumer warpgroup reading the stage (kPP: the one warpgroup whose tile
      // it holds; kCM = 2: of each CTA of the cluster), from one thread after the warpgroup's
      // wgmma wait, which covers the warpgroup's reads (a wgmma is one warpgroup-wide
      // operation). EMPTY_ARRIVE_ALL = 1 (diagnostic, kCM = 1): every thread arrives, 128 per
      // warpgroup, as before 2026-12-01.
      // kCS > 1: the consumers of every CTA that receives this CTA's multicasts (itself, the
      // other CTAs of its cluster column and of its cluster row: kCM + kCN - 1 CTAs).
      cutlass::arch::ClusterBarrier::init(&empty[s], kCS == 1 ? Cfg::kMmaWG * (EMPTY_ARRIVE_ALL ? 128 : 1)
                                                              : Cfg::kNWG * (kCM + kCN - 1));
    }
    cutlass::arch::fence_barrier_init();
  }
  if constexpr (kCS > 1) {     // the peers' barriers are initialised before any multicast or arrive
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  } else {
    __syncthreads();
  }

  if (wg == 0) {
    // ------------------------------- producer ------------------------------------------
    if constexpr (kTMA) {
      if constexpr (Cfg::kNWG == 2) cutlass::arch::warpgroup_reg_dealloc<kWideRegs ? 40 : 56>();
      if (threadIdx.x / 32 == 0 && elect_one_sync()) {
        Tensor mA = tma_a.get_tma_tensor(make_shape(p.M, p.K, p.L));
        Tensor mB = tma_b0.get_tma_tensor(make_shape(p.N, p.K, p.L));
        Tensor gA = local_tile(mA, make_shape(Int<BM>{}, Int<TILE_K>{}), make_coord(_, _, _));   // (BM, BK, m, k, l)
        // (BN, BK, n, k, l); kSplitB: the 64 x 64 blocks of B, (64, BK, nb, k, l)
        Tensor gB = local_tile(mB, make_shape(Int<Cfg::kBoxN>{}, Int<TILE_K>{}), make_coord(_, _, _));
        // kCN = 2: this CTA's slice rn of the A box, multicast along its cluster row (the CTAs
        // rm + kCM j); kCM = 2: slice rm of the B box, multicast along its cluster column (the
        // CTAs kCM rn + i). (SM90_TMA_LOAD ignores the mask: no cluster along that dim.)
        const int rm = cl_rm(), rn = cl_rn();
        auto [tAgA, tAsA] = tma_partition(tma_a, rn, Layout<Int<kCN>>{}, group_modes<0, 2>(sA), group_modes<0, 2>(gA));
        // kSplitB: B as 64 x 64 boxes (tma_b0 built for one block, no slicing) into the ring's
        // blocks; block b of a tile is loaded by CTA b % kCM of the cluster column and multicast
        // to all of it.
        auto part_b = [&](auto const& tma, auto const& sB) {
          if constexpr (Cfg::kSplitB)
            return tma_partition(tma, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sBblk), group_modes<0, 2>(gB));
          else
            return tma_partition(tma, rm, Layout<Int<kCM>>{}, group_modes<0, 2>(sB), group_modes<0, 2>(gB));
        };
        auto [tBgB, tBsB0] = part_b(tma_b0, sB0);
        auto [tBgB_, tBsB1] = part_b(tma_b1, sB1);
        constexpr int kBlk = BN / 64;
        const uint16_t mcast_a = uint16_t((1u | (1u << kCM)) << rm);
        const uint16_t mcast_b = uint16_t(((1u << kCM) - 1) << (kCM * rn));
        int stage = 0, phase = 0;
        const Sched sc = sched();
        PieceIter it = make_pieces(sc.first);
#pragma unroll 1
        for (int w, kb, ke; next_piece(it, sc.step, w, kb, ke);) {
          const Work u = work_of(w);
#pragma unroll 1
          for (int kt = kb; kt < ke; ++kt) {
            cutlass::arch::ClusterBarrier::wait(&empty[stage], phase ^ 1);
            cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[stage], Cfg::kStageBytes);
            copy(tma_a.with(full[stage], mcast_a), tAgA(_, u.m_blk, kt, u.l), tAsA(_, stage));
            if constexpr (Cfg::kSplitB) {
              CUTE_UNROLL
              for (int b = rm; b < kBlk; b += kCM)
                copy(tma_b0.with(full[stage], mcast_b), tBgB(_, kBlk * u.n_blk + b, kt, u.l), tBsB0(_, kBlk * stage + b));
            } else {
              copy(tma_b0.with(full[stage], mcast_b), tBgB(_, u.n_blk, kt, u.l), tBsB0(_, stage));
            }
            if constexpr (kNB == 2) copy(tma_b1.with(full[stage], mcast_b), tBgB(_, u.n_blk, kt, u.l), tBsB1(_, stage));
            if (++stage == NSTAGE) { stage = 0; phase ^= 1; }
          }
        }
      }
    } else {
      // (never persistent: one work unit)
      const Work u0 = work_of(sched().first);
      const int m_blk = u0.m_blk, n_blk = u0.n_blk, l = u0.l;
      const int t = threadIdx.x;
      Tensor mA = make_tensor(make_gmem_ptr(p.A + l * p.a_l), make_shape(p.M, p.K), make_stride(p.lda, _1{}));
      Tensor gA = local_tile(mA, make_shape(Int<BM>{}, Int<TILE_K>{}), make_coord(m_blk, _));
      Tensor cA = local_tile(make_identity_tensor(make_shape(p.M, p.K)), make_shape(Int<BM>{}, Int<TILE_K>{}),
                             make_coord(m_blk, _));
      auto cpA = make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, bf16>{},
                                 Layout<Shape<_16, _8>, Stride<_8, _1>>{}, Layout<Shape<_1, _8>>{});
      auto cpB = make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, bf16>{},
                                 Layout<Shape<Int<BN / 8>, Int<128 / (BN / 8)>>>{}, Layout<Shape<_8, _1>>{});
      auto thrA = cpA.get_slice(t);
      auto thrB = cpB.get_slice(t);
      Tensor tAgA = thrA.partition_S(gA);
      Tensor tAcA = thrA.partition_S(cA);
      Tensor tAsA = thrA.partition_D(sA);
      Tensor cB = local_tile(make_identity_tensor(make_shape(p.N, p.K)), make_shape(Int<BN>{}, Int<TILE_K>{}),
                             make_coord(n_blk, _));
      Tensor tBcB = thrB.partition_S(cB);
      Tensor tBsB0 = thrB.partition_D(sB0);
      Tensor tBsB1 = thrB.partition_D(sB1);
      auto ext_a = make_coord(p.M, p.K);
      auto ext_b = make_coord(p.N, p.K);
      int stage = 0, phase = 0;
      for (int kt = 0; kt < k_tiles; ++kt) {
        cutlass::arch::ClusterBarrier::wait(&empty[stage], phase ^ 1);
        ldg_tile(tAgA(_, _, _, kt), tAcA(_, _, _, kt), tAsA(_, _, _, stage), ext_a);
        CUTE_UNROLL
        for (int b = 0; b < kNB; ++b) {
          Tensor mB = make_tensor(make_gmem_ptr(p.B[b] + l * p.b_l), make_shape(p.N, p.K),
                                  make_stride(_1{}, p.ldb));
          Tensor gB = local_tile(mB, make_shape(Int<BN>{}, Int<TILE_K>{}), make_coord(n_blk, _));
          Tensor tBgB = thrB.partition_S(gB);
          if (b == 0) ldg_tile(tBgB(_, _, _, kt), tBcB(_, _, _, kt), tBsB0(_, _, _, stage), ext_b);
          else        ldg_tile(tBgB(_, _, _, kt), tBcB(_, _, _, kt), tBsB1(_, _, _, stage), ext_b);
        }
        cutlass::arch::fence_view_async_shared();   // generic-proxy stores -> wgmma (async proxy)
        cutlass::arch::ClusterBarrier::arrive(&full[stage]);
        if (++stage == NSTAGE) { stage = 0; phase ^= 1; }
      }
    }
  } else {
    // ------------------------------- consumers -----------------------------------------
    if constexpr (kTMA && Cfg::kNWG == 2) cutlass::arch::warpgroup_reg_alloc<kWideRegs ? 232 : 224>();
    typename Cfg::TiledMma mma;
    const int mma_tid = kPP ? int(threadIdx.x) % 128 : int(threadIdx.x) - 128;
    auto thr = mma.get_thread_slice(mma_tid);
    Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));   // (MMA, MMA_M, MMA_K, P)
    // kDual: tCrB0 covers both B tiles (one wgmma); otherwise one fragment per B operand
    // kBN2 > 0 (TILE_N = 320): tCrB0 covers B's columns [0, 256), tCrB2 (second wgmma, own A
    // fragment tCrA2 of the same A tile) columns [256, 320).
    constexpr int kBN1 = Cfg::kBN1, kBN2 = Cfg::kBN2;
    auto tCrB0 = [&]() {
      if constexpr (kDual) return thr.make_fragment_B(thr.partition_B(sBB));
      else return thr.make_fragment_B(thr.partition_B(sB0));
    }();
    Tensor tCrB1 = thr.make_fragment_B(thr.partition_B(sB1));
    constexpr bool kAcc1 = kNB == 2 && !kDual;   // a second accumulator fragment (W3's)
    typename Cfg::TiledMma2 mma2;
    auto thr2 = mma2.get_thread_slice(mma_tid);
    Tensor tCrA2 = thr2.make_fragment_A(thr2.partition_A(sA));
    Tensor tCrB2 = thr2.make_fragment_B(thr2.partition_B(sB2));
    auto thr_c = typename Cfg::TiledMmaC{}.get_thread_slice(mma_tid);   // epilogue partition (kBN1 columns)

    // Stage release: thread 0 of each consumer warpgroup arrives on this CTA's empty barrier
    // (EMPTY_ARRIVE_ALL, kCS = 1: every consumer thread); kCM = 2: thread 32 also on the peer
    // along M's (it multicasts its half of B into this stage too); kCN = 2: thread 64 on the
    // peer along N's (its half of A).
    const int wtid = int(threadIdx.x) % 128;
    auto release = [&](int st) {
      if constexpr (kCS == 1) {
        if (EMPTY_ARRIVE_ALL || wtid == 0) cutlass::arch::ClusterBarrier::arrive(&empty[st]);
      } else {
        const int rm = cl_rm(), rn = cl_rn();
        if (wtid == 0) cutlass::arch::ClusterBarrier::arrive(&empty[st]);
        if constexpr (kCM > 1)
          cutlass::arch::ClusterBarrier::arrive(&empty[st], uint32_t((rm ^ 1) + kCM * rn), wtid == 32);
        if constexpr (kCN > 1)
          cutlass::arch::ClusterBarrier::arrive(&empty[st], uint32_t(rm + kCM * (rn ^ 1)), wtid == 64);
      }
    };
    // Ring positions carry over from one work unit to the next (PERSIST). kPP: the CTA's work
    // units alternate between the two consumer warpgroups (warpgroup c takes the CTA's units
    // c, c + 2, ...), and the producer loads them in order, so the CTA's unit j starts at ring
    // position j * k_tiles, whichever warpgroup reads it. Main loops take turns (an order
    // barrier: a warpgroup starts one only after the other has issued its previous unit's last
    // wgmma), so one warpgroup's epilogue runs under the other's maths, and -- required for
    // correctness, not only speed -- no warpgroup waits on a ring position more than one phase
    // ahead of its barrier (mbarrier waits compare phase parity only).
    int stage = 0, phase = 0;
    const int pp_wg = kPP ? wg - 1 : 0;
    const Sched sc = sched();
    PieceIter it = make_pieces(sc.first + pp_wg * sc.step);
    constexpr int kThr = Cfg::kNWG * 128;   // consumer threads (kSK: cooperative tiles)
    const int ct = int(threadIdx.x) - 128;
    // EPI_DEFER (persistent cooperative kernel): a tile wholly inside C is not stored when its
    // main loop ends. Its accumulators are packed to bf16 pairs (dv: value pairs, or for
    // EPILOGUE 2 each value's gate and up side by side, as torch's two GEMMs round theirs;
    // EPILOGUE 1 adds the bias to the packed values in the slice: loaded at the tile's end next
    // to the accumulators, its 32 words spilled), the next tile's main loop starts at once,
    // and the activation and stores run in kSlices slices between that loop's first k-steps,
    // under its wgmmas; the last tile's are flushed after the loop. Without it the tensor pipe
    // idles for the whole epilogue of every tile.
    constexpr bool kDefer = EPI_DEFER != 0 && kPersist && !kPP && !kSK && kBN2 == 0;
    constexpr int kNV = decltype(size(thr_c.partition_C(
        make_tensor(make_gmem_ptr(p.C), make_shape(Int<BM>{}, Int<kBN1>{})))))::value;   // output values per thread
    constexpr int kDV = kDefer ? (EPILOGUE == 2 ? kNV : kNV / 2) : 1;   // packed words
    // 4 output pairs per slice: with 8 (bias+GELU's 128 values in 8 slices) the scheduler
    // interleaved 16 GELUs' temporaries next to 192 live registers and spilled
    constexpr int kSlices = kNV / 8 > 0 ? kNV / 8 : 1;
    static_assert(!kDefer || kNV % (2 * kSlices) == 0, "EPI_DEFER: output pairs must split into kSlices slices");
    uint32_t dv[kDV];
    int d_m = -1, d_n = 0, d_l = 0;   // the deferred tile (d_m < 0: none)
    // EPILOGUE 1: the bias as 32-bit words from the column of value 0 of a coordinate
    // partition; value 4 g sits 8 g columns right of value 0 (word 4 g: immediate offsets).
    auto bias_words = [&](auto const& cI) { return reinterpret_cast<const uint32_t*>(p.bias) + (get<1>(cI(0)) >> 1); };
    auto flush = [&](int s) {   // (called from fully unrolled loops: s is a constant there)
      Tensor mC = make_tensor(make_gmem_ptr(p.C + d_l * p.c_l), make_shape(p.M, p.N), make_stride(int64_t(p.N), _1{}));
      Tensor tCgC = thr_c.partition_C(local_tile(mC, make_shape(Int<BM>{}, Int<BN>{}), make_coord(d_m, d_n)));
      Tensor tCcC = thr_c.partition_C(local_tile(make_identity_tensor(make_shape(p.M, p.N)),
                                                 make_shape(Int<BM>{}, Int<BN>{}), make_coord(d_m, d_n)));
      const uint32_t* bw = bias_words(tCcC);   // EPILOGUE 1: this slice's words are read below
      constexpr int kPer = kNV / 2 / kSlices;   // output pairs per slice
      CUTE_UNROLL
      for (int q = s * kPer; q < (s + 1) * kPer; ++q) {
        const int i = 2 * q;
        uint32_t out;
        if constexpr (EPILOGUE == 2) {   // dv[i]: (gate, up) of value i
          out = pack_bf16x2(silu(bf16_lo(dv[i])) * bf16_hi(dv[i]), silu(bf16_lo(dv[i + 1])) * bf16_hi(dv[i + 1]));
        } else if constexpr (EPILOGUE == 1) {   // dv[q]: values (i, i + 1); bias added here
          const uint32_t b = __ldg(bw + 4 * ((i / 4) % (kBN1 / 8)));
          // EPI_BF16X2: h = x / 2 with x = bf16(dv + b), in one packed FMA (dv / 2 + b / 2 rounds
          // once, to bf16(dv + b) / 2: halving is exact). x is rounded to bf16 as torch's addmm
          // hands its GELU a bf16 sum; ours rounds A @ B first (dv), so at most one ulp more.
          if constexpr (EPI_BF16X2 != 0) {
            const uint32_t h = bf16x2_fma(dv[q], kBf16x2Half, bf16x2_mul(b, kBf16x2Half));
            out = pack_bf16x2(gelu_from_half(bf16_lo(h)), gelu_from_half(bf16_hi(h)));
          } else {
            out = pack_bf16x2(gelu_erf(bf16_lo(dv[q]) + bf16_lo(b)), gelu_erf(bf16_hi(dv[q]) + bf16_hi(b)));
          }
        } else {
          out = dv[q];
        }
        *reinterpret_cast<uint32_t*>(&tCgC(i)) = out;
      }
    };
#pragma unroll 1
    for (int w, kb, ke; next_piece(it, (kPP ? 2 : 1) * sc.step, w, kb, ke);) {
      // Order barrier kPP: named barrier 1 + c is "warpgroup c may start"; the other warpgroup
      // arrives on it (bar.arrive, 128 threads) after its main loop, this one syncs (128).
      if constexpr (kPP) {
        if (w != sc.first) asm volatile("bar.sync %0, 256;" :: "r"(1 + pp_wg) : "memory");
        const int64_t pos = int64_t((w - sc.first) / sc.step) * k_tiles;
        stage = int(pos % NSTAGE);
        phase = int((pos / NSTAGE) & 1);
      }
      // Accumulators first; C's views are made after the main loop (nothing of them stays live
      // across it: the persistent loop otherwise spills under the kernel's 168-register bound).
      // kDual: acc0 holds both (BM x 2BN: gate columns, then up columns).
      Tensor acc0 = thr.partition_fragment_C(
          make_tensor(make_gmem_ptr(p.C), make_shape(Int<BM>{}, Int<(kDual ? 2 : 1) * kBN1>{})));
      Tensor acc1 = thr.partition_fragment_C(make_tensor(make_gmem_ptr(p.C), make_shape(Int<BM>{}, Int<BN>{})));
      // acc1: only the dual (silu_mul) epilogue without DUAL_MMA. acc2: columns [256, 320) of
      // TILE_N = 320 (acc0 then holds [0, 256)).
      Tensor acc2 = thr2.partition_fragment_C(make_tensor(make_gmem_ptr(p.C), make_shape(Int<BM>{}, Int<Cfg::kBN2w>{})));
      clear(acc0);
      if constexpr (kAcc1) clear(acc1);
      if constexpr (kBN2 > 0) clear(acc2);
      mma.accumulate_ = GMMA::ScaleOut::One;
      mma2.accumulate_ = GMMA::ScaleOut::One;

      warpgroup_fence_operand(acc0);
      if constexpr (kAcc1) warpgroup_fence_operand(acc1);
      if constexpr (kBN2 > 0) warpgroup_fence_operand(acc2);
      int prev = -1;
      // One k-step: issue its wgmma batch, then (retire) wait for the previous batch and
      // release that batch's stage.
      auto issue = [&]() {
        cutlass::arch::ClusterBarrier::wait(&full[stage], phase);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int kb = 0; kb < size<2>(tCrA); ++kb) {
          gemm(mma, tCrA(_, _, kb, stage), tCrB0(_, _, kb, stage), acc0);
          if constexpr (kAcc1) gemm(mma, tCrA(_, _, kb, stage), tCrB1(_, _, kb, stage), acc1);
          if constexpr (kBN2 > 0) gemm(mma2, tCrA2(_, _, kb, stage), tCrB2(_, _, kb, stage), acc2);
        }
        warpgroup_commit_batch();
      };
      auto retire = [&]() {
        warpgroup_wait<1>();                     // the batch of the previous stage has retired
        if (prev >= 0) release(prev);
        prev = stage;
        if (++stage == NSTAGE) { stage = 0; phase ^= 1; }
      };
      int kt = kb;
      if constexpr (kDefer) {
        // EPI_DEFER: the previous tile's stores, one slice per k-step, each between this
        // tile's wgmma issue and the wait for it (so the tensor pipe has work meanwhile).
        if (d_m >= 0) {
          CUTE_UNROLL
          for (int sl = 0; sl < kSlices; ++sl) {
            const bool step = kt < ke;
            if (step) issue();
            flush(sl);
            if (step) { retire(); ++kt; }
          }
          d_m = -1;
        }
      }
#pragma unroll 1
      for (; kt < ke; ++kt) {
        issue();
        retire();
      }
      if constexpr (kPP) {   // the other warpgroup's next unit (if any) may start its main loop
        if (w + sc.step < sc.end) asm volatile("bar.arrive %0, 256;" :: "r"(2 - pp_wg) : "memory");
      }
      if constexpr (kSK) {
        if (kb > 0) {   // a unit's tail: publish the partial for the previous CTA, no epilogue
          warpgroup_wait<0>();
          if (prev >= 0) release(prev);
          warpgroup_fence_operand(acc0);
          float4* part = reinterpret_cast<float4*>(p.sk_partial + int64_t(blockIdx.x) * (BM * BN));
          CUTE_UNROLL
          for (int q = 0; q < size(acc0) / 4; ++q)
            part[q * kThr + ct] = make_float4(acc0(4 * q), acc0(4 * q + 1), acc0(4 * q + 2), acc0(4 * q + 3));
          __threadfence();
          asm volatile("bar.sync 1, %0;" :: "r"(kThr) : "memory");
          if (ct == 0) asm volatile("st.release.gpu.global.b32 [%0], %1;" :: "l"(p.sk_flags + blockIdx.x), "r"(1) : "memory");
          continue;
        }
      }
      // ----------------------------- epilogue ------------------------------------------
      // (its addresses and bias loads are issued before the last wgmma batch has retired)
      const Work u = work_of(w);
      Tensor mC = make_tensor(make_gmem_ptr(p.C + u.l * p.c_l), make_shape(p.M, p.N), make_stride(int64_t(p.N), _1{}));
      Tensor gCt = local_tile(mC, make_shape(Int<BM>{}, Int<BN>{}), make_coord(u.m_blk, u.n_blk));
      Tensor cCt = local_tile(make_identity_tensor(make_shape(p.M, p.N)), make_shape(Int<BM>{}, Int<BN>{}),
                              make_coord(u.m_blk, u.n_blk));
      // The acc0 part of the tile: columns [0, kBN1) (all of it unless TILE_N = 320).
      Tensor gC = local_tile(gCt, make_shape(Int<BM>{}, Int<kBN1>{}), make_coord(0, 0));
      Tensor cC = local_tile(cCt, make_shape(Int<BM>{}, Int<kBN1>{}), make_coord(0, 0));
      Tensor tCgC = thr_c.partition_C(gC);
      Tensor tCcC = thr_c.partition_C(cC);
      // EPI_FAST: a tile wholly inside C (and, for the bias, a 4-byte aligned bias) takes a
      // straight-line path: every bias pair loaded up front as one 32-bit word per 8-column
      // group, then maths and bf16x2 stores with no predicates. The predicated path below
      // branches per value pair, and its bias loads sat each behind the previous pair's store
      // (SASS: load, wait, tanh, store, 64 times per thread), which cost bias+GELU ~7% against
      // the plain GEMM at 8192^3 on an H200.
      // GMMA accumulator layout (CLayout_64xN): values i = (2 columns, 2 rows 8 apart, N / 8
      // column groups of 8) [, MMA_M row blocks], so value i's column is that of value
      // 4 * ((i / 4) % kNG) plus i % 2.
      constexpr int kNG = kBN1 / 8;
      static_assert(decltype(size<0>(acc0))::value == (kDual ? 8 : 4) * kNG, "unexpected GMMA accumulator layout");
      static_assert(decltype(size(tCgC))::value * (kDual ? 2 : 1) == decltype(size(acc0))::value,
                    "accumulator and output partitions disagree");
      // Output value i (tCgC's order) of the gate GEMM and of the up GEMM (EPILOGUE 2). kDual:
      // each MMA_M row block of acc0 holds 4 kNG gate values, then the 4 kNG up values of the
      // same positions (column + BN).
      constexpr int kVC = 4 * kNG;
      auto acc_g = [&](int i) -> float& {
        if constexpr (kDual) return acc0(i + (i / kVC) * kVC);
        else return acc0(i);
      };
      auto acc_u = [&](int i) -> float& {
        if constexpr (kDual) return acc0(i + (i / kVC) * kVC + kVC);
        else return acc1(i);
      };
      // kBN2 > 0: the acc2 part, columns [kBN1, BN), through its own partition; it is skipped
      // when it lies wholly past N (the last tile column of N = 8192 with TILE_N = 320).
      auto thr_c2 = typename Cfg::TiledMma2{}.get_thread_slice(mma_tid);
      auto part2_tile = make_shape(Int<BM>{}, Int<Cfg::kBN2w>{});
      auto part2_at = make_coord(0, kBN1 / Cfg::kBN2w);   // (columns [kBN1, BN))
      Tensor tCgC2 = thr_c2.partition_C(local_tile(gCt, part2_tile, part2_at));
      Tensor tCcC2 = thr_c2.partition_C(local_tile(cCt, part2_tile, part2_at));
      auto acc_2 = [&](int i) -> float& { return acc2(i); };
      const int n0 = u.n_blk * BN;   // the tile's first column
      const bool rows_in = EPI_FAST != 0 && p.c_vec && (u.m_blk + 1) * BM <= p.M && (EPILOGUE != 1 || p.bias_vec);
      const bool fast = rows_in && n0 + kBN1 <= p.N;
      const bool fast2 = rows_in && n0 + BN <= p.N;
      const bool part2 = kBN2 > 0 && n0 + kBN1 < p.N;
      uint32_t bias_w[EPILOGUE == 1 ? kNG : 1];
      uint32_t bias_w2[EPILOGUE == 1 && kBN2 > 0 ? kBN2 / 8 : 1];
      // (kDefer: the flush loads the words it needs)
      auto load_bias = [&] {
        if (fast) {
          const uint32_t* bw = bias_words(tCcC);
          CUTE_UNROLL
          for (int g = 0; g < kNG; ++g) bias_w[g] = __ldg(bw + 4 * g);
        }
        if constexpr (kBN2 > 0) {
          if (fast2) {
            const uint32_t* bw = bias_words(tCcC2);
            CUTE_UNROLL
            for (int g = 0; g < kBN2 / 8; ++g) bias_w2[g] = __ldg(bw + 4 * g);
          }
        }
      };
      if constexpr (EPILOGUE == 1 && !kDefer) load_bias();
      warpgroup_wait<0>();
      // The last stage is free too: with PERSIST the producer refills it (the next tile) while
      // this epilogue runs.
      if (prev >= 0) release(prev);
      warpgroup_fence_operand(acc0);
      if constexpr (kAcc1) warpgroup_fence_operand(acc1);
      if constexpr (kBN2 > 0) warpgroup_fence_operand(acc2);
      if constexpr (kSK) {
        static_assert(!kSK || kBN2 == 0, "STREAMK publishes acc0 only");
        if (ke < k_tiles) {   // a unit's head: add the next CTA's partial (its tail) first
          if (ct == 0) {
            int ready = 0;
            do {
              asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(ready) : "l"(p.sk_flags + blockIdx.x + 1) : "memory");
            } while (ready == 0);
          }
          asm volatile("bar.sync 1, %0;" :: "r"(kThr) : "memory");
          const float4* part = reinterpret_cast<const float4*>(p.sk_partial + int64_t(blockIdx.x + 1) * (BM * BN));
          CUTE_UNROLL
          for (int q = 0; q < size(acc0) / 4; ++q) {
            const float4 v = __ldcg(part + q * kThr + ct);
            acc0(4 * q) += v.x; acc0(4 * q + 1) += v.y; acc0(4 * q + 2) += v.z; acc0(4 * q + 3) += v.w;
          }
        }
      }
      if constexpr (kDefer) {
        if (fast) {
          CUTE_UNROLL
          for (int i = 0; i < kNV; i += 2) {
            if constexpr (EPILOGUE == 2) {
              dv[i] = pack_bf16x2(acc_g(i), acc_u(i));
              dv[i + 1] = pack_bf16x2(acc_g(i + 1), acc_u(i + 1));
            } else {
              dv[i / 2] = pack_bf16x2(acc_g(i), acc_g(i + 1));
            }
          }
          d_m = u.m_blk;
          d_n = u.n_blk;
          d_l = u.l;
          continue;
        }
      }
      // Stores one part of the tile: gate values g(i), up values up(i) (EPILOGUE 2), output and
      // coordinate partitions oC / oI, its bias words bw (EPILOGUE 1, straight-line path only),
      // kng: its 8-column groups; straight: the part lies wholly inside C.
      auto store_part = [&](auto& g, auto& up, auto const& oC, auto const& oI, auto const& bw, auto kng, bool straight) {
        [[maybe_unused]] constexpr int kNGp = decltype(kng)::value;
        // The task's activation of the value pair (i, i + 1), bias b0, b1 (EPILOGUE 1 only).
        auto activate = [&](int i, float& v0, float& v1, float b0, float b1) {
          if constexpr (EPILOGUE == 1) {
            v0 = gelu_erf(v0 + b0);
            v1 = gelu_erf(v1 + b1);
          } else if constexpr (EPILOGUE == 2) {
            v0 = silu(v0) * up(i);
            v1 = silu(v1) * up(i + 1);
          }
        };
        if (straight) {
          CUTE_UNROLL
          for (int i = 0; i < size(oC); i += 2) {
            float v0 = g(i), v1 = g(i + 1);
            if constexpr (EPILOGUE == 1) {
              const uint32_t b = bw[(i / 4) % kNGp];   // (n, n + 1): low, high half; exact
              activate(i, v0, v1, __uint_as_float(b << 16), __uint_as_float(b & 0xffff0000u));
            } else {
              activate(i, v0, v1, 0.f, 0.f);
            }
            *reinterpret_cast<__nv_bfloat162*>(&oC(i)) = __floats2bfloat162_rn(v0, v1);
          }
          return;
        }
        // GMMA accumulators come in pairs of adjacent columns: values i, i+1 (i even) are
        // (m, n) and (m, n + 1).
        // Bias through the read-only path (ld.global.nc): its loads need not wait behind this
        // loop's stores to C, which a plain load must (the compiler cannot prove bias and C apart).
        [[maybe_unused]] const unsigned short* bias_bits = reinterpret_cast<const unsigned short*>(p.bias);
        CUTE_UNROLL
        for (int i = 0; i < size(oC); i += 2) {
          const int m = get<0>(oI(i));
          const int n = get<1>(oI(i));
          if (m >= p.M) continue;
          float v0 = g(i), v1 = g(i + 1);
          if constexpr (EPILOGUE == 1) {
            const float b0 = n < p.N ? __uint_as_float(uint32_t(__ldg(bias_bits + n)) << 16) : 0.f;   // exact
            const float b1 = n + 1 < p.N ? __uint_as_float(uint32_t(__ldg(bias_bits + n + 1)) << 16) : 0.f;
            activate(i, v0, v1, b0, b1);
          } else {
            activate(i, v0, v1, 0.f, 0.f);
          }
          if (p.c_vec && n + 1 < p.N) {
            __nv_bfloat162 pair = __floats2bfloat162_rn(v0, v1);
            *reinterpret_cast<__nv_bfloat162*>(&oC(i)) = pair;
          } else {
            if (n < p.N) oC(i) = bf16(v0);
            if (n + 1 < p.N) oC(i + 1) = bf16(v1);
          }
        }
      };
      store_part(acc_g, acc_u, tCgC, tCcC, bias_w, Int<kNG>{}, fast);
      if constexpr (kBN2 > 0) {
        if (part2) store_part(acc_2, acc_2, tCgC2, tCcC2, bias_w2, Int<kBN2 / 8>{}, fast2);
      }
    }
    if constexpr (kDefer) {   // the last tile's deferred stores
      if (d_m >= 0) {
        CUTE_UNROLL
        for (int sl = 0; sl < kSlices; ++sl) flush(sl);
      }
    }
  }
  if constexpr (kCS > 1) {
    // No CTA leaves while a peer may still arrive on its barriers or multicast into its
    // stages (every thread of both CTAs gets here: no role returns early).
    cute::cluster_arrive();
    cute::cluster_wait();
  }
}

template <int BM, int BN, int NSTAGE, bool kTMA, class TmaA, class TmaB>
cudaError_t launch(Params p, TmaA const& ta, TmaB const& tb0, TmaB const& tb1, cudaStream_t stream) {
  using Cfg = Config<BM, BN, NSTAGE, kPingPong<kTMA>>;
  auto kernel = gemm_bf16_kernel<BM, BN, NSTAGE, kTMA, TmaA, TmaB>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  constexpr int kCM = kTMA ? CLUSTER_M : 1;
  constexpr int kCN = kTMA ? CLUSTER_N : 1;
  constexpr int kCS = kCM * kCN;   // CTAs per cluster
  const int64_t tiles_c = int64_t((p.tiles_m + kCM - 1) / kCM) * ((p.tiles_n + kCN - 1) / kCN);   // cluster tiles
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = evo_launch_config(dim3(unsigned(tiles_c * kCS), unsigned(p.L), 1), dim3(Cfg::kThreads, 1, 1),
                                             Cfg::kSmemBytes, stream, kCS, &attr);
  if constexpr (PERSIST != 0 && kTMA) {
    // As many clusters as fit at once (one CTA per SM; with kCM = 2 the hardware's count of
    // co-resident 2-CTA clusters), each looping over the cluster tiles.
    int slots = 0;
    if constexpr (kCS > 1) {
      cfg.gridDim = dim3(unsigned(kCS), 1, 1);
      err = cudaOccupancyMaxActiveClusters(&slots, kernel, &cfg);
      if (err != cudaSuccess) return err;
    } else {
      slots = evo_sm_count();
    }
    if (slots < 1) return cudaErrorInvalidConfiguration;   // no device, or the CTA does not fit at all
    const int64_t work = tiles_c * p.L;
    cfg.gridDim = dim3(unsigned((work < slots ? work : slots) * kCS), 1, 1);
    // STREAMK: make_plan gave a workspace (p.sk_partial) only when the units outnumber the
    // CTAs (one per SM: this grid) and do not divide evenly among them; the last two rounds go
    // to stream-K (kernel comment).
    const int64_t ctas = cfg.gridDim.x;
    if (p.sk_partial != nullptr && kCS == 1 && !kPingPong<kTMA>) {
      const int64_t k_tiles = (p.K + TILE_K - 1) / TILE_K;
      p.sk_first = int((work / ctas - 1) * ctas);
      const int64_t total = (work - p.sk_first) * k_tiles;
      p.sk_base = int(total / ctas);
      p.sk_rem = int(total % ctas);
      err = cudaMemsetAsync(p.sk_flags, 0, size_t(ctas) * sizeof(int), stream);
      if (err != cudaSuccess) return err;
    }
  }
  err = cudaLaunchKernelEx(&cfg, kernel, p, ta, tb0, tb1);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

template <int BM, int BN, int NSTAGE>
cudaError_t launch_tma(Params p, cudaStream_t stream) {
  using Cfg = Config<BM, BN, NSTAGE>;
  Tensor mA = make_tensor(make_gmem_ptr(p.A), make_shape(p.M, p.K, p.L), make_stride(p.lda, _1{}, p.a_l));
  // CLUSTER_N = 2: A boxes split in two slices likewise
  using ALoad = cute::conditional_t<(CLUSTER_N > 1), SM90_TMA_LOAD_MULTICAST, SM90_TMA_LOAD>;
  auto tma_a = make_tma_atom(ALoad{}, mA, typename Cfg::SmemLayoutA{}(_, _, 0),
                             make_shape(Int<BM>{}, Int<TILE_K>{}), Int<CLUSTER_N>{});
  Tensor mB0 = make_tensor(make_gmem_ptr(p.B[0]), make_shape(p.N, p.K, p.L), make_stride(_1{}, p.ldb, p.b_l));
  Tensor mB1 = make_tensor(make_gmem_ptr(p.B[kNB - 1]), make_shape(p.N, p.K, p.L), make_stride(_1{}, p.ldb, p.b_l));
  // CLUSTER_M = 2: B boxes split in two slices, each CTA of a cluster loads one, multicast
  using BLoad = cute::conditional_t<(CLUSTER_M > 1), SM90_TMA_LOAD_MULTICAST, SM90_TMA_LOAD>;
  // TILE_N = 320 (kSplitB): one 64 x 64 block per box, whole boxes multicast (kernel comment)
  using BBox = cute::conditional_t<Cfg::kSplitB, decltype(typename Cfg::SmemLayoutBBlk{}(_, _, 0)),
                                   decltype(typename Cfg::SmemLayoutB{}(_, _, 0))>;
  constexpr int kBSlices = Cfg::kSplitB ? 1 : CLUSTER_M;
  auto tma_b0 = make_tma_atom(BLoad{}, mB0, BBox{}, make_shape(Int<Cfg::kBoxN>{}, Int<TILE_K>{}), Int<kBSlices>{});
  auto tma_b1 = make_tma_atom(BLoad{}, mB1, BBox{}, make_shape(Int<Cfg::kBoxN>{}, Int<TILE_K>{}), Int<kBSlices>{});
  p.tiles_m = int((p.M + BM - 1) / BM);
  p.tiles_n = int((p.N + BN - 1) / BN);
  return launch<BM, BN, NSTAGE, true>(p, tma_a, tma_b0, tma_b1, stream);
}

// Pad copy: rows x cols (row stride cols, 2-byte aligned) -> rows x ld (ld % 8 == 0, 16-byte
// aligned base). One thread writes one 16-byte chunk of a row (blockIdx.x, threadIdx.x: chunk;
// blockIdx.y strides over rows: no 64-bit division per chunk); its 8 source elements are
// scalar loads (a warp still reads 512 contiguous bytes). Chunks past `cols` get zeros.
__global__ void __launch_bounds__(256) pad_rows_kernel(const uint16_t* __restrict__ src, uint16_t* __restrict__ dst,
                                                       int64_t rows, int cols, int ld) {
  const int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (c0 >= ld) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const uint16_t* s = src + r * cols + c0;
    uint32_t w[4];
    CUTE_UNROLL
    for (int k = 0; k < 4; ++k) {
      const uint32_t lo = c0 + 2 * k < cols ? uint32_t(__ldg(s + 2 * k)) : 0u;
      const uint32_t hi = c0 + 2 * k + 1 < cols ? uint32_t(__ldg(s + 2 * k + 1)) : 0u;
      w[k] = lo | (hi << 16);
    }
    *reinterpret_cast<uint4*>(dst + r * ld + c0) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

inline cudaError_t pad_rows(const bf16* src, bf16* dst, int64_t rows, int64_t cols, int64_t ld, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const dim3 grid(unsigned((ld / 8 + 255) / 256), unsigned(std::min<int64_t>(rows, 65535)));
  pad_rows_kernel<<<grid, 256, 0, stream>>>(reinterpret_cast<const uint16_t*>(src), reinterpret_cast<uint16_t*>(dst),
                                            rows, int(cols), int(ld));
  return cudaGetLastError();
}

constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// What one call does, decided from the tensors alone (shared by evo_workspace_bytes and
// evo_launch, so the two agree on the workspace).
struct Plan {
  Params p;
  bool empty = false;      // M, N or L is 0: nothing to compute
  bool tma = false;        // run the TMA kernel (on the operands or on their padded copies)
  bool pad = false;        // copy the operands into the workspace first
  int64_t lda_pad = 0, ldb_pad = 0;
  int64_t off_b = 0;       // byte offsets of the padded B operands in the workspace
  int64_t off_sk = -1;     // STREAMK: byte offset of the partial tiles (then the flags); -1: none
  int sk_ctas = 0;
  int64_t ws_bytes = 0;
};

// Validates the task tensors (out[0] only: the workspace is checked by evo_launch) and fills
// `plan`. Returns cudaErrorInvalidValue for inputs outside the contract of the header.
inline cudaError_t make_plan(const EvoTensor* in, int n_in, const EvoTensor* out, int n_out, Plan& plan) {
  const int want_in = (EPILOGUE == 0) ? 2 : 3;
  if (n_in != want_in || n_out < 1) return cudaErrorInvalidValue;
  for (int i = 0; i < n_in; ++i)
    if (in[i].dtype != EVO_BF16 || !evo_is_contiguous(in[i])) return cudaErrorInvalidValue;
  const EvoTensor& a = in[0];
  const EvoTensor& b = in[1];
  const EvoTensor& c = out[0];
  if (c.dtype != EVO_BF16 || !evo_is_contiguous(c)) return cudaErrorInvalidValue;
  if (a.ndim < 2 || b.ndim < 2 || b.ndim > 3) return cudaErrorInvalidValue;

  int64_t L = 1, M, K = a.shape[a.ndim - 1];
  if (b.ndim == 3) {
    if (a.ndim != 3 || a.shape[0] != b.shape[0]) return cudaErrorInvalidValue;
    L = a.shape[0];
    M = a.shape[1];
  } else {
    M = (K > 0) ? evo_numel(a) / K : 0;
  }
  const int64_t N = b.shape[b.ndim - 1];
  if (b.shape[b.ndim - 2] != K) return cudaErrorInvalidValue;
  if (c.shape[c.ndim - 1] != N || evo_numel(c) != L * M * N) return cudaErrorInvalidValue;
  if (EPILOGUE == 1 && (in[2].ndim != 1 || in[2].shape[0] != N)) return cudaErrorInvalidValue;
  if (EPILOGUE == 2) {
    const EvoTensor& w3 = in[2];
    if (w3.ndim != b.ndim) return cudaErrorInvalidValue;
    for (int i = 0; i < b.ndim; ++i)
      if (w3.shape[i] != b.shape[i]) return cudaErrorInvalidValue;
  }
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || L > 65535) return cudaErrorInvalidValue;
  // work-unit indices (l * tiles + tile) are ints, whatever the tile size (>= 64 x 64)
  if (((M + 63) / 64) * ((N + 63) / 64) * L > INT32_MAX) return cudaErrorInvalidValue;
  if (M == 0 || N == 0 || L == 0) {
    plan.empty = true;
    return cudaSuccess;
  }

  Params& p = plan.p;
  p.A = static_cast<const bf16*>(a.data);
  p.B[0] = static_cast<const bf16*>(b.data);
  p.B[1] = static_cast<const bf16*>(EPILOGUE == 2 ? in[2].data : b.data);
  p.bias = static_cast<const bf16*>(EPILOGUE == 1 ? in[2].data : nullptr);
  p.C = static_cast<bf16*>(c.data);
  p.M = int(M); p.N = int(N); p.K = int(K); p.L = int(L);
  p.lda = K;
  p.ldb = N;
  p.a_l = (L > 1) ? M * K : 0;
  p.b_l = (L > 1) ? K * N : 0;
  p.c_l = M * N;
  p.c_vec = (N % 2 == 0) && ((reinterpret_cast<uintptr_t>(c.data) & 3) == 0);
  p.bias_vec = (EPILOGUE == 1) && ((reinterpret_cast<uintptr_t>(p.bias) & 3) == 0);

  uintptr_t ptrs = reinterpret_cast<uintptr_t>(p.A) | reinterpret_cast<uintptr_t>(p.B[0]) |
                   reinterpret_cast<uintptr_t>(p.B[1]);
  if (ptrs & 1) return cudaErrorInvalidValue;
  const bool tma_ok = K > 0 && (ptrs & 15) == 0 && (K % 8 == 0) && (N % 8 == 0);
  plan.tma = tma_ok;
  if (!tma_ok && PAD && K > 0) {
    plan.tma = plan.pad = true;
    plan.lda_pad = round_up(K, PAD_LD);
    plan.ldb_pad = round_up(N, PAD_LD);
    plan.off_b = round_up(L * M * plan.lda_pad * 2, 256);
    plan.ws_bytes = plan.off_b + kNB * round_up(L * K * plan.ldb_pad * 2, 256);
  }
  p.sk_first = INT32_MAX;
  p.sk_base = p.sk_rem = 0;
  p.sk_partial = nullptr;
  p.sk_flags = nullptr;
  // STREAMK: one fp32 partial tile and one flag per CTA of the persistent grid (one per SM),
  // when the TMA kernel's units do not divide evenly among them.
  if (STREAMK && PERSIST && CLUSTER_M == 1 && CLUSTER_N == 1 && !PINGPONG && EPILOGUE != 2 && plan.tma) {
    const int64_t units = ((M + TILE_M - 1) / TILE_M) * ((N + TILE_N - 1) / TILE_N) * L;
    const int sms = evo_sm_count();
    if (sms > 0 && units > sms && units % sms != 0) {
      plan.sk_ctas = sms;
      plan.off_sk = round_up(plan.ws_bytes, 256);
      plan.ws_bytes = plan.off_sk + int64_t(sms) * TILE_M * TILE_N * 4 + round_up(int64_t(sms) * 4, 256);
    }
  }
  return cudaSuccess;
}

}  // namespace evo_bf16

EVO_EXPORT int64_t evo_workspace_bytes(const EvoTensor* in, int n_in, const EvoTensor* out, int n_out,
                                       const double* scalars, int n_scalars) {
  (void)scalars;
  (void)n_scalars;
  evo_bf16::Plan plan;
  if (evo_bf16::make_plan(in, n_in, out, n_out, plan) != cudaSuccess) return -1;
  return plan.ws_bytes;
}

EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  using namespace evo_bf16;
  (void)scalars;
  (void)n_scalars;
  Plan plan;
  cudaError_t err = make_plan(in, n_in, out, n_out, plan);
  if (err != cudaSuccess) return err;
  if (!evo_workspace_ok(out, n_out, 1, plan.ws_bytes, 256)) return cudaErrorInvalidValue;
  if (plan.empty) return cudaSuccess;
  Params p = plan.p;
  if (plan.pad) {
    char* base = static_cast<char*>(out[1].data);
    bf16* a_pad = reinterpret_cast<bf16*>(base);
    err = pad_rows(p.A, a_pad, int64_t(p.L) * p.M, p.K, plan.lda_pad, stream);
    if (err != cudaSuccess) return err;
    p.A = a_pad;
    p.lda = plan.lda_pad;
    p.a_l = p.L > 1 ? int64_t(p.M) * plan.lda_pad : 0;
    const int64_t b_bytes = round_up(int64_t(p.L) * p.K * plan.ldb_pad * 2, 256);
    for (int i = 0; i < kNB; ++i) {
      bf16* b_pad = reinterpret_cast<bf16*>(base + plan.off_b + i * b_bytes);
      err = pad_rows(p.B[i], b_pad, int64_t(p.L) * p.K, p.N, plan.ldb_pad, stream);
      if (err != cudaSuccess) return err;
      p.B[i] = b_pad;
    }
    if (kNB == 1) p.B[1] = p.B[0];
    p.ldb = plan.ldb_pad;
    p.b_l = p.L > 1 ? int64_t(p.K) * plan.ldb_pad : 0;
  }
  if (plan.off_sk >= 0) {
    char* sk = static_cast<char*>(out[1].data) + plan.off_sk;
    p.sk_partial = reinterpret_cast<float*>(sk);
    p.sk_flags = reinterpret_cast<int*>(sk + int64_t(plan.sk_ctas) * TILE_M * TILE_N * 4);
  }
  if (plan.tma) return launch_tma<TILE_M, TILE_N, STAGES>(p, stream);
  p.tiles_m = int((p.M + TILE_M - 1) / TILE_M);
  p.tiles_n = int((p.N + FB_TILE_N - 1) / FB_TILE_N);
  return launch<TILE_M, FB_TILE_N, FB_STAGES, false>(p, 0, 0, 0, stream);
}
