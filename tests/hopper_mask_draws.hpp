// hopper_mask_draws.hpp: the masks the Hopper kernels' tests and the lab's CPU planning programs
// (dev/hopper_attention/plan_choice.cpp, short_choice.cpp, bwd_short_choice.cpp) draw, as
// dev/hopper_attention/ab_masks.py draws them on the GPU side: n documents of uniformly random
// cuts, causal inside; a causal window of w keys; BigBird of `block`-token blocks (the neighbours,
// a global first block row and column, 3 random blocks per row). rng() % n, not <random>'s
// distributions, so a seed gives the same masks under every standard library (the cuts still
// differ from ab_masks.py's, which draws with Python's generator).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>

#include "kernels/hopper/hopper_tiles.hpp"

namespace seqpar::testing {

inline hopper::PairMask documents_mask(int S, int n, std::mt19937_64& rng) {
  hopper::PairMask m;
  m.seq_q = m.seq_k = S, m.window_right = 0;
  std::set<int64_t> cuts;
  while (int(cuts.size()) < n - 1) cuts.insert(1 + int64_t(rng() % uint64_t(S - 1)));
  m.doc_offsets = {0};
  m.doc_offsets.insert(m.doc_offsets.end(), cuts.begin(), cuts.end());
  m.doc_offsets.push_back(S);
  return m;
}
inline hopper::PairMask window_mask(int S, int w) {
  hopper::PairMask m;
  m.seq_q = m.seq_k = S, m.window_left = w, m.window_right = 0;
  return m;
}
inline hopper::PairMask bigbird_mask(int S, int block, std::mt19937_64& rng) {
  hopper::PairMask m;
  m.seq_q = m.seq_k = S, m.pattern_block = block;
  const int64_t nb = S / block;
  m.pattern_begin = {0};
  for (int64_t qb = 0; qb < nb; ++qb) {
    std::set<int64_t> row = {0};
    for (int64_t kb = std::max<int64_t>(0, qb - 1); kb <= std::min(nb - 1, qb + 1); ++kb) row.insert(kb);
    for (int r = 0; r < 3; ++r) row.insert(int64_t(rng() % uint64_t(nb)));
    if (qb == 0)
      for (int64_t kb = 0; kb < nb; ++kb) row.insert(kb);
    m.pattern_cols.insert(m.pattern_cols.end(), row.begin(), row.end());
    m.pattern_begin.push_back(int64_t(m.pattern_cols.size()));
  }
  return m;
}

// By ab_masks.py's names: "docsN", "windowW", "bigbirdB".
inline hopper::PairMask draw_mask(const std::string& name, int S, std::mt19937_64& rng) {
  if (name.rfind("docs", 0) == 0) return documents_mask(S, std::stoi(name.substr(4)), rng);
  if (name.rfind("window", 0) == 0) return window_mask(S, std::stoi(name.substr(6)));
  return bigbird_mask(S, std::stoi(name.substr(7)), rng);
}

}  // namespace seqpar::testing
