// rowreduce.cu -- seed template for row-wise reductions over the last dim of a [R, C] tensor.
//
//   EVO_OP_SOFTMAX      out = exp(x - max) / sum(exp(x - max))          in = (x[R, C])
//   EVO_OP_LOG_SOFTMAX  out = (x - max) - log(sum(exp(x - max)))        in = (x[R, C])
//   EVO_OP_RMSNORM      out = x / sqrt(mean(x^2) + eps) * w             in = (x[R, C], w[C]),
//                                                                       scalars[0] = eps
// The task config block below sets EVO_DTYPE / EVO_ELEM_BYTES / EVO_DTYPE_CODE and one op.
// Maths is fp32 for every dtype; sums are per-thread sequential, then tree reductions across
// the warp, the block and the cluster in a fixed order (bitwise deterministic, no atomics).
//
// Structure: a row is split over a cluster of CL CTAs (CL = 1 when the row fits in the
// registers of one CTA, otherwise CL = CLUSTER); each CTA owns a contiguous chunk of
// VEC-element vectors, and each thread walks its chunk with stride BLOCK, REG_VECS vectors
// per step (all loads of a step in flight together).
//   pass 1: per-thread online (max, sum of exp) -- or sum of squares for RMSNorm --,
//           combined over the block (shuffles + shared memory) and the cluster (DSMEM);
//   pass 2: out from the registers when the chunk fitted in them; else from a copy of the
//           chunk staged in shared memory during pass 1 (STAGE_SMEM, when it fits: still
//           one DRAM read); else by re-reading the chunk (recent and small: mostly L2).
// Rows whose length or base pointers do not allow VEC-wide aligned access use VEC = 1.
//
// STREAM = 1 (kb23 / kb24 seeds): for rows that need shared-memory staging, persistent
// clusters stream rows through shared memory instead of a cluster launched per row. Each warp
// owns a fixed slice of its CTA's chunk, cut into groups of 32 * REG_VECS vectors, one mbarrier
// and one cp.async.bulk a group. Pass 2 reads a group into registers and at once issues the
// bulk load of the same group of the cluster's next row, then computes and stores: the next
// row's reads overlap this row's writes. Only for 16-byte vectors and warp slices of at most
// 8 groups (else the kSmem kernel runs). Measured on an H200 at 4096 x 393216 fp32
// (docs/kernels.md): kb23 1.42x -> 1.80x torch, kb24 1.43x -> 1.75x (BLOCK 512).
#include <cute/tensor.hpp>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include "evo_abi.h"

// @evo:task-config

#ifndef EVO_DTYPE
#define EVO_DTYPE float
#define EVO_ELEM_BYTES 4
#define EVO_DTYPE_CODE EVO_F32
#endif
#ifndef EVO_S0_DEFAULT
#define EVO_S0_DEFAULT 1e-6
#endif

// @tunable BLOCK = 256 in {128, 256, 512, 1024}
// @tunable VEC = 4 in {1, 2, 4, 8}
// @tunable REG_VECS = 4 in {1, 2, 4, 8, 16}
// @tunable CLUSTER = 8 in {1, 2, 4, 8, 16}
// @tunable STAGE_SMEM = 1 in {0, 1}
// @tunable FAST_MATH = 0 in {0, 1}
// @tunable STREAM = 0 in {0, 1}
// @tunable KEEP_EXP = 0 in {0, 1}
// @constraint VEC * EVO_ELEM_BYTES <= 16
// @constraint REG_VECS * VEC * EVO_ELEM_BYTES <= 128
// STREAM = 1 changes nothing without staging or with vectors other than 16 bytes:
// @constraint STREAM == 0 || (STAGE_SMEM == 1 && VEC * EVO_ELEM_BYTES == 16)
// KEEP_EXP = 1 changes only softmax (elsewhere it would build the same kernels again):
// @constraint KEEP_EXP == 0 || EVO_OP_SOFTMAX == 1
#ifndef BLOCK
#define BLOCK 256
#endif
#ifndef VEC
#define VEC 4
#endif
#ifndef REG_VECS
#define REG_VECS 4
#endif
#ifndef CLUSTER
#define CLUSTER 8
#endif
#ifndef STAGE_SMEM
#define STAGE_SMEM 1
#endif
#ifndef FAST_MATH
#define FAST_MATH 0
#endif
#ifndef STREAM
#define STREAM 0
#endif
#ifndef KEEP_EXP
#define KEEP_EXP 0
#endif
#if STREAM
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>
#endif

