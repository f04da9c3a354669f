// The CUDA half of lm_head_loss.cpp: a chunk's logits by cuBLAS into fp32 scratch, one block per
// row for its logsumexp and loss; the backward turns the scratch into bf16 scale * (softmax -
// onehot) and multiplies back (dx fp32, dw fp32 added). Scratch: chunk x vocab fp32 and bf16.
#include <algorithm>

#include "model/cuda_common.cuh"
#include "seqpar/gpu.hpp"

namespace seqpar::model::cuda {
namespace {

constexpr int kThreads = 256;

__device__ float block_reduce(float v, bool take_max) {
  __shared__ float partial[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = take_max ? fmaxf(v, other) : v + other;
  }
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = partial[0];
  for (int w = 1; w < kThreads / 32; ++w) total = take_max ? fmaxf(total, partial[w]) : total + partial[w];
  __syncthreads();
  return total;
}

__global__ void row_loss_kernel(const float* logits, const int32_t* targets, int64_t vocab, float* lse, float* loss) {
  const float* row = logits + blockIdx.x * vocab;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) m = fmaxf(m, row[v]);
  m = block_reduce(m, true);
  float z = 0;
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) z += __expf(row[v] - m);
  z = block_reduce(z, false);
  if (threadIdx.x == 0) {
    const float l = m + logf(z);
    lse[blockIdx.x] = l;
    const int32_t t = targets[blockIdx.x];
    loss[blockIdx.x] = t >= 0 ? l - row[t] : 0.0f;
  }
}

__global__ void dlogits_kernel(const float* logits, const int32_t* targets, const float* lse, int64_t vocab,
                               float scale, __nv_bfloat16* d) {
  const float* row = logits + blockIdx.x * vocab;
  __nv_bfloat16* out = d + blockIdx.x * vocab;
  const int32_t t = targets[blockIdx.x];
  const float l = lse[blockIdx.x];
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) {
    const float p = t >= 0 ? scale * (__expf(row[v] - l) - (v == t ? 1.0f : 0.0f)) : 0.0f;
    out[v] = __float2bfloat16(p);
  }
}

// Scratch for one chunk's logits (fp32) and their gradient (bf16), per thread.
struct Scratch {
  DeviceBuffer logits, dlogits;
};
StatusOr<Scratch*> scratch(int64_t chunk, int64_t vocab) {
  thread_local Scratch s;
  SP_RETURN_IF_ERROR(s.logits.reserve(size_t(chunk * vocab) * 4));
  SP_RETURN_IF_ERROR(s.dlogits.reserve(size_t(chunk * vocab) * 2));
  return &s;
}

}  // namespace

Status lm_head_loss_forward(const bf16_t* x, const bf16_t* w, const int32_t* targets, int64_t rows, int64_t dim,
                            int64_t vocab, int64_t chunk, float* lse, float* row_loss, void* stream) {
  SP_ASSIGN_OR_RETURN(Scratch * s, scratch(std::min(chunk, rows), vocab));
  float* logits = static_cast<float*>(s->logits.data());
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    SP_RETURN_IF_ERROR(gemm_bf16(false, true, n, vocab, dim, 1.0f, x + r0 * dim, w, 0.0f, logits, CUDA_R_32F, stream));
    row_loss_kernel<<<unsigned(n), kThreads, 0, as_stream(stream)>>>(logits, targets + r0, vocab, lse + r0, row_loss + r0);
    SP_CUDA_CHECK(cudaGetLastError());
  }
  return Status::Ok();
}

Status lm_head_loss_backward(const bf16_t* x, const bf16_t* w, const int32_t* targets, const float* lse, int64_t rows,
                             int64_t dim, int64_t vocab, int64_t chunk, double scale, float* dx, float* dw,
                             void* stream) {
  SP_ASSIGN_OR_RETURN(Scratch * s, scratch(std::min(chunk, rows), vocab));
  float* logits = static_cast<float*>(s->logits.data());
  bf16_t* d = static_cast<bf16_t*>(s->dlogits.data());
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    SP_RETURN_IF_ERROR(gemm_bf16(false, true, n, vocab, dim, 1.0f, x + r0 * dim, w, 0.0f, logits, CUDA_R_32F, stream));
    dlogits_kernel<<<unsigned(n), kThreads, 0, as_stream(stream)>>>(logits, targets + r0, lse + r0, vocab, float(scale),
                                                                    as_bf16(d));
    SP_CUDA_CHECK(cudaGetLastError());
    SP_RETURN_IF_ERROR(gemm_bf16(false, false, n, dim, vocab, 1.0f, d, w, 0.0f, dx + r0 * dim, CUDA_R_32F, stream));
    SP_RETURN_IF_ERROR(gemm_bf16(true, false, vocab, dim, n, 1.0f, d, x + r0 * dim, 1.0f, dw, CUDA_R_32F, stream));
  }
  return Status::Ok();
}

}  // namespace seqpar::model::cuda
