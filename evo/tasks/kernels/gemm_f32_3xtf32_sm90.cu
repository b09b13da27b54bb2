// gemm_f32_3xtf32_sm90.cu -- strict-fp32 GEMM on Hopper (sm_90a): TMA + wgmma TF32 with
// 3xTF32 error compensation and per-k-tile promotion into an fp32 register accumulator.
//
// STATUS: EXPERIMENTAL, NOT YET VALIDATED ON A GPU. Checked on the CPU only
// (tests/test_gemm_3xtf32_sm90.py): policy, builds for sm_90a without spills or wgmma
// serialisation, HGMMA in the SASS, host-side CuTe layout checks of the hand-coded mappings.
// benchmarks/probes/f32_3xtf32_sm90.json checks and times it.
//
// Computes C[M, N] = A[M, K] @ B[K, N], all fp32, 2-D, row-major, contiguous, 16-byte
// aligned pointers, with M % BM == 0, N % BN == 0, K % BK == 0, K > 0 (anything else returns
// cudaErrorInvalidValue).
//
// Maths. Every fp32 operand x is split into big = tf32_rna(x) and small = tf32_rna(x - big)
// (x - big is exact). Each k-tile of BK = 32 issues, per k-block of 8, three TF32 wgmmas in
// the order small*big, big*small, big*big into a FRESH tile accumulator (the first wgmma of
// the tile has scale-D = 0); after the tile it is added into the fp32 total accumulator with
// ordinary round-to-nearest FADDs ("promotion"): the tensor core's truncating fp32
// accumulation then only ever spans 32 products.
//
// Structure. Warp-specialised CTA of 1 + BM / 64 warpgroups. Warpgroup 0 is the producer: one
// thread issues TMA loads of raw fp32 tiles into a STAGES-deep ring guarded by full/empty
// mbarriers (the protocol of gemm_bf16_sm90.cu):
//   A stage: BM x BK, K-major, 128-byte swizzle (GMMA K-major SW128 layout of fp32);
//   B stage: BK x BN, plain N-contiguous rows (no swizzle).
// Consumer warpgroup w owns rows [64 w, 64 w + 64) of the tile and the whole BN width.
// TF32 wgmma needs both smem operands K-major, so:
//   * A goes through registers (RS wgmma): each thread reads its raw fragment from the A stage
//     with four 16-byte loads and splits it in registers into big and small tf32 fragments;
//   * B is transposed and split by all consumer threads together into B_big / B_small tiles in
//     the canonical GMMA K-major SW128 tf32 layout (double-buffered), then fence.proxy.async +
//     a named barrier among the consumers before the wgmmas read them.
// K-slot permutation. Inside a k-tile, the logical k-slot s = 8 j + 4 h + t (k-block j, half
// h, lane % 4 = t: what the wgmma A fragment pairs with B) holds global k = k0 + 8 t + 4 h + j.
// Applied to A and B alike, so the product is unchanged; it makes a thread's four k-blocks of
// one fragment row 4 consecutive floats (one 16-byte, bank-conflict-free load from the
// swizzled A stage). B_big/B_small chunk c (slots 4c .. 4c+3) of row n holds
// B[k0 + 8 i + 4 (c & 1) + (c >> 1)][n], i = 0..3.
// Pipeline per consumer and k-tile kt: issue the 12 wgmmas of kt in two commit groups
// (k-blocks 0-1, 2-3); meanwhile wait for stage kt+1, transform B(kt+1) into the other B
// buffer, load the raw A(kt+1) fragment, release the stage; when the first group retires,
// split the first half of A(kt+1) into its fragment registers, when the second retires the
// second half; promote; named barrier among the consumers. (One fragment register set plus 16
// raw floats: a second full set would spill at the 232-register consumer budget.)
// Registers (kb01 default, nvcc 13.0): no spills, no wgmma serialisation, 12 HGMMA in the loop.
// Epilogue: 8-byte stores of column pairs straight from the total accumulator.
//
// No allocation, no atomics, one launch on `stream`: deterministic by construction.
// ABI: evo_abi.h.
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include "evo_abi.h"

// @evo:task-config

