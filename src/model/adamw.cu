// The CUDA half of adamw.cpp: the update elementwise, and the gradient's squared norm (the GPU
// engine's clipping needs only the norm) by per-block fp64 partials and one block that adds them in
// block order: a grid fixed by n and no atomics, so the same gradient gives the same bits every run.
#include <algorithm>

#include "model/cuda_common.cuh"
#include "seqpar/gpu.hpp"

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

constexpr int kThreads = 256, kMaxSquareBlocks = 1024;

// block_sums[b] = block b's part of sum x^2 in fp64: thread t takes elements b * kThreads + t
// + k * gridDim.x * kThreads in ascending k.
__global__ void squares(const float* x, int64_t n, double* block_sums) {
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads)
    s += double(x[i]) * double(x[i]);
  const double total = block_sum<kThreads>(s);
  if (threadIdx.x == 0) block_sums[blockIdx.x] = total;
}

// *out += the blocks' sums, by one block: thread t adds sums t, t + kThreads, ... in order, then
// block_sum.
__global__ void add_block_sums(const double* block_sums, int blocks, double* out) {
  double s = 0;
  for (int b = threadIdx.x; b < blocks; b += kThreads) s += block_sums[b];
  const double total = block_sum<kThreads>(s);
  if (threadIdx.x == 0) *out += total;
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
  const cudaStream_t s = as_stream(stream);
  // The grid depends on n alone, so each block's share of the elements (and the order of the
  // adds) is the same on every call.
  const int blocks = int(std::min<unsigned>(blocks_for(n, kThreads), kMaxSquareBlocks));
  // Given back in stream order as it goes out of scope, after add_block_sums is queued.
  SP_ASSIGN_OR_RETURN(StreamBuffer block_sums, StreamBuffer::allocate(size_t(blocks) * sizeof(double), stream));
  double* sums = static_cast<double*>(block_sums.data());
  squares<<<unsigned(blocks), kThreads, 0, s>>>(x, n, sums);
  SP_CUDA_CHECK(cudaGetLastError());
  add_block_sums<<<1, kThreads, 0, s>>>(sums, blocks, out);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace seqpar::model::cuda
