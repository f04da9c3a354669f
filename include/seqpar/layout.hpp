// How a global sequence is split over P ranks, and moving tensors between global and local
// (sharded) form. Layouts:
//   contiguous  rank r holds one run of consecutive tokens
//   zigzag      2P chunks; rank r holds chunks r and 2P-1-r (balances causal work)
//   striped     token t lives on rank t mod P (balances causal work, no tile skipping)
// Lengths need not divide evenly: earlier chunks (or ranks) take one token more. A layout
// refuses sequences shorter than its chunk count (P, or 2P for zigzag).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "seqpar/status.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar {

enum class LayoutKind : uint8_t { kContiguous, kZigzag, kStriped };

const char* layout_name(LayoutKind kind);
StatusOr<LayoutKind> parse_layout(const std::string& name);

class Layout {
 public:
  // Checks that seq_len can be split this way over `ranks`.
  static StatusOr<Layout> create(LayoutKind kind, int64_t seq_len, int ranks);

  LayoutKind kind() const { return kind_; }
  int64_t seq_len() const { return seq_len_; }
  int ranks() const { return ranks_; }
  // Global positions of rank r's local rows, in local order.
  const std::vector<int64_t>& positions(int rank) const { return positions_[rank]; }
  int64_t local_len(int rank) const { return static_cast<int64_t>(positions_[rank].size()); }
  int64_t max_local_len() const;

  // Copies rank r's rows of `global` (sequence along `seq_dim`) into `local`.
  Status shard(const TensorView& global, int seq_dim, int rank, const TensorView& local) const;
  // Copies `local` (rank r's rows) back into their places in `global`.
  Status unshard(const TensorView& local, int seq_dim, int rank, const TensorView& global) const;

 private:
  Layout(LayoutKind kind, int64_t seq_len, int ranks);
  Status check_pair(const TensorView& global, const TensorView& local, int seq_dim,
                    int rank) const;

  LayoutKind kind_;
  int64_t seq_len_;
  int ranks_;
  std::vector<std::vector<int64_t>> positions_;
};

}  // namespace seqpar