namespace evo_seed {
using namespace cute;
namespace cg = cooperative_groups;
using T = EVO_DTYPE;

static_assert(VEC * sizeof(T) <= 16, "VEC * sizeof(element) must fit one 128-bit access");
static_assert(BLOCK % 32 == 0 && BLOCK <= 1024, "BLOCK must be a multiple of 32, at most 1024");
constexpr int kWarps = BLOCK / 32;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void from_f32(float v, float& dst) { dst = v; }
__device__ __forceinline__ void from_f32(float v, __nv_bfloat16& dst) { dst = __float2bfloat16_rn(v); }

template <int V>
using Vec = cute::array_aligned<T, V, V * sizeof(T)>;

// Partial state of a row: softmax keeps (max, sum of exp(x - max)); RMSNorm keeps (0, sum x^2).
struct Acc {
  float m, s;
};

// exp of a non-positive difference x - max. FAST_MATH = 1: the hardware exp2 (__expf), one MUFU
// op instead of expf's range reduction + MUFU; relative error <= ~2 ulp + |d| * 6e-8 (1.2e-6
// at d = -20; smaller results are far below the tolerance's absolute floor), inside
// FP32_SOFTMAX's 1e-5. Each element costs two exps (pass 1 and pass 2), which made the
// cluster kernel compute-bound during its phases.
__device__ __forceinline__ float row_exp(float d) {
#if FAST_MATH
  return __expf(d);
#else
  return expf(d);
#endif
}

__device__ __forceinline__ Acc combine(Acc a, Acc b) {
#if defined(EVO_OP_RMSNORM)
  return {0.f, a.s + b.s};
#else
  if (a.m == -INFINITY) return b;  // empty partials (-inf max) must not produce inf - inf
  if (b.m == -INFINITY) return a;
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * row_exp(a.m - m) + b.s * row_exp(b.m - m)};
#endif
}

__device__ __forceinline__ Acc empty_acc() {
#if defined(EVO_OP_RMSNORM)
  return {0.f, 0.f};
#else
  return {-INFINITY, 0.f};
#endif
}

// Folds one step of up to REG_VECS vectors (flags say which are valid) into acc.
template <int V>
__device__ __forceinline__ Acc accumulate(Acc acc, const Vec<V> (&r)[REG_VECS], int nvalid) {
#if defined(EVO_OP_RMSNORM)
  CUTE_UNROLL
  for (int i = 0; i < REG_VECS; ++i)
    if (i < nvalid) {
      CUTE_UNROLL
      for (int k = 0; k < V; ++k) {
        const float x = to_f32(r[i][k]);
        acc.s = fmaf(x, x, acc.s);
      }
    }
  return acc;
#else
  float m = -INFINITY;
  CUTE_UNROLL
  for (int i = 0; i < REG_VECS; ++i)
    if (i < nvalid) {
      CUTE_UNROLL
      for (int k = 0; k < V; ++k) m = fmaxf(m, to_f32(r[i][k]));
    }
  if (m == -INFINITY) return acc;
  float s = 0.f;
  CUTE_UNROLL
  for (int i = 0; i < REG_VECS; ++i)
    if (i < nvalid) {
      CUTE_UNROLL
      for (int k = 0; k < V; ++k) s += row_exp(to_f32(r[i][k]) - m);
    }
  return combine(acc, Acc{m, s});
#endif
}

