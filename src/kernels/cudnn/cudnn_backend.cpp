// cuDNN as a local-attention backend: each shard pair is planned once (block_plan.hpp) into
// dense cuDNN calls (full, or top-left causal inside row ranges); a call's fresh (O, LSE) part
// is merged into the running fp32 result and its dQ, dK, dV parts are added into the fp32
// gradients, so to the executor it continues and adds like every backend. cuDNN's backward
// computes D itself from O: the schedules' query packs carry O (caps: !takes_delta).
#include <map>
#include <tuple>

#include "kernels/cuda/cuda_backend.hpp"
#include "seqpar/cudnn_attention.hpp"
#include "seqpar/flash_cuda.hpp"

namespace seqpar::cuda {
namespace {

enum Slot { kOPart = 10, kLsePart, kDqPart, kDkPart, kDvPart };

class CudnnBackend : public CudaKernelBackend {
 public:
  explicit CudnnBackend(int64_t max_call_rows) : max_call_rows_(max_call_rows) {}
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
                 const TensorView& o, const TensorView& lse, void* stream) const override {
    SP_ASSIGN_OR_RETURN(const BlockPlan* plan, plan_of(params, q.shape[1], k.shape[1]));
    const int64_t B = q.shape[0], H = q.shape[2], D = q.shape[3];
    for (const BlockCall& c : plan->calls) {
      const int64_t nq = c.q_end - c.q_begin;
      SP_ASSIGN_OR_RETURN(const TensorView o_part, scratch(kOPart, q.dtype, {B, nq, H, D}, q));
      SP_ASSIGN_OR_RETURN(const TensorView lse_part, scratch(kLsePart, DType::kF32, {B, H, nq}, q));
      SP_RETURN_IF_ERROR(cudnn_attention_forward(q.narrow(1, c.q_begin, c.q_end), k.narrow(1, c.k_begin, c.k_end),
                                                 v.narrow(1, c.k_begin, c.k_end), dense(params, c.causal), o_part,
                                                 lse_part, stream));
      SP_RETURN_IF_ERROR(flash_merge_partials(o.narrow(1, c.q_begin, c.q_end), lse.narrow(2, c.q_begin, c.q_end),
                                              o_part, lse_part, stream));
    }
    return Status::Ok();
  }

  // `o` is the forward's output (cuDNN computes D from it).
  Status backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                  const TensorView& lse, const TensorView& o, const AttentionParams& params, const TensorView& dq,
                  const TensorView& dk, const TensorView& dv, void* stream) const override {
    SP_CHECK_ARG(o.ndim == 4 && o.same_shape(q), "the cuDNN backward takes O (shaped like q) in place of D; got " +
                                                     o.shape_string());
    SP_ASSIGN_OR_RETURN(const BlockPlan* plan, plan_of(params, q.shape[1], k.shape[1]));
    const int64_t B = q.shape[0], H = q.shape[2], D = q.shape[3], Hkv = k.shape[2], n = q.shape[1];
    for (const BlockCall& c : plan->calls) {
      const int64_t nq = c.q_end - c.q_begin, nk = c.k_end - c.k_begin;
      TensorView lse_rows = lse;
      if (nq != n || !lse.is_contiguous()) {  // cuDNN wants its rows' stats contiguous
        SP_ASSIGN_OR_RETURN(lse_rows, stat_rows(0, lse, c.q_begin, c.q_end, stream));
      }
      SP_ASSIGN_OR_RETURN(const TensorView dq_part, scratch(kDqPart, q.dtype, {B, nq, H, D}, q));
      SP_ASSIGN_OR_RETURN(const TensorView dk_part, scratch(kDkPart, q.dtype, {B, nk, Hkv, D}, q));
      SP_ASSIGN_OR_RETURN(const TensorView dv_part, scratch(kDvPart, q.dtype, {B, nk, Hkv, D}, q));
      SP_RETURN_IF_ERROR(cudnn_attention_backward(
          q.narrow(1, c.q_begin, c.q_end), k.narrow(1, c.k_begin, c.k_end), v.narrow(1, c.k_begin, c.k_end),
          o.narrow(1, c.q_begin, c.q_end), dout.narrow(1, c.q_begin, c.q_end), lse_rows, dense(params, c.causal),
          dq_part, dk_part, dv_part, stream));
      SP_RETURN_IF_ERROR(flash_accumulate(dq_part, dq.narrow(1, c.q_begin, c.q_end), stream));
      SP_RETURN_IF_ERROR(flash_accumulate(dk_part, dk.narrow(1, c.k_begin, c.k_end), stream));
      SP_RETURN_IF_ERROR(flash_accumulate(dv_part, dv.narrow(1, c.k_begin, c.k_end), stream));
    }
    return Status::Ok();
  }

 private:
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
  mutable std::map<std::pair<PairKey, std::string>, BlockPlan> plans_;
};

}  // namespace

std::unique_ptr<AttentionBackend> make_cudnn_backend(int64_t max_call_rows) {
  return std::make_unique<CudnnBackend>(max_call_rows);
}

}  // namespace seqpar::cuda
