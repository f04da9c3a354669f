// The CUDA kernels of the linear-attention mixer's elementwise steps (layers_cuda.hpp): SiLU on
// q and k and the output gate, bf16 in memory and fp32 inside, as swiglu.cu.
#include "model/cuda_common.cuh"

namespace seqpar::model::cuda {
namespace {

__device__ float sigmoid(float x) {
  return 1.0f / (1.0f + __expf(-x));
}

__global__ void silu_forward_kernel(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float xi = __bfloat162float(x[i]);
    y[i] = __float2bfloat16(xi * sigmoid(xi));
  }
}

// silu'(x) = sigmoid(x) * (1 + x * (1 - sigmoid(x))). dx may alias dy: each element is read
// before it is written, by the same thread.
__global__ void silu_backward_kernel(const __nv_bfloat16* x, const __nv_bfloat16* dy,
                                     __nv_bfloat16* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float xi = __bfloat162float(x[i]), sig = sigmoid(xi);
    dx[i] = __float2bfloat16(__bfloat162float(dy[i]) * sig * (1.0f + xi * (1.0f - sig)));
  }
}

// The gate as a template parameter: one kernel per gate, no branch per element.
template <bool silu_gate>
__device__ float gate_of(float g) {
  return silu_gate ? g * sigmoid(g) : g;
}

template <bool silu_gate>
__global__ void gate_forward_kernel(const __nv_bfloat16* g, const __nv_bfloat16* normed,
                                    __nv_bfloat16* a, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    a[i] =
        __float2bfloat16(__bfloat162float(normed[i]) * gate_of<silu_gate>(__bfloat162float(g[i])));
}

// a = n * gate(g): dn = da * gate(g), dg = da * n * gate'(g), gate' = 1 or silu'.
template <bool silu_gate>
__global__ void gate_backward_kernel(const __nv_bfloat16* g, const __nv_bfloat16* normed,
                                     const float* da, __nv_bfloat16* dg, float* dnormed,
                                     int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = __bfloat162float(g[i]), ni = __bfloat162float(normed[i]);
    float slope = 1.0f;
    if constexpr (silu_gate) {
      const float sig = sigmoid(gi);
      slope = sig * (1.0f + gi * (1.0f - sig));
    }
    dnormed[i] = da[i] * gate_of<silu_gate>(gi);
    dg[i] = __float2bfloat16(da[i] * ni * slope);
  }
}

}  // namespace

Status silu_forward(const bf16_t* x, bf16_t* y, int64_t n, void* stream) {
  if (n == 0) return Status::Ok();
  silu_forward_kernel<<<blocks_for(n), 256, 0, as_stream(stream)>>>(as_bf16(x), as_bf16(y), n);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status silu_backward(const bf16_t* x, const bf16_t* dy, bf16_t* dx, int64_t n, void* stream) {
  if (n == 0) return Status::Ok();
  silu_backward_kernel<<<blocks_for(n), 256, 0, as_stream(stream)>>>(as_bf16(x), as_bf16(dy),
                                                                     as_bf16(dx), n);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status mixer_gate_forward(bool silu_gate, const bf16_t* g, const bf16_t* normed, bf16_t* a,
                          int64_t n, void* stream) {
  if (n == 0) return Status::Ok();
  const auto kernel = silu_gate ? gate_forward_kernel<true> : gate_forward_kernel<false>;
  kernel<<<blocks_for(n), 256, 0, as_stream(stream)>>>(as_bf16(g), as_bf16(normed), as_bf16(a), n);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status mixer_gate_backward(bool silu_gate, const bf16_t* g, const bf16_t* normed, const float* da,
                           bf16_t* dg, float* dnormed, int64_t n, void* stream) {
  if (n == 0) return Status::Ok();
  const auto kernel = silu_gate ? gate_backward_kernel<true> : gate_backward_kernel<false>;
  kernel<<<blocks_for(n), 256, 0, as_stream(stream)>>>(as_bf16(g), as_bf16(normed), da, as_bf16(dg),
                                                       dnormed, n);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace seqpar::model::cuda
