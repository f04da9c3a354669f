// The CPU executor: runs any schedule (include/seqpar/schedule.hpp) on host tensors over any
// communicator (threads or MPI processes), computing through the plan's backend. Blocks live
// in one store per pass, named as the steps name them; a received input is dropped after its
// last use, a result leaves with the message that sends it.
#include <cmath>
#include <cstring>
#include <algorithm>
#include <map>
#include <memory>

#include "parallel/ring_common.hpp"
#include "seqpar/distributed_attention.hpp"

namespace seqpar {
namespace {

using parallel::copy_bshd;

// Copies a [B, H, S] view into another.
void copy_bhs(const TensorView& src, const TensorView& dst) {
  const size_t es = dtype_size(src.dtype);
  for (int64_t b = 0; b < src.shape[0]; ++b)
    for (int64_t h = 0; h < src.shape[1]; ++h)
      for (int64_t s = 0; s < src.shape[2]; ++s)
        std::memcpy(static_cast<char*>(dst.data) + cpu::bhs_offset(dst, b, h, s) * es,
                    static_cast<const char*>(src.data) + cpu::bhs_offset(src, b, h, s) * es, es);
}

class Executor {
 public:
  Executor(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, Pass pass)
      : comm_(comm), plan_(plan), t_(t), pass_(pass), steps_(plan.schedule.pass(pass)), me_(comm.rank()) {}

  Status run(PassStats* stats) {
    cpu::AttentionDims dims;
    SP_RETURN_IF_ERROR(pass_ == Pass::kForward
                           ? parallel::check_ring_args(comm_, plan_.layout, plan_.params, t_.q, t_.k, t_.v, &dims)
                           : parallel::check_backward_args(comm_, plan_.layout, plan_.params, t_.q, t_.k, t_.v, t_.o,
                                                           t_.lse, t_.dout, t_.dq, t_.dk, t_.dv, &dims));
    if (pass_ == Pass::kForward) {
      SP_RETURN_IF_ERROR(cpu::validate_like("o", t_.o, t_.q.dtype, dims.batch, dims.seq_q, dims.heads, dims.head_dim));
      SP_RETURN_IF_ERROR(cpu::validate_like("lse", t_.lse, t_.q.dtype, dims.batch, dims.heads, dims.seq_q));
    }
    SP_CHECK_ARG(plan_.rank == me_, "the plan is rank " + std::to_string(plan_.rank) + "'s, this is rank " +
                                        std::to_string(me_));
    SP_CHECK_SUPPORTED(plan_.backend->caps().takes_delta, "the CPU executor needs a backend that takes D");
    const std::string why_not = plan_.backend->supports(t_.q, plan_.params);
    SP_CHECK_SUPPORTED(why_not.empty(), why_not);
    B_ = dims.batch, H_ = dims.heads, Hkv_ = dims.kv_heads, D_ = dims.head_dim, dtype_ = t_.q.dtype;
    const PhaseScope phase(comm_, pass_ == Pass::kForward ? Phase::kForward : Phase::kBackward);
    SP_RETURN_IF_ERROR(make_home());
    last_use_ = last_input_uses(steps_, pass_, me_);
    PassStats local;
    for (size_t i = 0; i < steps_.size(); ++i) {
      const Step& s = steps_[i];
      local.rounds = std::max(local.rounds, s.round + 1);
      if (s.kind == StepKind::kPost) SP_RETURN_IF_ERROR(post(s));
      else if (s.kind == StepKind::kWait) SP_RETURN_IF_ERROR(wait(s));
      else {
        SP_RETURN_IF_ERROR(compute(s));
        ++local.pairs_computed;
      }
      drop_after(i);
    }
    SP_CHECK_ARG(pending_.empty(), "internal: the schedule left a batch unwaited");
    SP_RETURN_IF_ERROR(write_results());
    if (stats) *stats = local;
    return Status::Ok();
  }

