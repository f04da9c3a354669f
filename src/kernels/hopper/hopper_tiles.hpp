// Visible-tile lists of a mask for the Hopper kernels (issue 34, "masks at dense speed"): plain
// host C++ that the backend (hopper_backend.cpp) and the lab (dev/hopper_attention) run to turn
// a mask in global positions (a band (L, R), documents by offsets, a block-sparse pattern) over
// one shard pair, each side one run of consecutive positions or (band and documents) any
// increasing positions, several runs (a zigzag or documents-layout shard), into what the kernels
// read:
//   - per tile of one side (the forward: query tiles; the backward: key tiles) the tiles of the
//     other side that hold a visible pair, with a flag per entry saying which element masks that
//     tile needs (none: it is wholly visible and runs the unmasked path); wholly masked tiles
//     are not listed, so they cost nothing;
//   - per row of that side the interval of the other side's rows it sees under the band and
//     documents (one interval: see row_intervals), and the pattern as a bitmap, which is all a
//     boundary tile evaluates element by element;
//   - the tiles in the order each head's CTAs should take them (order_tiles);
//   - at D = 128, which backward kernel's tiles the backward's lists are made of (128 keys x 64
//     query rows, base; 128 x 80, q80; 64 x 64, short64), chosen per mask from the plans
//     (short_bwd_pays, tall_tiles_pay).
// Everything is laid out in one int32 blob (pack_tiles) that the caller uploads once per mask,
// shard pair and head dim, then points a TileMask (hopper_args.hpp) into it.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "kernels/hopper/hopper_args.hpp"

namespace seqpar::hopper {

// The mask of one shard pair in the kernels' terms. Rows i of q sit at position q0 + i, rows j of
// k at k0 + j, unless q_pos / k_pos hold each row's position (strictly increasing: a shard of
// several runs). The lists and intervals are in rows, so a tile may straddle two runs: under a
// band and documents the keys a query row sees are one run of key rows all the same (positions
// increase on both sides), and that interval is what a boundary tile evaluates. The kernels read
// a pattern's blocks from q0 + i and k0 + j: no pattern with q_pos or k_pos (the backend launches
// a pattern per pair of runs of step 1).
// Pattern: query block qb sees key block kb iff kb is in pattern_cols[pattern_begin[qb]
// .. pattern_begin[qb + 1]) (sorted); the grid of pattern_begin.size() - 1 blocks starts at 0.
struct PairMask {
  int64_t q0 = 0, k0 = 0;
  int seq_q = 0, seq_k = 0;
  std::vector<int64_t> q_pos, k_pos;            // empty: q0 + i, k0 + j
  int64_t window_left = -1, window_right = -1;  // -1 unbounded
  std::vector<int64_t> doc_offsets;             // empty: one document
  int64_t pattern_block = 0;                    // 0: no pattern
  std::vector<int64_t> pattern_begin, pattern_cols;
  bool has_pattern() const { return pattern_block > 0; }
  int64_t pattern_blocks() const { return has_pattern() ? int64_t(pattern_begin.size()) - 1 : 0; }
};


// The order in which one head's CTAs take the tiles (the kernels launch heads outer, so only one
// or two heads' tiles are in flight at once). A tile's work is its entry count.
//   kNeighbours (the default): position order, so the CTAs in flight are neighbours that read the
//     same rows of the other side (a document's, a window's) from L2, except that outliers (more
//     than 4x the mean count of the listed tiles: a BigBird global row) go first, heaviest first;
//     the kernels take every head's outliers before any head's other tiles (listed_unit), so the
//     last wave has no long list to wait for (with heads outer alone, the last head's global row
//     was a tail of 0.3 ms in a 1.7 ms BigBird forward at 32K).
//   kClasses: classes of entry counts within a factor of 2, heaviest class first, each in
//     position order.
//   kHeavyFirst: by descending entry count (longest-processing-time first; neighbours are apart).
//   kPosition: position order alone.
// Measured on one H100 (32K and 128K, README "Schedule"): heads outer is what counts (the
// backward's DRAM traffic on 16 documents fell from 27.7 to 3.1 GB); among these orders
// position order won on 256 documents (up to 1.2x over heaviest first), classes by 3% on BigBird.
// Position order runs in the direction causal masks make heavy first: the forward's query tiles
// from the last, the backward's key tiles from the first (the dense kernels' order).
enum class TileOrder { kNeighbours, kClasses, kHeavyFirst, kPosition };

// *heavy: how many outliers lead the order (kNeighbours; 0 otherwise).
inline std::vector<int32_t> order_tiles(const std::vector<int32_t>& begin, bool key_side, TileOrder how,
                                        int* heavy) {
  *heavy = 0;
  const int n = int(begin.size()) - 1;
  std::vector<int32_t> order(size_t(std::max(n, 0)));
  for (int i = 0; i < n; ++i) order[size_t(i)] = key_side ? i : n - 1 - i;
  const auto count = [&](int32_t t) { return begin[size_t(t) + 1] - begin[size_t(t)]; };
  const auto cls = [&](int32_t t) {
    int c = 0;
    for (int32_t x = count(t); x > 0; x >>= 1) ++c;  // 0 for empty, else floor(log2) + 1
    return c;
  };
  if (how == TileOrder::kHeavyFirst) {
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return count(x) > count(y); });
  } else if (how == TileOrder::kClasses) {
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return cls(x) > cls(y); });
  } else if (how == TileOrder::kNeighbours && n > 0) {
    int64_t listed = 0;
    for (int t = 0; t < n; ++t) listed += count(t) > 0;
    const int64_t cut = listed > 0 ? 4 * (int64_t(begin[size_t(n)]) - begin[0]) / listed : 0;
    const auto big = [&](int32_t t) { return count(t) > cut ? count(t) : 0; };
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return big(x) > big(y); });
    for (int t = 0; t < n; ++t) *heavy += big(t) > 0;
  }
  return order;
}

