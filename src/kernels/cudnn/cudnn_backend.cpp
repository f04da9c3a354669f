// cuDNN as a local-attention backend: each shard pair is planned once (block_plan.hpp) into
// dense cuDNN calls (full, or top-left causal inside row ranges); a call's (O, LSE) part is
// merged into the running result and its dQ, dK, dV parts are added into the gradients, so to
// the executor it continues and adds like every backend. A call that is its rows' first part
// of a fresh result is written straight into it (where the result is in the inputs' dtype) or
// cast in: no clearing, no read-add-write. Results may be fp32 or in the inputs' dtype (caps:
// writes_parts). cuDNN's backward computes D itself from O: the schedules' query packs carry O
// (caps: !takes_delta).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cudnn/cudnn_attention.hpp"
#include "kernels/cuda/flash_cuda.hpp"

namespace seqpar::cuda {
namespace {

// Scratch slots: the forward's LSE part, and the fp32 sums of a side two calls write. The O,
// dQ, dK and dV parts are stream buffers (PartLease). The forward's sums and the
// backward's dQ sums never live at once (one stream runs a rank's passes in order): they share
// a slot.
enum Slot { kLsePart = 10, kQAcc, kDkAcc, kDvAcc };

// Rows of one side of a pair (query rows, or key rows) that the pair's calls have written so far.
class RowCover {
 public:
  bool touches(int64_t begin, int64_t end) const {
    return std::any_of(spans_.begin(), spans_.end(), [&](const auto& r) { return r.first < end && begin < r.second; });
  }
  // [begin, end) less the rows written.
  std::vector<std::pair<int64_t, int64_t>> gaps(int64_t begin, int64_t end) const {
    std::vector<std::pair<int64_t, int64_t>> out;
    int64_t at = begin;
    for (const auto& [b, e] : spans_) {  // sorted and disjoint
      if (e <= at || b >= end) continue;
      if (b > at) out.emplace_back(at, b);
      at = std::max(at, e);
    }
    if (at < end) out.emplace_back(at, end);
    return out;
  }
  void add(int64_t begin, int64_t end) {
    spans_.emplace_back(begin, end);
    std::sort(spans_.begin(), spans_.end());
    std::vector<std::pair<int64_t, int64_t>> merged;
    for (const auto& r : spans_)
      if (!merged.empty() && r.first <= merged.back().second) merged.back().second = std::max(merged.back().second, r.second);
      else merged.push_back(r);
    spans_ = std::move(merged);
  }

 private:
  std::vector<std::pair<int64_t, int64_t>> spans_;
};

// cuDNN takes its tensors 16-byte aligned; a caller's head slice (a later head group's LSE, say)
// may start anywhere: such outputs are written through a part buffer.
bool aligned16(const TensorView& t) { return reinterpret_cast<uintptr_t>(t.data) % 16 == 0; }

// Whether two of a plan's calls share a query row (q_side) or a key row.
bool calls_share_rows(const std::vector<BlockCall>& calls, bool q_side) {
  for (size_t i = 0; i < calls.size(); ++i)
    for (size_t j = i + 1; j < calls.size(); ++j) {
      const BlockCall &a = calls[i], &b = calls[j];
      if (q_side ? a.q_begin < b.q_end && b.q_begin < a.q_end : a.k_begin < b.k_end && b.k_begin < a.k_end) return true;
    }
  return false;
}

class CudnnBackend : public CudaKernelBackend {
 public:
  CudnnBackend(int64_t max_call_rows, bool deterministic)
      : max_call_rows_(max_call_rows), deterministic_(deterministic) {}
  const char* name() const override { return "cudnn"; }
  BackendCaps caps() const override {
    BackendCaps c;
    c.takes_delta = false;
    c.writes_parts = true;
    c.needs_dense_blocks = true;
    c.device = true;
    return c;
  }
  std::string supports(const TensorView& q, const AttentionParams& params) const override {
    AttentionParams plain = params;
    plain.q_positions = plain.k_positions = nullptr;  // the plans place rows; cuDNN sees none
    std::string why = cudnn_attention_unsupported_reason(q, plain);
    if (!why.empty()) return why;
    if (params.mask.window_left >= 0) return "the cuDNN backend plans full and causal-like masks only (no left window)";
    if (params.mask.has_block_pattern()) return "the cuDNN backend does not take block-sparse masks";
    return {};
  }