 private:
  // The parts of a block, in its wire order (schedule.hpp's BlockKind).
  std::vector<std::vector<int64_t>> part_shapes(BlockKind kind, int64_t rows) const {
    const std::vector<int64_t> q{B_, rows, H_, D_}, kv{B_, rows, Hkv_, D_}, stats{B_, H_, rows};
    switch (kind) {
      case BlockKind::kKV: case BlockKind::kDKV: return {kv, kv};
      case BlockKind::kQuery: case BlockKind::kDQ: return {q};
      case BlockKind::kOutput: return {q, stats};
      case BlockKind::kQueryPack: return {q, q, stats, stats};  // Q, dO, D, LSE
    }
    return {};
  }
  struct Stored {
    HostTensor data;  // the parts, one after another
    std::vector<TensorView> parts;
  };
  std::unique_ptr<Stored> make_block(const Block& b) const {
    auto s = std::make_unique<Stored>();
    const auto shapes = part_shapes(b.kind, plan_.layout.local_len(b.shard));
    int64_t n = 0;
    for (const auto& shape : shapes) {
      int64_t e = 1;
      for (int64_t d : shape) e *= d;
      n += e;
    }
    s->data = HostTensor(dtype_, {n});  // zeroed
    char* at = static_cast<char*>(s->data.view().data);
    for (const auto& shape : shapes) {
      s->parts.push_back(TensorView::contiguous(at, dtype_, shape));
      at += s->parts.back().numel() * dtype_size(dtype_);
    }
    return s;
  }
  // A result block present or made empty: zero, or for (O, LSE) the empty running result.
  Stored& result(const Block& b) {
    auto& slot = store_[b];
    if (!slot) {
      slot = make_block(b);
      if (b.kind == BlockKind::kOutput) set_lse_empty(slot->parts[1]);
    }
    return *slot;
  }
  void set_lse_empty(const TensorView& lse) const {
    for (int64_t i = 0; i < lse.numel(); ++i) {
      if (dtype_ == DType::kF32) lse.as<float>()[i] = -INFINITY;
      else lse.as<double>()[i] = -INFINITY;
    }
  }

  Status make_home() {
    auto kv = make_block({BlockKind::kKV, me_});
    copy_bshd(t_.k, kv->parts[0]);
    copy_bshd(t_.v, kv->parts[1]);
    store_[{BlockKind::kKV, me_}] = std::move(kv);
    if (pass_ == Pass::kForward) {
      auto q = make_block({BlockKind::kQuery, me_});
      copy_bshd(t_.q, q->parts[0]);
      store_[{BlockKind::kQuery, me_}] = std::move(q);
      return Status::Ok();
    }
    auto pack = make_block({BlockKind::kQueryPack, me_});
    copy_bshd(t_.q, pack->parts[0]);
    copy_bshd(t_.dout, pack->parts[1]);
    SP_RETURN_IF_ERROR(plan_.backend->delta(t_.o, t_.dout, pack->parts[2], nullptr));
    copy_bhs(t_.lse, pack->parts[3]);
    store_[{BlockKind::kQueryPack, me_}] = std::move(pack);
    return Status::Ok();
  }

  Status write_results() {
    const auto out = [&](const Block& b, std::initializer_list<TensorView> dst) {
      Stored& s = result(b);  // a result no pair touched is zero (O = 0, LSE = -inf)
      size_t i = 0;
      for (const TensorView& d : dst) {
        const TensorView& src = s.parts[i++];
        if (d.ndim == 4) copy_bshd(src, d);
        else copy_bhs(src, d);
      }
    };
    if (pass_ == Pass::kForward) {
      out({BlockKind::kOutput, me_}, {t_.o, t_.lse});
    } else {
      out({BlockKind::kDQ, me_}, {t_.dq});
      out({BlockKind::kDKV, me_}, {t_.dk, t_.dv});
    }
    return Status::Ok();
  }

  AttentionParams pair_params(int q_shard, int kv_shard) const {
    AttentionParams p = plan_.params;
    p.q_positions = plan_.layout.positions(q_shard).data();
    p.k_positions = plan_.layout.positions(kv_shard).data();
    return p;
  }

  Status present(const Block& b) const {
    SP_CHECK_ARG(store_.count(b), std::string("internal: the schedule reads ") + block_kind_name(b.kind) + "[" +
                                      std::to_string(b.shard) + "], which rank " + std::to_string(me_) + " lacks");
    return Status::Ok();
  }

