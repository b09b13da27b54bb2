// elementwise.cu -- seed template for memory-bound elementwise tasks.
//
//   EVO_ROWSCALE == 0 (default):  out = op(in[0])                 any shape, contiguous
//   EVO_ROWSCALE == 1:            out[i, j] = in[0][i] * in[1][i, j]   in = (A[N], B[N, M])
//
// The task config block below (filled in by evo.tasks.seeds) picks the dtype and the op:
//   EVO_DTYPE float | __nv_bfloat16, EVO_ELEM_BYTES 4 | 2, EVO_DTYPE_CODE EVO_F32 | EVO_BF16,
//   one EVO_OP_<NAME> 1 (SCALE RELU LEAKY_RELU SIGMOID TANH SWISH GELU SELU HARDSIGMOID
//   SOFTPLUS SOFTSIGN ELU HARDTANH), EVO_S0_DEFAULT / EVO_S1_DEFAULT for scalars the
//   harness does not pass.
// Maths is fp32 (bf16 is converted on load and rounded once on store); fp32 tasks use the
// precise libdevice functions (expf, erff, tanhf, log1pf, expm1f; no fast-math), which stay
// within a few ulp of an fp64 reference (GELU: see apply_op).
// FAST_MATH = 1 swaps in fast-intrinsic formulations that stay inside the fp32 tolerance
// (sigmoid / swish: __expf + __fdividef; GELU: an A&S erfc); FAST_MATH = 2 (bf16 only) uses the
// tanh-form GELU on the hardware tanh. Other ops ignore FAST_MATH.
//
// Structure: the tensor is viewed (CuTe) as an array of VEC-element, 16-byte-or-smaller
// aligned vectors; a grid of GRID_MULT blocks per SM (0: one block per tile) strides over
// tiles of BLOCK * ITEMS vectors; each thread issues its ITEMS loads before using any (loads in
// flight), then computes and stores. Measured on an H200 (4096 x 393216 fp32 ReLU): one
// 128-thread block per tile of 128 vectors (the defaults) reached 4293 GB/s, 1.01x torch;
// a persistent grid (GRID_MULT 8, 256 threads, ITEMS 4) only 3793 GB/s. The last partial tile and the < VEC-element tail take a
// predicated path. Pointers that are not aligned to the vector width use the VEC = 1
// instantiation of the same kernel. All indexing is 64-bit.
#include <cute/tensor.hpp>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "evo_abi.h"

// @evo:task-config
#define EVO_DTYPE float
#define EVO_ELEM_BYTES 4
#define EVO_DTYPE_CODE EVO_F32
#define EVO_OP_RELU 1

#ifndef EVO_DTYPE
#define EVO_DTYPE float
#define EVO_ELEM_BYTES 4
#define EVO_DTYPE_CODE EVO_F32
#endif
#ifndef EVO_ROWSCALE
#define EVO_ROWSCALE 0
#endif
#ifndef EVO_GELU_ERFC
#define EVO_GELU_ERFC 0
#endif
#ifndef EVO_S0_DEFAULT
#define EVO_S0_DEFAULT 0.0
#endif
#ifndef EVO_S1_DEFAULT
#define EVO_S1_DEFAULT 0.0
#endif

// @tunable VEC = 4 in {1, 2, 4, 8}
// @tunable BLOCK = 128 in {128, 256, 512, 1024}
// @tunable ITEMS = 1 in {1, 2, 4, 8}
// @tunable GRID_MULT = 0 in {0, 1, 2, 4, 8, 16, 32}
// @tunable CACHE_HINT = 0 in {0, 1}
// @tunable FAST_MATH = 0 in {0, 1, 2}
// @constraint VEC * EVO_ELEM_BYTES <= 16
// @constraint ITEMS * VEC * EVO_ELEM_BYTES <= 128
// @constraint BLOCK * GRID_MULT <= 16384
// @constraint FAST_MATH < 2 || EVO_ELEM_BYTES == 2
#ifndef VEC
#define VEC 4
#endif
#ifndef BLOCK
#define BLOCK 128
#endif
#ifndef ITEMS
#define ITEMS 1
#endif
#ifndef GRID_MULT
#define GRID_MULT 0
#endif
#ifndef CACHE_HINT
#define CACHE_HINT 0
#endif
#ifndef FAST_MATH
#define FAST_MATH 0
#endif

