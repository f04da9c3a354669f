// The CPU executor: runs any schedule (include/seqpar/schedule.hpp) on host tensors over any
// communicator (threads or MPI processes), computing through the plan's backend. Blocks live
// in one store per pass, named as the steps name them; a received input is dropped after its
// last use, a result leaves with the message that sends it. Head parts of the rank's own
// inputs are cut out when first named; its results may come home in parts, which are put
// together (added, where GQA gave two parts one K/V head) into its outputs.
#include <cmath>
#include <cstring>
#include <algorithm>
#include <map>
#include <memory>

#include "parallel/block_views.hpp"
#include "parallel/forward_state.hpp"
#include "parallel/ring_common.hpp"
#include "seqpar/distributed_attention.hpp"

namespace seqpar {
namespace {

using parallel::copy_bshd;
using parallel::Heads;
using parallel::heads_slice;
using parallel::rows_slice;

// Copies a [B, H, S] view into another.
void copy_bhs(const TensorView& src, const TensorView& dst) {
  const size_t es = dtype_size(src.dtype);
  for (int64_t b = 0; b < src.shape[0]; ++b)
    for (int64_t h = 0; h < src.shape[1]; ++h)
      for (int64_t s = 0; s < src.shape[2]; ++s)
        std::memcpy(static_cast<char*>(dst.data) + cpu::bhs_offset(dst, b, h, s) * es,
                    static_cast<const char*>(src.data) + cpu::bhs_offset(src, b, h, s) * es, es);
}

// dst (any strides) += src (contiguous), [B, S, H, D] or [B, H, S].
template <class T>
void add_into(const TensorView& src, const TensorView& dst) {
  const int64_t n0 = src.shape[0], n1 = src.shape[1], n2 = src.shape[2], n3 = src.ndim == 4 ? src.shape[3] : 1;
  const T* in = src.as<T>();
  T* out = dst.as<T>();
  for (int64_t a = 0; a < n0; ++a)
    for (int64_t b = 0; b < n1; ++b)
      for (int64_t c = 0; c < n2; ++c)
        for (int64_t d = 0; d < n3; ++d) {
          const int64_t at = a * dst.strides[0] + b * dst.strides[1] + c * dst.strides[2] +
                             (src.ndim == 4 ? d * dst.strides[3] : 0);
          out[at] += *in++;
        }
}

class Executor {
 public:
  Executor(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, Pass pass, ForwardState* state)
      : comm_(comm), plan_(plan), t_(t), pass_(pass), steps_(plan.schedule.pass(pass)), me_(comm.rank()),
        state_(state) {}

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
    const std::vector<Block>& kept = plan_.schedule.kept;
    SP_CHECK_ARG(kept.empty() || state_, "this plan keeps forward blocks for the backward: pass a ForwardState");
    SP_RETURN_IF_ERROR(make_home());
    if (pass_ == Pass::kBackward && !kept.empty()) SP_RETURN_IF_ERROR(take_kept());
    last_use_ = last_input_uses(steps_, pass_, me_, pass_ == Pass::kForward ? kept : std::vector<Block>{});
    PassStats local;
    for (size_t i = 0; i < steps_.size(); ++i) {
      const Step& s = steps_[i];
      local.rounds = std::max(local.rounds, s.round + 1);
      if (s.kind == StepKind::kPost) SP_RETURN_IF_ERROR(post(s));
      else if (s.kind == StepKind::kWait) SP_RETURN_IF_ERROR(wait(s));
      else if (s.kind == StepKind::kConcat || s.kind == StepKind::kSplit) SP_RETURN_IF_ERROR(regroup(s));
      else if (s.kind == StepKind::kPack) SP_RETURN_IF_ERROR(pack(s));
      else {
        SP_RETURN_IF_ERROR(compute(s));
        ++local.pairs_computed;
      }
      drop_after(i);
    }
    SP_CHECK_ARG(pending_.empty(), "internal: the schedule left a batch unwaited");
    SP_RETURN_IF_ERROR(write_results());
    if (pass_ == Pass::kForward && !kept.empty()) SP_RETURN_IF_ERROR(keep());
    if (stats) *stats = local;
    return Status::Ok();
  }

