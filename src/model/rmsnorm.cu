// The CUDA half of rmsnorm.cpp: one block per row, the row's sums by a block reduction; dw by
// fp32 atomics per element and block.
#include <algorithm>

#include "model/cuda_common.cuh"

namespace seqpar::model::cuda {
namespace {

constexpr int kThreads = 256;

// The sum of v over the block (every thread gets it).
__device__ float block_sum(float v) {
  __shared__ float partial[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  __syncthreads();
  return total;
}

__global__ void forward(const float* x, const __nv_bfloat16* w, __nv_bfloat16* y, float* rstd, int64_t dim, float eps) {
  const float* xr = x + blockIdx.x * dim;
  float ss = 0;
  for (int64_t d = threadIdx.x; d < dim; d += kThreads) ss += xr[d] * xr[d];
  const float s = rsqrtf(block_sum(ss) / float(dim) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = s;
  for (int64_t d = threadIdx.x; d < dim; d += kThreads)
    y[blockIdx.x * dim + d] = __float2bfloat16(__bfloat162float(w[d]) * xr[d] * s);
}

__global__ void backward(const float* x, const __nv_bfloat16* w, const float* rstd, const float* dy, float* dx,
                         float* dw, int64_t dim) {
  const float* xr = x + blockIdx.x * dim;
  const float* gr = dy + blockIdx.x * dim;
  const float s = rstd[blockIdx.x];
  float dot = 0;
  for (int64_t d = threadIdx.x; d < dim; d += kThreads) dot += gr[d] * __bfloat162float(w[d]) * xr[d] * s;
  const float mean = block_sum(dot) / float(dim);
  for (int64_t d = threadIdx.x; d < dim; d += kThreads) {
    const float xhat = xr[d] * s;
    dx[blockIdx.x * dim + d] += s * (gr[d] * __bfloat162float(w[d]) - xhat * mean);
    atomicAdd(dw + d, gr[d] * xhat);
  }
}

}  // namespace

Status rmsnorm_forward(const float* x, const bf16_t* w, bf16_t* y, float* rstd, int64_t rows, int64_t dim, double eps,
                       void* stream) {
  if (rows == 0) return Status::Ok();
  forward<<<unsigned(rows), kThreads, 0, as_stream(stream)>>>(x, as_bf16(w), as_bf16(y), rstd, dim, float(eps));
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status rmsnorm_backward(const float* x, const bf16_t* w, const float* rstd, const float* dy, float* dx, float* dw,
                        int64_t rows, int64_t dim, void* stream) {
  if (rows == 0) return Status::Ok();
  backward<<<unsigned(rows), kThreads, 0, as_stream(stream)>>>(x, as_bf16(w), rstd, dy, dx, dw, dim);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace seqpar::model::cuda
