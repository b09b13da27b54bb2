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
//   Fallback path (any shape/alignment, e.g. 8205 x 2949 x 5921 where a row of A is 5898
//     bytes): the 64 k-slots of a stage are stored k-permuted (slot 8a + b holds k0 + a + 8b,
//     the same for A and B, so the product is unchanged). B comes by TMA whenever B's pointer
//     is 16-byte aligned (FB_TMA_B): its "super-row" view (x, y) = ((k % 8) * N + n, k / 8) has
//     the row stride 8 N elements, a multiple of 16 bytes for any N, and one 64 x 8 box of it is
//     exactly one permuted 8-slot atom of the swizzled B stage (8 * BN/64 boxes per stage).
//     A is gathered by the 128 producer threads with 2-byte loads (thread t: packet g = t % 8
//     of rows t / 8 + 16 i, elements k0 + g + 8b; 8 lanes read 16 contiguous bytes), packed
//     into 16-byte smem stores, then fence.proxy.async + mbarrier arrive (full barrier count
//     129 = 128 producers + thread 0's expect_tx/plain arrive). The last, partial k-tile (and
//     every k-tile when B is unaligned) loads B element by element with zero fill. Own tile
//     width FB_TILE_N and depth FB_STAGES; FB_PRODUCER_REGS > 0 moves registers from the
//     producer to the consumers with setmaxnreg (needed for FB_TILE_N = 256).
// Epilogue: straight from the accumulators to global memory (bf16x2 stores when aligned),
// every store predicated, so any M, N, K works.
//
// ABI: evo_abi.h. Returns cudaErrorInvalidValue for inputs outside the contract above.
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include "evo_abi.h"

// @evo:task-config

#ifndef EPILOGUE
#define EPILOGUE 0
#endif

// @tunable TILE_M = 128 in {64, 128, 256}
// @tunable TILE_N = 256 in {64, 128, 256}
// @tunable TILE_K = 64 in {64}
// @tunable STAGES = 4 in {2, 3, 4, 5, 6, 7}
// @tunable GROUP_M = 8 in {1, 4, 8, 16}
// @tunable FB_TILE_N = 128 in {64, 128, 256}
// @tunable FB_STAGES = 4 in {2, 3, 4, 5, 6}
// @tunable FB_TMA_B = 1 in {0, 1}
// @tunable FB_PRODUCER_REGS = 0 in {0, 120, 152}
// @tunable GELU_FAST = 2 in {0, 1, 2}
// @constraint TILE_M * TILE_N * (1 + (EPILOGUE == 2)) <= 32768
// @constraint TILE_M * FB_TILE_N * (1 + (EPILOGUE == 2)) <= 16384 * (1 + (FB_PRODUCER_REGS > 0))
// @constraint STAGES * (TILE_M + TILE_N * (1 + (EPILOGUE == 2))) * TILE_K * 2 + 2048 <= 232448
// @constraint FB_STAGES * (TILE_M + FB_TILE_N * (1 + (EPILOGUE == 2))) * TILE_K * 2 + 2048 <= 232448
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
#ifndef FB_TMA_B
#define FB_TMA_B 1
#endif
#ifndef FB_PRODUCER_REGS
#define FB_PRODUCER_REGS 0
#endif