  Status forward(const TensorView& q, const TensorView& k, const TensorView& v, const AttentionParams& params,
                 const TensorView& o, const TensorView& lse, FreshOutputs fresh, void* stream) const override {
    SP_ASSIGN_OR_RETURN(const BlockPlan* plan, plan_of(params, q.shape[1], k.shape[1]));
    const int64_t B = q.shape[0], H = q.shape[2], D = q.shape[3], n = q.shape[1];
    Side side{{o}, fresh.o, {}};
    SP_RETURN_IF_ERROR(stage(side, plan->calls, true, kQAcc, q, &lse, stream));
    for (const BlockCall& c : plan->calls) {
      const TensorView o_rows = side.out[0].narrow(1, c.q_begin, c.q_end), lse_rows = lse.narrow(2, c.q_begin, c.q_end);
      const bool first = side.first(c.q_begin, c.q_end);
      const auto call = [&](const TensorView& o_to, const TensorView& lse_to) {
        return cudnn_attention_forward(q.narrow(1, c.q_begin, c.q_end), k.narrow(1, c.k_begin, c.k_end),
                                       v.narrow(1, c.k_begin, c.k_end), dense(params, c.causal), o_to, lse_to, stream);
      };
      // Straight into the result where cuDNN can write it as it is; else through a part buffer.
      if (first && o_rows.dtype == q.dtype && lse_rows.is_contiguous() && aligned16(o_rows) && aligned16(lse_rows)) {
        SP_RETURN_IF_ERROR(call(o_rows, lse_rows));
      } else {
        const int64_t nq = c.q_end - c.q_begin;
        PartLease lease(stream);
        SP_ASSIGN_OR_RETURN(const TensorView o_part, lease.take(q.dtype, {B, nq, H, D}, q));
        SP_ASSIGN_OR_RETURN(const TensorView lse_part, scratch(kLsePart, DType::kF32, {B, H, nq}, q));
        SP_RETURN_IF_ERROR(call(o_part, lse_part));
        if (first) {
          SP_RETURN_IF_ERROR(flash_cast(o_part, o_rows, stream));
          SP_RETURN_IF_ERROR(flash_cast(lse_part, lse_rows, stream));
        } else {
          SP_RETURN_IF_ERROR(side.clear_gaps(c.q_begin, c.q_end, &lse, stream));
          SP_RETURN_IF_ERROR(flash_merge_partials(o_rows, lse_rows, o_part, lse_part, stream));
        }
      }
      side.done.add(c.q_begin, c.q_end);
    }
    SP_RETURN_IF_ERROR(side.clear_gaps(0, n, &lse, stream));
    return unstage(side, {o}, stream);
  }

