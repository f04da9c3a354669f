// The CUDA half of swiglu.cpp, elementwise in fp32.
#include "model/cuda_common.cuh"

namespace seqpar::model::cuda {
namespace {

__global__ void forward(const __nv_bfloat16* g, const __nv_bfloat16* u, __nv_bfloat16* a, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = __bfloat162float(g[i]), sig = 1.0f / (1.0f + __expf(-gi));
    a[i] = __float2bfloat16(gi * sig * __bfloat162float(u[i]));
  }
}

__global__ void backward(const __nv_bfloat16* g, const __nv_bfloat16* u, const float* da, __nv_bfloat16* dg,
                         __nv_bfloat16* du, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = __bfloat162float(g[i]), ui = __bfloat162float(u[i]), sig = 1.0f / (1.0f + __expf(-gi));
    du[i] = __float2bfloat16(da[i] * gi * sig);
    dg[i] = __float2bfloat16(da[i] * ui * sig * (1.0f + gi * (1.0f - sig)));
  }
}

}  // namespace

Status swiglu_forward(const bf16_t* g, const bf16_t* u, bf16_t* a, int64_t n, void* stream) {
  if (n == 0) return Status::Ok();
  forward<<<blocks_for(n), 256, 0, as_stream(stream)>>>(as_bf16(g), as_bf16(u), as_bf16(a), n);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status swiglu_backward(const bf16_t* g, const bf16_t* u, const float* da, bf16_t* dg, bf16_t* du, int64_t n,
                       void* stream) {
  if (n == 0) return Status::Ok();
  backward<<<blocks_for(n), 256, 0, as_stream(stream)>>>(as_bf16(g), as_bf16(u), da, as_bf16(dg), as_bf16(du), n);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace seqpar::model::cuda
