// Sequence layouts: which global tokens each rank holds, and strided shard/unshard copies.
#include "seqpar/layout.hpp"

#include <algorithm>
#include <cstring>

#include "parallel/document_layout.hpp"

namespace seqpar {

const char* layout_name(LayoutKind kind) {
  switch (kind) {
    case LayoutKind::kContiguous: return "contiguous";
    case LayoutKind::kZigzag: return "zigzag";
    case LayoutKind::kStriped: return "striped";
    case LayoutKind::kDocuments: return "documents";
  }
  return "?";
}

StatusOr<LayoutKind> parse_layout(const std::string& name) {
  if (name == "contiguous") return LayoutKind::kContiguous;
  if (name == "zigzag") return LayoutKind::kZigzag;
  if (name == "striped") return LayoutKind::kStriped;
  if (name == "documents") return LayoutKind::kDocuments;
  return SP_STATUS(StatusCode::kInvalidArgument,
                   "unknown layout '" + name + "' (expected contiguous, zigzag, striped or documents)");
}

Layout::Layout(LayoutKind kind, int64_t seq_len, int ranks, std::vector<int64_t> doc_offsets)
    : kind_(kind), seq_len_(seq_len), ranks_(ranks), positions_(ranks), doc_offsets_(std::move(doc_offsets)) {
  using parallel::chunk_start;
  if (kind == LayoutKind::kDocuments) {
    positions_ = parallel::document_balanced_positions(seq_len, ranks, doc_offsets_);
    return;
  }
  for (int r = 0; r < ranks; ++r) {
    switch (kind) {
      case LayoutKind::kContiguous:
        for (int64_t t = chunk_start(seq_len, ranks, r); t < chunk_start(seq_len, ranks, r + 1); ++t)
          positions_[r].push_back(t);
        break;
      case LayoutKind::kZigzag: parallel::append_zigzag_piece(0, seq_len, ranks, r, &positions_[r]); break;
      case LayoutKind::kStriped:
        for (int64_t t = r; t < seq_len; t += ranks) positions_[r].push_back(t);
        break;
      case LayoutKind::kDocuments: break;  // above
    }
  }
}

StatusOr<Layout> Layout::create(LayoutKind kind, int64_t seq_len, int ranks) {
  SP_CHECK_ARG(kind != LayoutKind::kDocuments,
               "the documents layout is made from the packed documents' offsets (Layout::create with "
               "doc_offsets; empty offsets are one document), as seqpar train --pack makes one from each "
               "batch's documents");
  return create(kind, seq_len, ranks, {});
}

StatusOr<Layout> Layout::create(LayoutKind kind, int64_t seq_len, int ranks, const std::vector<int64_t>& doc_offsets) {
  SP_CHECK_ARG(ranks >= 1, "need at least one rank, got " + std::to_string(ranks));
  const int64_t chunks = kind == LayoutKind::kZigzag ? 2 * int64_t(ranks) : ranks;
  SP_CHECK_ARG(seq_len >= chunks,
               std::string(layout_name(kind)) + " layout over " + std::to_string(ranks) +
                   " ranks needs at least " + std::to_string(chunks) + " tokens, got " +
                   std::to_string(seq_len));
  if (kind != LayoutKind::kDocuments) return Layout(kind, seq_len, ranks, {});
  SP_RETURN_IF_ERROR(MaskSpec::documents(doc_offsets).validate(seq_len));
  return Layout(kind, seq_len, ranks, doc_offsets);
}

int64_t Layout::max_local_len() const {
  int64_t m = 0;
  for (int r = 0; r < ranks_; ++r) m = std::max(m, local_len(r));
  return m;
}

Status Layout::check_pair(const TensorView& global, const TensorView& local, int seq_dim,
                          int rank) const {
  SP_CHECK_ARG(rank >= 0 && rank < ranks_, "rank " + std::to_string(rank) + " out of range");
  SP_CHECK_ARG(global.ndim == local.ndim && seq_dim >= 0 && seq_dim < global.ndim,
               "shard: global " + global.shape_string() + " and local " + local.shape_string() +
                   " differ in rank or seq_dim is out of range");
  SP_CHECK_ARG(global.dtype == local.dtype, "shard: dtypes differ");
  SP_CHECK_ARG(global.device.kind == DeviceKind::kCpu && local.device.kind == DeviceKind::kCpu,
               "shard/unshard copy host tensors");
  for (int d = 0; d < global.ndim; ++d) {
    const int64_t want = d == seq_dim ? local_len(rank) : global.shape[d];
    SP_CHECK_ARG(local.shape[d] == want && (d != seq_dim || global.shape[d] == seq_len_),
                 "shard: global " + global.shape_string() + " / local " + local.shape_string() +
                     " do not fit a " + std::to_string(seq_len_) + "-token sequence with " +
                     std::to_string(local_len(rank)) + " rows on rank " + std::to_string(rank));
  }
  return Status::Ok();
}

namespace {
// Copies row `from_row` of `src` to row `to_row` of `dst` along seq_dim, for every index of
// the other dims; the trailing dims go as one memcpy when both sides are dense there.
void copy_rows(const TensorView& src, int64_t from_row, const TensorView& dst, int64_t to_row,
               int seq_dim) {
  const size_t es = dtype_size(src.dtype);
  int64_t inner = 1;
  bool dense = true;
  for (int d = src.ndim - 1; d > seq_dim; --d) {
    dense = dense && src.strides[d] == inner && dst.strides[d] == inner;
    inner *= src.shape[d];
  }
  const int64_t run = dense ? inner : 1;
  // Iterate the outer dims and, when not dense, the inner dims element by element.
  std::vector<int64_t> idx(src.ndim, 0);
  const int64_t total_outer = [&] {
    int64_t n = 1;
    for (int d = 0; d < src.ndim; ++d)
      if (d != seq_dim) n *= src.shape[d];
    return n / run;
  }();
  for (int64_t it = 0; it < total_outer; ++it) {
    int64_t rem = it;
    int64_t s_off = from_row * src.strides[seq_dim], d_off = to_row * dst.strides[seq_dim];
    int64_t inner_left = run;
    for (int d = src.ndim - 1; d >= 0; --d) {
      if (d == seq_dim) continue;
      if (inner_left > 1) {  // dims inside the dense run stay at 0
        inner_left /= src.shape[d];
        continue;
      }
      const int64_t i = rem % src.shape[d];
      rem /= src.shape[d];
      s_off += i * src.strides[d];
      d_off += i * dst.strides[d];
    }
    std::memcpy(static_cast<char*>(dst.data) + d_off * es,
                static_cast<const char*>(src.data) + s_off * es, run * es);
  }
}
}  // namespace

Status Layout::shard(const TensorView& global, int seq_dim, int rank,
                     const TensorView& local) const {
  SP_RETURN_IF_ERROR(check_pair(global, local, seq_dim, rank));
  const auto& pos = positions_[rank];
  for (size_t i = 0; i < pos.size(); ++i) copy_rows(global, pos[i], local, i, seq_dim);
  return Status::Ok();
}

Status Layout::unshard(const TensorView& local, int seq_dim, int rank,
                       const TensorView& global) const {
  SP_RETURN_IF_ERROR(check_pair(global, local, seq_dim, rank));
  const auto& pos = positions_[rank];
  for (size_t i = 0; i < pos.size(); ++i) copy_rows(local, i, global, pos[i], seq_dim);
  return Status::Ok();
}

}  // namespace seqpar
