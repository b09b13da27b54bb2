// gemm_f32.cu -- strict-fp32 GEMM seed template (CuTe SIMT FFMA, cp.async multistage pipeline).
//
// Computes, per batch l:  C[l] = epilogue(op(A[l]) @ op(B[l]))  in plain fp32 FFMA arithmetic
// (no TF32), so the result matches an fp64 reference to fp32 accuracy.
//
// Inputs (all contiguous row-major, dtype f32), selected by the task-config defines below:
//   TRANS_A = 0: A is [..., M, K]  (leading dims of a 3+-D A fold into M when B is 2-D)
//   TRANS_A = 1: A is [K, M] or [L, K, M]          (the task computes A.T @ B)
//   TRANS_B = 0: B is [K, N] or [L, K, N]
//   TRANS_B = 1: B is [N, K] or [L, N, K]          (the task computes A @ B.T)
//   A 3-D with a 3-D B is a batched product (bmm) over the leading dim L.
//   EPILOGUE = 0 plain, 1 triu (C[m][n] = 0 for n < m), 2 tril (C[m][n] = 0 for n > m).
//   Tiles that lie wholly in the zeroed triangle skip the main loop and only write zeros.
//
// Structure: one CTA computes a BM x BN tile of C. Global -> shared with 4-byte cp.async
// (zero-filled outside the matrix, so any M/N/K and any 4-byte alignment work), STAGES
// deep; shared -> registers with 128-bit loads; a CuTe UniversalFMA tiled MMA with a
// THR_M x THR_N thread grid in which every thread owns 4-wide contiguous runs along M and N
// (permuted tiling), so each k step is 4 LDS.128 per 64 FFMA at the defaults.
// SPLIT_K > 1 splits K over a thread-block cluster of SPLIT_K CTAs; partial tiles are summed
// through distributed shared memory in a fixed rank order (deterministic, no workspace, no
// atomics). That is what makes small-M/N, huge-K shapes (256 x 524288 x 256) fill the GPU.
//
// ABI: evo_abi.h. Returns cudaErrorInvalidValue for inputs outside the contract above.
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

// @tunable BM = 128 in {32, 64, 128, 256}
// @tunable BN = 128 in {32, 64, 128, 256}
// @tunable BK = 8 in {4, 8, 16, 32}
// @tunable STAGES = 4 in {2, 3, 4, 5, 6}
// @tunable THR_M = 16 in {4, 8, 16, 32}
// @tunable THR_N = 16 in {4, 8, 16, 32}
// @tunable SPLIT_K = 1 in {1, 2, 4, 8}
// @tunable GROUP_M = 8 in {1, 4, 8, 16}
// @tunable MIN_BLOCKS = 1 in {1, 2, 3, 4}
// @constraint BM % (4 * THR_M) == 0 && BN % (4 * THR_N) == 0
// @constraint THR_M * THR_N >= 64 && THR_M * THR_N <= 1024
// @constraint (BM / THR_M) * (BN / THR_N) <= 128
// @constraint (THR_M * THR_N) % BK == 0 && BM % (THR_M * THR_N / BK) == 0 && BN % (THR_M * THR_N / BK) == 0
// @constraint (BM % (THR_M * THR_N) == 0) || ((THR_M * THR_N) % BM == 0 && BK % ((THR_M * THR_N) / BM) == 0)
// @constraint (BN % (THR_M * THR_N) == 0) || ((THR_M * THR_N) % BN == 0 && BK % ((THR_M * THR_N) / BN) == 0)
// @constraint STAGES * BK * (BM + BN + 8) * 4 <= 232448 && BM * BN * 4 <= 232448
// @constraint BM % SPLIT_K == 0
// @constraint THR_M * THR_N * MIN_BLOCKS <= 2048
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 8
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef THR_M
#define THR_M 16
#endif
#ifndef THR_N
#define THR_N 16
#endif
#ifndef SPLIT_K
#define SPLIT_K 1
#endif
#ifndef GROUP_M
#define GROUP_M 8
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif

namespace evo_f32 {
using namespace cute;

constexpr int kThreads = THR_M * THR_N;
constexpr int kPad = 4;  // floats of padding per smem column: keeps 16B alignment, spreads banks
static_assert(BM % (4 * THR_M) == 0 && BN % (4 * THR_N) == 0, "BM/BN must be multiples of 4*THR");
static_assert(kThreads % BK == 0, "threads must be a multiple of BK");
static_assert(BM % SPLIT_K == 0, "BM must be a multiple of SPLIT_K");
static_assert(SPLIT_K == 1 || SPLIT_K == 2 || SPLIT_K == 4 || SPLIT_K == 8, "SPLIT_K in {1,2,4,8}");

struct Params {
  const float* A;
  const float* B;
  float* C;
  int M, N, K;
  int64_t a_m, a_k, a_l;   // A viewed as (M, K) per batch
  int64_t b_n, b_k, b_l;   // B viewed as (N, K) per batch
  int64_t c_m, c_l;        // C is (M, N) row-major per batch
  int tiles_m, tiles_n;
  int c_vec;               // 1 when 16-byte vector stores to C are legal
};

// Thread layout of the global->shared copy for an operand whose tile is (X, BK):
// threads run along whichever mode is contiguous in global memory (coalescing).
template <bool kContiguous, int X>
CUTE_HOST_DEVICE constexpr auto copy_thr_layout() {
  if constexpr (kContiguous) {   // k contiguous in gmem: k fastest
    return Layout<Shape<Int<kThreads / BK>, Int<BK>>, Stride<Int<BK>, _1>>{};
  } else {                       // x contiguous in gmem: x fastest
    constexpr int TX = X < kThreads ? X : kThreads;
    return Layout<Shape<Int<TX>, Int<kThreads / TX>>>{};
  }
}

CUTE_DEVICE float dsmem_load(const float* local, uint32_t rank) {
  uint32_t laddr = cute::cast_smem_ptr_to_uint(local);
  uint32_t raddr;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(raddr) : "r"(laddr), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(raddr) : "memory");
  return v;
}

// True when every element of tile (m0.., n0..) is in the zeroed triangle of the epilogue.
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

