// gemm_f32_3xtf32.cu -- fp32 GEMM by error-compensated TF32 tensor-core maths (3xTF32).
//
// STATUS: NOT YET VALIDATED ON A GPU. Written in a session without device time. What has been
// verified (tests/test_gemm_3xtf32.py, CPU only): the rendered source passes the static policy;
// tunables and their #ifndef defaults agree and the defaults satisfy every @constraint; a real
// nvcc 13.0 build for sm_90a succeeds with ptxas reporting no spills; the PTX contains
// `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32` and `cvt.rna.tf32.f32`. What has NOT
// been verified: correctness against the reference, bitwise determinism and speed on a GPU.
// Validate with (see docs/kernels.md, "3xTF32 fp32 GEMM template"):
//   python -c "from tests.test_gemm_3xtf32 import KB01_3XTF32; from evo.tasks.seedspec import render; \
//              open('/tmp/kb01_3xtf32.cu','w').write(render(KB01_3XTF32))"
//   evo check /tmp/kb01_3xtf32.cu --task kb01_square
//
// Computes C = A @ B for A [M, K], B [K, N], C [M, N] (2-D, contiguous row-major, fp32, any
// M, N, K >= 0). Each fp32 operand x is split at the register level into
//   big   = tf32_rna(x)            (cvt.rna.tf32.f32: 10 explicit mantissa bits)
//   small = tf32_rna(x - big)      (the next ~11 bits; x - big is exact in fp32)
// and every k-step issues three TF32 tensor-core MMAs into ONE fp32 accumulator, in the order
// small*big, big*small, big*big (the small cross terms first, as CUTLASS's FastF32 operator
// does, so they are not swamped by the big product before they are added). The dropped
// small*small term is ~2^-22 relative, below fp32 rounding of the sum. Inputs with Inf/NaN
// give NaN where the reference may give Inf (x - big is NaN for x = Inf); the fp32 tasks use
// finite inputs.
//
// Structure: one CTA computes a BM x BN tile of C with WARPS_M x WARPS_N warps; the CuTe
// TiledMMA repeats the SM80_16x8x8_F32TF32TF32F32_TN atom over (BM, BN). Global -> shared by
// cp.async, STAGES deep, zero-filled outside the matrix: 16-byte copies when K % 4 == 0,
// N % 4 == 0 and A, B are 16-byte aligned, otherwise 4-byte copies (a second instantiation
// picked on the host). Shared memory holds raw fp32: A K-major with rows padded to BK + 4
// floats, B N-major with k-rows padded to BN + 8 floats; both paddings make the fragment
// loads (lane -> m = lane/4, k = lane%4 for A; n = lane/4, k = lane%4 for B) hit 32 distinct
// banks. Shared -> registers are scalar 32-bit loads per k-block of 8, followed by the
// big/small split and the three MMAs. Epilogue: predicated stores straight from the
// accumulators (8-byte stores of adjacent column pairs for full tiles when N is even).
// Grouped rasterisation (GROUP_M tile rows sweep N together) for L2 reuse.
//
// No allocation, no atomics, one launch on `stream`: bitwise deterministic by construction.
// ABI: evo_abi.h. Returns cudaErrorInvalidValue for inputs outside the contract above
// (not two inputs and one output, dtype not fp32, not 2-D, non-contiguous, shape mismatch,
// misaligned to 4 bytes, or dimensions beyond int32 / grid limits).
#include <cute/tensor.hpp>
#include "evo_abi.h"

// @evo:task-config

// @tunable BM = 128 in {64, 128}
// @tunable BN = 128 in {64, 128}
// @tunable BK = 32 in {16, 32}
// @tunable STAGES = 3 in {2, 3, 4}
// @tunable WARPS_M = 2 in {1, 2, 4}
// @tunable WARPS_N = 4 in {1, 2, 4}
// @tunable GROUP_M = 8 in {1, 4, 8, 16}
// @tunable MIN_BLOCKS = 1 in {1, 2}
// @constraint BM % (16 * WARPS_M) == 0 && BN % (8 * WARPS_N) == 0
// @constraint (BM * BN) / (32 * WARPS_M * WARPS_N) <= 128
// @constraint BM % ((32 * WARPS_M * WARPS_N) / (BK / 4)) == 0
// @constraint (32 * WARPS_M * WARPS_N) % (BN / 4) == 0 && BK % ((32 * WARPS_M * WARPS_N) / (BN / 4)) == 0
// @constraint STAGES * (BM * (BK + 4) + BK * (BN + 8)) * 4 <= 232448
// @constraint MIN_BLOCKS * STAGES * (BM * (BK + 4) + BK * (BN + 8)) * 4 <= 233472 && MIN_BLOCKS * 32 * WARPS_M * WARPS_N <= 2048
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
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif

namespace evo_3xtf32 {
using namespace cute;

constexpr int kThreads = 32 * WARPS_M * WARPS_N;
constexpr int kPadA = 4;   // floats per A row (K-major): 16B-aligned rows, conflict-free fragment loads
constexpr int kPadB = 8;   // floats per B k-row (N-major): same, for the B fragment pattern
constexpr int kSmemFloats = STAGES * (BM * (BK + kPadA) + BK * (BN + kPadB));

static_assert(BM % (16 * WARPS_M) == 0, "BM must be a multiple of 16 * WARPS_M");
static_assert(BN % (8 * WARPS_N) == 0, "BN must be a multiple of 8 * WARPS_N");
static_assert(BK % 8 == 0, "BK must be a multiple of the MMA k (8)");
static_assert(BM % (kThreads / (BK / 4)) == 0, "A copy: BM must be a multiple of threads / (BK / 4)");
static_assert(kThreads % (BN / 4) == 0 && BK % (kThreads / (BN / 4)) == 0, "B copy layout must tile (BN, BK)");
static_assert(STAGES >= 2, "the pipeline needs at least two stages");
static_assert(kSmemFloats * 4 <= 232448, "shared memory above 227 KB");

struct Params {
  const float* A;   // [M, K] row-major
  const float* B;   // [K, N] row-major
  float* C;         // [M, N] row-major
  int M, N, K;
  int tiles_m, tiles_n;
  int c_vec2;       // 1 when 8-byte stores of column pairs to C are legal
};

// fp32 -> tf32 bit pattern, round to nearest (ties away from zero), as the tensor core wants.
CUTE_DEVICE uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
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

// Global -> shared tiled copies. kVec: 16-byte cp.async of 4 consecutive floats along the
// contiguous mode (legal when that extent is a multiple of 4 and the base 16-byte aligned);
// otherwise one float per cp.async. Zero-fill (src-size 0) outside the matrix.
template <bool kVec>
struct Copies {
  using AtomA = cute::conditional_t<kVec, SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>,
                                   SM80_CP_ASYNC_CACHEALWAYS_ZFILL<uint32_t>>;
  static constexpr int kVal = kVec ? 4 : 1;
  // A tile (BM, BK), k contiguous: threads run along k first.
  CUTE_HOST_DEVICE static auto copy_a() {
    constexpr int TK = BK / kVal;
    return make_tiled_copy(Copy_Atom<AtomA, float>{},
                           Layout<Shape<Int<kThreads / TK>, Int<TK>>, Stride<Int<TK>, _1>>{},
                           Layout<Shape<_1, Int<kVal>>>{});
  }
  // B tile (BN, BK), n contiguous: threads run along n first.
  CUTE_HOST_DEVICE static auto copy_b() {
    constexpr int TN = (BN / kVal) < kThreads ? (BN / kVal) : kThreads;
    return make_tiled_copy(Copy_Atom<AtomA, float>{},
                           Layout<Shape<Int<TN>, Int<kThreads / TN>>>{},
                           Layout<Shape<Int<kVal>, _1>>{});
  }
};

// Layouts shared by the kernel and the host-side layout check in tests/test_gemm_3xtf32.py.
// A stages: (BM, BK, STAGES), k contiguous, rows padded to BK + kPadA floats.
CUTE_HOST_DEVICE constexpr auto smem_layout_a() {
  return make_layout(make_shape(Int<BM>{}, Int<BK>{}, Int<STAGES>{}),
                     make_stride(Int<BK + kPadA>{}, _1{}, Int<BM * (BK + kPadA)>{}));
}
// B stages: (BN, BK, STAGES), n contiguous, k-rows padded to BN + kPadB floats.
CUTE_HOST_DEVICE constexpr auto smem_layout_b() {
  return make_layout(make_shape(Int<BN>{}, Int<BK>{}, Int<STAGES>{}),
                     make_stride(_1{}, Int<BN + kPadB>{}, Int<BK * (BN + kPadB)>{}));
}
// WARPS_M x WARPS_N warps, each repeating the m16n8k8 TF32 atom over its share of (BM, BN).
CUTE_HOST_DEVICE auto make_mma() {
  return make_tiled_mma(MMA_Atom<SM80_16x8x8_F32TF32TF32F32_TN>{},
                        Layout<Shape<Int<WARPS_M>, Int<WARPS_N>, _1>>{});
}

template <bool kVec>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) gemm_3xtf32_kernel(Params p) {
  extern __shared__ __align__(128) float smem[];
  const int tid = threadIdx.x;

  // Grouped rasterisation: GROUP_M tile rows sweep the N tiles together (L2 reuse).
  const int tile = blockIdx.x;
  const int group_size = GROUP_M * p.tiles_n;
  const int first_m = (tile / group_size) * GROUP_M;
  const int gm = min(p.tiles_m - first_m, GROUP_M);
  const int m_blk = first_m + (tile % group_size) % gm;
  const int n_blk = (tile % group_size) / gm;

  // ---- global views -------------------------------------------------------------------
  Tensor mA = make_tensor(make_gmem_ptr(p.A), make_shape(p.M, p.K), make_stride(p.K, Int<1>{}));
  Tensor mB = make_tensor(make_gmem_ptr(p.B), make_shape(p.N, p.K), make_stride(Int<1>{}, p.N));
  Tensor mC = make_tensor(make_gmem_ptr(p.C), make_shape(p.M, p.N), make_stride(p.N, Int<1>{}));
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
  auto sA_layout = smem_layout_a();
  auto sB_layout = smem_layout_b();
  Tensor sA = make_tensor(make_smem_ptr(smem), sA_layout);
  Tensor sB = make_tensor(make_smem_ptr(smem + cosize(sA_layout)), sB_layout);

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
  using CpAtom = typename Copies<kVec>::AtomA;

  // In vector mode a 4-float chunk starts at a multiple of 4 along its contiguous mode and
  // that extent is a multiple of 4, so checking the chunk's first element covers all four.
  auto load_tile = [&](int kt, int stage) {
    CUTE_UNROLL
    for (int i = 0; i < size<1>(tAsA); ++i) {
      CUTE_UNROLL
      for (int j = 0; j < size<2>(tAsA); ++j) {
        const bool ok = elem_less(tAcA(0, i, j, kt), make_coord(p.M, p.K));
        copy(Copy_Atom<CpAtom, float>{}.with(ok), tAgA(_, i, j, kt), tAsA(_, i, j, stage));
      }
    }
    CUTE_UNROLL
    for (int i = 0; i < size<1>(tBsB); ++i) {
      CUTE_UNROLL
      for (int j = 0; j < size<2>(tBsB); ++j) {
        const bool ok = elem_less(tBcB(0, i, j, kt), make_coord(p.N, p.K));
        copy(Copy_Atom<CpAtom, float>{}.with(ok), tBgB(_, i, j, kt), tBsB(_, i, j, stage));
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

  // One k-block (8) of operands: fp32 staging, then tf32 big/small fragments.
  Tensor fA = make_tensor<float>(shape(tCsA(_, _, 0, 0)));   // (MMA, MMA_M)
  Tensor fB = make_tensor<float>(shape(tCsB(_, _, 0, 0)));   // (MMA, MMA_N)
  Tensor aBig = make_tensor<cutlass::tfloat32_t>(shape(fA));
  Tensor aSmall = make_tensor<cutlass::tfloat32_t>(shape(fA));
  Tensor bBig = make_tensor<cutlass::tfloat32_t>(shape(fB));
  Tensor bSmall = make_tensor<cutlass::tfloat32_t>(shape(fB));
  constexpr int kBlocks = BK / 8;
  static_assert(decltype(size<2>(tCsA))::value == kBlocks, "MMA_K must be BK / 8");

  // ---- main loop: STAGES-deep cp.async pipeline ------------------------------------------
  const int nk = (p.K + BK - 1) / BK;
  CUTE_UNROLL
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nk) load_tile(s, s);
    cp_async_fence();
  }
  CUTE_NO_UNROLL
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();   // stage kt landed for every thread; stage kt-1 is free to overwrite
    const int nxt = kt + STAGES - 1;
    if (nxt < nk) load_tile(nxt, nxt % STAGES);
    cp_async_fence();
    const int stage = kt % STAGES;
    CUTE_UNROLL
    for (int kb = 0; kb < kBlocks; ++kb) {
      copy(tCsA(_, _, kb, stage), fA);
      copy(tCsB(_, _, kb, stage), fB);
      split_fragment(fA, aBig, aSmall);
      split_fragment(fB, bBig, bSmall);
      gemm(mma, aSmall, bBig, acc);   // small cross terms first ...
      gemm(mma, aBig, bSmall, acc);
      gemm(mma, aBig, bBig, acc);     // ... then the dominant product
    }
  }
  cp_async_wait<0>();

  // ---- epilogue ---------------------------------------------------------------------------
  // Accumulator values (v0, v1) of an atom are columns (n, n + 1) of one row (SM80_16x8_Row).
  const int m0 = m_blk * BM, n0 = n_blk * BN;
  if (p.c_vec2 && m0 + BM <= p.M && n0 + BN <= p.N) {
    CUTE_UNROLL
    for (int mi = 0; mi < size<1>(acc); ++mi) {
      CUTE_UNROLL
      for (int ni = 0; ni < size<2>(acc); ++ni) {
        *reinterpret_cast<float2*>(&tCgC(0, mi, ni)) = make_float2(acc(0, mi, ni), acc(1, mi, ni));
        *reinterpret_cast<float2*>(&tCgC(2, mi, ni)) = make_float2(acc(2, mi, ni), acc(3, mi, ni));
      }
    }
  } else {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) {
      if (elem_less(tCcC(i), make_coord(p.M, p.N))) tCgC(i) = acc(i);
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

template <bool kVec>
cudaError_t launch(const Params& p, cudaStream_t stream) {
  const size_t smem = size_t(kSmemFloats) * sizeof(float);
  cudaError_t err = cudaFuncSetAttribute(gemm_3xtf32_kernel<kVec>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(smem));
  if (err != cudaSuccess) return err;
  const unsigned tiles = unsigned(p.tiles_m) * unsigned(p.tiles_n);
  gemm_3xtf32_kernel<kVec><<<dim3(tiles, 1, 1), dim3(kThreads, 1, 1), smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace evo_3xtf32

EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  using namespace evo_3xtf32;
  (void)scalars;
  (void)n_scalars;
  if (in == nullptr || out == nullptr || n_in != 2 || n_out != 1) return cudaErrorInvalidValue;
  const EvoTensor& a = in[0];
  const EvoTensor& b = in[1];
  const EvoTensor& c = out[0];
  if (a.dtype != EVO_F32 || b.dtype != EVO_F32 || c.dtype != EVO_F32) return cudaErrorInvalidValue;
  if (a.ndim != 2 || b.ndim != 2 || c.ndim != 2) return cudaErrorInvalidValue;
  if (!row_major_contiguous(a) || !row_major_contiguous(b) || !row_major_contiguous(c))
    return cudaErrorInvalidValue;
  const uintptr_t pa = reinterpret_cast<uintptr_t>(a.data), pb = reinterpret_cast<uintptr_t>(b.data),
                  pc = reinterpret_cast<uintptr_t>(c.data);
  if ((pa | pb | pc) & 3) return cudaErrorInvalidValue;

  const int64_t M = a.shape[0], K = a.shape[1], N = b.shape[1];
  if (b.shape[0] != K || c.shape[0] != M || c.shape[1] != N) return cudaErrorInvalidValue;
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX) return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;   // K == 0 runs: no k-tiles, the epilogue writes zeros

  Params p;
  p.A = static_cast<const float*>(a.data);
  p.B = static_cast<const float*>(b.data);
  p.C = static_cast<float*>(c.data);
  p.M = int(M); p.N = int(N); p.K = int(K);
  p.tiles_m = int((M + BM - 1) / BM);
  p.tiles_n = int((N + BN - 1) / BN);
  p.c_vec2 = (N % 2 == 0) && ((pc & 7) == 0);
  if (int64_t(p.tiles_m) * p.tiles_n > INT32_MAX) return cudaErrorInvalidValue;

  const bool vec = (K % 4 == 0) && (N % 4 == 0) && ((pa & 15) == 0) && ((pb & 15) == 0);
  return vec ? launch<true>(p, stream) : launch<false>(p, stream);
}
