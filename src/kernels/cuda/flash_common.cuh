// Shared by our CUDA attention kernels: the mask as arithmetic position runs (passed by value
// in the kernel parameters), per-row visible key intervals, CTA-wide bounds for skipping
// whole tiles, and the host-side argument checks.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <vector>

#include "seqpar/flash_cuda.hpp"

namespace seqpar::cuda {

inline constexpr int kMaxDocuments = 256;  // document offsets ride in the kernel parameters

struct MaskRuns {
  int64_t q_offset, q_stride, k_offset, k_stride;
  int64_t window_left, window_right;  // -1 unbounded
  int num_docs;                       // 0: no documents
  int64_t doc_offsets[kMaxDocuments + 1];
};

struct RowInterval {
  int64_t lo, hi;  // visible key positions are lo..hi; lo > hi when none
  bool valid;      // the row exists
};

struct TileBounds {
  int64_t min_lo, max_hi;  // union of the valid rows' intervals lies inside [min_lo, max_hi]
  int64_t max_lo, min_hi;  // every valid row sees all of [max_lo, min_hi]
  int any_valid;
};

__device__ __forceinline__ RowInterval row_interval(const MaskRuns& m, int row, int seq_q) {
  if (row >= seq_q) return {LLONG_MAX / 4, LLONG_MIN / 4, false};
  const int64_t qp = m.q_offset + m.q_stride * int64_t(row);
  int64_t lo = m.window_left >= 0 ? qp - m.window_left : LLONG_MIN / 4;
  int64_t hi = m.window_right >= 0 ? qp + m.window_right : LLONG_MAX / 4;
  if (m.num_docs > 0) {
    int a = 0, b = m.num_docs;  // find the document d with offsets[d] <= qp < offsets[d+1]
    while (b - a > 1) {
      const int mid = (a + b) / 2;
      if (m.doc_offsets[mid] <= qp) a = mid;
      else b = mid;
    }
    lo = max(lo, m.doc_offsets[a]);
    hi = min(hi, m.doc_offsets[a + 1] - 1);
  }
  return {lo, hi, true};
}

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

__device__ __forceinline__ int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
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

// Rows [*begin, *end) of [0, seq_q) whose intervals end at or after position hi_at_least and
// start at or before position lo_at_most. The rows' intervals start and end at positions that
// never decrease with the row (positions step forward by q_stride > 0, documents are in
// order, the window is fixed), so each test holds on a suffix or a prefix of the rows and the
// rows passing both are one run: two binary searches find it. With (first, last) of a key
// block it gives the rows that see some of its keys; with (last, first), those that see all.
__device__ __forceinline__ void rows_with(const MaskRuns& m, int seq_q, int64_t hi_at_least,
                                          int64_t lo_at_most, int* begin, int* end) {
  int a = 0, b = seq_q;  // the first row with hi >= hi_at_least
  while (a < b) {
    const int mid = a + (b - a) / 2;
    if (row_interval(m, mid, seq_q).hi >= hi_at_least) b = mid;
    else a = mid + 1;
  }
  int c = a, d = seq_q;  // past the last row with lo <= lo_at_most
  while (c < d) {
    const int mid = c + (d - c) / 2;
    if (row_interval(m, mid, seq_q).lo <= lo_at_most) c = mid + 1;
    else d = mid;
  }
  *begin = a;
  *end = c;
}

// Columns c in [0, n) of a key block whose column 0 sits at position first (columns step by
// m.k_stride) that a row with interval [row.lo, row.hi] sees: [*c_lo, *c_hi], empty when
// *c_lo > *c_hi. Worked out once per row, so the per-element mask is two int compares.
__device__ __forceinline__ void visible_columns(const MaskRuns& m, int64_t first, const RowInterval& row,
                                                int n, int* c_lo, int* c_hi) {
  int64_t lo, hi;
  if (m.k_stride == 1) {  // the usual case: no division
    lo = row.lo - first;
    hi = row.hi - first;
  } else {  // ceil and floor of the offsets in steps of k_stride
    lo = row.lo <= first ? 0 : -floor_div(first - row.lo, m.k_stride);
    hi = row.hi < first ? -1 : floor_div(row.hi - first, m.k_stride);
  }
  *c_lo = int(lo < 0 ? 0 : lo > n ? n : lo);
  *c_hi = int(hi < -1 ? -1 : hi > n - 1 ? n - 1 : hi);
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