__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) gemm_f32_kernel(Params p) {
  extern __shared__ __align__(128) float smem[];
  const int tid = threadIdx.x;
  const int l = blockIdx.y;
  const int tile = blockIdx.x / SPLIT_K;
  const int krank = blockIdx.x % SPLIT_K;   // == rank in the (SPLIT_K,1,1) cluster

  // Grouped rasterisation: GROUP_M tile rows sweep the N tiles together (L2 reuse).
  const int group_size = GROUP_M * p.tiles_n;
  const int first_m = (tile / group_size) * GROUP_M;
  const int gm = min(p.tiles_m - first_m, GROUP_M);
  const int m_blk = first_m + (tile % group_size) % gm;
  const int n_blk = (tile % group_size) / gm;
  const int m0 = m_blk * BM, n0 = n_blk * BN;

  Tensor mC = make_tensor(make_gmem_ptr(p.C + l * p.c_l), make_shape(p.M, p.N), make_stride(p.c_m, Int<1>{}));
  Tensor gC = local_tile(mC, make_shape(Int<BM>{}, Int<BN>{}), make_coord(m_blk, n_blk));
  Tensor cC = local_tile(make_identity_tensor(make_shape(p.M, p.N)), make_shape(Int<BM>{}, Int<BN>{}),
                         make_coord(m_blk, n_blk));

  if (tile_is_zero(m0, n0)) {            // same branch for every CTA of a cluster
    if (krank == 0) {
      for (int i = tid; i < BM * BN; i += kThreads) {
        int r = i / BN, c = i % BN;
        if (m0 + r < p.M && n0 + c < p.N) gC(r, c) = 0.f;
      }
    }
    return;
  }

  // ---- operands -----------------------------------------------------------------------
  Tensor mA = make_tensor(make_gmem_ptr(p.A + l * p.a_l), make_shape(p.M, p.K), make_stride(p.a_m, p.a_k));
  Tensor mB = make_tensor(make_gmem_ptr(p.B + l * p.b_l), make_shape(p.N, p.K), make_stride(p.b_n, p.b_k));
  auto tileA = make_shape(Int<BM>{}, Int<BK>{});
  auto tileB = make_shape(Int<BN>{}, Int<BK>{});
  Tensor gA = local_tile(mA, tileA, make_coord(m_blk, _));   // (BM, BK, k)
  Tensor gB = local_tile(mB, tileB, make_coord(n_blk, _));   // (BN, BK, k)
  Tensor cA = local_tile(make_identity_tensor(make_shape(p.M, p.K)), tileA, make_coord(m_blk, _));
  Tensor cB = local_tile(make_identity_tensor(make_shape(p.N, p.K)), tileB, make_coord(n_blk, _));

  // smem: M-major (resp. N-major) columns padded by kPad floats.
  auto sA_layout = make_layout(make_shape(Int<BM>{}, Int<BK>{}, Int<STAGES>{}),
                               make_stride(_1{}, Int<BM + kPad>{}, Int<(BM + kPad) * BK>{}));
  auto sB_layout = make_layout(make_shape(Int<BN>{}, Int<BK>{}, Int<STAGES>{}),
                               make_stride(_1{}, Int<BN + kPad>{}, Int<(BN + kPad) * BK>{}));
  Tensor sA = make_tensor(make_smem_ptr(smem), sA_layout);
  Tensor sB = make_tensor(make_smem_ptr(smem + cosize(sA_layout)), sB_layout);

  using CpAtom = Copy_Atom<SM80_CP_ASYNC_CACHEALWAYS_ZFILL<float>, float>;
  auto copyA = make_tiled_copy(CpAtom{}, copy_thr_layout<TRANS_A == 0, BM>(), Layout<Shape<_1, _1>>{});
  auto copyB = make_tiled_copy(CpAtom{}, copy_thr_layout<TRANS_B == 1, BN>(), Layout<Shape<_1, _1>>{});
  auto thr_cA = copyA.get_slice(tid);
  auto thr_cB = copyB.get_slice(tid);
  Tensor tAgA = thr_cA.partition_S(gA);   // (CPY, CPY_M, CPY_K, k)
  Tensor tAcA = thr_cA.partition_S(cA);
  Tensor tAsA = thr_cA.partition_D(sA);   // (CPY, CPY_M, CPY_K, PIPE)
  Tensor tBgB = thr_cB.partition_S(gB);
  Tensor tBcB = thr_cB.partition_S(cB);
  Tensor tBsB = thr_cB.partition_D(sB);

  auto load_tile = [&](int kt, int stage) {
    CUTE_UNROLL
    for (int i = 0; i < size<1>(tAsA); ++i) {
      CUTE_UNROLL
      for (int j = 0; j < size<2>(tAsA); ++j) {
        bool ok = elem_less(tAcA(0, i, j, kt), make_coord(p.M, p.K));
        copy(CpAtom{}.with(ok), tAgA(_, i, j, kt), tAsA(_, i, j, stage));
      }
    }
    CUTE_UNROLL
    for (int i = 0; i < size<1>(tBsB); ++i) {
      CUTE_UNROLL
      for (int j = 0; j < size<2>(tBsB); ++j) {
        bool ok = elem_less(tBcB(0, i, j, kt), make_coord(p.N, p.K));
        copy(CpAtom{}.with(ok), tBgB(_, i, j, kt), tBsB(_, i, j, stage));
      }
    }
  };

  // ---- MMA: THR_M x THR_N threads (N fastest), each owning 4-wide runs along M and N -----
  using PermM = Layout<Shape<Int<THR_M>, _4>, Stride<_4, _1>>;
  using PermN = Layout<Shape<Int<THR_N>, _4>, Stride<_4, _1>>;
  auto mma = make_tiled_mma(UniversalFMA<float, float, float, float>{},
                            Layout<Shape<Int<THR_M>, Int<THR_N>, _1>, Stride<Int<THR_N>, _1, _0>>{},
                            Tile<PermM, PermN, _1>{});
  auto thr_mma = mma.get_slice(tid);
  Tensor tCsA = thr_mma.partition_A(sA);             // (MMA, MMA_M, MMA_K, PIPE)
  Tensor tCsB = thr_mma.partition_B(sB);             // (MMA, MMA_N, MMA_K, PIPE)
  Tensor tCrA = thr_mma.partition_fragment_A(sA(_, _, 0));   // (MMA, MMA_M, MMA_K)
  Tensor tCrB = thr_mma.partition_fragment_B(sB(_, _, 0));
  Tensor tCgC = thr_mma.partition_C(gC);             // (MMA, MMA_M, MMA_N)
  Tensor tCcC = thr_mma.partition_C(cC);
  Tensor acc = thr_mma.make_fragment_C(tCgC);        // (MMA, MMA_M, MMA_N); MMA_N = (4, R)
  clear(acc);

  // ---- K range of this CTA (split-K rank) -----------------------------------------------
  const int k_tiles = (p.K + BK - 1) / BK;
  const int per = (k_tiles + SPLIT_K - 1) / SPLIT_K;
  const int kt_begin = min(krank * per, k_tiles);
  const int kt_end = min(kt_begin + per, k_tiles);
  const int nk = kt_end - kt_begin;

  CUTE_UNROLL
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nk) load_tile(kt_begin + s, s);
    cp_async_fence();
  }
  CUTE_NO_UNROLL
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();   // stage kt landed for all threads; stage kt-1 is free to overwrite
    const int nxt = kt + STAGES - 1;
    if (nxt < nk) load_tile(kt_begin + nxt, nxt % STAGES);
    cp_async_fence();
    const int stage = kt % STAGES;
    CUTE_UNROLL
    for (int kb = 0; kb < BK; ++kb) {
      copy(AutoVectorizingCopyWithAssumedAlignment<128>{}, tCsA(_, _, kb, stage), tCrA(_, _, kb));
      copy(AutoVectorizingCopyWithAssumedAlignment<128>{}, tCsB(_, _, kb, stage), tCrB(_, _, kb));
      gemm(mma, tCrA(_, _, kb), tCrB(_, _, kb), acc);
    }
  }
  cp_async_wait<0>();

  // ---- epilogue -------------------------------------------------------------------------
  if constexpr (SPLIT_K == 1) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) {
      if (!keep(get<0>(tCcC(i)), get<1>(tCcC(i)))) acc(i) = 0.f;
    }
    if (p.c_vec && m0 + BM <= p.M && n0 + BN <= p.N) {
      // Each thread's N values come in runs of 4 adjacent columns: one 16-byte store each.
      CUTE_UNROLL
      for (int mi = 0; mi < size<1>(acc); ++mi) {
        CUTE_UNROLL
        for (int nj = 0; nj < size<2>(acc); nj += 4) {   // colex: index nj+v is run nj/4, value v
          float4 v = make_float4(acc(0, mi, nj), acc(0, mi, nj + 1), acc(0, mi, nj + 2), acc(0, mi, nj + 3));
          *reinterpret_cast<float4*>(&tCgC(0, mi, nj)) = v;
        }
      }
    } else {
      CUTE_UNROLL
      for (int i = 0; i < size(acc); ++i) {
        if (elem_less(tCcC(i), make_coord(p.M, p.N))) tCgC(i) = acc(i);
      }
    }
  } else {
    // Partial tiles -> own smem, then CTA `krank` sums rows [rank*BM/S, (rank+1)*BM/S) of all
    // SPLIT_K partials in rank order through DSMEM.
    __syncthreads();
    Tensor red = make_tensor(make_smem_ptr(smem), make_layout(make_shape(Int<BM>{}, Int<BN>{}), LayoutRight{}));
    Tensor tCred = thr_mma.partition_C(red);
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) tCred(i) = acc(i);
    cute::cluster_sync();
    constexpr int rows = BM / SPLIT_K;
    for (int i = tid; i < rows * BN; i += kThreads) {
      const int r = krank * rows + i / BN, c = i % BN;
      float s = 0.f;
      CUTE_UNROLL
      for (int q = 0; q < SPLIT_K; ++q) s += dsmem_load(&red(r, c), q);
      const int m = m0 + r, n = n0 + c;
      if (m < p.M && n < p.N) gC(r, c) = keep(m, n) ? s : 0.f;
    }
    cute::cluster_sync();   // keep our smem alive until every peer has read it
  }
}

}  // namespace evo_f32

EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  using namespace evo_f32;
  (void)scalars;
  (void)n_scalars;
  if (n_in != 2 || n_out != 1) return cudaErrorInvalidValue;
  const EvoTensor& a = in[0];
  const EvoTensor& b = in[1];
  const EvoTensor& c = out[0];
  if (a.dtype != EVO_F32 || b.dtype != EVO_F32 || c.dtype != EVO_F32) return cudaErrorInvalidValue;
  if (a.ndim < 2 || b.ndim < 2 || b.ndim > 3 || c.ndim < 2) return cudaErrorInvalidValue;
  if (!evo_is_contiguous(a) || !evo_is_contiguous(b) || !evo_is_contiguous(c))
    return cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(a.data) | reinterpret_cast<uintptr_t>(b.data) |
       reinterpret_cast<uintptr_t>(c.data)) & 3)
    return cudaErrorInvalidValue;

  int64_t L = 1, M, K, N, Kb;
  if (b.ndim == 3) {                      // bmm: A [L, ., .], B [L, ., .]
    if (a.ndim != 3 || a.shape[0] != b.shape[0]) return cudaErrorInvalidValue;
    L = a.shape[0];
  } else if (a.ndim > 2 && TRANS_A) {
    return cudaErrorInvalidValue;         // folding leading dims needs M-rows of A
  }
  const int64_t a0 = a.shape[a.ndim - 2], a1 = a.shape[a.ndim - 1];
  if (TRANS_A) { K = a0; M = a1; }
  else { K = a1; M = (b.ndim == 3) ? a0 : evo_numel(a) / (a1 > 0 ? a1 : 1); }
  const int64_t b0 = b.shape[b.ndim - 2], b1 = b.shape[b.ndim - 1];
  if (TRANS_B) { N = b0; Kb = b1; } else { Kb = b0; N = b1; }
  if (Kb != K) return cudaErrorInvalidValue;
  if (c.shape[c.ndim - 1] != N || evo_numel(c) != L * M * N) return cudaErrorInvalidValue;
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || L > 65535) return cudaErrorInvalidValue;
  if (M == 0 || N == 0 || L == 0) return cudaSuccess;

  Params p;
  p.A = static_cast<const float*>(a.data);
  p.B = static_cast<const float*>(b.data);
  p.C = static_cast<float*>(c.data);
  p.M = int(M); p.N = int(N); p.K = int(K);
  if (TRANS_A) { p.a_m = 1; p.a_k = M; } else { p.a_m = K; p.a_k = 1; }
  p.a_l = M * K;
  if (TRANS_B) { p.b_n = K; p.b_k = 1; } else { p.b_n = 1; p.b_k = N; }
  p.b_l = K * N;
  p.c_m = N; p.c_l = M * N;
  p.tiles_m = int((M + BM - 1) / BM);
  p.tiles_n = int((N + BN - 1) / BN);
  p.c_vec = (N % 4 == 0) && ((reinterpret_cast<uintptr_t>(c.data) & 15) == 0);
  const int64_t tiles = int64_t(p.tiles_m) * p.tiles_n * SPLIT_K;
  if (tiles > INT32_MAX) return cudaErrorInvalidValue;

  size_t pipe = size_t(STAGES) * BK * (BM + kPad + BN + kPad) * sizeof(float);
  size_t red = (SPLIT_K > 1) ? size_t(BM) * BN * sizeof(float) : 0;
  size_t smem = pipe > red ? pipe : red;
  cudaError_t err = cudaFuncSetAttribute(gemm_f32_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err != cudaSuccess) return err;

  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = evo_launch_config(dim3(unsigned(tiles), unsigned(L), 1), dim3(kThreads, 1, 1), smem, stream,
                                             SPLIT_K, &attr);
  err = cudaLaunchKernelEx(&cfg, gemm_f32_kernel, p);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}