namespace evo_bf16 {
using namespace cute;
using bf16 = cutlass::bfloat16_t;

constexpr int kNB = (EPILOGUE == 2) ? 2 : 1;   // B operands sharing the A tile
static_assert(TILE_K == 64, "TILE_K must be 64 (one 128-byte swizzle atom of bf16)");

struct Params {
  const bf16* A;
  const bf16* B[2];
  const bf16* bias;
  bf16* C;
  int M, N, K, L;
  int64_t a_l, b_l, c_l;   // batch strides (elements); 0 when B is shared
  int tiles_m, tiles_n;
  int k_tma;               // fallback path: k-tiles whose B comes by TMA (super-row view)
  int c_vec;               // bf16x2 stores legal
};

template <int BM, int BN, int NSTAGE>
struct Config {
  static constexpr int kNWG = BM == 64 ? 1 : 2;          // consumer warpgroups
  static constexpr int kThreads = 128 * (kNWG + 1);
  using SmemLayoutA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bf16>{},
                                             make_shape(Int<BM>{}, Int<TILE_K>{}, Int<NSTAGE>{})));
  using SmemLayoutB = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<bf16>{},
                                             make_shape(Int<BN>{}, Int<TILE_K>{}, Int<NSTAGE>{})));
  static constexpr int kABytes = int(cosize_v<SmemLayoutA>) * 2;
  static constexpr int kBBytes = int(cosize_v<SmemLayoutB>) * 2;
  static constexpr int kStageBytes = (BM + kNB * BN) * TILE_K * 2;   // TMA bytes per stage
  static constexpr int kSmemBytes = kABytes + kNB * kBBytes + 2 * NSTAGE * 8 + 1024;  // +align slack
  using MmaAtom = decltype(SM90::GMMA::ss_op_selector<bf16, bf16, float, Shape<_64, Int<BN>, Int<TILE_K>>,
                                                      GMMA::Major::K, GMMA::Major::MN>());
  using TiledMma = decltype(make_tiled_mma(MmaAtom{}, Layout<Shape<Int<kNWG>, _1, _1>>{}));
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
CUTE_DEVICE float gelu_erf(float x) {
#if GELU_FAST == 2
  const float u = 0.7978845608028654f * fmaf(0.044715f * x, x * x, x);
  float th;
  asm("tanh.approx.f32 %0, %1;" : "=f"(th) : "f"(u));
  return 0.5f * x * (1.0f + th);
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
CUTE_DEVICE float silu(float x) { return x / (1.f + __expf(-x)); }

// ---- fallback producer helpers ------------------------------------------------------------
// On the fallback path the 64 k-slots of a stage are stored in a permuted order: logical slot
// p = 8a + b (what wgmma pairs between A and B) holds global k = k0 + a + 8b. The permutation is
// applied to A and B alike, so the product is unchanged; it lets B's rows be loaded by TMA from
// a "super-row" view of B (rows k with the same k % 8 are 8 * N elements apart, a stride that is
// always a multiple of 16 bytes) even when N is odd.
CUTE_DEVICE int kperm(int p) { return (p >> 3) + ((p & 7) << 3); }

// Packs 8 raw bf16 values (low 16 bits of each word) into 4 words and stores one 16-byte packet.
CUTE_DEVICE void store_packet(bf16* dst, const uint32_t (&v)[8]) {
  uint4 q;
  q.x = __byte_perm(v[0], v[1], 0x5410);
  q.y = __byte_perm(v[2], v[3], 0x5410);
  q.z = __byte_perm(v[4], v[5], 0x5410);
  q.w = __byte_perm(v[6], v[7], 0x5410);
  *reinterpret_cast<uint4*>(dst) = q;
}

// Loads the A packets of one stage. Thread t owns k-packet g = t % 8 of rows r0 + 16 i
// (r0 = t / 8): the 8 elements A[m][k0 + g + 8b], b = 0..7 (2-byte loads, 8 lanes of a row read
// 16 consecutive bytes per instruction). All loads are issued before the first store.
template <int BM, bool kFullK, class SA>
CUTE_DEVICE void produce_a(Params const& p, const bf16* A, int m0, int k0, SA&& sA, int stage) {
  constexpr int kI = BM / 16;
  const int t = threadIdx.x;
  const int g = t % 8, r0 = t / 8;
  const uint16_t* base = reinterpret_cast<const uint16_t*>(A);
  uint32_t v[kI][8];
  CUTE_UNROLL
  for (int i = 0; i < kI; ++i) {
    const int m = m0 + r0 + 16 * i;
    const bool row_ok = m < p.M;
    const uint16_t* src = base + int64_t(row_ok ? m : 0) * p.K + (k0 + g);
    CUTE_UNROLL
    for (int b = 0; b < 8; ++b) {
      const bool ok = row_ok && (kFullK || k0 + g + 8 * b < p.K);
      v[i][b] = ok ? uint32_t(__ldg(src + 8 * b)) : 0u;
    }
  }
  CUTE_UNROLL
  for (int i = 0; i < kI; ++i) store_packet(&sA(r0 + 16 * i, 8 * g, stage), v[i]);
}

// Loads the B packets of one stage element by element (used for the last, partial k-tile and
// when B itself is not 16-byte aligned): packet (slot s, n-packet c) = B[k0 + kperm(s)][n0 + 8c
// .. + 7], zero outside the matrix. Thread t owns n-packet c = t % (BN / 8); batches of 8 packets.
template <int BN, class SmemLayoutB>
CUTE_DEVICE void produce_b_slow(Params const& p, const bf16* B, int n0, int k0, bf16* smem, int stage) {
  Tensor sB = make_tensor(make_smem_ptr(smem), SmemLayoutB{});
  constexpr int kC = BN / 8;             // n-packets per k-slot
  constexpr int kSlotsPerPass = 128 / kC;
  constexpr int kPasses = TILE_K / kSlotsPerPass;
  constexpr int kBatch = 2;
  const int t = threadIdx.x;
  const int c = t % kC, s0 = t / kC;
  const uint16_t* base = reinterpret_cast<const uint16_t*>(B);
  const int n = n0 + 8 * c;
#pragma unroll 1
  for (int j0 = 0; j0 < kPasses; j0 += kBatch) {
    __syncwarp();   // keeps the compiler from hoisting this batch's loads over earlier stores
    uint32_t v[kBatch][8];
    CUTE_UNROLL
    for (int j = 0; j < kBatch; ++j) {
      const int k = k0 + kperm(s0 + kSlotsPerPass * (j0 + j));
      const bool row_ok = k < p.K;
      const uint16_t* src = base + int64_t(row_ok ? k : 0) * p.N + n;
      CUTE_UNROLL
      for (int e = 0; e < 8; ++e) v[j][e] = (row_ok && n + e < p.N) ? uint32_t(__ldg(src + e)) : 0u;
    }
    CUTE_UNROLL
    for (int j = 0; j < kBatch; ++j) store_packet(&sB(8 * c, s0 + kSlotsPerPass * (j0 + j), stage), v[j]);
  }
}

template <int BM, int BN, int NSTAGE, bool kTMA, class TmaA, class TmaB>
__global__ void __launch_bounds__(Config<BM, BN, NSTAGE>::kThreads, 1)
gemm_bf16_kernel(Params p, CUTE_GRID_CONSTANT TmaA const tma_a, CUTE_GRID_CONSTANT TmaB const tma_b0,
                 CUTE_GRID_CONSTANT TmaB const tma_b1) {
  using Cfg = Config<BM, BN, NSTAGE>;
  extern __shared__ char smem_raw[];
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  bf16* smemA = reinterpret_cast<bf16*>(base);
  bf16* smemB = reinterpret_cast<bf16*>(base + Cfg::kABytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(base + Cfg::kABytes + kNB * Cfg::kBBytes);
  uint64_t* empty = full + NSTAGE;

  Tensor sA = make_tensor(make_smem_ptr(smemA), typename Cfg::SmemLayoutA{});            // (BM, BK, P)
  Tensor sB0 = make_tensor(make_smem_ptr(smemB), typename Cfg::SmemLayoutB{});           // (BN, BK, P)
  Tensor sB1 = make_tensor(make_smem_ptr(smemB + (kNB - 1) * cosize_v<typename Cfg::SmemLayoutB>),
                           typename Cfg::SmemLayoutB{});

  const int wg = threadIdx.x / 128;
  const int l = blockIdx.y;
  const int tile = blockIdx.x;
  const int group_size = GROUP_M * p.tiles_n;
  const int first_m = (tile / group_size) * GROUP_M;
  const int gm = min(p.tiles_m - first_m, GROUP_M);
  const int m_blk = first_m + (tile % group_size) % gm;
  const int n_blk = (tile % group_size) / gm;
  const int k_tiles = (p.K + TILE_K - 1) / TILE_K;

  if (threadIdx.x == 0) {
    CUTE_UNROLL
    for (int s = 0; s < NSTAGE; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], kTMA ? 1 : 129);   // fallback: 128 producers + thread 0's TMA/plain arrive
      cutlass::arch::ClusterBarrier::init(&empty[s], Cfg::kNWG * 128);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ------------------------------- producer ------------------------------------------
    if constexpr (kTMA) {
      if constexpr (Cfg::kNWG == 2) cutlass::arch::warpgroup_reg_dealloc<40>();
      if (threadIdx.x / 32 == 0 && elect_one_sync()) {
        Tensor mA = tma_a.get_tma_tensor(make_shape(p.M, p.K, p.L));
        Tensor mB = tma_b0.get_tma_tensor(make_shape(p.N, p.K, p.L));
        Tensor gA = local_tile(mA, make_shape(Int<BM>{}, Int<TILE_K>{}), make_coord(_, _, _))(_, _, m_blk, _, l);
        Tensor gB = local_tile(mB, make_shape(Int<BN>{}, Int<TILE_K>{}), make_coord(_, _, _))(_, _, n_blk, _, l);
        auto [tAgA, tAsA] = tma_partition(tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA), group_modes<0, 2>(gA));
        auto [tBgB, tBsB0] = tma_partition(tma_b0, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB0), group_modes<0, 2>(gB));
        auto [tBgB_, tBsB1] = tma_partition(tma_b1, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB1), group_modes<0, 2>(gB));
        int stage = 0, phase = 0;
        for (int kt = 0; kt < k_tiles; ++kt) {
          cutlass::arch::ClusterBarrier::wait(&empty[stage], phase ^ 1);
          cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[stage], Cfg::kStageBytes);
          copy(tma_a.with(full[stage]), tAgA(_, kt), tAsA(_, stage));
          copy(tma_b0.with(full[stage]), tBgB(_, kt), tBsB0(_, stage));
          if constexpr (kNB == 2) copy(tma_b1.with(full[stage]), tBgB(_, kt), tBsB1(_, stage));
          if (++stage == NSTAGE) { stage = 0; phase ^= 1; }
        }
      }
    } else {
      // Fallback: A by 2-byte gathers (k-permuted packets, see kperm), B by TMA from the
      // super-row view for the k-tiles kt < p.k_tma, element by element otherwise.
      if constexpr (Cfg::kNWG == 2 && FB_PRODUCER_REGS > 0) cutlass::arch::warpgroup_reg_dealloc<FB_PRODUCER_REGS>();
      const bf16* A = p.A + l * p.a_l;
      const int m0 = m_blk * BM, n0 = n_blk * BN;
      int stage = 0, phase = 0;
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int k0 = kt * TILE_K;
        const bool b_tma = kt < p.k_tma;
        cutlass::arch::ClusterBarrier::wait(&empty[stage], phase ^ 1);
        if (threadIdx.x == 0) {
          if (b_tma) {
            cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[stage], kNB * BN * TILE_K * 2);
#pragma unroll 1
            for (int b = 0; b < kNB; ++b) {
              const void* desc = (b == 0 ? tma_b0 : tma_b1).get_tma_descriptor();
#pragma unroll 1
              for (int a = 0; a < 8; ++a) {
#pragma unroll 1
                for (int nb = 0; nb < BN / 64; ++nb) {
                  bf16* dst = b == 0 ? &sB0(64 * nb, 8 * a, stage) : &sB1(64 * nb, 8 * a, stage);
                  SM90_TMA_LOAD_3D::copy(desc, &full[stage], uint64_t(TMA::CacheHintSm90::EVICT_NORMAL), dst,
                                         a * p.N + n0 + 64 * nb, k0 / 8, l);
                }
              }
            }
          } else {
            cutlass::arch::ClusterBarrier::arrive(&full[stage]);
          }
        }
        if (k0 + TILE_K <= p.K) produce_a<BM, true>(p, A, m0, k0, sA, stage);
        else                    produce_a<BM, false>(p, A, m0, k0, sA, stage);
        if (!b_tma) {
#pragma unroll 1
          for (int b = 0; b < kNB; ++b)
            produce_b_slow<BN, typename Cfg::SmemLayoutB>(p, (b == 0 ? p.B[0] : p.B[1]) + l * p.b_l, n0, k0,
                                                         smemB + b * cosize_v<typename Cfg::SmemLayoutB>, stage);
        }
        cutlass::arch::fence_view_async_shared();   // generic-proxy stores -> wgmma (async proxy)
        cutlass::arch::ClusterBarrier::arrive(&full[stage]);
        if (++stage == NSTAGE) { stage = 0; phase ^= 1; }
      }
    }
  } else {
    // ------------------------------- consumers -----------------------------------------
    if constexpr (Cfg::kNWG == 2) {
      if constexpr (kTMA) cutlass::arch::warpgroup_reg_alloc<232>();
      else if constexpr (FB_PRODUCER_REGS > 0)
        cutlass::arch::warpgroup_reg_alloc<(65536 - 128 * FB_PRODUCER_REGS) / 256 / 8 * 8>();
    }
    typename Cfg::TiledMma mma;
    auto thr = mma.get_thread_slice(threadIdx.x - 128);
    Tensor tCsA = thr.partition_A(sA);     // (MMA, MMA_M, MMA_K, P)
    Tensor tCsB0 = thr.partition_B(sB0);
    Tensor tCsB1 = thr.partition_B(sB1);
    Tensor tCrA = thr.make_fragment_A(tCsA);
    Tensor tCrB0 = thr.make_fragment_B(tCsB0);
    Tensor tCrB1 = thr.make_fragment_B(tCsB1);

    Tensor mC = make_tensor(make_gmem_ptr(p.C + l * p.c_l), make_shape(p.M, p.N), make_stride(int64_t(p.N), _1{}));
    Tensor gC = local_tile(mC, make_shape(Int<BM>{}, Int<BN>{}), make_coord(m_blk, n_blk));
    Tensor cC = local_tile(make_identity_tensor(make_shape(p.M, p.N)), make_shape(Int<BM>{}, Int<BN>{}),
                           make_coord(m_blk, n_blk));
    Tensor tCgC = thr.partition_C(gC);
    Tensor tCcC = thr.partition_C(cC);
    Tensor acc0 = thr.partition_fragment_C(gC);
    Tensor acc1 = thr.partition_fragment_C(gC);   // used only by the dual (silu_mul) epilogue
    clear(acc0);
    if constexpr (kNB == 2) clear(acc1);
    mma.accumulate_ = GMMA::ScaleOut::One;

    warpgroup_fence_operand(acc0);
    if constexpr (kNB == 2) warpgroup_fence_operand(acc1);
    int stage = 0, phase = 0, prev = -1;
    for (int kt = 0; kt < k_tiles; ++kt) {
      cutlass::arch::ClusterBarrier::wait(&full[stage], phase);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        gemm(mma, tCrA(_, _, kb, stage), tCrB0(_, _, kb, stage), acc0);
        if constexpr (kNB == 2) gemm(mma, tCrA(_, _, kb, stage), tCrB1(_, _, kb, stage), acc1);
      }
      warpgroup_commit_batch();
      warpgroup_wait<1>();                     // the batch of the previous stage has retired
      if (prev >= 0) cutlass::arch::ClusterBarrier::arrive(&empty[prev]);
      prev = stage;
      if (++stage == NSTAGE) { stage = 0; phase ^= 1; }
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc0);
    if constexpr (kNB == 2) warpgroup_fence_operand(acc1);

    // ------------------------------- epilogue ------------------------------------------
    // GMMA accumulators come in pairs of adjacent columns: values i, i+1 (i even) are
    // (m, n) and (m, n + 1).
    CUTE_UNROLL
    for (int i = 0; i < size(acc0); i += 2) {
      const int m = get<0>(tCcC(i));
      const int n = get<1>(tCcC(i));
      if (m >= p.M) continue;
      float v0 = acc0(i), v1 = acc0(i + 1);
      if constexpr (EPILOGUE == 1) {
        const float b0 = n < p.N ? float(p.bias[n]) : 0.f;
        const float b1 = n + 1 < p.N ? float(p.bias[n + 1]) : 0.f;
        v0 = gelu_erf(v0 + b0);
        v1 = gelu_erf(v1 + b1);
      } else if constexpr (EPILOGUE == 2) {
        v0 = silu(v0) * acc1(i);
        v1 = silu(v1) * acc1(i + 1);
      }
      if (p.c_vec && n + 1 < p.N) {
        __nv_bfloat162 pair = __floats2bfloat162_rn(v0, v1);
        *reinterpret_cast<__nv_bfloat162*>(&tCgC(i)) = pair;
      } else {
        if (n < p.N) tCgC(i) = bf16(v0);
        if (n + 1 < p.N) tCgC(i + 1) = bf16(v1);
      }
    }
  }
}

