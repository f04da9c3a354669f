// tiles_selftest.cpp: CPU-only check of the visible-tile lists (src/kernels/hopper/hopper_tiles.hpp)
// against brute force, on random masks (documents of random lengths incl. 1-token ones, windows,
// block patterns, offsets between the sides, odd lengths): every visible (query, key) pair lies in
// a listed tile pair of both sides' lists; an entry without flags is wholly visible; an entry's
// element mask as the kernels evaluate it (row interval, then the pattern's hidden block runs as
// hopper_mask.cuh walks them) equals the mask; wholly masked tile pairs are not listed (exact
// for band and documents, whose tiles the lists decide exactly). Runs here, no GPU needed:
//   g++ -std=c++20 -O2 -I src dev/hopper_attention/tiles_selftest.cpp -o /tmp/tiles_selftest && /tmp/tiles_selftest
#include <algorithm>
#include <cstdio>
#include <random>
#include <map>
#include <set>

#include "kernels/hopper/hopper_tiles.hpp"

using namespace seqpar::hopper;

static bool allows(const PairMask& m, int64_t qp, int64_t kp) {
  if (m.window_left >= 0 && qp - kp > m.window_left) return false;
  if (m.window_right >= 0 && kp - qp > m.window_right) return false;
  if (!m.doc_offsets.empty()) {
    const auto& o = m.doc_offsets;
    if (qp < o.front() || qp >= o.back() || kp < o.front() || kp >= o.back()) return false;
    const auto dq = std::upper_bound(o.begin(), o.end(), qp), dk = std::upper_bound(o.begin(), o.end(), kp);
    if (dq != dk) return false;
  }
  if (m.has_pattern()) {
    const int64_t n = m.pattern_blocks() * m.pattern_block;
    if (qp < 0 || kp < 0 || qp >= n || kp >= n) return false;
    return pattern_cover(m, qp / m.pattern_block, kp / m.pattern_block, kp / m.pattern_block) == 2;
  }
  return true;
}

// The kernels' element test for this side's row r, other-side index c, with entry flags.
static bool kernel_keeps(const SideTiles& t, const PairMask& m, int64_t pos0, int64_t other_pos0, int r, int n,
                         int c, int tile_first, int flags) {
  const int lo = r < n ? t.ranges[2 * r] : 1, hi = r < n ? t.ranges[2 * r + 1] : 0;
  if ((flags & 1) && (c < lo || c > hi)) return false;
  if ((flags & 2) && lo <= hi) {
    const int64_t bs = m.pattern_block;
    const int64_t kb0 = (other_pos0 + tile_first) / bs, qb = (pos0 + r) / bs;
    const int64_t d = (other_pos0 + c) / bs - kb0;
    if (d < 0 || d >= 32) return false;
    const int64_t b = kb0 + d;  // the window reads the bitmap (zero past the grid)
    if (b >= m.pattern_blocks()) return false;
    const uint32_t w = t.bits[size_t(qb) * t.bits_words + size_t(b / 32)];
    if (!((w >> (b % 32)) & 1u)) return false;
  }
  return true;
}

static int check_side(const PairMask& m, const SideTiles& t, bool key_side, const char* what) {
  const int n = key_side ? m.seq_k : m.seq_q, no = key_side ? m.seq_q : m.seq_k;
  const int64_t pos0 = key_side ? m.k0 : m.q0, other0 = key_side ? m.q0 : m.k0;
  const int tr = t.tile_rows, orows = t.other_tile_rows;
  int bad = 0;
  const int n_tiles = (n + tr - 1) / tr, n_other = (no + orows - 1) / orows;
  for (int tile = 0; tile < n_tiles; ++tile) {
    std::map<int, int> listed;
    for (int e = t.begin[tile]; e < t.begin[tile + 1]; ++e) listed[t.entries[e] >> 2] = t.entries[e] & 3;
    for (int ot = 0; ot < n_other; ++ot) {
      bool any = false, all = (ot + 1) * orows <= no;
      for (int r = tile * tr; r < std::min(n, (tile + 1) * tr); ++r)
        for (int c = ot * orows; c < std::min(no, (ot + 1) * orows); ++c) {
          const bool v = key_side ? allows(m, m.q0 + c, m.k0 + r) : allows(m, m.q0 + r, m.k0 + c);
          any |= v, all &= v;
          auto it = listed.find(ot);
          if (v && it == listed.end()) {
            if (bad++ < 5) std::printf("  %s: visible pair (%d, %d) in an unlisted tile pair\n", what, r, c);
          } else if (it != listed.end()) {
            const bool keep = it->second == 0 || kernel_keeps(t, m, pos0, other0, r, n, c, ot * orows, it->second);
            if (keep != v && bad++ < 5)
              std::printf("  %s: tile (%d, %d) flags %d: element (%d, %d) kept %d, visible %d\n", what, tile, ot,
                          it->second, r, c, keep, v);
          }
        }
      auto it = listed.find(ot);
      if (!m.has_pattern() && !any && it != listed.end() && bad++ < 5)
        std::printf("  %s: wholly masked tile (%d, %d) listed\n", what, tile, ot);
      (void)all;
    }
  }
  return bad;
}