// Block-wide reduction in a fixed order; every thread gets the result.
__device__ __forceinline__ Acc block_reduce(Acc a, Acc* smem_warp) {
  CUTE_UNROLL
  for (int off = 16; off > 0; off >>= 1) {
    Acc o{__shfl_xor_sync(0xffffffffu, a.m, off), __shfl_xor_sync(0xffffffffu, a.s, off)};
    a = combine(a, o);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem_warp[warp] = a;
  __syncthreads();
  a = lane < kWarps ? smem_warp[lane] : empty_acc();
  CUTE_UNROLL
  for (int off = 16; off > 0; off >>= 1) {
    Acc o{__shfl_xor_sync(0xffffffffu, a.m, off), __shfl_xor_sync(0xffffffffu, a.s, off)};
    a = combine(a, o);
  }
  return a;  // identical in every warp (same inputs, same order)
}

// The per-row epilogue: y = f(x) given the row's reduced state.
struct RowFinal {
  float m, inv_s, log_s, scale;
};

__device__ __forceinline__ RowFinal finalize(Acc a, int64_t cols, float eps) {
  RowFinal f;
#if defined(EVO_OP_RMSNORM)
  f.m = 0.f; f.inv_s = 0.f; f.log_s = 0.f;
  f.scale = 1.0f / sqrtf(a.s / float(cols) + eps);
#else
  f.m = a.m; f.inv_s = 1.0f / a.s; f.log_s = logf(a.s); f.scale = 0.f;
#endif
  return f;
}

template <int V>
__device__ __forceinline__ void emit(Vec<V>& v, const RowFinal& f, const T* __restrict__ w, int64_t vec_idx) {
#if defined(EVO_OP_RMSNORM)
  const Vec<V> wv = reinterpret_cast<const Vec<V>*>(w)[vec_idx];
#endif
  CUTE_UNROLL
  for (int k = 0; k < V; ++k) {
    const float x = to_f32(v[k]);
#if defined(EVO_OP_SOFTMAX)
    from_f32(row_exp(x - f.m) * f.inv_s, v[k]);
#elif defined(EVO_OP_LOG_SOFTMAX)
    from_f32((x - f.m) - f.log_s, v[k]);
#elif defined(EVO_OP_RMSNORM)
    from_f32((x * f.scale) * to_f32(wv[k]), v[k]);
#else
#error "define EVO_OP_SOFTMAX, EVO_OP_LOG_SOFTMAX or EVO_OP_RMSNORM in the task config block"
#endif
  }
}

// grid.x = rows * cl; the cl CTAs of a row form one cluster (cl == 1: no cluster).
// MODE kRegs: the chunk fits in REG_VECS vectors per thread; pass 2 reuses the registers.
// MODE kSmem: the chunk is staged in dynamic shared memory during pass 1 (one DRAM read).
// MODE kReread: pass 2 reads the chunk again from global memory (L2, mostly).
enum : int { kRegs = 0, kSmem = 1, kReread = 2 };

template <int V, int MODE>
__global__ void __launch_bounds__(BLOCK) row_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                    T* __restrict__ y, int64_t cols, int cl, float eps) {
  __shared__ Acc smem_warp[32];
  __shared__ Acc cta_acc;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  const int64_t row = blockIdx.x / cl;
  const int rank = blockIdx.x % cl;
  const int64_t cv = cols / V;  // vectors per row
  Tensor gX = make_tensor(make_gmem_ptr(reinterpret_cast<const Vec<V>*>(x + row * cols)), make_shape(cv));
  Tensor gY = make_tensor(make_gmem_ptr(reinterpret_cast<Vec<V>*>(y + row * cols)), make_shape(cv));
  const int64_t chunk = (cv + cl - 1) / cl;
  const int64_t begin = rank * chunk;
  const int64_t end = begin + chunk < cv ? begin + chunk : cv;
  // The staged chunk, indexed by vector offset from `begin` (MODE kSmem only).
  Tensor sX = make_tensor(make_smem_ptr(reinterpret_cast<Vec<V>*>(dyn_smem)), make_shape(chunk));
  constexpr int STEP = BLOCK * REG_VECS;
#if KEEP_EXP && defined(EVO_OP_SOFTMAX)
  // KEEP_EXP: softmax with the chunk in registers keeps pass 1's exp(x - own max) in fp32
  // registers, and pass 2 scales them by exp(own max - row max) / sum: one exp per element
  // instead of two. Rounding: two exps and one more product where the plain path has one exp.
  constexpr bool kKeep = MODE == kRegs;
#else
  constexpr bool kKeep = false;
#endif
  float e[kKeep ? REG_VECS : 1][kKeep ? V : 1];
  float own_m = -INFINITY;

  Vec<V> r[REG_VECS];
  Acc acc = empty_acc();
  for (int64_t base = begin; base < end; base += STEP) {
    const int64_t first = base + threadIdx.x;
    const int nvalid = first < end ? int((end - 1 - first) / BLOCK) + 1 : 0;
    CUTE_UNROLL
    for (int i = 0; i < REG_VECS; ++i)
      if (i < nvalid) r[i] = gX(first + int64_t(i) * BLOCK);
    if constexpr (kKeep) {
      CUTE_UNROLL
      for (int i = 0; i < REG_VECS; ++i)
        if (i < nvalid) {
          CUTE_UNROLL
          for (int k = 0; k < V; ++k) own_m = fmaxf(own_m, to_f32(r[i][k]));
        }
      float s = 0.f;
      CUTE_UNROLL
      for (int i = 0; i < REG_VECS; ++i) {
        CUTE_UNROLL
        for (int k = 0; k < V; ++k) {
          // An all -inf (or empty) chunk: every exp is 0, as in the plain path's pass 2.
          e[i][k] = (i < nvalid && own_m != -INFINITY) ? row_exp(to_f32(r[i][k]) - own_m) : 0.f;
          s += e[i][k];
        }
      }
      if (own_m != -INFINITY) acc = Acc{own_m, s};
      break;  // kRegs: one step
    }
    acc = accumulate<V>(acc, r, nvalid);
    if (MODE == kSmem) {
      CUTE_UNROLL
      for (int i = 0; i < REG_VECS; ++i)
        if (i < nvalid) sX(first - begin + int64_t(i) * BLOCK) = r[i];  // read back by this thread only
    }
    if (MODE == kRegs) break;
  }
  acc = block_reduce(acc, smem_warp);
  if (cl > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) cta_acc = acc;
    cluster.sync();
    Acc total = empty_acc();
    for (int j = 0; j < cl; ++j) total = combine(total, *cluster.map_shared_rank(&cta_acc, j));
    acc = total;
    cluster.sync();  // no CTA may exit while another still reads its shared memory
  }
  const RowFinal f = finalize(acc, cols, eps);

  for (int64_t base = begin; base < end; base += STEP) {
    const int64_t first = base + threadIdx.x;
    const int nvalid = first < end ? int((end - 1 - first) / BLOCK) + 1 : 0;
    if (MODE != kRegs) {
      CUTE_UNROLL
      for (int i = 0; i < REG_VECS; ++i)
        if (i < nvalid) r[i] = MODE == kSmem ? sX(first - begin + int64_t(i) * BLOCK) : gX(first + int64_t(i) * BLOCK);
    }
    if constexpr (kKeep) {
      // own_m == -inf with a finite row max: scale 0, and every kept exp is 0 as well.
      const float scale = row_exp(own_m - f.m) * f.inv_s;
      CUTE_UNROLL
      for (int i = 0; i < REG_VECS; ++i)
        if (i < nvalid) {
          CUTE_UNROLL
          for (int k = 0; k < V; ++k) from_f32(e[i][k] * scale, r[i][k]);
          gY(first + int64_t(i) * BLOCK) = r[i];
        }
      break;
    }
    CUTE_UNROLL
    for (int i = 0; i < REG_VECS; ++i)
      if (i < nvalid) {
        emit<V>(r[i], f, w, first + int64_t(i) * BLOCK);
        gY(first + int64_t(i) * BLOCK) = r[i];
      }
    if (MODE == kRegs) break;
  }
}