  // `o` is the forward's output (cuDNN computes D from it).
  Status backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                  const TensorView& lse, const TensorView& o, const AttentionParams& params, const TensorView& dq,
                  const TensorView& dk, const TensorView& dv, FreshOutputs fresh, void* stream) const override {
    SP_CHECK_ARG(o.ndim == 4 && o.same_shape(q), "the cuDNN backward takes O (shaped like q) in place of D; got " +
                                                     o.shape_string());
    SP_ASSIGN_OR_RETURN(const BlockPlan* plan, plan_of(params, q.shape[1], k.shape[1]));
    const int64_t B = q.shape[0], H = q.shape[2], D = q.shape[3], Hkv = k.shape[2], n = q.shape[1];
    Side qs{{dq}, fresh.dq, {}}, ks{{dk, dv}, fresh.dkv, {}};
    SP_RETURN_IF_ERROR(stage(qs, plan->calls, true, kQAcc, q, nullptr, stream));
    SP_RETURN_IF_ERROR(stage(ks, plan->calls, false, kDkAcc, q, nullptr, stream));
    for (const BlockCall& c : plan->calls) {
      const int64_t nq = c.q_end - c.q_begin, nk = c.k_end - c.k_begin;
      TensorView lse_rows = lse;
      if (nq != n || !lse.is_contiguous()) {  // cuDNN wants its rows' stats contiguous
        SP_ASSIGN_OR_RETURN(lse_rows, stat_rows(0, lse, c.q_begin, c.q_end, stream));
      }
      // Each gradient goes straight into the result where it is the rows' first part, of cuDNN's
      // dtype and aligned, else through a part buffer.
      const bool q_first = qs.first(c.q_begin, c.q_end), k_first = ks.first(c.k_begin, c.k_end);
      const TensorView dq_rows = qs.out[0].narrow(1, c.q_begin, c.q_end);
      const TensorView dk_rows = ks.out[0].narrow(1, c.k_begin, c.k_end), dv_rows = ks.out[1].narrow(1, c.k_begin, c.k_end);
      const bool q_direct = q_first && dq_rows.dtype == q.dtype && aligned16(dq_rows);
      const bool k_direct = k_first && dk_rows.dtype == q.dtype && aligned16(dk_rows) && aligned16(dv_rows);
      TensorView dq_to = dq_rows, dk_to = dk_rows, dv_to = dv_rows;
      PartLease lease(stream);
      if (!q_direct) {
        SP_ASSIGN_OR_RETURN(dq_to, lease.take(q.dtype, {B, nq, H, D}, q));
      }
      if (!k_direct) {
        SP_ASSIGN_OR_RETURN(dk_to, lease.take(q.dtype, {B, nk, Hkv, D}, q));
        SP_ASSIGN_OR_RETURN(dv_to, lease.take(q.dtype, {B, nk, Hkv, D}, q));
      }
      SP_RETURN_IF_ERROR(cudnn_attention_backward(
          q.narrow(1, c.q_begin, c.q_end), k.narrow(1, c.k_begin, c.k_end), v.narrow(1, c.k_begin, c.k_end),
          o.narrow(1, c.q_begin, c.q_end), dout.narrow(1, c.q_begin, c.q_end), lse_rows, dense(params, c.causal),
          dq_to, dk_to, dv_to, stream, deterministic_));
      if (!q_direct) SP_RETURN_IF_ERROR(qs.settle({dq_to}, c.q_begin, c.q_end, q_first, *this, stream));
      if (!k_direct) SP_RETURN_IF_ERROR(ks.settle({dk_to, dv_to}, c.k_begin, c.k_end, k_first, *this, stream));
      qs.done.add(c.q_begin, c.q_end);
      ks.done.add(c.k_begin, c.k_end);
    }
    SP_RETURN_IF_ERROR(qs.clear_gaps(0, n, nullptr, stream));
    SP_RETURN_IF_ERROR(ks.clear_gaps(0, k.shape[1], nullptr, stream));
    SP_RETURN_IF_ERROR(unstage(qs, {dq}, stream));
    return unstage(ks, {dk, dv}, stream);
  }