inline bool row_major_contiguous(const EvoTensor& t) {
  int64_t expect = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expect) return false;
    expect *= t.shape[i];
  }
  return true;
}

template <int BM, int BN, int NSTAGE, bool kTMA, class TmaA, class TmaB>
cudaError_t launch(Params const& p, TmaA const& ta, TmaB const& tb0, TmaB const& tb1, cudaStream_t stream) {
  using Cfg = Config<BM, BN, NSTAGE>;
  auto kernel = gemm_bf16_kernel<BM, BN, NSTAGE, kTMA, TmaA, TmaB>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  dim3 grid(unsigned(p.tiles_m * p.tiles_n), unsigned(p.L), 1);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, ta, tb0, tb1);
  return cudaGetLastError();
}

template <int BM, int BN, int NSTAGE>
cudaError_t launch_tma(Params p, cudaStream_t stream) {
  using Cfg = Config<BM, BN, NSTAGE>;
  const int64_t M = p.M, N = p.N, K = p.K;
  Tensor mA = make_tensor(make_gmem_ptr(p.A), make_shape(p.M, p.K, p.L), make_stride(K, _1{}, p.a_l));
  auto tma_a = make_tma_atom(SM90_TMA_LOAD{}, mA, typename Cfg::SmemLayoutA{}(_, _, 0),
                             make_shape(Int<BM>{}, Int<TILE_K>{}));
  Tensor mB0 = make_tensor(make_gmem_ptr(p.B[0]), make_shape(p.N, p.K, p.L), make_stride(_1{}, N, p.b_l));
  Tensor mB1 = make_tensor(make_gmem_ptr(p.B[kNB - 1]), make_shape(p.N, p.K, p.L), make_stride(_1{}, N, p.b_l));
  auto tma_b0 = make_tma_atom(SM90_TMA_LOAD{}, mB0, typename Cfg::SmemLayoutB{}(_, _, 0),
                              make_shape(Int<BN>{}, Int<TILE_K>{}));
  auto tma_b1 = make_tma_atom(SM90_TMA_LOAD{}, mB1, typename Cfg::SmemLayoutB{}(_, _, 0),
                              make_shape(Int<BN>{}, Int<TILE_K>{}));
  (void)M;
  p.tiles_m = int((p.M + BM - 1) / BM);
  p.tiles_n = int((p.N + BN - 1) / BN);
  return launch<BM, BN, NSTAGE, true>(p, tma_a, tma_b0, tma_b1, stream);
}