#if STREAM
// Groups (one mbarrier each) a warp's slice may have; longer slices use the kSmem kernel.
constexpr int kStreamGroups = 8;
constexpr int kGroupVecs = 32 * REG_VECS;  // vectors of one group: lane l reads l, l + 32, ...

// Vectors of group g of a warp slice of n vectors.
__device__ __forceinline__ int group_vecs(int n, int g) { return min(kGroupVecs, n - g * kGroupVecs); }

// Group g of the warp slice at s (n vectors) into this lane's registers; returns how many it holds.
template <int V>
__device__ __forceinline__ int read_group(const Vec<V>* s, int n, int g, int lane, Vec<V> (&r)[REG_VECS]) {
  const int nv = group_vecs(n, g);
  const int nvalid = lane < nv ? (nv - 1 - lane) / 32 + 1 : 0;
  CUTE_UNROLL
  for (int i = 0; i < REG_VECS; ++i)
    if (i < nvalid) r[i] = s[g * kGroupVecs + lane + 32 * i];
  return nvalid;
}

// Persistent clusters, one row at a time per cluster (rows cluster_id, + nclusters, ...). The
// slice of warp w of CTA `rank` is vectors [begin + w * slice, + slice) of the row, clipped to
// the CTA's chunk; it lives at dyn_smem[w * slice]. Group g of the slice has its own mbarrier,
// completed once a row by its bulk copy (phase = row iteration & 1). Only V * sizeof(T) == 16
// (bulk copies move 16-byte multiples between 16-byte-aligned addresses).
template <int V>
__global__ void __launch_bounds__(BLOCK) row_stream_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                           T* __restrict__ y, int64_t rows, int64_t cols, int cl,
                                                           int64_t slice, float eps) {
  static_assert(sizeof(Vec<V>) == 16, "bulk copies need 16-byte vectors");
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  __shared__ Acc smem_warp[32];
  __shared__ Acc cta_acc[2];  // by row parity: a peer may still read row i's while row i+1's is written
  __shared__ alignas(8) uint64_t full[kWarps][kStreamGroups];
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  const int rank = blockIdx.x % cl;
  const int64_t nclusters = gridDim.x / cl;
  const int64_t cv = cols / V;
  const int64_t chunk = (cv + cl - 1) / cl;
  const int64_t begin = min(rank * chunk, cv), end = min(begin + chunk, cv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t wb = min(begin + warp * slice, end);
  const int n = int(min(wb + slice, end) - wb);  // this warp's vectors of every row
  const int ngroups = (n + kGroupVecs - 1) / kGroupVecs;
  Vec<V>* s = reinterpret_cast<Vec<V>*>(dyn_smem) + warp * slice;

  // Lane 0 of each warp issues its groups' copies of `row`; the group's lanes wait on its barrier.
  auto load_group = [&](int64_t row, int g) {
    const uint32_t bytes = uint32_t(group_vecs(n, g)) * uint32_t(sizeof(Vec<V>));
    Barrier::arrive_and_expect_tx(&full[warp][g], bytes);
    SM90_BULK_COPY_G2S::copy(reinterpret_cast<const Vec<V>*>(x + row * cols) + wb + g * kGroupVecs, &full[warp][g],
                             s + g * kGroupVecs, int32_t(bytes));
  };
  int64_t row = blockIdx.x / cl;
  if (lane == 0) {
    for (int g = 0; g < ngroups; ++g) Barrier::init(&full[warp][g], 1);
    cutlass::arch::fence_barrier_init();
    if (row < rows)
      for (int g = 0; g < ngroups; ++g) load_group(row, g);
  }
  __syncwarp();

  for (int it = 0; row < rows; row += nclusters, ++it) {
    const uint32_t phase = uint32_t(it & 1);
    Acc acc = empty_acc();
    for (int g = 0; g < ngroups; ++g) {
      Vec<V> r[REG_VECS];
      Barrier::wait(&full[warp][g], phase);
      const int nvalid = read_group<V>(s, n, g, lane, r);
      acc = accumulate<V>(acc, r, nvalid);
    }
    acc = block_reduce(acc, smem_warp);
    if (cl > 1) {
      cg::cluster_group cluster = cg::this_cluster();
      if (threadIdx.x == 0) cta_acc[it & 1] = acc;
      cluster.sync();  // also orders this row's smem_warp reads before the next row's writes
      Acc total = empty_acc();
      for (int j = 0; j < cl; ++j) total = combine(total, *cluster.map_shared_rank(&cta_acc[it & 1], j));
      acc = total;
    } else {
      __syncthreads();  // smem_warp is rewritten by the next row's block_reduce
    }
    const RowFinal f = finalize(acc, cols, eps);
    const int64_t next = row + nclusters;

    for (int g = 0; g < ngroups; ++g) {
      Vec<V> r[REG_VECS];
      const int nvalid = read_group<V>(s, n, g, lane, r);
      if (next < rows) {
        cutlass::arch::fence_view_async_shared();  // these generic reads before the async overwrite
        __syncwarp();
        if (lane == 0) load_group(next, g);
      }
      const int64_t first = wb + g * kGroupVecs + lane;
      CUTE_UNROLL
      for (int i = 0; i < REG_VECS; ++i)
        if (i < nvalid) {
          emit<V>(r[i], f, w, first + 32 * i);
          reinterpret_cast<Vec<V>*>(y + row * cols)[first + 32 * i] = r[i];
        }
    }
  }
  if (cl > 1) cg::this_cluster().sync();  // no CTA exits while a peer may still read its cta_acc
}
#endif

// ---------------------------------------------------------------- host side
// Opt-in dynamic shared memory (when the kernel uses any) and, past 8 CTAs, non-portable clusters.
template <class Kernel>
static cudaError_t allow_smem_and_cluster(Kernel kernel, size_t smem_bytes, int cl) {
  if (smem_bytes > 0) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes));
    if (e != cudaSuccess) return e;
  }
  if (cl > 8) return cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  return cudaSuccess;
}

