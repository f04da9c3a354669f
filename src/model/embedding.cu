// The CUDA half of embedding.cpp: a row gather into the fp32 residual stream, and a scatter-add
// of the gradient with fp32 atomics (rows that share a token add into one row).
#include <algorithm>

#include "model/cuda_common.cuh"

namespace seqpar::model::cuda {
namespace {

__global__ void gather(const int32_t* tokens, const __nv_bfloat16* table, float* x, int64_t rows, int64_t dim) {
  const int64_t n = rows * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = __bfloat162float(table[int64_t(tokens[i / dim]) * dim + i % dim]);
}

__global__ void scatter_add(const int32_t* tokens, const float* dx, float* dtable, int64_t rows, int64_t dim) {
  const int64_t n = rows * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    atomicAdd(dtable + int64_t(tokens[i / dim]) * dim + i % dim, dx[i]);
}

}  // namespace

Status embedding_forward(const int32_t* tokens, const bf16_t* table, float* x, int64_t rows, int64_t dim, void* stream) {
  gather<<<blocks_for(rows * dim), 256, 0, as_stream(stream)>>>(tokens, as_bf16(table), x, rows, dim);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status embedding_backward(const int32_t* tokens, const float* dx, float* dtable, int64_t rows, int64_t dim,
                          void* stream) {
  scatter_add<<<blocks_for(rows * dim), 256, 0, as_stream(stream)>>>(tokens, dx, dtable, rows, dim);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace seqpar::model::cuda