// One side's lists (see the top of the file), in host memory.
struct SideTiles {
  int tile_rows = 0, other_tile_rows = 0;
  std::vector<int32_t> begin, entries, order, ranges;
  std::vector<uint32_t> bits;  // [this side's pattern blocks][bits_words]; empty: no pattern
  int bits_words = 0;
  int heavy = 0;  // outliers leading `order` (order_tiles)
  int64_t entry_count() const { return int64_t(entries.size()); }
};

// Per query row i: the first and last key row it sees under the band and documents, clamped to
// [0, seq_k) (first > last: none). Both bounds never decrease with i (positions increase,
// documents are in order, the window is fixed; rows before every document or the pattern's grid
// get (0, -1), rows after it (seq_k, seq_k - 1)), which the lists and the key-side intervals
// rely on. Keys outside the pattern's grid are cut off here too.
inline std::vector<int32_t> row_intervals(const PairMask& m) {
  std::vector<int32_t> r(2 * size_t(m.seq_q));
  const int64_t big = int64_t(1) << 40;
  int64_t lo_grid = -big, hi_grid = big;
  if (m.has_pattern()) lo_grid = 0, hi_grid = m.pattern_blocks() * m.pattern_block - 1;
  size_t d = 0;  // the document of the current row (rows walk forward)
  const size_t nd = m.doc_offsets.empty() ? 0 : m.doc_offsets.size() - 1;
  for (int i = 0; i < m.seq_q; ++i) {
    const int64_t qp = m.q_pos.empty() ? m.q0 + i : m.q_pos[size_t(i)];
    int64_t lo = m.window_left >= 0 ? qp - m.window_left : -big;
    int64_t hi = m.window_right >= 0 ? qp + m.window_right : big;
    bool before = false, after = false;
    if (nd > 0) {
      while (d + 1 < nd && m.doc_offsets[d + 1] <= qp) ++d;
      if (qp < m.doc_offsets[0]) before = true;
      else if (qp >= m.doc_offsets[nd]) after = true;
      else lo = std::max(lo, m.doc_offsets[d]), hi = std::min(hi, m.doc_offsets[d + 1] - 1);
    }
    if (m.has_pattern()) {
      if (qp < lo_grid) before = true;
      if (qp > hi_grid) after = true;
      lo = std::max(lo, lo_grid), hi = std::min(hi, hi_grid);
    }
    int64_t a = lo - m.k0, b = hi - m.k0;
    if (!m.k_pos.empty()) {  // the key rows whose positions lie in [lo, hi]
      a = std::lower_bound(m.k_pos.begin(), m.k_pos.end(), lo) - m.k_pos.begin();
      b = std::upper_bound(m.k_pos.begin(), m.k_pos.end(), hi) - m.k_pos.begin() - 1;
    }
    if (before) a = 0, b = -1;
    if (after) a = m.seq_k, b = m.seq_k - 1;
    r[2 * size_t(i)] = int32_t(std::clamp<int64_t>(a, 0, m.seq_k));
    r[2 * size_t(i) + 1] = int32_t(std::clamp<int64_t>(b, -1, m.seq_k - 1));
  }
  return r;
}

