// Attention masks in *global* token positions: a band (window_left, window_right) around the
// diagonal, -1 meaning unbounded (causal is (-1, 0)), optionally restricted to documents of a
// packed sequence given by their global offsets (cu_seqlens style) and to a block-sparse
// pattern of visible (query block, key block) pairs; a key is visible when all three allow it.
//
// Text syntax (parse_mask, and `seqpar attn --mask`):
//   full | causal | window:L,R      the band alone (L, R >= -1; -1 unbounded)
//   docs:N                          N packed documents of unequal length, causal inside each
//   docs-lognormal:M[,SIGMA[,SEED]] packed documents of lognormal lengths (mean M tokens, log
//                                   standard deviation SIGMA, default 2: a few documents 16x
//                                   the mean; seed default 1), each at most the sequence,
//                                   the last cut at its end; causal inside each
//   bigbird:W,G,R[,B=N]             BigBird on blocks of N tokens (default 64): a query block
//                                   sees the W blocks each side of it, the first G blocks are
//                                   global (see and are seen by every block), and R more key
//                                   blocks per query block drawn at random from a fixed seed
//   bigbird-causal:W,G,R[,B=N]      the same ANDed with causal (random blocks from the past)
//   blocks:PATH | blocks-causal:PATH  a pattern read from a file (read_block_pattern), full
//                                   or causal band
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "seqpar/status.hpp"

namespace seqpar {

// Where the diagonal sits when S_q != S_k and no explicit positions are given: top-left puts
// query row i at position i; bottom-right puts it at i + S_k - S_q (the KV-cache convention).
enum class MaskAlign { kTopLeft, kBottomRight };

// Tokens per block of a parsed bigbird mask without ",B=N".
inline constexpr int64_t kDefaultMaskBlock = 64;

// A block-sparse pattern: global positions are cut into blocks of block_size() tokens (block b
// holds [b * block_size, (b + 1) * block_size)) on a square grid of blocks() x blocks() that
// starts at position 0. A query in block qb may see a key in block kb only if (qb, kb) is a
// pair of the pattern; positions outside the grid see nothing and are seen by nothing.
// Immutable once made; rows are stored sorted (CSR), O(pairs) memory.
class BlockPattern {
 public:
  // rows[qb]: the key blocks query block qb sees (any order; repeats are dropped); the grid has
  // rows.size() blocks. `name` is the text that makes it again ("bigbird:1,1,2,B=64").
  static StatusOr<BlockPattern> from_rows(int64_t block_size,
                                          const std::vector<std::vector<int64_t>>& rows,
                                          std::string name);

  int64_t block_size() const { return block_size_; }
  int64_t blocks() const { return static_cast<int64_t>(row_begin_.size()) - 1; }
  int64_t covered_len() const { return blocks() * block_size_; }  // positions [0, this)
  int64_t pair_count() const { return static_cast<int64_t>(cols_.size()); }
  const std::string& name() const { return name_; }
  // Block of a position, or -1 outside the grid.
  int64_t block_of(int64_t pos) const {
    return pos >= 0 && pos < covered_len() ? pos / block_size_ : -1;
  }
  // Key blocks that query block qb sees, sorted; empty for a block outside the grid.
  std::span<const int64_t> row(int64_t qb) const;
  bool allows_blocks(int64_t qb, int64_t kb) const;  // O(log row length); false outside
  bool allows(int64_t qp, int64_t kp) const { return allows_blocks(block_of(qp), block_of(kp)); }