namespace evo_seed {
using namespace cute;
using T = EVO_DTYPE;

static_assert(VEC * sizeof(T) <= 16, "VEC * sizeof(element) must fit one 128-bit access");

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void from_f32(float v, float& dst) { dst = v; }
__device__ __forceinline__ void from_f32(float v, __nv_bfloat16& dst) { dst = __float2bfloat16_rn(v); }

struct OpArgs {
  double d0;   // scalars[0] in double: scale factors are applied exactly, then rounded once
  float s0, s1;
};

// The unary op, in fp32. Formulas follow torch's definitions (see each comment).
__device__ __forceinline__ float apply_op(float x, const OpArgs& a) {
#if defined(EVO_OP_SCALE)          // A * s
  return (float)((double)x * a.d0);
#elif defined(EVO_OP_RELU)         // NaN propagates like torch.relu
  return x <= 0.f ? 0.f : x;
#elif defined(EVO_OP_LEAKY_RELU)   // x > 0 ? x : slope * x
  return x > 0.f ? x : (float)((double)x * a.d0);
#elif defined(EVO_OP_SIGMOID)
#if FAST_MATH
  return __fdividef(1.0f, 1.0f + __expf(-x));   // 1 / inf = 0 for x << 0, as expected
#else
  return 1.0f / (1.0f + expf(-x));
#endif
#elif defined(EVO_OP_TANH)
  return tanhf(x);
#elif defined(EVO_OP_SWISH)        // x * sigmoid(x)
#if FAST_MATH
  return x * __fdividef(1.0f, 1.0f + __expf(-x));
#else
  return x / (1.0f + expf(-x));
#endif
#elif defined(EVO_OP_GELU)
  // torch's fp32 formula 0.5 x (1 + erf(x / sqrt2)): its error for x << 0, where 1 + erf
  // cancels, is ~1e-7 |x| absolute, the same as torch's. EVO_GELU_ERFC = 1 computes
  // 0.5 x erfc(-x / sqrt2) instead: accurate relative to every output, but erfcf costs
  // enough to make the kernel compute-bound on an H200 (0.79x torch measured); a branch to
  // erfcf for x < -3 only was slower still on wide inputs (warp divergence).
#if FAST_MATH == 2
  // bf16 only (constraint): tanh-form GELU with the hardware tanh (rel. error 2^-11). Its
  // distance from the erf form (<= 1.3e-3 |x|-scaled) is below a bf16 ulp; measured on the
  // CPU against BF16_ELEMENTWISE at input scales 0.01..100: worst ratio 0.23 of the bound.
  const float u = 0.7978845608028654f * fmaf(0.044715f * x, x * x, x);
  float th;
  asm("tanh.approx.f32 %0, %1;" : "=f"(th) : "f"(u));
  return 0.5f * x * (1.0f + th);
#elif FAST_MATH == 1
  // erfc by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7 absolute), with the fast exp and
  // reciprocal: x >= 0 -> x - 0.5 x erfc(x / sqrt2); x < 0 -> 0.5 x erfc(|x| / sqrt2), which
  // has no cancellation. Within FP32_ELEMENTWISE at input scales 0.01..100 (CPU check: worst
  // ratio 0.16 of the bound); about 15 instructions against erff's ~25.
  const float z = fabsf(x) * 0.70710678118654752f;
  const float t = __fdividef(1.0f, fmaf(0.3275911f, z, 1.0f));
  const float poly = t * fmaf(t, fmaf(t, fmaf(t, fmaf(t, 1.061405429f, -1.453152027f), 1.421413741f),
                                      -0.284496736f), 0.254829592f);
  const float hc = 0.5f * x * poly * __expf(-z * z);
  return x >= 0.f ? x - hc : hc;
#elif EVO_GELU_ERFC
  return 0.5f * x * erfcf(-x * 0.70710678118654752f);
#else
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
#endif
#elif defined(EVO_OP_SELU)        // (a branch-free expm1f(min(x, 0)) + select measured slower)
  return 1.0507009873554804934f * (x > 0.f ? x : 1.6732632423543772848f * expm1f(x));
#elif defined(EVO_OP_HARDSIGMOID)  // relu6(x + 3) / 6
  return fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) * (1.0f / 6.0f);  // as torch: times one_sixth
#elif defined(EVO_OP_SOFTPLUS)     // beta = 1, threshold = 20
  return x > 20.0f ? x : log1pf(expf(x));
#elif defined(EVO_OP_SOFTSIGN)
  return x / (1.0f + fabsf(x));
#elif defined(EVO_OP_ELU)          // alpha = s0
  return x > 0.f ? x : a.s0 * expm1f(x);
#elif defined(EVO_OP_HARDTANH)     // clamp(x, s0, s1)
  return fminf(fmaxf(x, a.s0), a.s1);
#elif EVO_ROWSCALE
  return x;
#else
#error "define one EVO_OP_<NAME> in the task config block"
#endif
}