// Fallback launch. B by TMA needs a 16-byte aligned B (and a 16-byte batch stride); its
// "super-row" view is the 2-D tensor (x, y) = (8 N, K / 8) with row stride 8 N elements, in
// which B[k][n] sits at (x, y) = ((k % 8) * N + n, k / 8). Every box of a full k-tile reads
// inside B (the view covers rows < 8 * (K / 8)); columns past N read the next row's elements,
// which only reach output columns that are never stored.
template <int BM, int BN, int NSTAGE>
cudaError_t launch_fallback(Params p, cudaStream_t stream) {
  using Cfg = Config<BM, BN, NSTAGE>;
  const int64_t N = p.N, K = p.K;
  const uintptr_t bptr = reinterpret_cast<uintptr_t>(p.B[0]) | reinterpret_cast<uintptr_t>(p.B[1]);
  const bool b_tma = FB_TMA_B && (bptr & 15) == 0 && K >= TILE_K && (p.b_l % 8) == 0 && 8 * N < (int64_t(1) << 31);
  using SmemBox = decltype(GMMA::Layout_MN_SW128_Atom<bf16>{});   // 64 (n) x 8 (k-rows)
  auto make_b = [&](const bf16* ptr) {
    Tensor mB = make_tensor(make_gmem_ptr(ptr), make_shape(int(8 * N), int(b_tma ? K / 8 : 8), p.L),
                            make_stride(_1{}, 8 * N, p.b_l));
    return make_tma_atom(SM90_TMA_LOAD{}, mB, SmemBox{}, make_shape(_64{}, _8{}));
  };
  using TmaB = decltype(make_b(p.B[0]));
  TmaB tb0{}, tb1{};
  if (b_tma) {
    tb0 = make_b(p.B[0]);
    tb1 = make_b(p.B[kNB - 1]);
  }
  p.k_tma = b_tma ? int(K / TILE_K) : 0;
  p.tiles_m = int((p.M + BM - 1) / BM);
  p.tiles_n = int((N + BN - 1) / BN);
  (void)sizeof(Cfg);
  return launch<BM, BN, NSTAGE, false>(p, 0, tb0, tb1, stream);
}

}  // namespace evo_bf16

EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  using namespace evo_bf16;
  (void)scalars;
  (void)n_scalars;
  const int want_in = (EPILOGUE == 0) ? 2 : 3;
  if (n_in != want_in || n_out != 1) return cudaErrorInvalidValue;
  for (int i = 0; i < n_in; ++i)
    if (in[i].dtype != EVO_BF16 || !row_major_contiguous(in[i])) return cudaErrorInvalidValue;
  const EvoTensor& a = in[0];
  const EvoTensor& b = in[1];
  const EvoTensor& c = out[0];
  if (c.dtype != EVO_BF16 || !row_major_contiguous(c)) return cudaErrorInvalidValue;
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
  if (M == 0 || N == 0 || L == 0) return cudaSuccess;

  Params p;
  p.A = static_cast<const bf16*>(a.data);
  p.B[0] = static_cast<const bf16*>(b.data);
  p.B[1] = static_cast<const bf16*>(EPILOGUE == 2 ? in[2].data : b.data);
  p.bias = static_cast<const bf16*>(EPILOGUE == 1 ? in[2].data : nullptr);
  p.C = static_cast<bf16*>(c.data);
  p.M = int(M); p.N = int(N); p.K = int(K); p.L = int(L);
  p.a_l = (L > 1) ? M * K : 0;
  p.b_l = (L > 1) ? K * N : 0;
  p.c_l = M * N;
  p.k_tma = 0;
  p.c_vec = (N % 2 == 0) && ((reinterpret_cast<uintptr_t>(c.data) & 3) == 0);

  uintptr_t ptrs = reinterpret_cast<uintptr_t>(p.A) | reinterpret_cast<uintptr_t>(p.B[0]) |
                   reinterpret_cast<uintptr_t>(p.B[1]);
  if (ptrs & 1) return cudaErrorInvalidValue;
  const bool tma_ok = K > 0 && (ptrs & 15) == 0 && (K % 8 == 0) && (N % 8 == 0);
  if (tma_ok) return launch_tma<TILE_M, TILE_N, STAGES>(p, stream);
  return launch_fallback<TILE_M, FB_TILE_N, FB_STAGES>(p, stream);
}
