// Shared by our CUDA attention kernels: the mask arithmetic (kernels/cuda/mask_runs.hpp),
// CTA-wide bounds for skipping whole tiles, and the host-side argument checks.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <vector>

#include "kernels/cuda/mask_runs.hpp"
#include "kernels/cuda/flash_cuda.hpp"

namespace seqpar::cuda {

struct TileBounds {
  int64_t min_lo, max_hi;  // union of the valid rows' intervals lies inside [min_lo, max_hi]
  int64_t max_lo, min_hi;  // every valid row sees all of [max_lo, min_hi]
  int any_valid;
};

// Reduces the rows each thread holds over the whole CTA (all threads must call).
template <int kWarps, int kRows>
__device__ __forceinline__ TileBounds cta_bounds(const RowInterval (&rows)[kRows], TileBounds* smem) {
  TileBounds t{LLONG_MAX / 4, LLONG_MIN / 4, LLONG_MIN / 4, LLONG_MAX / 4, 0};
  for (int r = 0; r < kRows; ++r)
    if (rows[r].valid) {
      t.min_lo = min(t.min_lo, rows[r].lo);
      t.max_hi = max(t.max_hi, rows[r].hi);
      t.max_lo = max(t.max_lo, rows[r].lo);
      t.min_hi = min(t.min_hi, rows[r].hi);
      t.any_valid = 1;
    }
  for (int off = 16; off > 0; off /= 2) {
    t.min_lo = min(t.min_lo, __shfl_xor_sync(0xffffffff, t.min_lo, off));
    t.max_hi = max(t.max_hi, __shfl_xor_sync(0xffffffff, t.max_hi, off));
    t.max_lo = max(t.max_lo, __shfl_xor_sync(0xffffffff, t.max_lo, off));
    t.min_hi = min(t.min_hi, __shfl_xor_sync(0xffffffff, t.min_hi, off));
    t.any_valid |= __shfl_xor_sync(0xffffffff, t.any_valid, off);
  }
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) smem[warp] = t;
  __syncthreads();
  TileBounds all = smem[0];
  for (int w = 1; w < kWarps; ++w) {
    all.min_lo = min(all.min_lo, smem[w].min_lo);
    all.max_hi = max(all.max_hi, smem[w].max_hi);
    all.max_lo = max(all.max_lo, smem[w].max_lo);
    all.min_hi = min(all.min_hi, smem[w].min_hi);
    all.any_valid |= smem[w].any_valid;
  }
  return all;
}

// Key rows [begin, end) whose positions may fall in some row's interval.
__device__ __forceinline__ void visible_key_range(const MaskRuns& m, const TileBounds& t, int seq_k,
                                                  int* begin, int* end) {
  *begin = *end = 0;
  if (!t.any_valid || t.min_lo > t.max_hi) return;
  const int64_t first = t.min_lo <= m.k_offset ? 0 : -floor_div(m.k_offset - t.min_lo, m.k_stride);
  const int64_t last = t.max_hi < m.k_offset ? -1 : floor_div(t.max_hi - m.k_offset, m.k_stride);
  const int64_t n = seq_k;
  const int64_t b = first < n ? first : n;
  const int64_t e = last + 1 < n ? last + 1 : n;
  *begin = int(b);
  *end = int(e > b ? e : b);
}

// Whether every valid row sees every key of rows [key0, key0 + n).
__device__ __forceinline__ bool tile_fully_visible(const MaskRuns& m, const TileBounds& t, int key0, int n) {
  const int64_t first = m.k_offset + m.k_stride * int64_t(key0);
  const int64_t last = m.k_offset + m.k_stride * int64_t(key0 + n - 1);
  return t.max_lo <= first && t.min_hi >= last;
}

// ---- host side ----------------------------------------------------------------------------

struct FlashProblem {
  int64_t batch, seq_q, seq_k, heads, kv_heads, head_dim;
  double scale;
};

Status check_device_tensor(const char* name, const TensorView& t, DType dtype,
                           const std::vector<int64_t>& shape);
Status check_flash_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttentionParams& params, const FlashPositions& positions,
                          FlashProblem* prob);
MaskRuns make_mask_runs(const AttentionParams& params, const FlashPositions& positions);

}  // namespace seqpar::cuda
