// lab_masks.hpp: the masks the lab's drivers check and time the visible-tile-list kernels on
// (plain C++, shared by hopper_fwd_test.cu, hopper_bwd_test.cu, hopper_mask_lib.cu and
// tiles_selftest.cpp): the brute-force definition of a PairMask (hopper_tiles.hpp) for the CPU
// oracles, and masks made from a short spec over a pair of lengths:
//   docs[:N]        documents of random lengths (cut points drawn from `seed`; without N, lengths
//                   of 1 token and up, so 1-token documents occur), causal inside
//   docsfull[:N]    the same without the causal band
//   window:L,R      the band alone (4K-style sliding window: window:4096,0)
//   bigbird:B       a block pattern of B-token blocks: each block sees its neighbours, the first
//                   block is global, plus one random block per row; bigbirdc:B, the same causal
// Positions: offset >= 0 puts the queries at offset.., keys at 0..; offset < 0 the keys at -offset..
// (so key j is visible from query i under causal iff j <= i + offset, as the kernels' causal_offset).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/hopper/hopper_tiles.hpp"

namespace lab {

using seqpar::hopper::PairMask;

// Whether key position kp is visible from query position qp: the definition, per element.
inline bool allows(const PairMask& m, int64_t qp, int64_t kp) {
  if (m.window_left >= 0 && qp - kp > m.window_left) return false;
  if (m.window_right >= 0 && kp - qp > m.window_right) return false;
  if (!m.doc_offsets.empty()) {
    const auto& o = m.doc_offsets;
    if (qp < o.front() || qp >= o.back() || kp < o.front() || kp >= o.back()) return false;
    if (std::upper_bound(o.begin(), o.end(), qp) != std::upper_bound(o.begin(), o.end(), kp)) return false;
  }
  if (m.has_pattern()) {
    const int64_t n = m.pattern_blocks() * m.pattern_block;
    if (qp < 0 || kp < 0 || qp >= n || kp >= n) return false;
    const int64_t qb = qp / m.pattern_block, kb = kp / m.pattern_block;
    const auto first = m.pattern_cols.begin() + m.pattern_begin[qb], last = m.pattern_cols.begin() + m.pattern_begin[qb + 1];
    return std::binary_search(first, last, kb);
  }
  return true;
}

// Document offsets over [0, total): n documents with random cut points, or (n = 0) lengths drawn
// so that 1-token documents are common.
inline std::vector<int64_t> random_documents(int64_t total, int n, std::mt19937_64& rng) {
  std::vector<int64_t> o{0};
  if (n > 0) {
    std::vector<int64_t> cuts;
    std::uniform_int_distribution<int64_t> u(1, std::max<int64_t>(1, total - 1));
    while (int(cuts.size()) < std::min<int64_t>(n - 1, total - 1)) {
      const int64_t c = u(rng);
      if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
    }
    std::sort(cuts.begin(), cuts.end());
    o.insert(o.end(), cuts.begin(), cuts.end());
  } else {
    std::uniform_int_distribution<int64_t> u(1, std::max<int64_t>(2, total / 4));
    while (o.back() < total) o.push_back(std::min(total, o.back() + (rng() % 3 == 0 ? 1 : u(rng))));
  }
  if (o.back() != total) o.push_back(total);
  return o;
}

// A BigBird-like pattern over `blocks` blocks (see the top of the file).
inline void bigbird(PairMask* m, int64_t block, int64_t blocks, bool causal, std::mt19937_64& rng) {
  m->pattern_block = block;
  m->pattern_begin = {0};
  m->pattern_cols.clear();
  for (int64_t qb = 0; qb < blocks; ++qb) {
    std::vector<int64_t> row;
    for (int64_t kb = std::max<int64_t>(0, qb - 1); kb <= std::min(blocks - 1, qb + 1); ++kb) row.push_back(kb);
    row.push_back(0);
    const int64_t hi = causal ? qb : blocks - 1;
    row.push_back(int64_t(rng() % uint64_t(hi + 1)));
    if (!causal && qb == 0)
      for (int64_t kb = 0; kb < blocks; ++kb) row.push_back(kb);  // the global block sees all
    if (causal) row.erase(std::remove_if(row.begin(), row.end(), [&](int64_t kb) { return kb > qb; }), row.end());
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());
    m->pattern_cols.insert(m->pattern_cols.end(), row.begin(), row.end());
    m->pattern_begin.push_back(int64_t(m->pattern_cols.size()));
  }
  if (causal) m->window_right = 0;
}

// The mask of `spec` for S_q query rows and S_k keys at the offset (see the top of the file).
// Returns false for an unknown spec.
inline bool make_mask(const std::string& spec, int Sq, int Sk, int offset, uint64_t seed, PairMask* m) {
  std::mt19937_64 rng(seed);
  *m = PairMask{};
  m->seq_q = Sq, m->seq_k = Sk;
  m->q0 = offset > 0 ? offset : 0;
  m->k0 = offset < 0 ? -offset : 0;
  const int64_t total = std::max(m->q0 + Sq, m->k0 + Sk);
  const auto colon = spec.find(':');
  const std::string kind = spec.substr(0, colon), arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (kind == "docs" || kind == "docsfull") {
    m->doc_offsets = random_documents(total, arg.empty() ? 0 : std::atoi(arg.c_str()), rng);
    if (kind == "docs") m->window_right = 0;
  } else if (kind == "window") {
    const auto comma = arg.find(',');
    if (comma == std::string::npos) return false;
    m->window_left = std::atoll(arg.substr(0, comma).c_str());
    m->window_right = std::atoll(arg.substr(comma + 1).c_str());
  } else if (kind == "bigbird" || kind == "bigbirdc") {
    const int64_t block = arg.empty() ? 64 : std::atoll(arg.c_str());
    bigbird(m, block, (total + block - 1) / block, kind == "bigbirdc", rng);
  } else {
    return false;
  }
  return true;
}

}  // namespace lab