 private:
  // The parts of a block, in its wire order (schedule.hpp's BlockKind).
  static std::vector<Heads> part_heads(BlockKind kind) {
    switch (kind) {
      case BlockKind::kKV: case BlockKind::kDKV: return {Heads::kKV, Heads::kKV};
      case BlockKind::kQuery: case BlockKind::kDQ: return {Heads::kQuery};
      case BlockKind::kOutput: return {Heads::kQuery, Heads::kStats};
      case BlockKind::kQueryPack: return {Heads::kQuery, Heads::kQuery, Heads::kStats, Heads::kStats};  // Q, dO, D, LSE
      case BlockKind::kGradPack: return {Heads::kQuery, Heads::kStats, Heads::kStats};  // dO, D, LSE
    }
    return {};
  }
  HeadRange heads_of(Heads h, int part) const {
    return parallel::heads_of(h, part, plan_.schedule.head_parts, H_, Hkv_);
  }
  static void copy_part(Heads h, const TensorView& src, const TensorView& dst) {
    if (h == Heads::kStats) copy_bhs(src, dst);
    else copy_bshd(src, dst);
  }
  struct Stored {
    HostTensor data;  // the parts, one after another
    std::vector<TensorView> parts;
  };
  // Block b's parts (all its rows, or `rows` of them: a trimmed transfer's).
  std::unique_ptr<Stored> make_block(const Block& b, int64_t rows = -1) const {
    auto s = std::make_unique<Stored>();
    if (rows < 0) rows = block_rows(b, plan_.layout);
    std::vector<std::vector<int64_t>> shapes;
    for (Heads h : part_heads(b.kind)) {
      const int64_t n = heads_of(h, b.part).count();
      shapes.push_back(h == Heads::kStats ? std::vector<int64_t>{B_, n, rows} : std::vector<int64_t>{B_, rows, n, D_});
    }
    int64_t n = 0;
    for (const auto& shape : shapes) n += shape[0] * shape[1] * shape[2] * (shape.size() == 4 ? shape[3] : 1);
    s->data = HostTensor(dtype_, {n});  // zeroed
    char* at = static_cast<char*>(s->data.view().data);
    for (const auto& shape : shapes) {
      s->parts.push_back(TensorView::contiguous(at, dtype_, shape));
      at += s->parts.back().numel() * dtype_size(dtype_);
    }
    return s;
  }
  // An input block: held, kept by the forward, or cut out of a block the rank holds: a head
  // part of the same block with all heads, or its own grad pack out of its query pack.
  StatusOr<Stored*> input(const Block& b) {
    auto it = store_.find(b);
    if (it != store_.end()) return it->second.get();
    auto k = kept_.find(b);
    if (k != kept_.end()) return k->second.get();
    const auto source = parallel::input_source(b, me_, [&](const Block& x) { return store_.count(x) > 0; });
    SP_CHECK_ARG(source.has_value(),
                 "internal: the schedule reads " + block_name(b) + ", which rank " + std::to_string(me_) + " lacks");
    const auto w = store_.find(source->whole);
    const size_t first = source->first_part;
    auto part = make_block(b);
    const std::vector<Heads> heads = part_heads(b.kind);
    for (size_t i = 0; i < heads.size(); ++i)
      copy_part(heads[i], heads_slice(w->second->parts[first + i], heads[i], heads_of(heads[i], b.part)),
                part->parts[i]);
    return (store_[b] = std::move(part)).get();
  }