template <int V, int MODE>
static cudaError_t launch(const T* x, const T* w, T* y, int64_t rows, int64_t cols, int cl, float eps,
                          size_t smem_bytes, cudaStream_t stream) {
  auto kernel = row_kernel<V, MODE>;
  if (MODE != kSmem) smem_bytes = 0;
  cudaError_t e = allow_smem_and_cluster(kernel, smem_bytes, cl);
  if (e != cudaSuccess) return e;
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = evo_launch_config(dim3(unsigned(rows * cl)), dim3(BLOCK), smem_bytes, stream, unsigned(cl), &attr);
  return cudaLaunchKernelEx(&cfg, kernel, x, w, y, cols, cl, eps);
}

#if STREAM
// As many clusters as are co-resident (cudaOccupancyMaxActiveClusters), at most one per row.
template <int V>
static cudaError_t launch_stream(const T* x, const T* w, T* y, int64_t rows, int64_t cols, int cl, int64_t slice,
                                 float eps, size_t smem_bytes, cudaStream_t stream) {
  auto kernel = row_stream_kernel<V>;
  cudaError_t e = allow_smem_and_cluster(kernel, smem_bytes, cl);
  if (e != cudaSuccess) return e;
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = evo_launch_config(dim3(unsigned(cl)), dim3(BLOCK), smem_bytes, stream, unsigned(cl), &attr);
  int resident = 1;
  if (cl > 1) {
    e = cudaOccupancyMaxActiveClusters(&resident, kernel, &cfg);
    if (e != cudaSuccess) return e;
  } else {
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, BLOCK, smem_bytes);
    if (e != cudaSuccess) return e;
    int dev = 0, sms = 0;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess) return e;
    if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return e;
    resident *= sms;
  }
  if (resident < 1) return cudaErrorInvalidConfiguration;
  cfg.gridDim = dim3(unsigned((rows < resident ? rows : resident) * cl));
  return cudaLaunchKernelEx(&cfg, kernel, x, w, y, rows, cols, cl, slice, eps);
}
#endif