// @tunable BM = 128 in {64, 128}
// @tunable BN = 128 in {64, 128}
// @tunable BK = 32 in {32}
// @tunable STAGES = 4 in {2, 3, 4, 5}
// @tunable GROUP_M = 8 in {1, 4, 8, 16}
// @tunable TF32_CVT = 0 in {0, 1}
// @constraint STAGES * (BM + BN) * BK * 4 + 4 * BN * BK * 4 + 2048 <= 232448
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
#define STAGES 4
#endif
#ifndef GROUP_M
#define GROUP_M 8
#endif
#ifndef TF32_CVT
#define TF32_CVT 0
#endif

namespace evo_3xtf32_sm90 {
using namespace cute;
using tf32 = cutlass::tfloat32_t;

static_assert(BK == 32, "BK must be 32 (one 128-byte swizzle row of fp32)");
static_assert(BM == 64 || BM == 128, "BM is 64 per consumer warpgroup (1 or 2 of them)");
static_assert(BN == 64 || BN == 128, "BN in {64, 128}: tile + total accumulators must fit the registers");
static_assert(STAGES >= 2, "the pipeline needs at least two stages");

constexpr int kNWG = BM / 64;                 // consumer warpgroups
constexpr int kConsumers = 128 * kNWG;
constexpr int kThreads = 128 + kConsumers;

using SmemLayoutA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<float>{},
                                           make_shape(Int<BM>{}, Int<BK>{}, Int<STAGES>{})));
// B stage: (n, k, stage), n contiguous (what TMA writes from the row-major [K, N] matrix).
using SmemLayoutBst = Layout<Shape<Int<BN>, Int<BK>, Int<STAGES>>, Stride<_1, Int<BN>, Int<BN * BK>>>;
// B_big / B_small: (n, k-slot, buffer), canonical GMMA K-major SW128 tf32.
using SmemLayoutBop = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<tf32>{},
                                             make_shape(Int<BN>{}, Int<BK>{}, _2{})));

constexpr int kABytes = int(cosize_v<SmemLayoutA>) * 4;
constexpr int kBstBytes = int(cosize_v<SmemLayoutBst>) * 4;
constexpr int kBopBytes = int(cosize_v<SmemLayoutBop>) * 4;
constexpr int kStageTx = (BM + BN) * BK * 4;  // TMA bytes per stage
constexpr int kSmemBytes = kABytes + kBstBytes + 2 * kBopBytes + 2 * STAGES * 8 + 1024;
static_assert(kSmemBytes <= 232448, "shared memory above 227 KB");
static_assert(kABytes % 1024 == 0 && kBstBytes % 1024 == 0 && kBopBytes % 1024 == 0,
              "swizzled tiles must stay 1024-byte aligned");

using MmaOp = std::conditional_t<BN == 128, SM90_64x128x8_F32TF32TF32_RS_TN<>, SM90_64x64x8_F32TF32TF32_RS_TN<>>;
using TiledMma = decltype(make_tiled_mma(MmaOp{}, Layout<Shape<Int<kNWG>, _1, _1>>{}));

struct Params {
  float* C;
  int M, N, K;
  int tiles_m, tiles_n;
};

