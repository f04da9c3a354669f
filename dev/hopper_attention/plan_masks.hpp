// plan_masks.hpp: the masks the lab's CPU planning programs draw (plan_choice.cpp, short_choice.cpp,
// bwd_short_choice.cpp), by name as ab_masks.py names them: "docsN" (N documents of uniformly
// random cuts, causal inside), "windowW" (a causal window of W keys), "bigbirdB" (BigBird of
// B-token blocks: the neighbours, a global first block row and column, 3 random blocks per row).
// rng() % n, not <random>'s distributions, so a seed gives the same masks under every standard
// library (tests/test_backends.cpp draws its own the same way). Cuts differ from a timed draw.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>

#include "kernels/hopper/hopper_tiles.hpp"

namespace lab_plan {

inline seqpar::hopper::PairMask draw_mask(const std::string& name, int S, std::mt19937_64& rng) {
  seqpar::hopper::PairMask m;
  m.seq_q = m.seq_k = S;
  if (name.rfind("docs", 0) == 0) {
    const int n = std::stoi(name.substr(4));
    std::set<int64_t> cuts;
    while (int(cuts.size()) < n - 1) cuts.insert(1 + int64_t(rng() % uint64_t(S - 1)));
    m.doc_offsets = {0};
    m.doc_offsets.insert(m.doc_offsets.end(), cuts.begin(), cuts.end());
    m.doc_offsets.push_back(S);
    m.window_right = 0;
  } else if (name.rfind("window", 0) == 0) {
    m.window_left = std::stoi(name.substr(6)), m.window_right = 0;
  } else {  // bigbirdB
    const int block = std::stoi(name.substr(7));
    const int64_t nb = S / block;
    m.pattern_block = block;
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
  }
  return m;
}

}  // namespace lab_plan
