// The executor (include/seqpar/distributed_attention.hpp; the class: executor.hpp): runs a
// plan's steps for each head group on one rank's tensors, host or device alike; the device
// shows only in its BlockMemory and its backend. Blocks are named as the steps name them; the
// rank's own inputs are the caller's tensors where they can be sent as they are. Head parts of
// them are cut out when first named, span blocks joined from their pieces, and results that come
// home in head parts put together (added where GQA gave two parts one K/V head) before they are
// rounded into the caller's tensors. A result that at most two parts reach and that goes nowhere
// but home (result_uses) is held in the inputs' dtype where the accumulators are wider and the
// backend writes parts, the rank's own in the caller's tensors: the backend puts the first part
// straight into it and sums the second there in fp32, rounding once, as through fp32. Other
// results sum in the accumulators' dtype (block_bytes_for: fp32 on devices, the inputs' on the
// host); one sent home travels rounded to the inputs' dtype (goes_home). A result's first part is
// computed fresh (FreshOutputs): nothing is cleared before it.
// This file runs the steps; the blocks are stored, cut out and joined in executor_blocks.cpp, the
// exchanges posted and waited for in executor_exchange.cpp.
#include "parallel/executor.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace seqpar {
namespace parallel {

Executor::Executor(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, Pass pass,
                   BlockMemory& memory, ForwardState* state)
    : comm_(comm), plan_(plan), t_(t), pass_(pass), steps_(plan.schedule.pass(pass)), mem_(memory), me_(comm.rank()),
      state_(state) {}

// A run that stopped with exchanges in flight: the stream waits for them (NCCL writes into
// their buffers on its own stream) before the buffers go back to the stream's arena, which
// hands them to the next block at once; kept blocks no forward state holds go back here too.
Executor::~Executor() {
  if (comm_.stream_ordered())
    for (auto& [batch, p] : pending_)
      if (p.exchange) (void)p.exchange->wait_on_stream(mem_.stream());
  for (auto& [b, st] : kept_)
    if (st.use_count() == 1) mem_.release(std::move(st->buffer));
}

Status Executor::run(PassStats* stats) {
  SP_RETURN_IF_ERROR(check_args());
  const std::vector<Block>& kept = plan_.schedule.kept;
  SP_CHECK_ARG(kept.empty() || state_, "this plan keeps forward blocks for the backward: pass a ForwardState");
  if (pass_ == Pass::kBackward && !kept.empty())
    SP_CHECK_ARG(state_->impl().plan == &plan_ &&
                     state_->impl().blocks.size() == kept.size() * size_t(plan_.head_groups),
                 "the ForwardState holds no forward of this plan: run the forward with it first");
  if (pass_ == Pass::kForward && !kept.empty()) state_->impl().blocks.clear(), state_->impl().plan = &plan_;
  const PhaseScope phase(comm_, pass_ == Pass::kForward ? Phase::kForward : Phase::kBackward);
  last_use_ = last_input_uses(steps_, pass_, me_, pass_ == Pass::kForward ? kept : std::vector<Block>{});
  if (plan_.block_bytes.results_rounded && dtype_ != acc_ && plan_.backend->caps().writes_parts)
    for (const auto& [b, use] : result_uses(steps_, pass_))
      if (holds_rounded(b, use, me_, plan_.schedule.head_parts)) rounded_.insert(b);
  SP_RETURN_IF_ERROR(mem_.begin());
  PassStats local;
  for (int g = 0; g < plan_.head_groups; ++g) {
    if (pass_ == Pass::kBackward && !kept.empty()) take_kept(g);
    SP_RETURN_IF_ERROR(run_group(g, g == 0 ? &local : nullptr));
    if (pass_ == Pass::kForward && !kept.empty()) SP_RETURN_IF_ERROR(keep(g));
    release_all();
  }
  if (pass_ == Pass::kBackward && !kept.empty()) state_->impl().plan = nullptr;
  if (stats) *stats = local;
  return mem_.end();
}

Status Executor::check_tensor(const char* name, const TensorView& t, DType dtype,
                              const std::vector<int64_t>& shape) const {
  bool ok = t.device.kind == mem_.device() && t.dtype == dtype && t.ndim == int(shape.size()) &&
            t.strides[t.ndim - 1] == 1;
  for (int i = 0; ok && i < t.ndim; ++i) ok = t.shape[i] == shape[i];
  SP_CHECK_ARG(ok, std::string(name) + " must be a " + (mem_.device() == DeviceKind::kCuda ? "device " : "host ") +
                       dtype_name(dtype) + " tensor of shape " +
                       TensorView::contiguous(nullptr, dtype, shape).shape_string() +
                       " (contiguous last dim) as the layout asks; got " + t.shape_string() + " " +
                       dtype_name(t.dtype) + (t.device.kind == DeviceKind::kCuda ? " on a device" : " on the host"));
  return Status::Ok();
}

Status Executor::check_args() {
  const Layout& layout = plan_.layout;
  SP_CHECK_ARG(layout.ranks() == comm_.size(), "the plan is for " + std::to_string(layout.ranks()) +
                                                   " ranks but the communicator has " + std::to_string(comm_.size()));
  const bool device = mem_.device() == DeviceKind::kCuda;
  SP_CHECK_SUPPORTED(!device || comm_.moves_device_buffers(),
                     "device tensors travel over NCCL or the local communicator (thread ranks), not " +
                         comm_.backend_name());
  SP_CHECK_ARG(plan_.rank == me_, "the plan is rank " + std::to_string(plan_.rank) + "'s, this is rank " +
                                      std::to_string(me_));
  SP_CHECK_ARG(!plan_.params.q_positions && !plan_.params.k_positions,
               "distributed attention takes positions from the layout; leave q/k_positions null");
  SP_CHECK_ARG(t_.q.ndim == 4 && t_.k.ndim == 4, "q, k, v must be [B, S, H, D]; got q " + t_.q.shape_string() +
                                                     ", k " + t_.k.shape_string());
  const int64_t S = layout.local_len(me_);
  B_ = t_.q.shape[0], H_ = t_.q.shape[2], Hkv_ = t_.k.shape[2], D_ = t_.q.shape[3], dtype_ = t_.q.dtype;
  acc_ = plan_.block_bytes.accumulator, stats_ = plan_.block_bytes.stats;
  SP_CHECK_ARG(Hkv_ > 0 && H_ % Hkv_ == 0, "query heads must be a multiple of K/V heads");
  SP_CHECK_ARG(Hkv_ % plan_.head_groups == 0, "head groups (" + std::to_string(plan_.head_groups) +
                                                  ") must divide the K/V heads (" + std::to_string(Hkv_) + ")");
  const std::string parts_refusal =
      head_parts_refusal(plan_.schedule.head_parts, H_ / plan_.head_groups, Hkv_ / plan_.head_groups);
  SP_CHECK_ARG(parts_refusal.empty(), "each head group's heads: " + parts_refusal);
  SP_CHECK_ARG(plan_.block_bytes.heads == H_ && plan_.block_bytes.kv_heads == Hkv_ && plan_.block_bytes.head_dim == D_ &&
                   plan_.block_bytes.batch == B_,
               "the plan was made for other dims than these tensors'");
  const std::string why_not = plan_.backend->supports(t_.q, plan_.params);
  SP_CHECK_SUPPORTED(why_not.empty(), why_not);
  SP_CHECK_SUPPORTED(plan_.backend->caps().device == device,
                     std::string("the plan's backend (") + plan_.backend->name() + ") computes on " +
                         (plan_.backend->caps().device ? "a GPU" : "the host") + ", the tensors are on " +
                         (device ? "a GPU" : "the host"));
  SP_CHECK_ARG(plan_.block_bytes.input == dtype_, std::string("the plan was made for ") +
                                                      dtype_name(plan_.block_bytes.input) + " inputs, q is " +
                                                      dtype_name(dtype_));
  const std::vector<int64_t> qs{B_, S, H_, D_}, kvs{B_, S, Hkv_, D_}, stats{B_, H_, S};
  SP_RETURN_IF_ERROR(check_tensor("q", t_.q, dtype_, qs));
  SP_RETURN_IF_ERROR(check_tensor("k", t_.k, dtype_, kvs));
  SP_RETURN_IF_ERROR(check_tensor("v", t_.v, dtype_, kvs));
  SP_RETURN_IF_ERROR(check_tensor("o", t_.o, dtype_, qs));
  SP_RETURN_IF_ERROR(check_tensor("lse", t_.lse, stats_, stats));
  if (pass_ == Pass::kBackward) {
    SP_RETURN_IF_ERROR(check_tensor("dout", t_.dout, dtype_, qs));
    SP_RETURN_IF_ERROR(check_tensor("dq", t_.dq, dtype_, qs));
    SP_RETURN_IF_ERROR(check_tensor("dk", t_.dk, dtype_, kvs));
    SP_RETURN_IF_ERROR(check_tensor("dv", t_.dv, dtype_, kvs));
  }
  return plan_.params.mask.validate(layout.seq_len());
}

// A milestone of group g's pass on the memory's stream (only built when traced).
Status Executor::mark(int g, size_t step, const char* what) {
  if (!mem_.tracing()) return Status::Ok();
  std::string label = std::string(pass_ == Pass::kForward ? "fwd" : "bwd") + " g" + std::to_string(g) + " ";
  label += step < steps_.size() ? std::to_string(step) + " " + what : std::string(what);
  return mem_.mark(label);
}

Status Executor::run_group(int g, PassStats* stats) {
  Hg_ = H_ / plan_.head_groups, Hkg_ = Hkv_ / plan_.head_groups;
  const auto qh = [&](const TensorView& t) { return t.narrow(2, g * Hg_, (g + 1) * Hg_); };
  const auto kvh = [&](const TensorView& t) { return t.narrow(2, g * Hkg_, (g + 1) * Hkg_); };
  const auto stat_h = [&](const TensorView& t) { return t.narrow(1, g * Hg_, (g + 1) * Hg_); };
  home_.clear(), joined_home_.clear(), joined_on_arrival_.clear();
  if (pass_ == Pass::kForward) {
    home_[BlockKind::kOutput] = {qh(t_.o), stat_h(t_.lse)};
  } else {
    home_[BlockKind::kDQ] = {qh(t_.dq)};
    home_[BlockKind::kDKV] = {kvh(t_.dk), kvh(t_.dv)};
  }
  SP_RETURN_IF_ERROR(make_home({BlockKind::kKV, me_}, {kvh(t_.k), kvh(t_.v)}));
  if (pass_ == Pass::kForward) {
    SP_RETURN_IF_ERROR(make_home({BlockKind::kQuery, me_}, {qh(t_.q)}));
  } else if (takes_delta()) {
    SP_RETURN_IF_ERROR(make_home({BlockKind::kQueryPack, me_}, {qh(t_.q), qh(t_.dout), TensorView{}, stat_h(t_.lse)}, 2));
    Stored& pack = *store_.at({BlockKind::kQueryPack, me_});
    SP_RETURN_IF_ERROR(plan_.backend->delta(qh(t_.o), qh(t_.dout), pack.parts[2], mem_.stream()));
  } else {
    SP_RETURN_IF_ERROR(make_home({BlockKind::kQueryPack, me_}, {qh(t_.q), qh(t_.dout), qh(t_.o), stat_h(t_.lse)}));
  }
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& s = steps_[i];
    if (stats) stats->rounds = std::max(stats->rounds, s.round + 1);
    if (s.kind == StepKind::kPost) {
      SP_RETURN_IF_ERROR(post(s));
      SP_RETURN_IF_ERROR(mark(g, i, "post"));
    } else if (s.kind == StepKind::kWait) {
      SP_RETURN_IF_ERROR(wait(s));
      SP_RETURN_IF_ERROR(mark(g, i, "arrived"));
    } else if (s.kind == StepKind::kConcat || s.kind == StepKind::kSplit || s.kind == StepKind::kPack) {
      SP_RETURN_IF_ERROR(s.kind == StepKind::kPack ? pack(s) : regroup(s));
      SP_RETURN_IF_ERROR(mark(g, i, "regrouped"));
    } else {
      SP_RETURN_IF_ERROR(compute(s));
      SP_RETURN_IF_ERROR(mark(g, i, "computed"));
      if (stats) ++stats->pairs_computed;
    }
    for (const auto& [block, last] : last_use_)
      if (last == i) {
        auto it = store_.find(block);
        if (it != store_.end()) release(std::move(it->second)), store_.erase(it);
        auto k = kept_.find(block);
        if (k != kept_.end()) mem_.release(std::move(k->second->buffer)), kept_.erase(k);
      }
  }
  SP_CHECK_ARG(pending_.empty(), "internal: the schedule left a batch unwaited");
  // The results, put together from their head parts and (unless held there) rounded once into
  // the caller's tensors.
  for (const auto& [kind, callers] : home_) {
    const Block own{kind, me_};
    SP_RETURN_IF_ERROR(join_parts(own));
    SP_ASSIGN_OR_RETURN(Stored* r, cleared_result(own));
    if (in_callers(own) || joined_home_.count(own)) continue;
    for (size_t i = 0; i < callers.size(); ++i) SP_RETURN_IF_ERROR(mem_.copy(r->parts[i], callers[i]));
  }
  return mark(g, steps_.size(), "out");
}