// fp32 -> tf32 bit pattern, round to nearest, ties away (cvt.rna.tf32.f32). TF32_CVT = 0 rounds
// with integer ops (bit-identical for every finite value and +-Inf; see gemm_f32_3xtf32.cu).
CUTE_DEVICE uint32_t to_tf32(float x) {
  uint32_t r;
#if TF32_CVT
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
#else
  r = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
#endif
  return r;
}

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
CUTE_DEVICE float4 lds128(const void* p) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(cast_smem_ptr_to_uint(p)) : "memory");
  return v;
}
CUTE_DEVICE void sts128(void* p, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n"
               :: "r"(cast_smem_ptr_to_uint(p)), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// A fragment of one k-tile. Fragment value (v, 0, j) of the RS wgmma: row r0 + 8 (v & 1),
// logical slot 8 j + 4 (v >> 1) + t, i.e. physical k = 8 t + 4 (v >> 1) + j: for fixed v the
// four k-blocks j are one float4 (raw fp32, loaded early; split into the tf32 fragments later).
template <class SA>
CUTE_DEVICE void load_a(SA const& sA, int st, int r0, int t, float4 (&q)[4]) {
  CUTE_UNROLL
  for (int v = 0; v < 4; ++v)
    q[v] = lds128(&sA(r0 + 8 * (v & 1), 8 * t + 4 * (v >> 1), st));
}

CUTE_DEVICE float lane_of(float4 const& q, int j) { return j == 0 ? q.x : j == 1 ? q.y : j == 2 ? q.z : q.w; }

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

// Transposes + splits the B stage `st` into buffer `buf` of B_big / B_small. Task q = (n-block
// nb of 32 columns, chunk c): lane l handles row n = 32 nb + l (32 consecutive n per warp:
// conflict-free 4-byte loads; 16-byte stores into 8 distinct swizzled chunks per 8 lanes).
template <class SBst, class SBop>
CUTE_DEVICE void transform_b(SBst const& sBst, int st, SBop& sBig, SBop& sSmall, int buf, int warp, int lane) {
  constexpr int kNB = BN / 32;
  constexpr int kTasks = kNB * (BK / 4);
  constexpr int kWarps = kConsumers / 32;
  static_assert(kTasks % kWarps == 0, "transform tasks must divide among the consumer warps");
  constexpr int kPer = kTasks / kWarps;
  float x[kPer][4];
  CUTE_UNROLL
  for (int r = 0; r < kPer; ++r) {
    const int q = warp + kWarps * r;
    const int n = 32 * (q % kNB) + lane, c = q / kNB;
    CUTE_UNROLL
    for (int i = 0; i < 4; ++i) x[r][i] = lds32(&sBst(n, 8 * i + 4 * (c & 1) + (c >> 1), st));
  }
  CUTE_UNROLL
  for (int r = 0; r < kPer; ++r) {
    const int q = warp + kWarps * r;
    const int n = 32 * (q % kNB) + lane, c = q / kNB;
    uint4 b, s;
    split(x[r][0], b.x, s.x);
    split(x[r][1], b.y, s.y);
    split(x[r][2], b.z, s.z);
    split(x[r][3], b.w, s.w);
    sts128(&sBig(n, 4 * c, buf), b);
    sts128(&sSmall(n, 4 * c, buf), s);
  }
}

template <class TmaA, class TmaB>
__global__ void __launch_bounds__(kThreads, 1)
gemm_3xtf32_sm90_kernel(Params p, CUTE_GRID_CONSTANT TmaA const tma_a, CUTE_GRID_CONSTANT TmaB const tma_b) {
  extern __shared__ char smem_raw[];
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  float* smemA = reinterpret_cast<float*>(base);
  float* smemBst = reinterpret_cast<float*>(base + kABytes);
  tf32* smemBig = reinterpret_cast<tf32*>(base + kABytes + kBstBytes);
  tf32* smemSmall = reinterpret_cast<tf32*>(base + kABytes + kBstBytes + kBopBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(base + kABytes + kBstBytes + 2 * kBopBytes);
  uint64_t* empty = full + STAGES;

  Tensor sA = make_tensor(make_smem_ptr(smemA), SmemLayoutA{});        // (BM, BK, STAGES)
  Tensor sBst = make_tensor(make_smem_ptr(smemBst), SmemLayoutBst{});  // (BN, BK, STAGES)
  Tensor sBig = make_tensor(make_smem_ptr(smemBig), SmemLayoutBop{});  // (BN, BK, 2)
  Tensor sSmall = make_tensor(make_smem_ptr(smemSmall), SmemLayoutBop{});

  const int wg = threadIdx.x / 128;
  const int tile = blockIdx.x;
  const int group_size = GROUP_M * p.tiles_n;
  const int first_m = (tile / group_size) * GROUP_M;
  const int gm = min(p.tiles_m - first_m, GROUP_M);
  const int m_blk = first_m + (tile % group_size) % gm;
  const int n_blk = (tile % group_size) / gm;
  const int k_tiles = p.K / BK;

  if (threadIdx.x == 0) {
    CUTE_UNROLL
    for (int s = 0; s < STAGES; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], 1);
      cutlass::arch::ClusterBarrier::init(&empty[s], kConsumers);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ------------------------------- producer ------------------------------------------
    if constexpr (kNWG == 2) cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x / 32 == 0 && elect_one_sync()) {
      Tensor mA = tma_a.get_tma_tensor(make_shape(p.M, p.K));
      Tensor mB = tma_b.get_tma_tensor(make_shape(p.N, p.K));
      Tensor gA = local_tile(mA, make_shape(Int<BM>{}, Int<BK>{}), make_coord(m_blk, _));   // (BM, BK, k)
      Tensor gB = local_tile(mB, make_shape(Int<BN>{}, Int<BK>{}), make_coord(n_blk, _));   // (BN, BK, k)
      auto [tAgA, tAsA] = tma_partition(tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA), group_modes<0, 2>(gA));
      auto [tBgB, tBsB] = tma_partition(tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sBst), group_modes<0, 2>(gB));
      int stage = 0, phase = 0;
      for (int kt = 0; kt < k_tiles; ++kt) {
        cutlass::arch::ClusterBarrier::wait(&empty[stage], phase ^ 1);
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[stage], kStageTx);
        copy(tma_a.with(full[stage]), tAgA(_, kt), tAsA(_, stage));
        copy(tma_b.with(full[stage]), tBgB(_, kt), tBsB(_, stage));
        if (++stage == STAGES) { stage = 0; phase ^= 1; }
      }
    }
  } else {
    // ------------------------------- consumers -----------------------------------------
    if constexpr (kNWG == 2) cutlass::arch::warpgroup_reg_alloc<232>();
    const int ct = threadIdx.x - 128;          // 0 .. kConsumers - 1
    const int cwarp = ct / 32, lane = ct % 32;
    const int t = lane % 4;
    const int r0 = 64 * (ct / 128) + 16 * ((ct % 128) / 32) + lane / 4;   // fragment row (v even)

    TiledMma mma;
    auto thr = mma.get_thread_slice(ct);
    Tensor tCsBig = thr.partition_B(sBig);        // (MMA, MMA_N, MMA_K, 2)
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

    Tensor mC = make_tensor(make_gmem_ptr(p.C), make_shape(p.M, p.N), make_stride(int64_t(p.N), _1{}));
    Tensor gC = local_tile(mC, make_shape(Int<BM>{}, Int<BN>{}), make_coord(m_blk, n_blk));
    Tensor tCgC = thr.partition_C(gC);
    Tensor accT = thr.partition_fragment_C(gC);   // per-k-tile tensor-core accumulator
    Tensor accS = thr.partition_fragment_C(gC);   // fp32 total (promotion target)
    clear(accS);

    // prologue: stage 0 -> B buffer 0 and the A fragment
    cutlass::arch::ClusterBarrier::wait(&full[0], 0);
    transform_b(sBst, 0, sBig, sSmall, 0, cwarp, lane);
    load_a(sA, 0, r0, t, qA);
    cutlass::arch::ClusterBarrier::arrive(&empty[0]);
    split_a<0, kJ>(qA, rA);
    cutlass::arch::fence_view_async_shared();     // generic-proxy B writes -> wgmma (async proxy)
    cutlass::arch::NamedBarrier::sync(kConsumers, 0);

    // Per k-tile: the wgmmas go out in two commit groups (k-blocks [0, kJh), [kJh, kJ)). While
    // they run: wait for the next stage, transform its B into the other buffer, load its raw A
    // fragment, release the stage. When the first group retires its fragment registers take the
    // next tile's first half; when the second retires, the second half; then promotion.
    int stage = 0, phase = 0;                     // stage / phase of tile kt
#pragma unroll 1
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int buf = kt & 1;
      const bool next = kt + 1 < k_tiles;
      warpgroup_fence_operand(accT);
      fence_a<0, kJ>(rA);
      warpgroup_arrive();
      mma_kblocks<0, kJh>(mma, rA, tCrBig, tCrSmall, buf, accT);
      warpgroup_commit_batch();
      mma_kblocks<kJh, kJ>(mma, rA, tCrBig, tCrSmall, buf, accT);
      warpgroup_commit_batch();
      if (next) {
        if (++stage == STAGES) { stage = 0; phase ^= 1; }
        cutlass::arch::ClusterBarrier::wait(&full[stage], phase);
        transform_b(sBst, stage, sBig, sSmall, buf ^ 1, cwarp, lane);
        load_a(sA, stage, r0, t, qA);
        cutlass::arch::ClusterBarrier::arrive(&empty[stage]);
        cutlass::arch::fence_view_async_shared();
      }
      warpgroup_wait<1>();
      fence_a<0, kJh>(rA);
      if (next) split_a<0, kJh>(qA, rA);
      warpgroup_wait<0>();
      warpgroup_fence_operand(accT);
      fence_a<kJh, kJ>(rA);
      if (next) split_a<kJh, kJ>(qA, rA);
      CUTE_UNROLL
      for (int i = 0; i < size(accS); ++i) accS(i) += accT(i);
      // B buffer buf ^ 1 is complete from every consumer; no wgmma reads buffer buf any more.
      cutlass::arch::NamedBarrier::sync(kConsumers, 0);
    }

    // ------------------------------- epilogue ------------------------------------------
    // Accumulator values i, i+1 (i even) are columns n, n + 1 of one row.
    CUTE_UNROLL
    for (int i = 0; i < size(accS); i += 2)
      *reinterpret_cast<float2*>(&tCgC(i)) = make_float2(accS(i), accS(i + 1));
  }
}

