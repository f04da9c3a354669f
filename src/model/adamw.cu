// The CUDA half of adamw.cpp: the update elementwise, and the gradient's squared norm by a block
// reduction and one fp64 atomic per block (the GPU engine's clipping needs only the norm).
#include "model/cuda_common.cuh"

namespace seqpar::model::cuda {
namespace {

__global__ void update(float* p, __nv_bfloat16* p16, const float* g, float* m, float* v, int64_t n, float lr,
                       float b1, float b2, float eps, float wd, float clip, float c1, float c2) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i] * clip;
    const float mi = b1 * m[i] + (1 - b1) * gi, vi = b2 * v[i] + (1 - b2) * gi * gi;
    m[i] = mi, v[i] = vi;
    const float pi = p[i] - lr * ((mi / c1) / (sqrtf(vi / c2) + eps) + wd * p[i]);
    p[i] = pi;
    if (p16) p16[i] = __float2bfloat16(pi);
  }
}

__global__ void squares(const float* x, int64_t n, double* out) {
  __shared__ double partial[256 / 32];
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    s += double(x[i]) * double(x[i]);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < 256 / 32; ++w) total += partial[w];
    atomicAdd(out, total);
  }
}

}  // namespace

Status adamw_update(float* params, bf16_t* params_bf16, const float* grads, float* m, float* v, int64_t n, double lr,
                    double beta1, double beta2, double eps, double weight_decay, double clip, double c1, double c2,
                    void* stream) {
  if (n == 0) return Status::Ok();
  update<<<blocks_for(n), 256, 0, as_stream(stream)>>>(params, params_bf16 ? as_bf16(params_bf16) : nullptr, grads, m, v,
                                                       n, float(lr), float(beta1), float(beta2), float(eps),
                                                       float(weight_decay), float(clip), float(c1), float(c2));
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status sum_of_squares(const float* x, int64_t n, double* out, void* stream) {
  if (n == 0) return Status::Ok();
  squares<<<std::min<unsigned>(blocks_for(n), 1024), 256, 0, as_stream(stream)>>>(x, n, out);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace seqpar::model::cuda
