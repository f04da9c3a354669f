// How a global sequence is split over P ranks, and moving tensors between global and local
// (sharded) form. Layouts:
//   contiguous  rank r holds one run of consecutive tokens
//   zigzag      2P chunks; rank r holds chunks r and 2P-1-r (balances causal work)
//   striped     token t lives on rank t mod P (balances causal work, no tile skipping)
//   documents   for packed documents (cu_seqlens offsets), causal inside each: whole documents
//               and per-document zigzag pieces dealt so that every rank has about the same
//               visible work (src/parallel/document_layout.cpp); one document is a zigzag
// Lengths need not divide evenly: earlier chunks (or ranks) take one token more. A layout
// refuses sequences shorter than its chunk count (P, or 2P for zigzag).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "seqpar/mask.hpp"
#include "seqpar/status.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar {

enum class LayoutKind : uint8_t { kContiguous, kZigzag, kStriped, kDocuments };

const char* layout_name(LayoutKind kind);
StatusOr<LayoutKind> parse_layout(const std::string& name);

class Layout {
 public:
  // Checks that seq_len can be split this way over `ranks`. The documents layout needs the
  // documents: use the overload below.
  static StatusOr<Layout> create(LayoutKind kind, int64_t seq_len, int ranks);
  // The same, with the packed documents' global offsets (cu_seqlens: starts and the total, as
  // MaskSpec::doc_offsets; empty is one document), which the documents layout balances and the
  // token-balanced layouts ignore. Pass the mask's offsets: Layout::create(kind, S, P, mask.doc_offsets).
  static StatusOr<Layout> create(LayoutKind kind, int64_t seq_len, int ranks, const std::vector<int64_t>& doc_offsets);

  LayoutKind kind() const { return kind_; }
  int64_t seq_len() const { return seq_len_; }
  int ranks() const { return ranks_; }
  // Global positions of rank r's local rows, in local order.
  const std::vector<int64_t>& positions(int rank) const { return positions_[rank]; }
  int64_t local_len(int rank) const { return static_cast<int64_t>(positions_[rank].size()); }
  int64_t max_local_len() const;
  // The documents layout's document offsets (empty for the other kinds): with kind, length and
  // ranks they name the layout (a plan cache key).
  const std::vector<int64_t>& doc_offsets() const { return doc_offsets_; }

  // Copies rank r's rows of `global` (sequence along `seq_dim`) into `local`.
  Status shard(const TensorView& global, int seq_dim, int rank, const TensorView& local) const;
  // Copies `local` (rank r's rows) back into their places in `global`.
  Status unshard(const TensorView& local, int seq_dim, int rank, const TensorView& global) const;

 private:
  Layout(LayoutKind kind, int64_t seq_len, int ranks, std::vector<int64_t> doc_offsets);
  Status check_pair(const TensorView& global, const TensorView& local, int seq_dim,
                    int rank) const;

  LayoutKind kind_;
  int64_t seq_len_;
  int ranks_;
  std::vector<std::vector<int64_t>> positions_;
  std::vector<int64_t> doc_offsets_;
};

// Visible (query, key) pairs of each rank's queries under `mask`, keys anywhere in the sequence
// (band, documents and block pattern, as MaskSpec::allows): the attention work a rank's rows
// bring, [ranks] entries. O(seq_len), times a pattern row's blocks with a block pattern.
std::vector<double> rank_visible_work(const Layout& layout, const MaskSpec& mask);

}  // namespace seqpar