// The transpose: per key row j the first and last query row that sees it (first > last: none).
// {i : lo_i <= j <= hi_i} is one run because both bounds never decrease with i.
inline std::vector<int32_t> column_intervals(const std::vector<int32_t>& rows, int seq_q, int seq_k) {
  std::vector<int32_t> c(2 * size_t(seq_k));
  int a = 0, b = 0;  // a: first row with hi >= j; b: past the last row with lo <= j
  for (int j = 0; j < seq_k; ++j) {
    while (a < seq_q && rows[2 * size_t(a) + 1] < j) ++a;
    while (b < seq_q && rows[2 * size_t(b)] <= j) ++b;
    c[2 * size_t(j)] = a;
    c[2 * size_t(j) + 1] = b - 1;
  }
  return c;
}

// Whole blocks of the pattern row qb within [kb_lo, kb_hi]: 0 (none), 1 (some), 2 (all).
inline int pattern_cover(const PairMask& m, int64_t qb, int64_t kb_lo, int64_t kb_hi) {
  if (qb < 0 || qb >= m.pattern_blocks() || kb_hi < kb_lo) return 0;
  const auto first = m.pattern_cols.begin() + m.pattern_begin[qb], last = m.pattern_cols.begin() + m.pattern_begin[qb + 1];
  const int64_t n = std::upper_bound(first, last, kb_hi) - std::lower_bound(first, last, kb_lo);
  return n == 0 ? 0 : n == kb_hi - kb_lo + 1 ? 2 : 1;
}

// Pattern bitmaps: rows = this side's blocks, bit c of a row = (other side's block c visible);
// with `transpose`, rows are key blocks. Three spare words per row, so a kernel may read a
// 64-bit window starting at any block of the grid.
inline void pattern_bitmap(const PairMask& m, bool transpose, std::vector<uint32_t>* bits, int* words) {
  const int64_t n = m.pattern_blocks();
  *words = int(n / 32 + 3);
  bits->assign(size_t(n) * size_t(*words), 0u);
  for (int64_t qb = 0; qb < n; ++qb)
    for (int64_t e = m.pattern_begin[qb]; e < m.pattern_begin[qb + 1]; ++e) {
      const int64_t kb = m.pattern_cols[e];
      const int64_t r = transpose ? kb : qb, c = transpose ? qb : kb;
      (*bits)[size_t(r) * *words + size_t(c / 32)] |= 1u << (c % 32);
    }
}

