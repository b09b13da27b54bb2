// my_argmax_seed.cu -- seed kernel of the example user task `rowargmax`
// (configs/examples/my_argmax_task.py): idx[r] = argmax_c x[r, c], fp32 in, int64 out.
//
// in = (x[R, C]) contiguous fp32, out = (idx[R]) int64. One CTA per row: each thread scans a
// strided slice keeping (value, index), then a warp/block tree keeps the better pair. Ties go
// to the smaller index and NaN beats any number (the first NaN wins), as torch.argmax does,
// so the exact comparison holds on any input.
#include <cuda_runtime.h>
#include "evo_abi.h"

// @tunable BLOCK = 256 in {128, 256, 512, 1024}
#ifndef BLOCK
#define BLOCK 256
#endif

namespace {

// Whether (va, ia) should win over (vb, ib): NaN first, then the larger value, then the
// smaller index.
__device__ __forceinline__ bool better(float va, long long ia, float vb, long long ib) {
  const bool na = va != va, nb = vb != vb;
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

__device__ __forceinline__ void warp_best(float& v, long long& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const long long oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) { v = ov; i = oi; }
  }
}

__global__ void __launch_bounds__(BLOCK)
rowargmax_kernel(const float* __restrict__ x, long long* __restrict__ idx, long long cols) {
  __shared__ float sv[BLOCK / 32];
  __shared__ long long si[BLOCK / 32];
  const float* xr = x + static_cast<long long>(blockIdx.x) * cols;
  float v = -__int_as_float(0x7f800000);  // -inf
  long long i = cols;                      // loses to any real element
  for (long long c = threadIdx.x; c < cols; c += BLOCK) {
    const float e = xr[c];
    if (better(e, c, v, i)) { v = e; i = c; }
  }
  warp_best(v, i);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { sv[warp] = v; si[warp] = i; }
  __syncthreads();
  if (warp == 0) {
    v = lane < BLOCK / 32 ? sv[lane] : -__int_as_float(0x7f800000);
    i = lane < BLOCK / 32 ? si[lane] : cols;
    warp_best(v, i);
    if (lane == 0) idx[blockIdx.x] = i < cols ? i : 0;  // a row of only -inf: index 0, as torch
  }
}

}  // namespace

EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  (void)scalars; (void)n_scalars;
  if (n_in != 1 || n_out != 1) return cudaErrorInvalidValue;
  const EvoTensor& xt = in[0];
  const EvoTensor& it = out[0];
  if (xt.dtype != EVO_F32 || it.dtype != EVO_I64 || xt.ndim != 2 || it.ndim != 1 ||
      it.shape[0] != xt.shape[0] || xt.strides[1] != 1 || xt.strides[0] != xt.shape[1] ||
      it.strides[0] != 1)
    return cudaErrorInvalidValue;
  const long long rows = xt.shape[0], cols = xt.shape[1];
  if (rows == 0) return cudaSuccess;
  if (rows > 0x7fffffffLL || cols == 0) return cudaErrorInvalidValue;
  rowargmax_kernel<<<static_cast<unsigned>(rows), BLOCK, 0, stream>>>(
      static_cast<const float*>(xt.data), static_cast<long long*>(it.data), cols);
  return static_cast<int>(cudaGetLastError());
}
