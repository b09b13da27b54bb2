// matvec.cu -- seed template for out[M, 1] = A[M, K] @ b[K, 1] (fp32, memory-bound).
//
// Inputs: (A[M, K], b[K, 1] or b[K]); output [M, 1] (or [M]). A is streamed once from DRAM
// (it dominates the traffic: 8 GB at the benchmark shape); b is small enough to stay in L2
// and is re-read by every CTA.
//
// Structure: one CTA per ROWS rows. Each thread walks K in VEC-element (128-bit) vectors
// with stride BLOCK, UNROLL vectors per row per step, all loads of a step in flight before
// the FMAs; a b vector is loaded once per step and used for all ROWS rows. Each thread keeps
// UNROLL * VEC sequential partial sums per row, added pairwise; the CTA then reduces them with a
// fixed shuffle tree and a fixed shared-memory pass, so the result is bitwise deterministic
// (no atomics, no workspace). K % VEC != 0 or unaligned pointers use the VEC = 1 instantiation.
#include <cute/tensor.hpp>
#include <cuda_runtime.h>
#include "evo_abi.h"

// @evo:task-config

// @tunable BLOCK = 256 in {128, 256, 512, 1024}
// @tunable VEC = 4 in {1, 2, 4}
// @tunable UNROLL = 4 in {1, 2, 4, 8}
// @tunable ROWS = 2 in {1, 2, 4}
// @constraint UNROLL * ROWS * VEC <= 64
#ifndef BLOCK
#define BLOCK 256
#endif
#ifndef VEC
#define VEC 4
#endif
#ifndef UNROLL
#define UNROLL 4
#endif
#ifndef ROWS
#define ROWS 2
#endif

namespace evo_seed {
using namespace cute;
using T = float;
static_assert(BLOCK % 32 == 0 && BLOCK <= 1024, "BLOCK must be a multiple of 32, at most 1024");
constexpr int kWarps = BLOCK / 32;

template <int V>
using Vec = cute::array_aligned<T, V, V * sizeof(T)>;

template <int V>
__global__ void __launch_bounds__(BLOCK) matvec_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                                       T* __restrict__ y, int64_t m, int64_t k) {
  __shared__ float smem[ROWS][kWarps];
  const int64_t kv = k / V;
  const int64_t row0 = int64_t(blockIdx.x) * ROWS;
  // A as [M, K/V] vectors (rows past M are clamped to the last row and never stored).
  Tensor gA = make_tensor(make_gmem_ptr(reinterpret_cast<const Vec<V>*>(a)), make_shape(m, kv),
                          make_stride(kv, Int<1>{}));
  Tensor gB = make_tensor(make_gmem_ptr(reinterpret_cast<const Vec<V>*>(b)), make_shape(kv));
  int64_t rows[ROWS];
  CUTE_UNROLL
  for (int r = 0; r < ROWS; ++r) rows[r] = row0 + r < m ? row0 + r : m - 1;

  // UNROLL independent partial sums per row: more FMAs in flight and shorter sequential
  // chains (smaller rounding error over K ~ 1e6); combined in a fixed order below.
  // Each partial sum is Kahan-compensated (acc + cmp): over K ~ 1e6 the plain fp32 running
  // sums lost ~2x more than cuBLAS; compensation costs 3 adds per FMA, far under the
  // arithmetic the memory time leaves free.
  constexpr int NACC = UNROLL * V;
  float acc[ROWS][NACC], cmp[ROWS][NACC];
  CUTE_UNROLL
  for (int r = 0; r < ROWS; ++r)
    CUTE_UNROLL
    for (int u = 0; u < NACC; ++u) acc[r][u] = cmp[r][u] = 0.f;
  auto kahan_fma = [](float& sum, float& c, float x, float y) {
    const float t_in = fmaf(x, y, -c);  // product minus the carried error, one rounding
    const float t = sum + t_in;
    c = (t - sum) - t_in;
    sum = t;
  };

  constexpr int STEP = BLOCK * UNROLL;
  int64_t base = 0;
  for (; base + STEP <= kv; base += STEP) {  // full steps: no predicates
    Vec<V> bv[UNROLL];
    Vec<V> av[ROWS][UNROLL];
    CUTE_UNROLL
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t c = base + threadIdx.x + u * BLOCK;
      bv[u] = gB(c);
      CUTE_UNROLL
      for (int r = 0; r < ROWS; ++r) av[r][u] = gA(rows[r], c);
    }
    CUTE_UNROLL
    for (int u = 0; u < UNROLL; ++u)
      CUTE_UNROLL
      for (int r = 0; r < ROWS; ++r)
        CUTE_UNROLL
        for (int e = 0; e < V; ++e) kahan_fma(acc[r][u * V + e], cmp[r][u * V + e], av[r][u][e], bv[u][e]);
  }
  for (int64_t c = base + threadIdx.x; c < kv; c += BLOCK) {  // last partial step
    const Vec<V> bv = gB(c);
    CUTE_UNROLL
    for (int r = 0; r < ROWS; ++r) {
      const Vec<V> av = gA(rows[r], c);
      CUTE_UNROLL
      for (int e = 0; e < V; ++e) kahan_fma(acc[r][e], cmp[r][e], av[e], bv[e]);
    }
  }
  for (int64_t c = kv * V + threadIdx.x; c < k; c += BLOCK) {  // K % V scalar tail
    CUTE_UNROLL
    for (int r = 0; r < ROWS; ++r) kahan_fma(acc[r][0], cmp[r][0], a[rows[r] * k + c], b[c]);
  }

  // Deterministic CTA reduction: fixed xor-shuffle tree per warp, then warp 0 over warps.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  CUTE_UNROLL
  for (int r = 0; r < ROWS; ++r) {
    CUTE_UNROLL
    for (int u = 0; u < NACC; ++u) acc[r][u] -= cmp[r][u];
    CUTE_UNROLL
    for (int step = 1; step < NACC; step *= 2)  // pairwise over the partial sums
      CUTE_UNROLL
      for (int u = 0; u + step < NACC; u += 2 * step) acc[r][u] += acc[r][u + step];
    float v = acc[r][0];
    CUTE_UNROLL
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) smem[r][warp] = v;
  }
  __syncthreads();
  if (warp == 0) {
    CUTE_UNROLL
    for (int r = 0; r < ROWS; ++r) {
      float v = lane < kWarps ? smem[r][lane] : 0.f;
      CUTE_UNROLL
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0 && row0 + r < m) y[row0 + r] = v;
    }
  }
}

}  // namespace evo_seed

EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  using namespace evo_seed;
  (void)scalars;
  (void)n_scalars;
  if (n_in != 2 || n_out != 1) return cudaErrorInvalidValue;
  const EvoTensor& at = in[0];
  const EvoTensor& bt = in[1];
  const EvoTensor& yt = out[0];
  if (at.dtype != EVO_F32 || bt.dtype != EVO_F32 || yt.dtype != EVO_F32 || at.ndim != 2) return cudaErrorInvalidValue;
  const int64_t m = at.shape[0], k = at.shape[1];
  const bool b_ok = (bt.ndim == 1 && bt.shape[0] == k) || (bt.ndim == 2 && bt.shape[0] == k && bt.shape[1] == 1);
  const bool y_ok = (yt.ndim == 1 && yt.shape[0] == m) || (yt.ndim == 2 && yt.shape[0] == m && yt.shape[1] == 1);
  if (!b_ok || !y_ok || !evo_is_contiguous(at) || !evo_is_contiguous(bt) || !evo_is_contiguous(yt)) return cudaErrorInvalidValue;
  if (m == 0) return cudaSuccess;
  const T* a = static_cast<const T*>(at.data);
  const T* b = static_cast<const T*>(bt.data);
  T* y = static_cast<T*>(yt.data);
  const int64_t grid = (m + ROWS - 1) / ROWS;
  if (grid > 0x7fffffffLL) return cudaErrorInvalidValue;
  constexpr int kVecBytes = VEC * int(sizeof(T));
  const bool vec_ok = VEC > 1 && k % VEC == 0 && evo_is_aligned(a, kVecBytes) && evo_is_aligned(b, kVecBytes);
  if (vec_ok) {
    matvec_kernel<VEC><<<dim3(unsigned(grid)), dim3(BLOCK), 0, stream>>>(a, b, y, m, k);
  } else {
    matvec_kernel<1><<<dim3(unsigned(grid)), dim3(BLOCK), 0, stream>>>(a, b, y, m, k);
  }
  return static_cast<int>(cudaGetLastError());
}