template <int V>
using Vec = cute::array_aligned<T, V, V * sizeof(T)>;

// 16-byte vectors may use streaming cache hints (CACHE_HINT = 1: ld/st .cs, evict-first).
template <int V>
__device__ __forceinline__ Vec<V> load_vec(const Vec<V>& src) {
#if CACHE_HINT
  if constexpr (sizeof(Vec<V>) == 16) {
    const uint4 u = __ldcs(reinterpret_cast<const uint4*>(&src));
    Vec<V> v;
    memcpy(&v, &u, 16);
    return v;
  }
#endif
  return src;
}

template <int V>
__device__ __forceinline__ void store_vec(Vec<V>& dst, const Vec<V>& v) {
#if CACHE_HINT
  if constexpr (sizeof(Vec<V>) == 16) {
    uint4 u;
    memcpy(&u, &v, 16);
    __stcs(reinterpret_cast<uint4*>(&dst), u);
    return;
  }
#endif
  dst = v;
}

template <int V>
__device__ __forceinline__ void transform(Vec<V>& v, const OpArgs& a, float scale) {
  CUTE_UNROLL
  for (int k = 0; k < V; ++k) {
#if EVO_ROWSCALE
    from_f32(scale * to_f32(v[k]), v[k]);
#else
    from_f32(apply_op(to_f32(v[k]), a), v[k]);
#endif
  }
}