 private:
  // One side's outputs (O; dQ; dK and dV) as the calls write them: the caller's, or fp32 scratch
  // where a result in the inputs' dtype would take parts from two calls (summed in fp32 there,
  // rounded once at the end); `fresh` while the rows no call wrote still hold nothing.
  struct Side {
    std::vector<TensorView> out;
    bool fresh;
    RowCover done;
    bool staged = false;
    // The rows' first part: written in place of the empty result, not combined with it.
    bool first(int64_t begin, int64_t end) const { return fresh && !done.touches(begin, end); }
    // Rows [begin, end) that no call wrote set to the empty result (and their LSE to -inf).
    Status clear_gaps(int64_t begin, int64_t end, const TensorView* lse, void* stream) const {
      if (!fresh) return Status::Ok();
      for (const auto& [b, e] : done.gaps(begin, end)) {
        for (const TensorView& t : out) SP_RETURN_IF_ERROR(flash_fill(t.narrow(1, b, e), 0.0f, stream));
        if (lse) SP_RETURN_IF_ERROR(flash_fill(lse->narrow(2, b, e), -INFINITY, stream));
      }
      return Status::Ok();
    }
    // A call's parts into rows [begin, end): cast in as the rows' first part, else added.
    Status settle(const std::vector<TensorView>& parts, int64_t begin, int64_t end, bool is_first,
                  const AttentionBackend& be, void* stream) const {
      if (!is_first) SP_RETURN_IF_ERROR(clear_gaps(begin, end, nullptr, stream));
      for (size_t i = 0; i < parts.size(); ++i) {
        const TensorView rows = out[i].narrow(1, begin, end);
        SP_RETURN_IF_ERROR(is_first ? flash_cast(parts[i], rows, stream) : be.accumulate(rows, parts[i], stream));
      }
      return Status::Ok();
    }
  };
  // Side outputs in the inputs' dtype that two calls write go through fp32 scratch (slot
  // first_slot for the first output, the next slot for the second).
  Status stage(Side& side, const std::vector<BlockCall>& calls, bool q_side, int first_slot, const TensorView& like,
               const TensorView* lse, void* stream) const {
    if (side.out[0].dtype == DType::kF32 || !calls_share_rows(calls, q_side)) return Status::Ok();
    for (size_t i = 0; i < side.out.size(); ++i) {
      const TensorView& t = side.out[i];
      SP_ASSIGN_OR_RETURN(const TensorView acc, scratch(first_slot + int(i), DType::kF32,
                                                        std::vector<int64_t>(t.shape.begin(), t.shape.begin() + 4), like));
      if (side.fresh) SP_RETURN_IF_ERROR(flash_fill(acc, 0.0f, stream));
      else SP_RETURN_IF_ERROR(flash_cast(t, acc, stream));
      side.out[i] = acc;
    }
    if (side.fresh && lse) SP_RETURN_IF_ERROR(flash_fill(*lse, -INFINITY, stream));
    side.fresh = false, side.staged = true;
    return Status::Ok();
  }
  Status unstage(const Side& side, const std::vector<TensorView>& to, void* stream) const {
    for (size_t i = 0; side.staged && i < to.size(); ++i) SP_RETURN_IF_ERROR(flash_cast(side.out[i], to[i], stream));
    return Status::Ok();
  }

  static AttentionParams dense(const AttentionParams& params, bool causal) {
    AttentionParams p;
    p.scale = params.scale;
    p.mask = causal ? MaskSpec::causal() : MaskSpec::none();
    return p;
  }
  // The pair's dense calls, planned once per pair of position lists and mask.
  StatusOr<const BlockPlan*> plan_of(const AttentionParams& params, int64_t seq_q, int64_t seq_k) const {
    auto key = std::pair{pair_key(params, seq_q, seq_k), params.mask.describe()};
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      const PairPositions p = pair_positions(params, seq_q, seq_k);
      it = plans_.emplace(std::move(key), limit_call_rows(plan_block_pair(p.q, p.k, params.mask), max_call_rows_)).first;
    }
    SP_CHECK_SUPPORTED(it->second.dense, "the cuDNN backend cannot plan this pair into dense calls (mask " +
                                             params.mask.describe() + ")");
    return &it->second;
  }
  int64_t max_call_rows_;
  bool deterministic_;  // backward: cuDNN's deterministic algorithm
  mutable std::map<std::pair<PairKey, std::string>, BlockPlan> plans_;
};

}  // namespace

std::unique_ptr<AttentionBackend> make_cudnn_backend(int64_t max_call_rows, bool deterministic) {
  return std::make_unique<CudnnBackend>(max_call_rows, deterministic);
}

}  // namespace seqpar::cuda