// One side's lists. `rows` are this side's intervals over the other side (row_intervals, or
// column_intervals for the key side), n rows in tiles of tile_rows, the other side n_other rows
// in tiles of other_rows. pos0 / other_pos0: the sides' first positions (for the pattern).
// Entries of a tile are listed from the last other-side tile to the first. pattern_cap >= 0: give
// up (returning lists with an empty `begin`) once more than pattern_cap entries need the
// pattern's element mask (plan_tiles' second backward plan, which has then lost).
inline SideTiles side_tiles(const PairMask& m, const std::vector<int32_t>& rows, int n, int n_other, int tile_rows,
                            int other_rows, int64_t pos0, int64_t other_pos0, bool key_side,
                            TileOrder how = TileOrder::kNeighbours, int64_t pattern_cap = -1) {
  SideTiles t;
  int64_t pattern_masked = 0;
  t.tile_rows = tile_rows, t.other_tile_rows = other_rows;
  const int n_tiles = (n + tile_rows - 1) / tile_rows;
  const int n_other_tiles = (n_other + other_rows - 1) / other_rows;
  t.begin.assign(size_t(n_tiles) + 1, 0);
  const int64_t bs = m.pattern_block;
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int first = tile * tile_rows, last = std::min(n, first + tile_rows) - 1;
    const int lo_first = rows[2 * size_t(first)], hi_last = rows[2 * size_t(last) + 1];
    const int lo_last = rows[2 * size_t(last)], hi_first = rows[2 * size_t(first) + 1];
    t.begin[size_t(tile)] = int32_t(t.entries.size());
    if (lo_first > hi_last) continue;  // (both bounds rise: nothing in between either)
    const int ot_lo = lo_first / other_rows, ot_hi = std::min(n_other_tiles - 1, hi_last / other_rows);
    for (int ot = ot_hi; ot >= ot_lo; --ot) {
      const int a = ot * other_rows, b_full = a + other_rows - 1, b = std::min(n_other - 1, b_full);
      // Any row of this tile seeing [a, b]: the first row with hi >= a must have lo <= b.
      int x = first, y = last + 1;
      while (x < y) {
        const int mid = (x + y) / 2;
        if (rows[2 * size_t(mid) + 1] >= a) y = mid;
        else x = mid + 1;
      }
      if (x > last || rows[2 * size_t(x)] > b) continue;
      int flags = 0;
      // Wholly visible: every row of the tile sees every row of the other tile, which must be
      // whole (rows past the other side's end are zero-filled by TMA and must be masked). On the
      // key side, the query tile may run past S_q: those rows carry LSE2 = +inf in the backward.
      if (!(lo_last <= a && hi_first >= b_full && b_full < n_other)) flags |= kTileRangeMask;
      if (m.has_pattern()) {
        // Blocks of the rows of this tile that see something, and of the other tile.
        const int64_t p_lo = std::max<int64_t>(0, pos0 + first), p_hi = pos0 + last;
        const int64_t o_lo = std::max<int64_t>(0, other_pos0 + a), o_hi = other_pos0 + b;
        const int64_t b_lo = p_lo / bs, b_hi = p_hi / bs, ob_lo = o_lo / bs, ob_hi = o_hi / bs;
        bool any = false, all = true;
        if (!key_side) {  // this side's blocks are query blocks: pattern rows, checked as ranges
          for (int64_t qb = b_lo; qb <= b_hi; ++qb) {
            const int c = pattern_cover(m, qb, ob_lo, ob_hi);
            any |= c > 0, all &= c == 2;
          }
        } else {  // key blocks: every query block of the other tile against each
          for (int64_t kb = b_lo; kb <= b_hi; ++kb)
            for (int64_t qb = ob_lo; qb <= ob_hi; ++qb) {
              const int c = pattern_cover(m, qb, kb, kb);
              any |= c > 0, all &= c == 2;
            }
        }
        if (!any) continue;
        if (!all) flags |= kTilePatternMask;
        if (!all && pattern_cap >= 0 && ++pattern_masked > pattern_cap) return SideTiles{};
      }
      t.entries.push_back(int32_t(ot) << 2 | flags);
    }
  }
  t.begin[size_t(n_tiles)] = int32_t(t.entries.size());
  t.order = order_tiles(t.begin, key_side, how, &t.heavy);
  t.ranges = rows;
  if (m.has_pattern()) pattern_bitmap(m, key_side, &t.bits, &t.bits_words);
  return t;
}