// ---------------------------------------------------------------- flat elementwise kernel
template <int V>
__global__ void __launch_bounds__(BLOCK) unary_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                      int64_t n, OpArgs a) {
  constexpr int TILE = BLOCK * ITEMS;  // vectors per tile
  const int64_t nvec = n / V;
  Tensor gX = make_tensor(make_gmem_ptr(reinterpret_cast<const Vec<V>*>(x)), make_shape(nvec));
  Tensor gY = make_tensor(make_gmem_ptr(reinterpret_cast<Vec<V>*>(y)), make_shape(nvec));
  const auto thr = make_layout(Int<BLOCK>{});
  const int64_t full_tiles = nvec / TILE;

  for (int64_t t = blockIdx.x; t < full_tiles; t += gridDim.x) {
    // This thread's ITEMS vectors of tile t: threadIdx.x, threadIdx.x + BLOCK, ... (coalesced)
    Tensor tX = local_partition(local_tile(gX, Shape<Int<TILE>>{}, make_coord(t)), thr, threadIdx.x);
    Tensor tY = local_partition(local_tile(gY, Shape<Int<TILE>>{}, make_coord(t)), thr, threadIdx.x);
    Tensor r = make_tensor<Vec<V>>(Shape<Int<ITEMS>>{});
    CUTE_UNROLL
    for (int i = 0; i < ITEMS; ++i) r(i) = load_vec<V>(tX(i));   // all loads issued before any use
    CUTE_UNROLL
    for (int i = 0; i < ITEMS; ++i) {
      transform<V>(r(i), a, 1.f);
      store_vec<V>(tY(i), r(i));
    }
  }
  // Remainder: vectors of the last partial tile, then the < V scalar tail.
  const int64_t gtid = int64_t(blockIdx.x) * BLOCK + threadIdx.x;
  const int64_t gthreads = int64_t(gridDim.x) * BLOCK;
  for (int64_t v = full_tiles * TILE + gtid; v < nvec; v += gthreads) {
    Vec<V> r = gX(v);
    transform<V>(r, a, 1.f);
    gY(v) = r;
  }
  for (int64_t i = nvec * V + gtid; i < n; i += gthreads) {
    Vec<1> r;
    r[0] = x[i];
    transform<1>(r, a, 1.f);
    y[i] = r[0];
  }
}

// ---------------------------------------------------------------- row-scale kernel
// out[i, j] = s[i] * b[i, j] for b of shape [rows, cols]; rows tiled as 1 x (BLOCK * ITEMS)
// vectors. V > 1 needs cols % V == 0 (so that every row starts aligned).
template <int V>
__global__ void __launch_bounds__(BLOCK) rowscale_kernel(const T* __restrict__ s, const T* __restrict__ b,
                                                         T* __restrict__ y, int64_t rows, int64_t cols) {
  constexpr int TILE = BLOCK * ITEMS;
  const int64_t cv = cols / V;
  Tensor gB = make_tensor(make_gmem_ptr(reinterpret_cast<const Vec<V>*>(b)), make_shape(rows, cv),
                          make_stride(cv, Int<1>{}));
  Tensor gY = make_tensor(make_gmem_ptr(reinterpret_cast<Vec<V>*>(y)), make_shape(rows, cv),
                          make_stride(cv, Int<1>{}));
  const int64_t tiles_per_row = (cv + TILE - 1) / TILE;
  const int64_t tiles = rows * tiles_per_row;
  const OpArgs unused{};
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t row = t / tiles_per_row;
    const int64_t ct = t - row * tiles_per_row;
    const float scale = to_f32(s[row]);
    Tensor tB = local_tile(gB, Shape<_1, Int<TILE>>{}, make_coord(row, ct));
    Tensor tY = local_tile(gY, Shape<_1, Int<TILE>>{}, make_coord(row, ct));
    const int64_t valid = cv - ct * TILE;  // vectors of this tile inside the row
    Tensor r = make_tensor<Vec<V>>(Shape<Int<ITEMS>>{});
    CUTE_UNROLL
    for (int i = 0; i < ITEMS; ++i) {
      const int c = threadIdx.x + i * BLOCK;
      if (c < valid) r(i) = load_vec<V>(tB(0, c));
    }
    CUTE_UNROLL
    for (int i = 0; i < ITEMS; ++i) {
      const int c = threadIdx.x + i * BLOCK;
      if (c < valid) {
        transform<V>(r(i), unused, scale);
        store_vec<V>(tY(0, c), r(i));
      }
    }
  }
}

// ---------------------------------------------------------------- host side
static int64_t grid_for(int64_t work_tiles) {
  int sms = evo_sm_count();
  if (sms < 1) sms = 132;   // (no device to ask: an H100/H200's count; the launch reports the error)
  // GRID_MULT = 0: one tile per block (no persistence); else GRID_MULT blocks per SM.
  int64_t grid = GRID_MULT == 0 ? work_tiles : int64_t(sms) * GRID_MULT;
  if (work_tiles < grid) grid = work_tiles;
  if (grid > 0x7fffffffLL) grid = 0x7fffffffLL;
  return grid < 1 ? 1 : grid;
}

