// Each rank's visible work under a layout and a mask (rank_visible_work, layout.hpp): the
// (query, key) pairs its queries see, counted per query from the interval of keys its band and
// document leave, cut to the pattern's key blocks where there is a pattern.
#include <algorithm>

#include "seqpar/layout.hpp"

namespace seqpar {
namespace {

// Keys in [lo, hi] that the pattern lets query position qp see.
int64_t pattern_keys(const BlockPattern& pattern, int64_t qp, int64_t lo, int64_t hi) {
  const int64_t qb = pattern.block_of(qp), B = pattern.block_size();
  int64_t count = 0;
  for (const int64_t kb : pattern.row(qb))
    count += std::max<int64_t>(0, std::min(hi, kb * B + B - 1) - std::max(lo, kb * B) + 1);
  return count;
}

}  // namespace

std::vector<double> rank_visible_work(const Layout& layout, const MaskSpec& mask) {
  const int64_t S = layout.seq_len();
  std::vector<double> work(layout.ranks(), 0.0);
  for (int r = 0; r < layout.ranks(); ++r)
    for (const int64_t qp : layout.positions(r)) {
      int64_t lo = 0, hi = S - 1;
      if (mask.window_left >= 0) lo = std::max(lo, qp - mask.window_left);
      if (mask.window_right >= 0) hi = std::min(hi, qp + mask.window_right);
      if (mask.has_documents()) {
        const auto next = std::upper_bound(mask.doc_offsets.begin(), mask.doc_offsets.end(), qp);
        if (next == mask.doc_offsets.begin() || next == mask.doc_offsets.end()) continue;  // in no document
        lo = std::max(lo, *(next - 1));
        hi = std::min(hi, *next - 1);
      }
      if (lo > hi) continue;
      work[r] += double(mask.has_block_pattern() ? pattern_keys(*mask.block_pattern, qp, lo, hi) : hi - lo + 1);
    }
  return work;
}

}  // namespace seqpar
