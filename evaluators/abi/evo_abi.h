// evo_abi.h -- the kernel ABI between the evaluator (host, trusted) and a candidate (.so).
//
// A candidate defines exactly one entry point:
//
//   extern "C" int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
//                             const double* scalars, int n_scalars, cudaStream_t stream);
//
// Contract:
// - `in` are the task's inputs in the order of the reference function's arguments; `out`
//   are the outputs, allocated (and poisoned) by the harness with the reference's shapes.
// - Every launch goes on `stream` (the harness times that stream); no other stream, no
//   host threads, no synchronisation of the device, no allocation that outlives the call.
// - Return cudaSuccess (0) or a cudaError_t; the harness also checks cudaGetLastError.
// - Inputs must not be modified; outputs must be fully written on every call.
// - Tunables arrive as -D macros; guard each with #ifndef and a default.
//
// Optional device scratch ("workspace"; e.g. a padded copy of operands whose rows are not
// 16-byte aligned, so TMA can read them). A candidate that needs one also defines
//
//   extern "C" int64_t evo_workspace_bytes(const EvoTensor* in, int n_in, const EvoTensor* out,
//                                          int n_out, const double* scalars, int n_scalars);
//
// returning the bytes it needs for these tensors (0: none; negative: the inputs are outside
// its contract, and evo_launch will say so). The caller asks before every call and, when the
// answer is positive, appends ONE more tensor to `out`: dtype EVO_U8, ndim 1, shape {bytes},
// 256-byte aligned, on the same device; n_out counts it. Its contents on entry are undefined
// (the harness fills it with 0xFF bytes -- NaN in every float format -- before every call,
// outside the timed region), so nothing can be carried from one call to the next in it. The
// workspace is the only memory a candidate may use besides its inputs and outputs.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#define EVO_ABI_VERSION 1
#define EVO_MAX_DIMS 8

enum EvoDType : int32_t {
  EVO_F32 = 0,
  EVO_F16 = 1,
  EVO_BF16 = 2,
  EVO_F64 = 3,
  EVO_I32 = 4,
  EVO_I64 = 5,
  EVO_U8 = 6,      // only the optional workspace tensor
  EVO_BOOL = 7,    // one byte per element, 0 or 1 (boolean outputs such as masks)
};

struct EvoTensor {
  void* data;                       // device pointer
  int32_t dtype;                    // EvoDType
  int32_t ndim;
  int64_t shape[EVO_MAX_DIMS];
  int64_t strides[EVO_MAX_DIMS];    // in elements, as torch reports them
};

#define EVO_EXPORT extern "C" __attribute__((visibility("default")))

EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream);

// Optional; see "device scratch" above. Declared here so a definition must match it.
EVO_EXPORT int64_t evo_workspace_bytes(const EvoTensor* in, int n_in, const EvoTensor* out, int n_out,
                                       const double* scalars, int n_scalars);

// Convenience for candidates: element count of a tensor.
static inline int64_t evo_numel(const EvoTensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

// Convenience for candidates: dense row-major (C-contiguous) in torch's sense, i.e. size-1
// dimensions may carry any stride.
static inline bool evo_is_contiguous(const EvoTensor& t) {
  int64_t expect = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expect) return false;
    expect *= t.shape[i];
  }
  return true;
}

// Convenience for candidates: `p` is a multiple of `bytes` (e.g. 16 for 128-bit accesses).
static inline bool evo_is_aligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes)) == 0;
}

// Convenience for host code that sizes a grid by the device: the current device's SM count,
// 0 when it cannot be queried (no device, no driver; the failed query's error is cleared so it
// does not surface as the launch's cudaGetLastError).
static inline int evo_sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return sms;
}

// Convenience for cudaLaunchKernelEx: a launch configuration on `stream` with thread-block
// clusters of (cluster_x, 1, 1) CTAs when cluster_x > 1 (gridDim.x must then be a multiple of
// it). `attr` holds the cluster attribute and must outlive the launch.
static inline cudaLaunchConfig_t evo_launch_config(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                                                   unsigned cluster_x, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = cluster_x;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = cluster_x > 1 ? 1 : 0;
  return cfg;
}

// Convenience for candidates with a workspace (see "device scratch" above): true when `out`
// holds exactly the task's `n_task_out` outputs and `bytes` <= 0, or those plus the appended
// workspace `out[n_task_out]` (EVO_U8, 1-D, at least `bytes`, non-null, `align`-byte aligned)
// and `bytes` > 0. evo_launch returns cudaErrorInvalidValue otherwise.
static inline bool evo_workspace_ok(const EvoTensor* out, int n_out, int n_task_out, int64_t bytes, int align) {
  if (bytes <= 0) return n_out == n_task_out;
  if (n_out != n_task_out + 1) return false;
  const EvoTensor& w = out[n_task_out];
  return w.dtype == EVO_U8 && w.ndim == 1 && w.shape[0] >= bytes && w.data != nullptr &&
         evo_is_aligned(w.data, align);
}
