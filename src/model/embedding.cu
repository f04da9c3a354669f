// The CUDA half of embedding.cpp: a row gather into the fp32 residual stream, and the gradient's
// scatter-add without atomics: the host groups the rows by token, and each token's rows are added
// into its table row in an order fixed by the tokens (ascending rows; a frequent token's rows in
// segments, then the segments in order), the same bits on every run.
#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "model/cuda_common.cuh"
#include "seqpar/gpu.hpp"

namespace seqpar::model::cuda {
namespace {

__global__ void gather(const int32_t* tokens, const __nv_bfloat16* table, float* x, int64_t rows, int64_t dim) {
  const int64_t n = rows * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = __bfloat162float(table[int64_t(tokens[i / dim]) * dim + i % dim]);
}

constexpr int kRunThreads = 128;  // columns per block of the backward's kernels
constexpr int kSegmentRows = 64;  // a token with more rows is summed in segments of this many

// The backward's grouping of the rows (built on the host; int32 device arrays): token u's rows,
// ascending, are order[run_starts[u] .. run_starts[u + 1]) and go to dtable[run_tokens[u]]. A
// token with more than kSegmentRows rows (a frequent word, a padding token) is cut into
// segments [segment_begin[k], segment_end[k]) of kSegmentRows rows, its segments being
// run_segments[u] .. run_segments[u + 1] (an empty range for the others): one long chain of
// adds would leave a few threads working long after the rest.
struct Grouping {
  const int32_t *order, *run_starts, *run_tokens, *run_segments, *segment_begin, *segment_end;
};

// segment_sums[k, d] = the sum of segment k's rows of dx at column d, in ascending row order.
__global__ void sum_segments(Grouping g, const float* dx, float* segment_sums, int64_t dim) {
  const int64_t d = blockIdx.y * int64_t(kRunThreads) + threadIdx.x;
  if (d >= dim) return;
  float sum = 0;
#pragma unroll 8
  for (int32_t i = g.segment_begin[blockIdx.x]; i < g.segment_end[blockIdx.x]; ++i)
    sum += dx[int64_t(g.order[i]) * dim + d];
  segment_sums[blockIdx.x * dim + d] = sum;
}

// Block (u, c) adds token u's rows (or its segments' sums, in segment order) into its table row
// at columns c * kRunThreads + threadIdx.x. Each table element has one thread, which adds one
// term after another: no atomics, an order fixed by the tokens. The loads do not depend on the
// running sum, so the unrolled loops keep several in flight.
__global__ void add_runs(Grouping g, const float* dx, const float* segment_sums, float* dtable, int64_t dim) {
  const int64_t d = blockIdx.y * int64_t(kRunThreads) + threadIdx.x;
  if (d >= dim) return;
  float* to = dtable + int64_t(g.run_tokens[blockIdx.x]) * dim + d;
  float sum = *to;
  const int32_t first_segment = g.run_segments[blockIdx.x], end_segment = g.run_segments[blockIdx.x + 1];
  if (first_segment < end_segment) {
#pragma unroll 8
    for (int32_t k = first_segment; k < end_segment; ++k) sum += segment_sums[k * dim + d];
  } else {
#pragma unroll 8
    for (int32_t i = g.run_starts[blockIdx.x]; i < g.run_starts[blockIdx.x + 1]; ++i)
      sum += dx[int64_t(g.order[i]) * dim + d];
  }
  *to = sum;
}

}  // namespace

Status embedding_forward(const int32_t* tokens, const bf16_t* table, float* x, int64_t rows, int64_t dim, void* stream) {
  gather<<<blocks_for(rows * dim), 256, 0, as_stream(stream)>>>(tokens, as_bf16(table), x, rows, dim);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status embedding_backward(const int32_t* host_tokens, const float* dx, float* dtable, int64_t rows, int64_t dim,
                          void* stream) {
  if (rows == 0 || dim == 0) return Status::Ok();
  // The signature once took device tokens (same type): a caller not yet moved over gets an error
  // here rather than a crash reading device memory on the host.
  SP_CHECK_ARG(!is_device_pointer(host_tokens), "embedding_backward takes the tokens in host memory");
  SP_CHECK_ARG(rows < INT32_MAX, "embedding_backward: " + std::to_string(rows) + " rows do not fit int32 indices");
  const int64_t column_blocks = (dim + kRunThreads - 1) / kRunThreads;
  SP_CHECK_ARG(column_blocks <= 65535, "embedding_backward: dim " + std::to_string(dim) + " is too wide");
  int32_t max_token = 0;
  for (int64_t r = 0; r < rows; ++r) {
    SP_CHECK_ARG(host_tokens[r] >= 0, "embedding_backward: token " + std::to_string(host_tokens[r]) + " at row " +
                                          std::to_string(r) + " is negative");
    max_token = std::max(max_token, host_tokens[r]);
  }
  // A counting sort by token (tokens index the table, so the counts are at most a vocabulary
  // long): row_start[t] is where token t's rows begin in `order`, and the rows are placed in
  // ascending order, so each token's rows stay ascending.
  std::vector<int32_t> row_start(size_t(max_token) + 2, 0);
  for (int64_t r = 0; r < rows; ++r) ++row_start[size_t(host_tokens[r]) + 1];
  int64_t runs = 0, segments = 0;
  for (size_t t = 1; t < row_start.size(); ++t) {
    const int32_t count = row_start[t];  // token t - 1's rows
    if (count > 0) ++runs;
    if (count > kSegmentRows) segments += (count + kSegmentRows - 1) / kSegmentRows;
    row_start[t] += row_start[t - 1];
  }
  // One upload, int32: [order: rows][run_starts: runs + 1][run_tokens: runs]
  // [run_segments: runs + 1][segment_begin: segments][segment_end: segments].
  std::vector<int32_t> index(size_t(rows + 3 * runs + 2 + 2 * segments));
  int32_t* order = index.data();
  int32_t* run_starts = order + rows;
  int32_t* run_tokens = run_starts + runs + 1;
  int32_t* run_segments = run_tokens + runs;
  int32_t* segment_begin = run_segments + runs + 1;
  int32_t* segment_end = segment_begin + segments;
  int64_t u = 0, k = 0;
  for (size_t t = 0; t + 1 < row_start.size(); ++t) {
    const int32_t begin = row_start[t], end = row_start[t + 1];
    if (end == begin) continue;
    run_starts[u] = begin, run_tokens[u] = int32_t(t), run_segments[u] = int32_t(k), ++u;
    if (end - begin > kSegmentRows)
      for (int32_t b = begin; b < end; b += kSegmentRows, ++k)
        segment_begin[k] = b, segment_end[k] = std::min(b + kSegmentRows, end);
  }
  run_starts[runs] = int32_t(rows), run_segments[runs] = int32_t(segments);
  for (int64_t r = 0; r < rows; ++r) order[row_start[size_t(host_tokens[r])]++] = int32_t(r);

  const cudaStream_t s = as_stream(stream);
  // Given back in stream order as they go out of scope, after add_runs is queued.
  SP_ASSIGN_OR_RETURN(StreamBuffer device_index, StreamBuffer::allocate(index.size() * sizeof(int32_t), stream));
  StreamBuffer segment_sums;
  if (segments > 0) {
    SP_ASSIGN_OR_RETURN(segment_sums, StreamBuffer::allocate(size_t(segments * dim) * sizeof(float), stream));
  }
  // From pageable memory the call returns once `index` is staged, so `index` may go out of scope
  // before the copy runs. (The call first waits for the work queued on the stream; at the end of
  // the backward that is little.)
  SP_CUDA_CHECK(
      cudaMemcpyAsync(device_index.data(), index.data(), index.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s));
  const auto* base = static_cast<const int32_t*>(device_index.data());
  const auto at = [&](const int32_t* host) { return base + (host - index.data()); };
  const Grouping g{at(order), at(run_starts), at(run_tokens), at(run_segments), at(segment_begin), at(segment_end)};
  float* sums = static_cast<float*>(segment_sums.data());
  if (segments > 0) {
    sum_segments<<<dim3{unsigned(segments), unsigned(column_blocks)}, kRunThreads, 0, s>>>(g, dx, sums, dim);
    SP_CUDA_CHECK(cudaGetLastError());
  }
  add_runs<<<dim3{unsigned(runs), unsigned(column_blocks)}, kRunThreads, 0, s>>>(g, dx, sums, dtable, dim);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace seqpar::model::cuda