static double scalar_or(const double* scalars, int n, int i, double fallback) {
  return (scalars != nullptr && i < n) ? scalars[i] : fallback;
}

}  // namespace evo_seed

EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  using namespace evo_seed;
  constexpr int kVecBytes = VEC * int(sizeof(T));
  if (n_out != 1 || out[0].dtype != EVO_DTYPE_CODE || !evo_is_contiguous(out[0])) return cudaErrorInvalidValue;
#if EVO_ROWSCALE
  if (n_in != 2) return cudaErrorInvalidValue;
  const EvoTensor& s = in[0];
  const EvoTensor& b = in[1];
  if (s.dtype != EVO_DTYPE_CODE || b.dtype != EVO_DTYPE_CODE || s.ndim != 1 || b.ndim != 2 ||
      out[0].ndim != 2 || !evo_is_contiguous(s) || !evo_is_contiguous(b) || s.shape[0] != b.shape[0] ||
      out[0].shape[0] != b.shape[0] || out[0].shape[1] != b.shape[1]) {
    return cudaErrorInvalidValue;
  }
  const int64_t rows = b.shape[0], cols = b.shape[1];
  if (rows == 0 || cols == 0) return cudaSuccess;
  const bool vec_ok = VEC > 1 && cols % VEC == 0 && evo_is_aligned(b.data, kVecBytes) &&
                      evo_is_aligned(out[0].data, kVecBytes);
  const int v = vec_ok ? VEC : 1;
  const int64_t tiles = rows * ((cols / v + BLOCK * ITEMS - 1) / (BLOCK * ITEMS));
  const int64_t grid = grid_for(tiles);
  if (vec_ok) {
    rowscale_kernel<VEC><<<dim3(unsigned(grid)), dim3(BLOCK), 0, stream>>>(
        static_cast<const T*>(s.data), static_cast<const T*>(b.data), static_cast<T*>(out[0].data), rows, cols);
  } else {
    rowscale_kernel<1><<<dim3(unsigned(grid)), dim3(BLOCK), 0, stream>>>(
        static_cast<const T*>(s.data), static_cast<const T*>(b.data), static_cast<T*>(out[0].data), rows, cols);
  }
#else
  if (n_in != 1) return cudaErrorInvalidValue;
  const EvoTensor& x = in[0];
  if (x.dtype != EVO_DTYPE_CODE || !evo_is_contiguous(x) || x.ndim != out[0].ndim) return cudaErrorInvalidValue;
  for (int i = 0; i < x.ndim; ++i)
    if (x.shape[i] != out[0].shape[i]) return cudaErrorInvalidValue;
  const int64_t n = evo_numel(x);
  if (n == 0) return cudaSuccess;
  OpArgs a;
  a.d0 = scalar_or(scalars, n_scalars, 0, EVO_S0_DEFAULT);
  a.s0 = float(a.d0);
  a.s1 = float(scalar_or(scalars, n_scalars, 1, EVO_S1_DEFAULT));
  const bool vec_ok = VEC > 1 && evo_is_aligned(x.data, kVecBytes) && evo_is_aligned(out[0].data, kVecBytes);
  const int v = vec_ok ? VEC : 1;
  const int64_t tiles = (n / v + BLOCK * ITEMS - 1) / (BLOCK * ITEMS);
  const int64_t grid = grid_for(tiles);
  if (vec_ok) {
    unary_kernel<VEC><<<dim3(unsigned(grid)), dim3(BLOCK), 0, stream>>>(
        static_cast<const T*>(x.data), static_cast<T*>(out[0].data), n, a);
  } else {
    unary_kernel<1><<<dim3(unsigned(grid)), dim3(BLOCK), 0, stream>>>(
        static_cast<const T*>(x.data), static_cast<T*>(out[0].data), n, a);
  }
#endif
  return static_cast<int>(cudaGetLastError());
}

