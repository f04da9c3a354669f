// Validation and mask evaluation shared by the CPU oracle and the fast CPU kernels.
#include "attention_common.hpp"

#include <span>
#include <string>

namespace seqpar::cpu {

Status validate_like(const char* name, const TensorView& t, DType dtype, int64_t d0, int64_t d1,
                     int64_t d2, int64_t d3) {
  const int ndim = d3 < 0 ? 3 : 4;
  const int64_t want[4] = {d0, d1, d2, d3};
  std::string expected = "[";
  for (int i = 0; i < ndim; ++i) expected += (i ? ", " : "") + std::to_string(want[i]);
  expected += std::string("] ") + dtype_name(dtype);
  SP_CHECK_ARG(t.data != nullptr, std::string(name) + " is null");
  SP_CHECK_SUPPORTED(t.device.kind == DeviceKind::kCpu,
                     std::string(name) + " is not in host memory (CPU backend)");
  bool ok = t.ndim == ndim && t.dtype == dtype && t.strides[ndim - 1] == 1;
  for (int i = 0; ok && i < ndim; ++i) ok = t.shape[i] == want[i];
  SP_CHECK_ARG(ok, std::string(name) + " is " + t.shape_string() + ", expected " + expected +
                       " with a contiguous last dimension");
  return Status::Ok();
}

Status validate_qkv(const TensorView& q, const TensorView& k, const TensorView& v,
                    AttentionDims* dims) {
  SP_CHECK_ARG(q.ndim == 4 && k.ndim == 4 && v.ndim == 4,
               "q, k, v must be [B, S, H, D]; got q " + q.shape_string() + ", k " +
                   k.shape_string() + ", v " + v.shape_string());
  dims->batch = q.shape[0];
  dims->seq_q = q.shape[1];
  dims->heads = q.shape[2];
  dims->head_dim = q.shape[3];
  dims->seq_k = k.shape[1];
  dims->kv_heads = k.shape[2];
  SP_CHECK_ARG(dims->batch > 0 && dims->heads > 0 && dims->head_dim > 0 && dims->kv_heads > 0,
               "q, k, v need positive batch, heads and head dim; got q " + q.shape_string());
  SP_CHECK_ARG(dims->heads % dims->kv_heads == 0,
               "query heads (" + std::to_string(dims->heads) + ") must be divisible by K/V heads (" +
                   std::to_string(dims->kv_heads) + ")");
  SP_RETURN_IF_ERROR(validate_like("q", q, q.dtype, dims->batch, dims->seq_q, dims->heads,
                                   dims->head_dim));
  SP_RETURN_IF_ERROR(validate_like("k", k, q.dtype, dims->batch, dims->seq_k, dims->kv_heads,
                                   dims->head_dim));
  SP_RETURN_IF_ERROR(validate_like("v", v, q.dtype, dims->batch, dims->seq_k, dims->kv_heads,
                                   dims->head_dim));
  return Status::Ok();
}

Status validate_mask_positions(const AttentionParams& params, int64_t seq_q, int64_t seq_k) {
  const int64_t implied_len = std::max(seq_q, seq_k);
  const MaskSpec& mask = params.mask;
  SP_RETURN_IF_ERROR(mask.validate(params.q_positions || params.k_positions ? 0 : implied_len));
  if (!mask.has_documents() && !mask.has_block_pattern()) return Status::Ok();
  // Positions must lie in [0, total): inside the documents and the pattern's grid.
  const int64_t docs_end = mask.has_documents() ? mask.doc_offsets.back() : INT64_MAX;
  const int64_t grid_end =
      mask.has_block_pattern() ? mask.block_pattern->covered_len() : INT64_MAX;
  const int64_t total = std::min(docs_end, grid_end);
  const char* where = total == docs_end ? "the documents" : "the block pattern's grid";
  auto check = [&](const int64_t* pos, int64_t n, const char* what) -> Status {
    if (!pos) return Status::Ok();
    for (int64_t i = 0; i < n; ++i) {
      SP_CHECK_ARG(pos[i] >= 0 && pos[i] < total,
                   std::string(what) + " position " + std::to_string(pos[i]) + " lies outside " +
                       where + " [0, " + std::to_string(total) + ")");
    }
    return Status::Ok();
  };
  SP_RETURN_IF_ERROR(check(params.q_positions, seq_q, "query"));
  return check(params.k_positions, seq_k, "key");
}

MaskEvaluator::MaskEvaluator(const AttentionParams& params, int64_t seq_q, int64_t seq_k)
    : mask_(params.mask), has_docs_(params.mask.has_documents()) {
  const int64_t q_shift =
      params.mask.align == MaskAlign::kBottomRight ? seq_k - seq_q : 0;
  q_pos_.resize(seq_q);
  k_pos_.resize(seq_k);
  for (int64_t i = 0; i < seq_q; ++i)
    q_pos_[i] = params.q_positions ? params.q_positions[i] : i + q_shift;
  for (int64_t j = 0; j < seq_k; ++j) k_pos_[j] = params.k_positions ? params.k_positions[j] : j;
  if (has_docs_) {
    const auto& offs = mask_.doc_offsets;
    auto doc_of = [&](int64_t p) {
      return static_cast<int32_t>(std::upper_bound(offs.begin(), offs.end(), p) - offs.begin() -
                                  1);
    };
    q_doc_.resize(seq_q);
    k_doc_.resize(seq_k);
    for (int64_t i = 0; i < seq_q; ++i) q_doc_[i] = doc_of(q_pos_[i]);
    for (int64_t j = 0; j < seq_k; ++j) k_doc_[j] = doc_of(k_pos_[j]);
  }
  if (mask_.has_block_pattern()) {
    pattern_ = mask_.block_pattern.get();
    q_block_.resize(seq_q);
    k_block_.resize(seq_k);
    for (int64_t i = 0; i < seq_q; ++i) q_block_[i] = pattern_->block_of(q_pos_[i]);
    for (int64_t j = 0; j < seq_k; ++j) k_block_[j] = pattern_->block_of(k_pos_[j]);
  }
}

MaskEvaluator::Range MaskEvaluator::range(const std::vector<int64_t>& pos,
                                          const std::vector<int32_t>& doc, int64_t a,
                                          int64_t b) const {
  Range r{pos[a], pos[a], 0, 0};
  for (int64_t i = a; i < b; ++i) {
    r.pos_min = std::min(r.pos_min, pos[i]);
    r.pos_max = std::max(r.pos_max, pos[i]);
  }
  if (has_docs_) {
    r.doc_min = r.doc_max = doc[a];
    for (int64_t i = a; i < b; ++i) {
      r.doc_min = std::min<int64_t>(r.doc_min, doc[i]);
      r.doc_max = std::max<int64_t>(r.doc_max, doc[i]);
    }
  }
  return r;
}

TileKind MaskEvaluator::classify(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
  if (i0 >= i1 || j0 >= j1) return TileKind::kEmpty;
  const Range q = range(q_pos_, q_doc_, i0, i1);
  const Range k = range(k_pos_, k_doc_, j0, j1);
  const int64_t wl = mask_.window_left, wr = mask_.window_right;
  if ((wr >= 0 && k.pos_min > q.pos_max + wr) || (wl >= 0 && k.pos_max < q.pos_min - wl))
    return TileKind::kEmpty;
  if (has_docs_ && (k.doc_min > q.doc_max || k.doc_max < q.doc_min)) return TileKind::kEmpty;
  const bool band_full =
      (wr < 0 || k.pos_max <= q.pos_min + wr) && (wl < 0 || k.pos_min >= q.pos_max - wl);
  const bool docs_full = !has_docs_ || (q.doc_min == q.doc_max && k.doc_min == k.doc_max &&
                                        q.doc_min == k.doc_min);
  const TileKind pattern = pattern_ ? classify_pattern(i0, i1, j0, j1) : TileKind::kFull;
  if (pattern == TileKind::kEmpty) return TileKind::kEmpty;
  if (band_full && docs_full && pattern == TileKind::kFull) return TileKind::kFull;
  // A tile whose rows each see no key could still be "partial" here; the kernel handles it.
  return TileKind::kPartial;
}

namespace {

// The distinct values of v[a, b), sorted.
std::vector<int64_t> distinct(const std::vector<int64_t>& v, int64_t a, int64_t b) {
  std::vector<int64_t> out(v.begin() + a, v.begin() + b);
  if (!std::is_sorted(out.begin(), out.end())) std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// How many values two sorted lists share: the shorter is looked up in the longer.
int64_t common_count(std::span<const int64_t> a, std::span<const int64_t> b) {
  if (a.size() > b.size()) std::swap(a, b);
  int64_t n = 0;
  for (const int64_t x : a) n += std::binary_search(b.begin(), b.end(), x);
  return n;
}

}  // namespace

TileKind MaskEvaluator::classify_pattern(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
  // Every row of the tile meets every key, so the tile holds exactly the block pairs
  // (query blocks of its rows) x (key blocks of its keys).
  const std::vector<int64_t> q_blocks = distinct(q_block_, i0, i1);
  const std::vector<int64_t> k_blocks = distinct(k_block_, j0, j1);
  const bool outside = q_blocks.front() < 0 || k_blocks.front() < 0;  // -1 sorts first
  const std::span<const int64_t> keys(k_blocks.data() + (k_blocks.front() < 0),
                                      k_blocks.data() + k_blocks.size());
  bool any = false, all = !outside;
  for (const int64_t qb : q_blocks) {
    if (qb < 0) continue;
    const int64_t seen = common_count(pattern_->row(qb), keys);
    any = any || seen > 0;
    all = all && seen == static_cast<int64_t>(keys.size());
    if (any && !all) return TileKind::kPartial;
  }
  return any ? (all ? TileKind::kFull : TileKind::kPartial) : TileKind::kEmpty;
}

}  // namespace seqpar::cpu
