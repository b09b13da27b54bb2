// my_task_seed.cu -- seed kernel of the example user task `rownorm_l2`
// (configs/examples/my_task.py): y[r, :] = x[r, :] / max(||x[r, :]||_2, eps), fp32.
//
// in = (x[R, C]) contiguous fp32, out = (y[R, C]), scalars[0] = eps.
// One CTA per row: pass 1 accumulates the sum of squares (per-thread fma chain, then a
// fixed-order warp/block tree, so the result is bitwise deterministic); pass 2 rereads the
// row (mostly from L2) and scales it. Any C works: threads stride over the row.
#include <cuda_runtime.h>
#include "evo_abi.h"

// @tunable BLOCK = 256 in {128, 256, 512, 1024}
#ifndef BLOCK
#define BLOCK 256
#endif

namespace {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void __launch_bounds__(BLOCK)
rownorm_l2_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t cols, float eps) {
  __shared__ float partial[BLOCK / 32];
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * cols;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * cols;

  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += BLOCK) {
    const float v = xr[c];
    ss = fmaf(v, v, ss);
  }
  ss = warp_sum(ss);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    float t = lane < BLOCK / 32 ? partial[lane] : 0.f;
    t = warp_sum(t);
    if (lane == 0) partial[0] = t;
  }
  __syncthreads();
  const float norm = fmaxf(sqrtf(partial[0]), eps);

  for (int64_t c = threadIdx.x; c < cols; c += BLOCK) yr[c] = xr[c] / norm;
}

bool contiguous(const EvoTensor& t) {
  int64_t expect = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expect) return false;
    expect *= t.shape[i];
  }
  return true;
}

}  // namespace

EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  if (n_in != 1 || n_out != 1) return cudaErrorInvalidValue;
  const EvoTensor& xt = in[0];
  const EvoTensor& yt = out[0];
  if (xt.dtype != EVO_F32 || yt.dtype != EVO_F32 || xt.ndim < 1 || xt.ndim != yt.ndim ||
      !contiguous(xt) || !contiguous(yt))
    return cudaErrorInvalidValue;
  for (int i = 0; i < xt.ndim; ++i)
    if (xt.shape[i] != yt.shape[i]) return cudaErrorInvalidValue;
  const int64_t numel = evo_numel(xt);
  if (numel == 0) return cudaSuccess;
  const int64_t cols = xt.shape[xt.ndim - 1];
  const int64_t rows = numel / cols;
  if (rows > 0x7fffffffLL) return cudaErrorInvalidValue;
  const float eps = float((scalars != nullptr && n_scalars > 0) ? scalars[0] : 1e-12);
  rownorm_l2_kernel<<<static_cast<unsigned>(rows), BLOCK, 0, stream>>>(
      static_cast<const float*>(xt.data), static_cast<float*>(yt.data), cols, eps);
  return static_cast<int>(cudaGetLastError());
}
