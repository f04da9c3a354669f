// Attention masks in *global* token positions: a band (window_left, window_right) around the
// diagonal, -1 meaning unbounded (causal is (-1, 0)), optionally restricted to documents of a
// packed sequence given by their global offsets (cu_seqlens style).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "seqpar/status.hpp"

namespace seqpar {

// Where the diagonal sits when S_q != S_k and no explicit positions are given: top-left puts
// query row i at position i; bottom-right puts it at i + S_k - S_q (the KV-cache convention).
enum class MaskAlign { kTopLeft, kBottomRight };

struct MaskSpec {
  int64_t window_left = -1;   // key may be at most this far before the query; -1 unbounded
  int64_t window_right = -1;  // key may be at most this far after the query; -1 unbounded
  MaskAlign align = MaskAlign::kTopLeft;
  // Global document start offsets followed by the total length: {0, 5, 12, 20} is three
  // documents. Empty means one document. A query sees keys of its own document only.
  std::vector<int64_t> doc_offsets;

  static MaskSpec none() { return {}; }
  static MaskSpec causal() { return window(-1, 0); }
  static MaskSpec window(int64_t left, int64_t right);
  static MaskSpec documents(std::vector<int64_t> offsets, bool causal_inside = true);

  bool has_documents() const { return !doc_offsets.empty(); }
  bool is_full() const { return window_left < 0 && window_right < 0 && !has_documents(); }
  // Whether key position kp is visible from query position qp, ignoring documents.
  bool band_allows(int64_t qp, int64_t kp) const {
    return (window_left < 0 || qp - kp <= window_left) &&
           (window_right < 0 || kp - qp <= window_right);
  }
  // Whether any key at positions k_pos is visible from any query at positions q_pos: exact,
  // O(|q_pos| log |k_pos|). The planner and the schedules decide from it which shard pairs
  // compute and which blocks travel.
  bool sees_any(std::span<const int64_t> q_pos, std::span<const int64_t> k_pos) const;
  // "full", "causal", "window:L,R", "docs:N"
  std::string describe() const;
  // Offsets start at 0, never decrease and end at a total at least `seq_len`.
  Status validate(int64_t seq_len) const;
};

// Parses the tool's mask syntax: full | causal | window:L,R | docs:N (N documents of varied
// lengths covering `seq_len`, causal inside each).
StatusOr<MaskSpec> parse_mask(const std::string& text, int64_t seq_len);

// Document boundaries of `count` documents of deliberately unequal lengths covering seq_len.
std::vector<int64_t> make_document_offsets(int64_t seq_len, int64_t count);

}  // namespace seqpar
