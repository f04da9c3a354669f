// The CUDA half of rmsnorm.cpp: one block per row, the row's sums by a block reduction; dw by a
// column reduction in a fixed order (fixed chunks of rows, then the chunks in order), so the same
// inputs give the same bits on every run, as no atomics race.
#include <algorithm>

#include "model/cuda_common.cuh"
#include "seqpar/gpu.hpp"

namespace seqpar::model::cuda {
namespace {

constexpr int kThreads = 256;
// dw's reduction: a block of kColumns columns x kRowThreads row-threads sums one chunk of rows.
// The chunks depend only on `rows`: at least kMinChunkRows rows each (every row-thread gets a
// few), at most kMaxChunks of them (the partials stay small and the second pass short).
constexpr int kColumns = 32, kRowThreads = 8, kMaxChunks = 64, kMinChunkRows = 32;

__global__ void forward(const float* x, const __nv_bfloat16* w, __nv_bfloat16* y, float* rstd, int64_t dim, float eps) {
  const float* xr = x + blockIdx.x * dim;
  float ss = 0;
  for (int64_t d = threadIdx.x; d < dim; d += kThreads) ss += xr[d] * xr[d];
  const float s = rsqrtf(block_sum<kThreads>(ss) / float(dim) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = s;
  for (int64_t d = threadIdx.x; d < dim; d += kThreads)
    y[blockIdx.x * dim + d] = __float2bfloat16(__bfloat162float(w[d]) * xr[d] * s);
}

__global__ void backward(const float* x, const __nv_bfloat16* w, const float* rstd, const float* dy, float* dx,
                         int64_t dim) {
  const float* xr = x + blockIdx.x * dim;
  const float* gr = dy + blockIdx.x * dim;
  const float s = rstd[blockIdx.x];
  float dot = 0;
  for (int64_t d = threadIdx.x; d < dim; d += kThreads) dot += gr[d] * __bfloat162float(w[d]) * xr[d] * s;
  const float mean = block_sum<kThreads>(dot) / float(dim);
  for (int64_t d = threadIdx.x; d < dim; d += kThreads) {
    const float xhat = xr[d] * s;
    dx[blockIdx.x * dim + d] += s * (gr[d] * __bfloat162float(w[d]) - xhat * mean);
  }
}

// partial[chunk, d] = sum over the chunk's rows r of dy[r, d] * x[r, d] * rstd[r]. Row-thread y
// takes rows begin + y, begin + y + kRowThreads, ... in ascending order, and the row-threads'
// sums are added in y order: the order is fixed by the launch shape alone. A warp reads 32
// consecutive columns of one row.
__global__ void dw_partials(const float* x, const float* rstd, const float* dy, float* partial, int64_t rows,
                            int64_t dim, int64_t chunk_rows) {
  __shared__ float sums[kRowThreads][kColumns];
  const int64_t d = blockIdx.x * int64_t(kColumns) + threadIdx.x;
  const int64_t begin = blockIdx.y * chunk_rows, end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  float s = 0;
  if (d < dim) {
#pragma unroll 4
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowThreads) s += dy[r * dim + d] * (x[r * dim + d] * rstd[r]);
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && d < dim) {
    float total = 0;
    for (int y = 0; y < kRowThreads; ++y) total += sums[y][threadIdx.x];
    partial[blockIdx.y * dim + d] = total;
  }
}

// dw[d] += the chunks' partials of column d, added in chunk order.
__global__ void dw_add(const float* partial, int chunks, int64_t dim, float* dw) {
  for (int64_t d = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; d < dim; d += int64_t(gridDim.x) * blockDim.x) {
    float total = 0;
    for (int c = 0; c < chunks; ++c) total += partial[c * dim + d];
    dw[d] += total;
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
  if (rows == 0 || dim == 0) return Status::Ok();
  const cudaStream_t s = as_stream(stream);
  backward<<<unsigned(rows), kThreads, 0, s>>>(x, as_bf16(w), rstd, dy, dx, dim);
  SP_CUDA_CHECK(cudaGetLastError());
  const int64_t chunk_rows = std::max<int64_t>(kMinChunkRows, (rows + kMaxChunks - 1) / kMaxChunks);
  const int chunks = int((rows + chunk_rows - 1) / chunk_rows);
  // The partials in stream order: given back as `partial` goes out of scope, after dw_add is
  // queued, so the next block taken on this stream reuses the memory.
  SP_ASSIGN_OR_RETURN(StreamBuffer partial, StreamBuffer::allocate(size_t(chunks * dim) * sizeof(float), stream));
  float* partial_f32 = static_cast<float*>(partial.data());
  const dim3 grid{unsigned((dim + kColumns - 1) / kColumns), unsigned(chunks)};
  dw_partials<<<grid, dim3(kColumns, kRowThreads), 0, s>>>(x, rstd, dy, partial_f32, rows, dim, chunk_rows);
  SP_CUDA_CHECK(cudaGetLastError());
  dw_add<<<blocks_for(dim), 256, 0, s>>>(partial_f32, chunks, dim, dw);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace seqpar::model::cuda