// Entries of one side's lists that need the pattern's element mask.
inline int64_t pattern_masked(const SideTiles& t) {
  return std::count_if(t.entries.begin(), t.entries.end(), [](int32_t e) { return (e & kTilePatternMask) != 0; });
}

// Whether the backward's lists of a mask should be the `tall` ones (q80: 80-row query tiles)
// rather than the `narrow` ones (base: 64 rows), from both plans of the key side. q80 runs a
// wholly visible query row about 1.13x faster than base (dense, dev/hopper_attention/README.md,
// "80-row query tiles"), but a mask's edges cut 80-row tiles more often: it computes every row of
// a listed tile, so its work grows with 80 x its entries, and a pattern whose blocks an 80-row
// tile straddles adds element-masked tiles (README, "Masked backward at D = 128 on q80", one
// H200, 32K: rows 80 x q80 / 64 x base 1.014 and 1.016 (16 documents, a 4K window): q80 1.06x
// and 1.07x base; 1.12 (256 documents): 0.90x; 1.27 and 1825 pattern-masked tiles where base had
// none (BigBird, 128-token blocks): 0.73x). So tall where it computes at most a few percent more
// query rows (below) and flags no more tiles for the pattern. The routed backward measured after
// (README, one H200, 32K and 128K): every mask at 1.005-1.019 gained 6-14% (backward alone); the
// break-even lies near 1.05 (a 1K window, 1.056: 1.01x; 64 documents at 32K, 1.057, and 256 at
// 128K, 1.054: 0.99x; session v, 8K: 16 documents, 1.04, 1.00x). A 4K window at 8K, 1.023, gained
// 1.078x (session v), which a threshold of 1.02 left to base; so 1.03, which keeps a margin.
inline bool tall_tiles_pay(const SideTiles& narrow, const SideTiles& tall) {
  const int64_t rows_narrow = int64_t(narrow.other_tile_rows) * narrow.entry_count();
  const int64_t rows_tall = int64_t(tall.other_tile_rows) * tall.entry_count();
  return rows_tall * 100 <= rows_narrow * 103 && pattern_masked(tall) <= pattern_masked(narrow);
}

// Whether the forward's lists of a mask should be the `short_` ones (64 x 64 tiles, the short-tile
// kernel: one consumer warpgroup, two CTAs per SM) rather than the `tall` ones (128 x 192, the
// persistent kernel), from both plans of the query side: the scores each computes are its entries
// x tile rows x tile keys. Measured on one H200 (dev/hopper_attention/README.md, "Forward on 64 x
// 64 tiles for short lists", 24 mask cells at 32K-128K): the short kernel runs a wholly visible
// score at 0.75-0.77 of the tall one's rate, and where its lists are short its second CTA hides
// the per-tile latency the tall kernel leaves exposed. Every cell where it computed at most 0.770
// of the tall plan's scores was faster (1.09-3.5x: 64 and 256 documents at 32K, 256 at 128K,
// windows of 256 and 512, BigBird of 64- to 256-token blocks); every cell from 0.846 up was slower
// (0.80-0.97x: 16 documents, 64 at 128K, windows of 1K and 4K). So short where it computes at most
// 0.80 of the scores. (The lab's A/B reports the choice from its plans' scores: short_scores_pay.)
inline bool short_scores_pay(int64_t computed_tall, int64_t computed_short) {
  return computed_short * 100 <= computed_tall * 80;
}
inline bool short_tiles_pay(const SideTiles& tall, const SideTiles& short_) {
  return short_scores_pay(int64_t(tall.tile_rows) * tall.other_tile_rows * tall.entry_count(),
                          int64_t(short_.tile_rows) * short_.other_tile_rows * short_.entry_count());
}