int main() {
  std::mt19937_64 rng(7);
  int fails = 0, cases = 0;
  auto U = [&](int a, int b) { return int(std::uniform_int_distribution<int>(a, b)(rng)); };
  for (int iter = 0; iter < 300; ++iter) {
    PairMask m;
    const int total = U(50, 900);
    m.seq_q = U(1, total), m.seq_k = U(1, total);
    m.q0 = U(0, total - m.seq_q), m.k0 = U(0, total - m.seq_k);
    const int kind = iter % 4;
    if (kind == 0 || kind == 3) {  // documents of random lengths, some of 1 token
      m.doc_offsets = {0};
      while (m.doc_offsets.back() < total) {
        const int len = U(0, 3) == 0 ? 1 : U(1, 200);
        m.doc_offsets.push_back(std::min<int64_t>(total, m.doc_offsets.back() + len));
      }
      if (U(0, 1)) m.window_right = 0;  // causal inside
    }
    if (kind == 1 || kind == 3) m.window_left = U(0, 150), m.window_right = U(0, 1) ? U(0, 40) : -1;
    if (kind == 2) {
      m.pattern_block = 8 << U(0, 3);
      const int nb = (total + int(m.pattern_block) - 1) / int(m.pattern_block) - U(0, 1);
      m.pattern_begin = {0};
      for (int qb = 0; qb < nb; ++qb) {
        for (int kb = 0; kb < nb; ++kb)
          if (std::abs(qb - kb) <= 1 || kb == 0 || U(0, 5) == 0) m.pattern_cols.push_back(kb);
        m.pattern_begin.push_back(int64_t(m.pattern_cols.size()));
      }
      if (U(0, 1)) m.window_right = 0;
    }
    // (fwd_bm, fwd_bn, bwd_bm, bwd_bn): the forward's tiles at D = 128 and 64; the backward's
    // query tiles of base (64), q80 (80, D = 128) and q128 (128, D = 64).
    const int shapes[4][4] = {{128, 192, 64, 128}, {192, 128, 64, 128}, {128, 192, 80, 128}, {192, 128, 128, 128}};
    const int* s = shapes[(iter / 4) % 4];
    const TileOrder orders[4] = {TileOrder::kNeighbours, TileOrder::kClasses, TileOrder::kHeavyFirst, TileOrder::kPosition};
    const TileOrder how = orders[iter % 4];
    // At D = 128 (64-row backward tiles) as the backend plans: the 80-row backward lists where
    // tall_tiles_pay takes them, so both kinds are checked.
    const TilePlan p = plan_tiles(m, s[0], s[1], s[2], s[3], how, s[0] == 128 && s[2] == 64 ? 80 : 0);
    int bad = check_side(m, p.fwd, false, "fwd") + check_side(m, p.bwd, true, "bwd");
    // Every order is a permutation of the tiles (each CTA of a head takes one, none twice).
    for (const SideTiles* t : {&p.fwd, &p.bwd}) {
      std::vector<int32_t> o = t->order;
      std::sort(o.begin(), o.end());
      for (size_t i = 0; i < o.size(); ++i) bad += o[i] != int32_t(i);
      bad += o.size() + 1 != t->begin.size();
    }
    // The visible-pair count against brute force.
    double brute = 0;
    for (int i = 0; i < m.seq_q; ++i)
      for (int j = 0; j < m.seq_k; ++j) brute += allows(m, m.q0 + i, m.k0 + j);
    const bool count_ok = brute == visible_pairs(m);
    ++cases;
    if (bad || !count_ok) {
      ++fails;
      std::printf("FAIL case %d kind %d Sq %d Sk %d q0 %ld k0 %ld window %ld,%ld docs %zu block %ld: %d bad, pairs %g vs %g\n",
                  iter, kind, m.seq_q, m.seq_k, long(m.q0), long(m.k0), long(m.window_left), long(m.window_right),
                  m.doc_offsets.size(), long(m.pattern_block), bad, visible_pairs(m), brute);
    }
  }
  // listed_unit (hopper_args.hpp): every (rank, head) of a grid exactly once.
  for (int iter = 0; iter < 200; ++iter) {
    const int tiles = U(1, 40), heads = U(1, 9), heavy = U(0, tiles);
    std::vector<int> seen(size_t(tiles) * heads, 0);
    for (int y = 0; y < heads; ++y)
      for (int x = 0; x < tiles; ++x) {
        int rank = -1, head = -1;
        listed_unit(x, y, tiles, heads, heavy, &rank, &head);
        if (rank >= 0 && rank < tiles && head >= 0 && head < heads) ++seen[size_t(head) * tiles + rank];
      }
    ++cases;
    if (std::count(seen.begin(), seen.end(), 1) != tiles * heads) {
      ++fails;
      std::printf("FAIL listed_unit tiles %d heads %d heavy %d\n", tiles, heads, heavy);
    }
  }
  std::printf("tiles selftest: %d/%d cases pass\n", cases - fails, cases);
  return fails ? 1 : 0;
}
