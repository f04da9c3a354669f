// The element masks of the Hopper kernels' boundary tiles, for masks given as visible-tile
// lists (TileMask, hopper_args.hpp; built by hopper_tiles.hpp): a score is kept iff its key
// lies in its query row's interval (band and documents) and, where the entry's flag says the
// pattern does not allow the whole tile, the pattern's bitmap allows the block pair. Everything
// is loaded from global memory (L1/L2-resident) when a boundary tile needs it, so that nothing
// stays in the consumers' registers across the main loop (they are at 237 of 240).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/hopper/hopper_args.hpp"

namespace seqpar::hopper {

// 64 bits of a pattern bitmap row starting at bit `first` (bits past the row's end read the
// row's three spare words, which are zero).
__device__ __forceinline__ uint64_t pattern_window(const TileMask& t, int row_block, int first) {
  const uint32_t* w = t.bits + static_cast<int64_t>(row_block) * t.bits_words + first / 32;
  const int sh = first % 32;
  const uint64_t lo = static_cast<uint64_t>(__ldg(w)) | static_cast<uint64_t>(__ldg(w + 1)) << 32;
  const uint64_t hi = __ldg(w + 2);
  return sh ? (lo >> sh) | (hi << (64 - sh)) : lo;
}

// This side's row `row` (rows: this side's length): its interval [lo, hi] over the other side's
// rows (band and documents; empty for a row past the end).
__device__ __forceinline__ int2 row_range(const TileMask& t, int row, int rows) {
  return row < rows ? __ldg(reinterpret_cast<const int2*>(t.ranges) + row) : make_int2(1, 0);
}

// Calls hide(first, last) for each run of the other side's rows [first, last] in the tile
// [first_row, first_row + kRows) whose pattern blocks row `row` may not see. Walking runs of
// hidden blocks (one or two per tile for the usual patterns) rather than testing a bit per
// element keeps the element loop as light as the range test: a bit per element spilled. A tile
// meets at most kRows / 8 + 1 <= 25 blocks (blocks of at least 8): 32-bit windows (64-bit
// ones spilled in the forward).
template <int kRows, class F>
__device__ __forceinline__ void for_hidden_runs(const TileMask& t, int row, int first_row, F&& hide) {
  static_assert(kRows / 8 + 1 <= 32, "a tile's blocks fit a 32-bit window");
  using Word = uint32_t;
  constexpr int kBits = 8 * sizeof(Word);
  // (Other-side rows before position 0 lie outside the grid: the range mask hides them.)
  const int kb0 = max(0, (t.other_pos0 + first_row) >> t.block_shift);
  const int nb = ((t.other_pos0 + first_row + kRows - 1) >> t.block_shift) - kb0 + 1;
  Word hidden = static_cast<Word>(~pattern_window(t, (t.pos0 + row) >> t.block_shift, kb0));
  if (nb < kBits) hidden &= (Word(1) << nb) - 1;
  while (hidden) {
    const int d0 = kBits == 32 ? __ffs(static_cast<int>(hidden)) - 1 : __ffsll(static_cast<long long>(hidden)) - 1;
    const Word rest = static_cast<Word>(~(hidden >> d0));  // its lowest set bit: the run's end
    const int len = !rest ? kBits - d0
                          : (kBits == 32 ? __ffs(static_cast<int>(rest)) : __ffsll(static_cast<long long>(rest))) - 1;
    hidden = d0 + len >= kBits ? Word(0) : static_cast<Word>(hidden & (~Word(0) << (d0 + len)));
    hide(((kb0 + d0) << t.block_shift) - t.other_pos0, ((kb0 + d0 + len) << t.block_shift) - t.other_pos0 - 1);
  }
}

// Forward: sets to -inf the scores this thread holds that the mask hides, in a key tile of kBN
// keys starting at key0 (accumulator layout of wgmma m64nN: s[4j + e] is row row0 + 8 (e >> 1),
// key key0 + 8j + 2 (lane % 4) + (e & 1)).
template <int kBN, bool kPattern>
__device__ __forceinline__ void apply_tile_mask(float (&s)[kBN / 2], const TileMask& t, int key0, int row0, int seq_q,
                                                int lane, int flags) {
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const int row = row0 + 8 * x;
    const int2 r = row_range(t, row, seq_q);
    auto hide = [&](int lo, int hi) {  // keys outside [lo, hi] (keep), or inside (hide)
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = key0 + 8 * j + 2 * (lane % 4) + e;
          if (key >= lo && key <= hi) s[4 * j + 2 * x + e] = -INFINITY;
        }
    };
    if (flags & 1) {
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = key0 + 8 * j + 2 * (lane % 4) + e;
          if (key < r.x || key > r.y) s[4 * j + 2 * x + e] = -INFINITY;
        }
    }
    if constexpr (kPattern) {
      if ((flags & 2) && r.x <= r.y) for_hidden_runs<kBN>(t, row, key0, hide);
    }
  }
}

// Backward: sets to 0 the probabilities P^T this thread holds that the mask hides, in a query
// tile of kBM rows starting at q0 (S^T accumulator layout: s[4j + e] is key key_r0 + 8 (e >> 1),
// query q0 + 8j + 2 (lane % 4) + (e & 1)). The key side's ranges are its query intervals and its
// bitmap rows are key blocks.
template <int kBM, bool kPattern>
__device__ __forceinline__ void apply_tile_mask_t(float (&s)[kBM / 2], const TileMask& t, int q0, int key_r0,
                                                  int seq_k, int lane, int flags) {
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const int key = key_r0 + 8 * x;
    const int2 r = row_range(t, key, seq_k);
    auto hide = [&](int lo, int hi) {
#pragma unroll
      for (int j = 0; j < kBM / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int q = q0 + 8 * j + 2 * (lane % 4) + e;
          if (q >= lo && q <= hi) s[4 * j + 2 * x + e] = 0.f;
        }
    };
    if (flags & 1) {
#pragma unroll
      for (int j = 0; j < kBM / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int q = q0 + 8 * j + 2 * (lane % 4) + e;
          if (q < r.x || q > r.y) s[4 * j + 2 * x + e] = 0.f;
        }
    }
    if constexpr (kPattern) {
      if ((flags & 2) && r.x <= r.y) for_hidden_runs<kBM>(t, key, q0, hide);
    }
  }
}

}  // namespace seqpar::hopper