Status Executor::compute(const Step& s) {
  SP_ASSIGN_OR_RETURN(Stored* keys, input(s.kv_block(BlockKind::kKV)));
  const bool forward = pass_ == Pass::kForward;
  Stored *q = nullptr, *out = nullptr, *dq = nullptr, *dkv = nullptr;
  FreshOutputs fresh;
  if (forward) {
    SP_ASSIGN_OR_RETURN(q, input(s.q_block(BlockKind::kQuery)));
    SP_ASSIGN_OR_RETURN(out, result(s.q_block(BlockKind::kOutput), &fresh.o));
  } else {
    SP_ASSIGN_OR_RETURN(q, input(s.q_block(BlockKind::kQueryPack)));
    SP_ASSIGN_OR_RETURN(dq, result(s.q_block(BlockKind::kDQ), &fresh.dq));
    SP_ASSIGN_OR_RETURN(dkv, result(s.kv_block(BlockKind::kDKV), &fresh.dkv));
  }
  // Spans whose positions go back between shards run per pair of increasing runs: cuDNN
  // plans dense calls and our kernels arithmetic runs, both over increasing positions.
  using Run = SpanPositions::Run;
  const std::vector<Run>& q_runs = positions_.increasing_runs(s.q_block(BlockKind::kQuery));
  const std::vector<Run>& k_runs = positions_.increasing_runs(s.kv_block(BlockKind::kKV));
  const bool whole = q_runs.size() == 1 && k_runs.size() == 1;
  if (!whole) {  // several calls, some maybe skipped: the results start cleared
    if (fresh.o) SP_RETURN_IF_ERROR(clear(s.q_block(BlockKind::kOutput), *out));
    if (fresh.dq) SP_RETURN_IF_ERROR(clear(s.q_block(BlockKind::kDQ), *dq));
    if (fresh.dkv) SP_RETURN_IF_ERROR(clear(s.kv_block(BlockKind::kDKV), *dkv));
    fresh = {};
  }
  for (const Run& qr : q_runs)
    for (const Run& kr : k_runs) {
      if (!whole && !plan_.params.mask.sees_any(qr.positions, kr.positions)) continue;
      AttentionParams params = plan_.params;
      params.q_positions = qr.positions.data();
      params.k_positions = kr.positions.data();
      const auto rows = [&](const TensorView& t, const Run& r) { return whole ? t : t.narrow(1, r.begin, r.end); };
      const auto stat_rows = [&](const TensorView& t, const Run& r) { return whole ? t : t.narrow(2, r.begin, r.end); };
      const TensorView k = rows(keys->parts[0], kr), v = rows(keys->parts[1], kr);
      if (forward) {
        SP_RETURN_IF_ERROR(plan_.backend->forward(rows(q->parts[0], qr), k, v, params, rows(out->parts[0], qr),
                                                  stat_rows(out->parts[1], qr), fresh, mem_.stream()));
        continue;
      }
      const TensorView delta = takes_delta() ? stat_rows(q->parts[2], qr) : rows(q->parts[2], qr);
      SP_RETURN_IF_ERROR(plan_.backend->backward(rows(q->parts[0], qr), k, v, rows(q->parts[1], qr),
                                                 stat_rows(q->parts[3], qr), delta, params, rows(dq->parts[0], qr),
                                                 rows(dkv->parts[0], kr), rows(dkv->parts[1], kr), fresh,
                                                 mem_.stream()));
    }
  return Status::Ok();
}

Status run_pass(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, Pass pass, BlockMemory& memory,
                PassStats* stats, ForwardState* state) {
  return Executor(comm, plan, t, pass, memory, state).run(stats);
}

}  // namespace parallel

Status run_forward_cpu(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, PassStats* stats,
                       ForwardState* state) {
  const auto memory = parallel::make_host_block_memory();
  return parallel::run_pass(comm, plan, t, Pass::kForward, *memory, stats, state);
}

Status run_backward_cpu(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, PassStats* stats,
                        ForwardState* state) {
  const auto memory = parallel::make_host_block_memory();
  return parallel::run_pass(comm, plan, t, Pass::kBackward, *memory, stats, state);
}

}  // namespace seqpar
