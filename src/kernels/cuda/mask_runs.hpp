// The mask of our CUDA kernels as arithmetic position runs (passed by value in the kernel
// parameters): each query row's interval of visible key positions, the run of rows that see
// a key block, and the columns of a block a row sees. Plain C++ on the host, inline device
// code under nvcc, so the host tests (tests/test_kernels.cpp) check it against brute force.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#if defined(__CUDACC__)
#define SP_MASK_FN __host__ __device__ __forceinline__
#else
#define SP_MASK_FN inline
#endif

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

SP_MASK_FN RowInterval row_interval(const MaskRuns& m, int row, int seq_q) {
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
#if defined(__CUDA_ARCH__)
    lo = max(lo, m.doc_offsets[a]);
    hi = min(hi, m.doc_offsets[a + 1] - 1);
#else
    lo = std::max(lo, m.doc_offsets[a]);
    hi = std::min(hi, m.doc_offsets[a + 1] - 1);
#endif
  }
  return {lo, hi, true};
}

SP_MASK_FN int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// Rows [*begin, *end) of [0, seq_q) whose intervals end at or after position hi_at_least and
// start at or before position lo_at_most. The rows' intervals start and end at positions that
// never decrease with the row (positions step forward by q_stride > 0, documents are in
// order, the window is fixed), so each test holds on a suffix or a prefix of the rows and the
// rows passing both are one run: two binary searches find it. With (first, last) of a key
// block it gives the rows that see some of its keys; with (last, first), those that see all.
SP_MASK_FN void rows_with(const MaskRuns& m, int seq_q, int64_t hi_at_least, int64_t lo_at_most,
                          int* begin, int* end) {
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
SP_MASK_FN void visible_columns(const MaskRuns& m, int64_t first, const RowInterval& row, int n,
                                int* c_lo, int* c_hi) {
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

}  // namespace seqpar::cuda