template <int V>
static cudaError_t dispatch(const T* x, const T* w, T* y, int64_t rows, int64_t cols, float eps,
                            cudaStream_t stream) {
  const int64_t cv = cols / V;
  const int64_t regs_capacity = int64_t(BLOCK) * REG_VECS;  // vectors one CTA holds in registers
  int cl = 1;
  if (cv > regs_capacity) {
    cl = CLUSTER;
    while (cl > 1 && (cv + cl - 1) / cl < BLOCK) cl /= 2;  // keep every CTA's threads busy
  }
  if (rows * cl > 0x7fffffffLL) return cudaErrorInvalidValue;
  const int64_t chunk = (cv + cl - 1) / cl;
  if (chunk <= regs_capacity) return launch<V, kRegs>(x, w, y, rows, cols, cl, eps, 0, stream);
  const size_t smem_bytes = size_t(chunk) * sizeof(Vec<V>);
  int dev = 0, optin = 0;
  if (STAGE_SMEM && cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
      smem_bytes + 1024 <= size_t(optin)) {
#if STREAM
    if constexpr (sizeof(Vec<V>) == 16) {
      const int64_t slice = (chunk + kWarps - 1) / kWarps;
      const size_t stream_bytes = size_t(slice) * kWarps * sizeof(Vec<V>);
      if (slice <= int64_t(kGroupVecs) * kStreamGroups && stream_bytes + 1024 + sizeof(uint64_t) * kWarps * kStreamGroups <= size_t(optin))
        return launch_stream<V>(x, w, y, rows, cols, cl, slice, eps, stream_bytes, stream);
    }
#endif
    return launch<V, kSmem>(x, w, y, rows, cols, cl, eps, smem_bytes, stream);
  }
  return launch<V, kReread>(x, w, y, rows, cols, cl, eps, 0, stream);
}

}  // namespace evo_seed

EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  using namespace evo_seed;
#if defined(EVO_OP_RMSNORM)
  constexpr int kInputs = 2;
#else
  constexpr int kInputs = 1;
#endif
  if (n_in != kInputs || n_out != 1) return cudaErrorInvalidValue;
  const EvoTensor& xt = in[0];
  const EvoTensor& yt = out[0];
  if (xt.dtype != EVO_DTYPE_CODE || yt.dtype != EVO_DTYPE_CODE || xt.ndim < 1 || xt.ndim != yt.ndim ||
      !evo_is_contiguous(xt) || !evo_is_contiguous(yt)) {
    return cudaErrorInvalidValue;
  }
  for (int i = 0; i < xt.ndim; ++i)
    if (xt.shape[i] != yt.shape[i]) return cudaErrorInvalidValue;
  const int64_t cols = xt.shape[xt.ndim - 1];
  const int64_t numel = evo_numel(xt);
  if (numel == 0) return cudaSuccess;
  const int64_t rows = numel / cols;
  const T* w = nullptr;
  float eps = 0.f;
#if defined(EVO_OP_RMSNORM)
  const EvoTensor& wt = in[1];
  if (wt.dtype != EVO_DTYPE_CODE || wt.ndim != 1 || wt.shape[0] != cols || !evo_is_contiguous(wt))
    return cudaErrorInvalidValue;
  w = static_cast<const T*>(wt.data);
  eps = float((scalars != nullptr && n_scalars > 0) ? scalars[0] : EVO_S0_DEFAULT);
#else
  (void)scalars;
  (void)n_scalars;
#endif
  const T* x = static_cast<const T*>(xt.data);
  T* y = static_cast<T*>(yt.data);
  constexpr int kVecBytes = VEC * int(sizeof(T));
  const bool vec_ok = VEC > 1 && cols % VEC == 0 && evo_is_aligned(x, kVecBytes) && evo_is_aligned(y, kVecBytes) &&
                      (w == nullptr || evo_is_aligned(w, kVecBytes));
  cudaError_t e = vec_ok ? dispatch<VEC>(x, w, y, rows, cols, eps, stream)
                         : dispatch<1>(x, w, y, rows, cols, eps, stream);
  if (e != cudaSuccess) return static_cast<int>(e);
  return static_cast<int>(cudaGetLastError());
}
