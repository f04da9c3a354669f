// Shared by the CPU attention kernels: argument validation, strided element addressing, and
// the mask evaluated in global positions (per element and per tile, for skipping).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "seqpar/attention.hpp"

namespace seqpar::cpu {

struct AttentionDims {
  int64_t batch = 0, seq_q = 0, seq_k = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t group() const { return heads / kv_heads; }  // query heads per K/V head
};

// Checks q/k/v (and optional outputs) against the BSHD contract; fills dims.
Status validate_qkv(const TensorView& q, const TensorView& k, const TensorView& v,
                    AttentionDims* dims);
// Checks that `t` is a CPU [d0, d1, d2, d3] (or [d0, d1, d2] when d3 < 0) tensor of `dtype`
// with a contiguous last dimension.
Status validate_like(const char* name, const TensorView& t, DType dtype, int64_t d0, int64_t d1,
                     int64_t d2, int64_t d3 = -1);

// Offset (in elements) of [b, s, h, 0] in a BSHD view and of [b, h, s] in a [B,H,S] view.
inline int64_t bshd_offset(const TensorView& t, int64_t b, int64_t s, int64_t h) {
  return b * t.strides[0] + s * t.strides[1] + h * t.strides[2];
}
inline int64_t bhs_offset(const TensorView& t, int64_t b, int64_t h, int64_t s) {
  return b * t.strides[0] + h * t.strides[1] + s * t.strides[2];
}

enum class TileKind { kEmpty, kPartial, kFull };

// The mask resolved for one call: global positions, document ids and pattern blocks of every
// local row.
class MaskEvaluator {
 public:
  MaskEvaluator(const AttentionParams& params, int64_t seq_q, int64_t seq_k);

  bool allowed(int64_t i, int64_t j) const {
    if (!mask_.band_allows(q_pos_[i], k_pos_[j])) return false;
    if (has_docs_ && q_doc_[i] != k_doc_[j]) return false;
    return !pattern_ || pattern_->allows_blocks(q_block_[i], k_block_[j]);
  }
  // Classifies rows [i0, i1) x keys [j0, j1): the band and documents from min/max of positions
  // and documents, exact for contiguous runs of positions and conservative (never wrongly empty
  // or full) otherwise; the block pattern exactly, from the blocks the rows and keys fall in.
  TileKind classify(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const;
  const std::vector<int64_t>& q_positions() const { return q_pos_; }
  const std::vector<int64_t>& k_positions() const { return k_pos_; }

 private:
  struct Range {
    int64_t pos_min, pos_max, doc_min, doc_max;
  };
  Range range(const std::vector<int64_t>& pos, const std::vector<int32_t>& doc, int64_t a,
              int64_t b) const;
  // The pattern alone on the tile: empty, full or partial, exactly.
  TileKind classify_pattern(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const;

  MaskSpec mask_;
  bool has_docs_ = false;
  const BlockPattern* pattern_ = nullptr;  // owned by mask_
  std::vector<int64_t> q_pos_, k_pos_;
  std::vector<int32_t> q_doc_, k_doc_;
  std::vector<int64_t> q_block_, k_block_;  // pattern block of each row, -1 outside its grid
};

// Checks the positions (if given) lie inside the documents and the block pattern's grid, so the
// mask is well defined.
Status validate_mask_positions(const AttentionParams& params, int64_t seq_q, int64_t seq_k);

inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();

}  // namespace seqpar::cpu