// Whether the backward's lists of a mask should be the `short_` ones (64-key tiles x 64-row query
// tiles, the short-tile backward: one consumer warpgroup, two CTAs per SM) rather than base's (128
// keys x 64 rows), from both plans of the key side: the scores each computes are its entries x
// tile keys x query rows. Measured on one H200 (dev/hopper_attention/README.md, "Backward on
// 64-key tiles for short lists"): the short kernel runs a wholly visible score at about 0.87 of
// base's rate (dense causal, 32K), and where its lists are short its second CTA hides the latency
// that base leaves exposed on a key tile listing 2-3 query tiles. At 0.770 of base's scores (256
// documents at 32K) it was 1.062-1.069x base in two calls; at 0.90-0.91 (a 512 window, 64
// documents at 32K, 256 at 128K) 0.97-1.01x; from 0.978 up (16 documents, a 4K window, BigBird of
// 128-token blocks) 0.83-0.93x. So short where it computes at most 0.85 of base's scores.
inline bool short_bwd_scores_pay(int64_t computed_base, int64_t computed_short) {
  return computed_short * 100 <= computed_base * 85;
}
inline bool short_bwd_pays(const SideTiles& base, const SideTiles& short_) {
  return short_bwd_scores_pay(int64_t(base.tile_rows) * base.other_tile_rows * base.entry_count(),
                              int64_t(short_.tile_rows) * short_.other_tile_rows * short_.entry_count());
}
// Entries of a side's lists that need an element mask (range or pattern).
inline int64_t flagged_entries(const SideTiles& t) {
  return std::count_if(t.entries.begin(), t.entries.end(), [](int32_t e) { return (e & 3) != 0; });
}
// Whether the short backward plan could pay, from base's plan alone (n: base's side's rows), where
// the short key tile is half of base's and the query tiles are the same: a wholly visible base
// entry becomes two wholly visible short entries (the same scores), a flagged one, or one of a
// last key tile of at most half a tile's rows, one or two. So the short plan computes at least
// 1 - halvable / (2 entries) of base's scores, and short_bwd_pays needs the halvable entries to be
// at least 30% of base's. Skipping the plan otherwise keeps the choice and saves the host most of
// its cost where it cannot pay (BigBird of 128-token blocks at 128K: backend_plan 181 -> 110 ms
// on the 2-core CPU machine; dev/hopper_attention/plan_choice.cpp).
inline bool short_bwd_may_pay(const SideTiles& base, int n) {
  int64_t halvable = flagged_entries(base);
  const int tiles = int(base.begin.size()) - 1, tail = n % base.tile_rows;
  if (tiles > 0 && tail > 0 && 2 * tail <= base.tile_rows)
    for (int32_t e = base.begin[size_t(tiles - 1)]; e < base.begin[size_t(tiles)]; ++e)
      halvable += (base.entries[size_t(e)] & 3) == 0;
  return 10 * halvable >= 3 * base.entry_count();
}

