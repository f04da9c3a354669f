// short_rule.hpp: the lab's proposed rule for routing a mask's forward to the short-tile kernel
// (persist64, src/kernels/hopper/hopper_fwd_short.cuh: 64 x 64 tiles, two CTAs per SM) rather than
// the backend's persistent 128 x 192 kernel (persist192), from both forward plans' sizes: the
// scores each computes are its entries x tile rows x tile keys. Measured on one H200 (README,
// "Forward on 64 x 64 tiles for short lists (session u)", call 1): persist64 runs a computed score
// at about 0.76 of persist192's rate where lists are long (dense causal: 501 vs 656 TFLOP/s), and
// faster than that where they are short (its two CTAs per SM hide the per-tile latency). Where its
// computed scores were <= 0.77 of persist192's it won (1.085x-3.5x: 256 and 64 documents at 32K,
// 256 at 128K, BigBird of 128- and 64-token blocks); at >= 0.85 it lost (0.80-0.97x: 16 documents,
// 64 at 128K, windows of 1K and 4K). So: short where it computes at most 0.80 of the scores.
#pragma once

#include <cstdint>

#include "kernels/hopper/hopper_tiles.hpp"

namespace lab {

inline constexpr int kShortComputedPct = 80;

// tall: the forward's lists of 128 x 192 tiles; short_: of 64 x 64 tiles (the same mask).
inline bool short_tiles_pay(const seqpar::hopper::SideTiles& tall, const seqpar::hopper::SideTiles& short_) {
  const int64_t c_tall = int64_t(tall.tile_rows) * tall.other_tile_rows * tall.entry_count();
  const int64_t c_short = int64_t(short_.tile_rows) * short_.other_tile_rows * short_.entry_count();
  return c_short * 100 <= c_tall * kShortComputedPct;
}
// The same from entry counts (ab_masks.py's plans): tall tiles 128 x 192, short 64 x 64.
inline bool short_tiles_pay(int64_t tall_entries, int64_t short_entries) {
  return short_entries * 64 * 64 * 100 <= tall_entries * 128 * 192 * kShortComputedPct;
}

}  // namespace lab