  // The forward's kept blocks into the state; the backward's out of it.
  Status keep() {
    auto& impl = state_->impl();
    impl.blocks.clear();
    impl.plan = &plan_;
    for (const Block& b : plan_.schedule.kept) {
      auto it = store_.find(b);
      SP_CHECK_ARG(it != store_.end(), "internal: the forward ends without " + block_name(b) + ", which it keeps");
      impl.blocks[{0, b}] = std::shared_ptr<Stored>(std::move(it->second));
      store_.erase(it);
    }
    return Status::Ok();
  }
  Status take_kept() {
    auto& impl = state_->impl();
    SP_CHECK_ARG(impl.plan == &plan_ && impl.blocks.size() == plan_.schedule.kept.size(),
                 "the ForwardState holds no forward of this plan: run the forward with it first");
    for (auto& [key, block] : impl.blocks) kept_[key.second] = std::static_pointer_cast<Stored>(block);
    impl.blocks.clear();
    impl.plan = nullptr;
    return Status::Ok();
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
      join_parts(b, s);
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

  // The home result put together from the head parts that came home (each into its heads;
  // parts sharing K/V heads add up). Output parts hold disjoint heads and arrive whole.
  void join_parts(const Block& whole, Stored& into) {
    const std::vector<Heads> heads = part_heads(whole.kind);
    for (int p = 0; p < plan_.schedule.head_parts && plan_.schedule.head_parts > 1; ++p) {
      auto it = store_.find({whole.kind, whole.shard, 1, p});
      if (it == store_.end()) continue;
      for (size_t i = 0; i < heads.size(); ++i) {
        const TensorView slice = heads_slice(into.parts[i], heads[i], heads_of(heads[i], p));
        if (whole.kind == BlockKind::kOutput) copy_part(heads[i], it->second->parts[i], slice);
        else if (dtype_ == DType::kF32) add_into<float>(it->second->parts[i], slice);
        else add_into<double>(it->second->parts[i], slice);
      }
    }
  }

  AttentionParams pair_params(const Block& q, const Block& kv) {
    AttentionParams p = plan_.params;
    p.q_positions = positions_.of(q);
    p.k_positions = positions_.of(kv);
    return p;
  }

  Status compute(const Step& s) {
    SP_ASSIGN_OR_RETURN(Stored* keys, input(s.kv_block(BlockKind::kKV)));
    const AttentionParams params = pair_params(s.q_block(BlockKind::kQuery), s.kv_block(BlockKind::kKV));
    if (pass_ == Pass::kForward) {
      SP_ASSIGN_OR_RETURN(Stored* q, input(s.q_block(BlockKind::kQuery)));
      Stored& out = result(s.q_block(BlockKind::kOutput));
      return plan_.backend->forward(q->parts[0], keys->parts[0], keys->parts[1], params, out.parts[0],
                                    out.parts[1], FreshOutputs{}, nullptr);
    }
    SP_ASSIGN_OR_RETURN(Stored* pack, input(s.q_block(BlockKind::kQueryPack)));
    Stored& dq = result(s.q_block(BlockKind::kDQ));
    Stored& dkv = result(s.kv_block(BlockKind::kDKV));
    return plan_.backend->backward(pack->parts[0], keys->parts[0], keys->parts[1], pack->parts[1], pack->parts[3],
                                   pack->parts[2], params, dq.parts[0], dkv.parts[0], dkv.parts[1], FreshOutputs{},
                                   nullptr);
  }

  // kPack: the query pack from the Q block and the grad pack of the same name.
  Status pack(const Step& s) {
    Block q = s.block, grads = s.block;
    q.kind = BlockKind::kQuery, grads.kind = BlockKind::kGradPack;
    SP_ASSIGN_OR_RETURN(Stored* from_q, input(q));
    SP_ASSIGN_OR_RETURN(Stored* from_grads, input(grads));
    auto made = make_block(s.block);
    const std::vector<Heads> heads = part_heads(BlockKind::kQueryPack);
    copy_part(heads[0], from_q->parts[0], made->parts[0]);
    for (size_t i = 1; i < heads.size(); ++i) copy_part(heads[i], from_grads->parts[i - 1], made->parts[i]);
    store_[s.block] = std::move(made);
    return Status::Ok();
  }

  // kConcat: the span block from its pieces (the rank's own input pieces are cut from its
  // whole-heads block); kSplit: a span result cut into pieces.
  Status regroup(const Step& s) {
    const Block& b = s.block;
    const std::vector<Heads> heads = part_heads(b.kind);
    if (s.kind == StepKind::kConcat) {
      auto joined = make_block(b);
      int64_t row = 0;
      for (int x = b.shard; x < b.shard + b.span; ++x) {
        const Block piece{b.kind, x, 1, b.part};
        Stored* from = nullptr;
        if (is_result(b.kind)) {
          from = &result(piece);
        } else {
          SP_ASSIGN_OR_RETURN(from, input(piece));
        }
        const int64_t n = plan_.layout.local_len(x);
        for (size_t i = 0; i < heads.size(); ++i) copy_part(heads[i], from->parts[i], rows_slice(joined->parts[i], heads[i], row, n));
        row += n;
        if (!(x == me_ && piece.part == kAllHeads)) store_.erase(piece);
      }
      store_[b] = std::move(joined);
      return Status::Ok();
    }
    Stored& whole = result(b);
    int64_t row = 0;
    for (int x = b.shard; x < b.shard + b.span; ++x) {
      const int64_t n = plan_.layout.local_len(x);
      auto piece = make_block({b.kind, x, 1, b.part});
      for (size_t i = 0; i < heads.size(); ++i) copy_part(heads[i], rows_slice(whole.parts[i], heads[i], row, n), piece->parts[i]);
      store_[{b.kind, x, 1, b.part}] = std::move(piece);
      row += n;
    }
    store_.erase(b);
    return Status::Ok();
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
      Stored* from = nullptr;
      if (is_result(t.block.kind)) {
        SP_CHECK_ARG(store_.count(t.block), "internal: the schedule sends " + block_name(t.block) + ", which rank " +
                                                std::to_string(me_) + " lacks");
        from = store_.at(t.block).get();
        p.leaving.push_back(t.block);
      } else {
        SP_ASSIGN_OR_RETURN(from, input(t.block));
      }
      if (!t.trimmed()) {
        sends.push_back({t.peer, from->data.view().data, from->data.bytes()});
        continue;
      }
      for (const TensorView& part : from->parts)
        for (const TensorView& piece : parallel::row_pieces(part, t.row_begin, t.row_end))
          sends.push_back({t.peer, piece.data, size_t(piece.numel()) * dtype_size(piece.dtype)});
    }
    for (const Transfer& t : s.recvs) {
      std::unique_ptr<Stored> into = make_block(t.block, t.trimmed() ? t.row_end - t.row_begin : -1);
      if (!t.trimmed()) recvs.push_back({t.peer, into->data.view().data, into->data.bytes()});
      for (const TensorView& part : t.trimmed() ? into->parts : std::vector<TensorView>{})
        for (const TensorView& piece : parallel::row_pieces(part, 0, t.row_end - t.row_begin))  // as sent
          recvs.push_back({t.peer, piece.data, size_t(piece.numel()) * dtype_size(piece.dtype)});
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
      if (!slot && !t.trimmed()) {
        slot = std::move(got);
      } else if (t.combine == Combine::kMerge) {
        SP_RETURN_IF_ERROR(plan_.backend->merge(slot->parts[0], slot->parts[1], got->parts[0], got->parts[1], nullptr));
      } else if (t.trimmed()) {  // its rows, per batch entry (the backends add contiguous tensors)
        if (!slot) slot = make_block(t.block);
        for (size_t i = 0; i < slot->parts.size(); ++i) {
          const std::vector<TensorView> into = parallel::row_pieces(slot->parts[i], t.row_begin, t.row_end),
                                        from = parallel::row_pieces(got->parts[i], 0, t.row_end - t.row_begin);
          for (size_t b = 0; b < into.size(); ++b)
            SP_RETURN_IF_ERROR(plan_.backend->accumulate(into[b], from[b], nullptr));
        }
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
      if (last == step) store_.erase(block), kept_.erase(block);
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
  parallel::SpanPositions positions_{plan_.layout};
  ForwardState* state_;
  std::map<Block, std::shared_ptr<Stored>> kept_;  // the backward's blocks kept by the forward
};

}  // namespace

Status run_forward_cpu(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, PassStats* stats,
                       ForwardState* state) {
  return Executor(comm, plan, t, Pass::kForward, state).run(stats);
}

Status run_backward_cpu(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, PassStats* stats,
                        ForwardState* state) {
  return Executor(comm, plan, t, Pass::kBackward, state).run(stats);
}

}  // namespace seqpar
