// What both executors need to lay a block's parts out and cut views of them: which heads each
// part spans (query heads, K/V heads, or row stats [B, H, S]), the heads of a head part, the
// head and row slices of a part, and the global positions of a span block's rows (and their
// increasing runs).
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "seqpar/layout.hpp"
#include "seqpar/schedule.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar::parallel {

enum class Heads : uint8_t { kQuery, kKV, kStats };

// The heads of head part `part` of `parts` (all of them for kAllHeads), of `heads` query and
// `kv_heads` K/V heads.
inline HeadRange heads_of(Heads h, int part, int parts, int64_t heads, int64_t kv_heads) {
  if (part == kAllHeads) return {0, h == Heads::kKV ? kv_heads : heads};
  return h == Heads::kKV ? kv_part_range(part, parts, heads, kv_heads) : head_part_range(part, parts, heads);
}
// Bytes a view covers (its elements, dense).
inline size_t view_bytes(const TensorView& t) { return size_t(t.numel()) * dtype_size(t.dtype); }

// The heads r of a part ([B, S, H, D] along dim 2; stats [B, H, S] along dim 1).
inline TensorView heads_slice(const TensorView& t, Heads h, HeadRange r) {
  return h == Heads::kStats ? t.narrow(1, r.first, r.last) : t.narrow(2, r.first, r.last);
}
// The rows [first, first + n) of a part.
inline TensorView rows_slice(const TensorView& t, Heads h, int64_t first, int64_t n) {
  return h == Heads::kStats ? t.narrow(2, first, first + n) : t.narrow(1, first, first + n);
}

// The rows [begin, end) of a contiguous [B, S, h, D] part as contiguous pieces, one per batch
// entry (one piece when B = 1): how a trimmed transfer (Transfer::trimmed) goes on the wire.
inline std::vector<TensorView> row_pieces(const TensorView& part, int64_t begin, int64_t end) {
  std::vector<TensorView> pieces;
  for (int64_t b = 0; b < part.shape[0]; ++b) pieces.push_back(part.narrow(0, b, b + 1).narrow(1, begin, end));
  return pieces;
}

// Where an input block a rank does not hold is cut from: the same block with all heads (for a
// head part), or the rank's own query pack from its part 1 on (for its own grad pack: the
// pack less Q). `has` says whether the rank holds a block; nullopt: from nowhere.
struct InputSource {
  Block whole;
  size_t first_part = 0;
};
template <class Has>
std::optional<InputSource> input_source(const Block& b, int me, Has&& has) {
  if (b.kind == BlockKind::kGradPack && b.shard == me && b.span == 1) {
    const Block pack{BlockKind::kQueryPack, me};
    if (has(pack)) return InputSource{pack, 1};
  }
  Block whole = b;
  whole.part = kAllHeads;
  if (b.part != kAllHeads && has(whole)) return InputSource{whole, 0};
  return std::nullopt;
}

// Global positions of a block's rows, and how a span block's rows come from its shards. A span
// keeps its rows in position order where its shards' rows interleave in few pieces (zigzag
// shards, the documents layout): a Ulysses span is then one increasing run and its compute step
// one backend call (one cuDNN causal call over the sequence, one Hopper launch over a documents
// mask) in place of one call per pair of shard runs, each merged into the result. Striped shards
// interleave row by row: those spans stay shard after shard, as do spans of one shard.
class SpanPositions {
 public:
  explicit SpanPositions(const Layout& layout) : layout_(layout) {}

  // Rows [from, from + rows) of shard `shard`'s block are the span's rows [to, to + rows).
  struct Piece {
    int shard;
    int64_t from, to, rows;
  };
  // At most this many pieces per shard of a span for position order: each piece is a copy per
  // part in the span's concatenation and split.
  static constexpr size_t kMaxPiecesPerShard = 64;

  const std::vector<Piece>& pieces(const Block& b) {
    auto& cached = pieces_[{b.shard, b.span}];
    if (!cached.empty()) return cached;
    std::vector<Piece> runs;  // every shard's runs of consecutive positions, then by position
    bool ordered = b.span > 1;
    for (int x = b.shard; x < b.shard + b.span && ordered; ++x) {
      const std::vector<int64_t>& p = layout_.positions(x);
      const size_t first = runs.size();
      for (int64_t i = 0; i < int64_t(p.size()); ++i) {
        if (i == 0 || p[i] != p[i - 1] + 1) runs.push_back({x, i, p[i], 0});  // `to` holds the position for now
        ++runs.back().rows;
      }
      ordered = runs.size() - first <= kMaxPiecesPerShard;
    }
    if (ordered) {
      std::sort(runs.begin(), runs.end(), [](const Piece& a, const Piece& c) { return a.to < c.to; });
      int64_t row = 0;
      for (Piece& r : runs) r.to = row, row += r.rows;
      cached = std::move(runs);
    } else {
      int64_t row = 0;
      for (int x = b.shard; x < b.shard + b.span; ++x) {
        cached.push_back({x, 0, row, layout_.local_len(x)});
        row += layout_.local_len(x);
      }
    }
    return cached;
  }

  const int64_t* of(const Block& b) {
    if (b.span == 1) return layout_.positions(b.shard).data();
    auto& cached = spans_[{b.shard, b.span}];
    if (cached.empty())
      for (const Piece& piece : pieces(b)) {
        const auto first = layout_.positions(piece.shard).begin() + piece.from;
        cached.insert(cached.end(), first, first + piece.rows);
      }
    return cached.data();
  }

  // A block's rows as runs of increasing positions ([begin, end) row ranges, each with its
  // positions): a span of striped shards goes back in position between shards.
  struct Run {
    int64_t begin, end;
    std::vector<int64_t> positions;
  };
  const std::vector<Run>& increasing_runs(const Block& b) {
    auto& cached = runs_[{b.shard, b.span}];
    if (!cached.empty()) return cached;
    const int64_t* p = of(b);
    const int64_t n = block_rows(b, layout_);
    for (int64_t i = 0; i < n; ++i) {
      if (i == 0 || p[i] <= p[i - 1]) cached.push_back({i, i, {}});
      cached.back().end = i + 1;
      cached.back().positions.push_back(p[i]);
    }
    return cached;
  }

 private:
  const Layout& layout_;
  std::map<std::pair<int, int>, std::vector<Piece>> pieces_;
  std::map<std::pair<int, int>, std::vector<int64_t>> spans_;
  std::map<std::pair<int, int>, std::vector<Run>> runs_;
};

}  // namespace seqpar::parallel