  Status compute(const Step& s) {
    const Block kv{BlockKind::kKV, s.kv_shard};
    SP_RETURN_IF_ERROR(present(kv));
    const Stored& keys = *store_.at(kv);
    const AttentionParams params = pair_params(s.q_shard, s.kv_shard);
    if (pass_ == Pass::kForward) {
      const Block q{BlockKind::kQuery, s.q_shard};
      SP_RETURN_IF_ERROR(present(q));
      Stored& out = result({BlockKind::kOutput, s.q_shard});
      return plan_.backend->forward(store_.at(q)->parts[0], keys.parts[0], keys.parts[1], params, out.parts[0],
                                    out.parts[1], nullptr);
    }
    const Block q{BlockKind::kQueryPack, s.q_shard};
    SP_RETURN_IF_ERROR(present(q));
    const Stored& pack = *store_.at(q);
    Stored& dq = result({BlockKind::kDQ, s.q_shard});
    Stored& dkv = result({BlockKind::kDKV, s.kv_shard});
    return plan_.backend->backward(pack.parts[0], keys.parts[0], keys.parts[1], pack.parts[1], pack.parts[3],
                                   pack.parts[2], params, dq.parts[0], dkv.parts[0], dkv.parts[1], nullptr);
  }

  struct Pending {
    std::unique_ptr<PendingExchange> exchange;
    std::vector<std::pair<Transfer, std::unique_ptr<Stored>>> arriving;  // results to add or merge
    std::vector<Block> leaving;                                            // results sent away
  };

  Status post(const Step& s) {
    Pending p;
    std::vector<SendSpec> sends;
    std::vector<RecvSpec> recvs;
    for (const Transfer& t : s.sends) {
      SP_RETURN_IF_ERROR(present(t.block));
      const HostTensor& data = store_.at(t.block)->data;
      sends.push_back({t.peer, data.view().data, data.bytes()});
      if (is_result(t.block.kind)) p.leaving.push_back(t.block);
    }
    for (const Transfer& t : s.recvs) {
      std::unique_ptr<Stored> into = make_block(t.block);
      recvs.push_back({t.peer, into->data.view().data, into->data.bytes()});
      if (t.combine == Combine::kReplace) store_[t.block] = std::move(into);
      else p.arriving.emplace_back(t, std::move(into));
    }
    SP_ASSIGN_OR_RETURN(p.exchange, comm_.start_exchange(sends, recvs));
    pending_[s.batch] = std::move(p);
    return Status::Ok();
  }

  Status wait(const Step& s) {
    auto it = pending_.find(s.batch);
    SP_CHECK_ARG(it != pending_.end(), "internal: a wait for a batch never posted");
    Pending& p = it->second;
    SP_RETURN_IF_ERROR(p.exchange->wait());
    for (const Block& b : p.leaving) store_.erase(b);
    for (auto& [t, got] : p.arriving) {
      auto& slot = store_[t.block];
      if (!slot) {
        slot = std::move(got);
      } else if (t.combine == Combine::kMerge) {
        SP_RETURN_IF_ERROR(plan_.backend->merge(slot->parts[0], slot->parts[1], got->parts[0], got->parts[1], nullptr));
      } else {
        for (size_t i = 0; i < slot->parts.size(); ++i)
          SP_RETURN_IF_ERROR(plan_.backend->accumulate(slot->parts[i], got->parts[i], nullptr));
      }
    }
    pending_.erase(it);
    return Status::Ok();
  }

  void drop_after(size_t step) {
    for (const auto& [block, last] : last_use_)
      if (last == step) store_.erase(block);
  }

  Communicator& comm_;
  const AttentionPlan& plan_;
  const ShardTensors& t_;
  Pass pass_;
  const std::vector<Step>& steps_;
  int me_;
  int64_t B_ = 0, H_ = 0, Hkv_ = 0, D_ = 0;
  DType dtype_ = DType::kF32;
  std::map<Block, std::unique_ptr<Stored>> store_;
  std::map<int, Pending> pending_;
  std::map<Block, size_t> last_use_;
};

}  // namespace

Status run_forward_cpu(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, PassStats* stats) {
  return Executor(comm, plan, t, Pass::kForward).run(stats);
}

Status run_backward_cpu(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, PassStats* stats) {
  return Executor(comm, plan, t, Pass::kBackward).run(stats);
}

}  // namespace seqpar