 private:
  int64_t block_size_ = 1;
  // Row qb's key blocks are cols_[row_begin_[qb], row_begin_[qb + 1]); [blocks + 1] entries.
  std::vector<int64_t> row_begin_{0};
  std::vector<int64_t> cols_;
  std::string name_;
};

// BigBird (Zaheer et al., 2020, the ITC form) on ceil(seq_len / block_size) blocks: query block
// qb sees key blocks |qb - kb| <= window, the first `global` blocks see and are seen by every
// block, and each other query block sees `random` more key blocks not already in its row,
// drawn from a fixed seed (the same pattern every run). With `causal` every pair has kb <= qb
// and the random blocks are drawn from the past.
StatusOr<BlockPattern> bigbird_pattern(int64_t seq_len, int64_t window, int64_t global,
                                       int64_t random, int64_t block_size, bool causal);

// Reads a pattern file (`name` defaults to "blocks:PATH"). Format, line by line: '#' starts a
// comment, blank lines are skipped; the first line is the header `block_size N` (N >= 1); then
// one line per query block with one 0 or 1 per key block (spaces between them optional), as many
// lines as entries on each (a square grid):
//   block_size 16
//   1 0 0
//   1 1 0
//   1 0 1
// A malformed file is refused with an error naming PATH:LINE.
StatusOr<BlockPattern> read_block_pattern(const std::string& path, std::string name = "");

struct MaskSpec {
  int64_t window_left = -1;   // key may be at most this far before the query; -1 unbounded
  int64_t window_right = -1;  // key may be at most this far after the query; -1 unbounded
  MaskAlign align = MaskAlign::kTopLeft;
  // Global document start offsets followed by the total length: {0, 5, 12, 20} is three
  // documents. Empty means one document. A query sees keys of its own document only.
  std::vector<int64_t> doc_offsets;
  // Block-sparse pattern ANDed with the band and documents; null means none. Shared, so a
  // MaskSpec stays cheap to copy.
  std::shared_ptr<const BlockPattern> block_pattern;

  static MaskSpec none() { return {}; }
  static MaskSpec causal() { return window(-1, 0); }
  static MaskSpec window(int64_t left, int64_t right);
  static MaskSpec documents(std::vector<int64_t> offsets, bool causal_inside = true);
  static MaskSpec block_sparse(BlockPattern pattern, bool causal);

  bool has_documents() const { return !doc_offsets.empty(); }
  // Kernels that evaluate only the band and documents (the GPU ones) must refuse these.
  bool has_block_pattern() const { return block_pattern != nullptr; }
  bool is_full() const {
    return window_left < 0 && window_right < 0 && !has_documents() && !has_block_pattern();
  }
  // Whether key position kp is visible from query position qp, ignoring documents and pattern.
  bool band_allows(int64_t qp, int64_t kp) const {
    return (window_left < 0 || qp - kp <= window_left) &&
           (window_right < 0 || kp - qp <= window_right);
  }
  // Whether key position kp is visible from query position qp under the whole mask (band,
  // documents, pattern): the definition, per element, O(log) time.
  bool allows(int64_t qp, int64_t kp) const;
  // Whether any key at positions k_pos is visible from any query at positions q_pos: exact,
  // O(|q_pos| log |k_pos|) (with a pattern, times the pattern blocks a query's band meets that
  // hold keys). The planner and the schedules decide from it which shard pairs compute and
  // which blocks travel.
  bool sees_any(std::span<const int64_t> q_pos, std::span<const int64_t> k_pos) const;
  // Visible (query, key) pairs of a sequence of seq_len tokens under the band and documents,
  // for FLOP counts: O(seq_len). A block pattern's sparsity is not counted.
  double visible_pairs(int64_t seq_len) const;
  // "full", "causal", "window:L,R", "docs:N", "bigbird:1,1,2,B=64", "blocks:PATH", joined by
  // '+' where the text alone does not say it ("docs:3+full", "bigbird:1,1,2,B=64+window:8,0").
  std::string describe() const;
  // Offsets start at 0, never decrease and end at a total at least `seq_len`; a pattern's grid
  // covers at least `seq_len` positions.
  Status validate(int64_t seq_len) const;
};

// Parses the tool's mask syntax (see the top of this file) for a sequence of `seq_len` tokens:
// docs:N and bigbird are laid out over it; blocks:PATH reads the file.
StatusOr<MaskSpec> parse_mask(const std::string& text, int64_t seq_len);

// Document boundaries of `count` documents of deliberately unequal lengths covering seq_len.
std::vector<int64_t> make_document_offsets(int64_t seq_len, int64_t count);
// Document boundaries covering seq_len with lengths drawn from a lognormal distribution of mean
// `mean` tokens and log standard deviation `sigma` (at least 1 token, the last document cut at
// seq_len): the same offsets for the same arguments on every platform (a 64-bit Mersenne twister
// and Box-Muller, not the standard library's distributions).
std::vector<int64_t> make_lognormal_document_offsets(int64_t seq_len, double mean, double sigma, uint64_t seed);

}  // namespace seqpar