cudaError_t launch(const float* A, const float* B, Params p, cudaStream_t stream) {
  Tensor mA = make_tensor(make_gmem_ptr(A), make_shape(p.M, p.K), make_stride(int64_t(p.K), _1{}));
  auto tma_a = make_tma_atom(SM90_TMA_LOAD{}, mA, SmemLayoutA{}(_, _, 0), make_shape(Int<BM>{}, Int<BK>{}));
  Tensor mB = make_tensor(make_gmem_ptr(B), make_shape(p.N, p.K), make_stride(_1{}, int64_t(p.N)));
  auto tma_b = make_tma_atom(SM90_TMA_LOAD{}, mB, SmemLayoutBst{}(_, _, 0), make_shape(Int<BN>{}, Int<BK>{}));
  auto kernel = gemm_3xtf32_sm90_kernel<decltype(tma_a), decltype(tma_b)>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  dim3 grid(unsigned(p.tiles_m * p.tiles_n), 1, 1);
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(p, tma_a, tma_b);
  return cudaGetLastError();
}

}  // namespace evo_3xtf32_sm90

EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  using namespace evo_3xtf32_sm90;
  (void)scalars;
  (void)n_scalars;
  if (n_in != 2 || n_out != 1) return cudaErrorInvalidValue;
  const EvoTensor& a = in[0];
  const EvoTensor& b = in[1];
  const EvoTensor& c = out[0];
  if (a.dtype != EVO_F32 || b.dtype != EVO_F32 || c.dtype != EVO_F32) return cudaErrorInvalidValue;
  if (a.ndim != 2 || b.ndim != 2 || c.ndim != 2) return cudaErrorInvalidValue;
  if (!evo_is_contiguous(a) || !evo_is_contiguous(b) || !evo_is_contiguous(c)) return cudaErrorInvalidValue;
  const int64_t M = a.shape[0], K = a.shape[1], N = b.shape[1];
  if (b.shape[0] != K || c.shape[0] != M || c.shape[1] != N) return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  if (K <= 0 || M % BM || N % BN || K % BK) return cudaErrorInvalidValue;
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX) return cudaErrorInvalidValue;
  if (M / BM * (N / BN) > INT32_MAX) return cudaErrorInvalidValue;
  const uintptr_t ptrs = reinterpret_cast<uintptr_t>(a.data) | reinterpret_cast<uintptr_t>(b.data) |
                         reinterpret_cast<uintptr_t>(c.data);
  if (ptrs & 15) return cudaErrorInvalidValue;

  Params p;
  p.C = static_cast<float*>(c.data);
  p.M = int(M); p.N = int(N); p.K = int(K);
  p.tiles_m = int(M / BM);
  p.tiles_n = int(N / BN);
  return launch(static_cast<const float*>(a.data), static_cast<const float*>(b.data), p, stream);
}