// Both sides' lists of a pair: the forward's per query tile (fwd_bm query rows, fwd_bn keys), the
// backward's per key tile (bwd_bn keys, bwd_bm query rows; or, with bwd_short_bn > 0, bwd_short_bn
// keys where short_bwd_pays says so; else, with bwd_bm_tall > 0, bwd_bm_tall rows where
// tall_tiles_pay says so: each is planned, the others dropped); likewise the forward's of
// fwd_short_bm x fwd_short_bn tiles where those are > 0 and short_tiles_pay says so. The tall plan stops
// as soon as it flags more tiles for the pattern than the narrow one: on BigBird of 128-token
// blocks at 128K the backend's plan then takes 51 ms on the CPU, as with one backward plan (89 ms
// without the stop; dev/hopper_attention/plan_choice.cpp).
struct TilePlan {
  SideTiles fwd, bwd;
};
inline TilePlan plan_tiles(const PairMask& m, int fwd_bm, int fwd_bn, int bwd_bm, int bwd_bn,
                           TileOrder how = TileOrder::kNeighbours, int bwd_bm_tall = 0, int fwd_short_bm = 0,
                           int fwd_short_bn = 0, int bwd_short_bn = 0) {
  TilePlan p;
  const std::vector<int32_t> rows = row_intervals(m);
  p.fwd = side_tiles(m, rows, m.seq_q, m.seq_k, fwd_bm, fwd_bn, m.q0, m.k0, false, how);
  if (fwd_short_bm > 0) {
    SideTiles short_ = side_tiles(m, rows, m.seq_q, m.seq_k, fwd_short_bm, fwd_short_bn, m.q0, m.k0, false, how);
    if (short_tiles_pay(p.fwd, short_)) p.fwd = std::move(short_);
  }
  const std::vector<int32_t> cols = column_intervals(rows, m.seq_q, m.seq_k);
  p.bwd = side_tiles(m, cols, m.seq_k, m.seq_q, bwd_bn, bwd_bm, m.k0, m.q0, true, how);
  if (bwd_short_bn > 0 && (2 * bwd_short_bn != bwd_bn || short_bwd_may_pay(p.bwd, m.seq_k))) {
    SideTiles short_ = side_tiles(m, cols, m.seq_k, m.seq_q, bwd_short_bn, bwd_bm, m.k0, m.q0, true, how);
    if (short_bwd_pays(p.bwd, short_)) {
      p.bwd = std::move(short_);
      return p;
    }
  }
  if (bwd_bm_tall > 0) {
    SideTiles tall =
        side_tiles(m, cols, m.seq_k, m.seq_q, bwd_bn, bwd_bm_tall, m.k0, m.q0, true, how, pattern_masked(p.bwd));
    if (!tall.begin.empty() && tall_tiles_pay(p.bwd, tall)) p.bwd = std::move(tall);
  }
  return p;
}
// The lists the backend (hopper_backend.cpp) runs at head dim D: tile_shape's tiles, each side's
// tile chosen per mask where two kernels take its lists (D = 128).
inline TilePlan backend_plan(const PairMask& m, int head_dim) {
  const TileShape ts = tile_shape(head_dim);
  return plan_tiles(m, ts.fwd_bm, ts.fwd_bn, ts.bwd_bm, ts.bwd_bn, TileOrder::kNeighbours, ts.bwd_bm_tall,
                    ts.fwd_short_bm, ts.fwd_short_bn, ts.bwd_short_bn);
}

// Visible (query, key) pairs of the mask, exactly (band, documents and pattern): the FLOP count
// of a masked benchmark. O(S_q * pattern blocks a row's interval meets).
inline double visible_pairs(const PairMask& m) {
  const std::vector<int32_t> rows = row_intervals(m);
  double n = 0;
  for (int i = 0; i < m.seq_q; ++i) {
    const int64_t lo = rows[2 * size_t(i)], hi = rows[2 * size_t(i) + 1];
    if (lo > hi) continue;
    if (!m.has_pattern()) {
      n += double(hi - lo + 1);
      continue;
    }
    const int64_t qb = (m.q0 + i) / m.pattern_block;
    for (int64_t e = m.pattern_begin[qb]; e < m.pattern_begin[qb + 1]; ++e) {
      const int64_t kb = m.pattern_cols[e];
      const int64_t a = std::max(lo, kb * m.pattern_block - m.k0), b = std::min(hi, (kb + 1) * m.pattern_block - 1 - m.k0);
      if (b >= a) n += double(b - a + 1);
    }
  }
  return n;
}

// Whether the kernels' element mask of a pattern can run on this pair: blocks of a power of two
// of at least 8 positions (a tile then meets at most 25 blocks of the other side, inside a 32-bit
// window; shifts, where a division by a runtime block size spilled registers in the backward).
// Empty when it can; else why not.
inline std::string pattern_refusal(int64_t block, int64_t blocks) {
  if (block < 8 || (block & (block - 1)) != 0)
    return "the Hopper kernels take block-sparse patterns with blocks of a power of two of at least 8 tokens, not " +
           std::to_string(block);
  if (blocks > 16384)
    return "the Hopper kernels take block-sparse patterns of at most 16384 blocks (a 32 MiB bitmap), not " +
           std::to_string(blocks);
  return {};
}

// One blob of int32 holding both sides' lists; TileMask views of it at a device address.
struct PackedTiles {
  std::vector<int32_t> blob;
  size_t off[2][5] = {};  // per side: begin, entries, order, ranges, bits (in int32 units)
  int bits_words[2] = {0, 0};
  int heavy[2] = {0, 0};
  int64_t pos0[2] = {0, 0}, other_pos0[2] = {0, 0};
  int block = 0;
  int64_t entries[2] = {0, 0};
  int query_rows[2] = {0, 0};  // per side: rows of its lists' query tiles (TileMask::query_rows)
  int key_rows[2] = {0, 0};    // per side: keys of its lists' key tiles (TileMask::key_rows)
};
inline PackedTiles pack_tiles(const TilePlan& p, const PairMask& m) {
  PackedTiles k;
  const SideTiles* sides[2] = {&p.fwd, &p.bwd};
  for (int s = 0; s < 2; ++s) {
    const SideTiles& t = *sides[s];
    const auto put = [&](const auto& v, int slot) {
      k.off[s][slot] = k.blob.size();
      for (auto x : v) k.blob.push_back(int32_t(x));
      while (k.blob.size() % 4) k.blob.push_back(0);  // 16-byte aligned pieces
    };
    put(t.begin, 0), put(t.entries, 1), put(t.order, 2), put(t.ranges, 3), put(t.bits, 4);
    k.bits_words[s] = t.bits_words;
    k.heavy[s] = t.heavy;
    k.entries[s] = t.entry_count();
  }
  k.query_rows[0] = p.fwd.tile_rows, k.query_rows[1] = p.bwd.other_tile_rows;
  k.key_rows[0] = p.fwd.other_tile_rows, k.key_rows[1] = p.bwd.tile_rows;
  k.pos0[0] = m.q0, k.other_pos0[0] = m.k0;
  k.pos0[1] = m.k0, k.other_pos0[1] = m.q0;
  k.block = int(m.pattern_block);
  return k;
}
// side 0: the forward's (query tiles); 1: the backward's (key tiles). `device` holds the blob.
inline TileMask tile_mask_view(const PackedTiles& k, int side, const void* device) {
  const int32_t* base = static_cast<const int32_t*>(device);
  TileMask t{};
  t.begin = base + k.off[side][0];
  t.entries = base + k.off[side][1];
  t.order = base + k.off[side][2];
  t.ranges = base + k.off[side][3];
  t.bits = k.bits_words[side] ? reinterpret_cast<const uint32_t*>(base + k.off[side][4]) : nullptr;
  t.bits_words = k.bits_words[side];
  t.heavy = k.heavy[side];
  t.block_shift = 0;
  while (k.block > 1 && (1 << (t.block_shift + 1)) <= k.block) ++t.block_shift;
  t.pos0 = int(k.pos0[side]);
  t.other_pos0 = int(k.other_pos0[side]);
  t.query_rows = k.query_rows[side];
  t.key_rows = k.key_rows[side];
  return t;
}

}  // namespace seqpar::hopper
