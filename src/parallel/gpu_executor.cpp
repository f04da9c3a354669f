// The GPU executor (include/seqpar/gpu_executor.hpp): runs a plan's steps for each head group
// on device tensors. Blocks are named as the steps name them and live in stream buffers; the rank's own inputs are the caller's tensors where they can be sent as they are.
// Head parts of them are cut out when first named, span blocks joined from their pieces, and
// results that come home in head parts put together (added where GQA gave two parts one K/V
// head) before they are rounded into the caller's tensors. A result that at most two parts
// reach and that goes nowhere but home (result_uses) is held in the inputs' dtype, the rank's
// own in the caller's tensors: backends that write parts put the first straight into it and sum
// the second there in fp32, rounding once, as through fp32. Other results accumulate in fp32;
// one sent home travels rounded to the inputs' dtype (goes_home). A result's first part is
// computed fresh (FreshOutputs): nothing is cleared before it.
#include "seqpar/gpu_executor.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "core/cuda_check.hpp"
#include "parallel/block_views.hpp"
#include "parallel/forward_state.hpp"
#include "parallel/gpu_workspace.hpp"
#include "seqpar/flash_cuda.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar {

namespace {

size_t view_bytes(const TensorView& t) { return t.numel() * dtype_size(t.dtype); }
// Parts start 256-byte aligned inside a block's buffer (kernels and NCCL like aligned rows).
size_t padded(size_t bytes) { return (bytes + 255) / 256 * 256; }
// Whether a slice of the caller's tensors can be sent and computed on as it is.
bool usable_as_is(const TensorView& t) { return t.is_contiguous() && reinterpret_cast<uintptr_t>(t.data) % 16 == 0; }

Status check_device(const char* name, const TensorView& t, DType dtype, const std::vector<int64_t>& shape) {
  bool ok = t.device.kind == DeviceKind::kCuda && t.dtype == dtype && t.ndim == int(shape.size()) &&
            t.strides[t.ndim - 1] == 1;
  for (int i = 0; ok && i < t.ndim; ++i) ok = t.shape[i] == shape[i];
  SP_CHECK_ARG(ok, std::string(name) + " must be a device " + dtype_name(dtype) + " tensor of shape " +
                       TensorView::contiguous(nullptr, dtype, shape).shape_string() +
                       " (contiguous last dim) as the layout asks; got " + t.shape_string() + " " +
                       dtype_name(t.dtype));
  return Status::Ok();
}

class GpuExecutor {
 public:
  GpuExecutor(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, Pass pass,
              GpuWorkspace::Impl& ws, cudaStream_t s, ForwardState* state)
      : comm_(comm), plan_(plan), t_(t), pass_(pass), steps_(plan.schedule.pass(pass)), ws_(ws), s_(s),
        me_(comm.rank()), state_(state) {}
  // A run that stopped with exchanges in flight: the stream waits for them (NCCL writes into
  // their buffers on its own stream) before the buffers go back to the stream's arena, which
  // hands them to the next block at once; kept blocks no forward state holds go back here too.
  ~GpuExecutor() {
    if (comm_.stream_ordered())
      for (auto& [batch, p] : pending_)
        if (p.exchange) (void)p.exchange->wait_on_stream(s_);
    for (auto& [b, st] : kept_)
      if (st.use_count() == 1) st->buffer.release(s_);
  }

  Status run(PassStats* stats) {
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
    if (plan_.block_bytes.results_rounded && dtype_ != DType::kF32 && plan_.backend->caps().writes_parts)
      for (const auto& [b, use] : result_uses(steps_, pass_))
        if (holds_rounded(b, use, me_, plan_.schedule.head_parts)) rounded_.insert(b);
    SP_RETURN_IF_ERROR(ws_.begin(s_));
    PassStats local;
    for (int g = 0; g < plan_.head_groups; ++g) {
      if (pass_ == Pass::kBackward && !kept.empty()) take_kept(g);
      SP_RETURN_IF_ERROR(run_group(g, g == 0 ? &local : nullptr));
      if (pass_ == Pass::kForward && !kept.empty()) SP_RETURN_IF_ERROR(keep(g));
      release_all();
    }
    if (pass_ == Pass::kBackward && !kept.empty()) state_->impl().plan = nullptr;
    if (stats) *stats = local;
    return ws_.end(s_);
  }

 private:
  Status check_args() {
    const Layout& layout = plan_.layout;
    SP_CHECK_ARG(layout.ranks() == comm_.size(), "the plan is for " + std::to_string(layout.ranks()) +
                                                     " ranks but the communicator has " + std::to_string(comm_.size()));
    SP_CHECK_SUPPORTED(comm_.moves_device_buffers(),
                       "the GPU executor moves device buffers: it needs NCCL or the local communicator (thread "
                       "ranks), not " + comm_.backend_name());
    SP_CHECK_ARG(plan_.rank == me_, "the plan is rank " + std::to_string(plan_.rank) + "'s, this is rank " +
                                        std::to_string(me_));
    SP_CHECK_ARG(t_.q.ndim == 4 && t_.k.ndim == 4, "q, k, v must be [B, S, H, D]; got q " + t_.q.shape_string() +
                                                       ", k " + t_.k.shape_string());
    const int64_t S = layout.local_len(me_);
    B_ = t_.q.shape[0], H_ = t_.q.shape[2], Hkv_ = t_.k.shape[2], D_ = t_.q.shape[3], dtype_ = t_.q.dtype;
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
    SP_CHECK_SUPPORTED(plan_.backend->caps().device, std::string("the GPU executor needs a GPU backend, not ") +
                                                         plan_.backend->name());
    const std::vector<int64_t> qs{B_, S, H_, D_}, kvs{B_, S, Hkv_, D_}, stats{B_, H_, S};
    SP_RETURN_IF_ERROR(check_device("q", t_.q, dtype_, qs));
    SP_RETURN_IF_ERROR(check_device("k", t_.k, dtype_, kvs));
    SP_RETURN_IF_ERROR(check_device("v", t_.v, dtype_, kvs));
    SP_RETURN_IF_ERROR(check_device("o", t_.o, dtype_, qs));
    SP_RETURN_IF_ERROR(check_device("lse", t_.lse, DType::kF32, stats));
    if (pass_ == Pass::kBackward) {
      SP_RETURN_IF_ERROR(check_device("dout", t_.dout, dtype_, qs));
      SP_RETURN_IF_ERROR(check_device("dq", t_.dq, dtype_, qs));
      SP_RETURN_IF_ERROR(check_device("dk", t_.dk, dtype_, kvs));
      SP_RETURN_IF_ERROR(check_device("dv", t_.dv, dtype_, kvs));
    }
    return Status::Ok();
  }

  // A block's parts in wire order (schedule.hpp's BlockKind), for one head group: which heads
  // each spans (query heads, K/V heads, or row stats [B, H, S]) and its dtype. Results are fp32
  // accumulators, or (`rounded`) in the inputs' dtype as they travel home (goes_home).
  using Heads = parallel::Heads;
  struct PartShape {
    DType dtype;
    Heads heads;
    std::vector<int64_t> shape;
  };
  std::vector<PartShape> part_shapes(const Block& b, int64_t rows, bool rounded = false) const {
    const int64_t hq = heads_of(Heads::kQuery, b.part).count(), hkv = heads_of(Heads::kKV, b.part).count();
    const std::vector<int64_t> q{B_, rows, hq, D_}, kv{B_, rows, hkv, D_}, stats{B_, hq, rows};
    const DType acc = rounded ? dtype_ : DType::kF32, f32 = DType::kF32;
    const PartShape Q{dtype_, Heads::kQuery, q}, KV{dtype_, Heads::kKV, kv}, S32{f32, Heads::kStats, stats};
    switch (b.kind) {
      case BlockKind::kKV: return {KV, KV};
      case BlockKind::kQuery: return {Q};
      case BlockKind::kOutput: return {{acc, Heads::kQuery, q}, S32};
      case BlockKind::kQueryPack:  // Q, dO, D (or O where the backend takes no D), LSE
        return {Q, Q, takes_delta() ? S32 : Q, S32};
      case BlockKind::kDQ: return {{acc, Heads::kQuery, q}};
      case BlockKind::kDKV: return {{acc, Heads::kKV, kv}, {acc, Heads::kKV, kv}};
      case BlockKind::kGradPack: return {Q, takes_delta() ? S32 : Q, S32};  // dO, D (or O), LSE
    }
    return {};
  }
  // The heads of head part `part` within the group (all of the group's for kAllHeads).
  HeadRange heads_of(Heads h, int part) const {
    return parallel::heads_of(h, part, plan_.schedule.head_parts, Hg_, Hkg_);
  }
  bool takes_delta() const { return plan_.backend->caps().takes_delta; }

  struct Stored {
    StreamBuffer buffer;  // empty where every part is a view of the caller's tensors
    std::vector<TensorView> parts;
  };
  // Block b's parts (all its rows, or `rows` of them: a trimmed transfer's), in one stream buffer.
  StatusOr<std::unique_ptr<Stored>> make_block(const Block& b, bool rounded = false, int64_t rows = -1) {
    auto st = std::make_unique<Stored>();
    if (rows < 0) rows = block_rows(b, plan_.layout);
    size_t capacity = 0;
    for (const PartShape& p : part_shapes(b, rows, rounded))
      capacity += padded(TensorView::contiguous(nullptr, p.dtype, p.shape).numel() * dtype_size(p.dtype));
    SP_ASSIGN_OR_RETURN(st->buffer, StreamBuffer::allocate(capacity, s_));
    char* at = static_cast<char*>(st->buffer.data());
    for (const PartShape& p : part_shapes(b, rows, rounded)) {
      st->parts.push_back(TensorView::contiguous(at, p.dtype, p.shape, t_.q.device));
      at += padded(view_bytes(st->parts.back()));
    }
    return st;
  }
  // Gives a block's buffer back after the work queued so far (stream order).
  void release(std::unique_ptr<Stored> st) {
    if (st) st->buffer.release(s_);
  }
  void release_all() {
    for (auto& [b, st] : store_) release(std::move(st));
    store_.clear();
    for (auto& [b, st] : kept_) st->buffer.release(s_);
    kept_.clear();
  }

  // Group g's kept blocks into the state at the forward's end (out of the pool until the
  // backward gives them back); out of it at the backward's start.
  Status keep(int g) {
    for (const Block& b : plan_.schedule.kept) {
      auto it = store_.find(b);
      SP_CHECK_ARG(it != store_.end(), "internal: the forward ends without " + block_name(b) + ", which it keeps");
      state_->impl().blocks[{g, b}] = std::shared_ptr<Stored>(std::move(it->second));
      store_.erase(it);
    }
    return Status::Ok();
  }
  void take_kept(int g) {
    auto& blocks = state_->impl().blocks;
    for (const Block& b : plan_.schedule.kept) {
      auto it = blocks.find({g, b});
      kept_[b] = std::static_pointer_cast<Stored>(it->second);
      blocks.erase(it);
    }
  }

  // How this rank holds result b: in the inputs' dtype (rounded_), its own in the caller's tensors.
  bool held_rounded(const Block& b) const { return rounded_.count(b) > 0; }
  bool in_callers(const Block& b) const { return held_rounded(b) && is_own_result(b, me_) && home_.count(b.kind); }
  // A result present (*fresh = false), or made with nothing in it yet (*fresh = true): its first
  // part is written, not added.
  StatusOr<Stored*> result(const Block& b, bool* fresh) {
    auto& slot = store_[b];
    *fresh = !slot;
    if (!slot && in_callers(b)) {
      slot = std::make_unique<Stored>();
      slot->parts = home_.at(b.kind);
    } else if (!slot) {
      SP_ASSIGN_OR_RETURN(slot, make_block(b, held_rounded(b)));
    }
    return slot.get();
  }
  // A result present, or made empty: zero, and for (O, LSE) LSE = -inf.
  StatusOr<Stored*> cleared_result(const Block& b) {
    bool fresh = false;
    SP_ASSIGN_OR_RETURN(Stored* r, result(b, &fresh));
    if (fresh) SP_RETURN_IF_ERROR(clear(b, *r));
    return r;
  }
  Status clear(const Block& b, const Stored& r) {
    for (size_t i = 0; i < r.parts.size(); ++i)
      SP_RETURN_IF_ERROR(flash_fill(r.parts[i], b.kind == BlockKind::kOutput && i == 1 ? -INFINITY : 0.0f, s_));
    return Status::Ok();
  }

  // This rank's own input block for head group g: the caller's slices where they can be used
  // as they are, copies (or, for D, computed rows) in a pooled buffer otherwise.
  Status make_home(const Block& b, const std::vector<TensorView>& slices, int computed_part = -1) {
    bool all_usable = computed_part < 0;
    for (const TensorView& t : slices) all_usable = all_usable && usable_as_is(t);
    if (all_usable) {
      auto st = std::make_unique<Stored>();
      st->parts = slices;
      store_[b] = std::move(st);
      return Status::Ok();
    }
    SP_ASSIGN_OR_RETURN(std::unique_ptr<Stored> st, make_block(b));
    for (size_t i = 0; i < slices.size(); ++i) {
      if (int(i) == computed_part) continue;
      if (usable_as_is(slices[i])) st->parts[i] = slices[i];
      else SP_RETURN_IF_ERROR(flash_cast(slices[i], st->parts[i], s_));
    }
    store_[b] = std::move(st);
    return Status::Ok();
  }

  Status run_group(int g, PassStats* stats) {
    Hg_ = H_ / plan_.head_groups, Hkg_ = Hkv_ / plan_.head_groups;
    const auto qh = [&](const TensorView& t) { return t.narrow(2, g * Hg_, (g + 1) * Hg_); };
    const auto kvh = [&](const TensorView& t) { return t.narrow(2, g * Hkg_, (g + 1) * Hkg_); };
    const auto stat_h = [&](const TensorView& t) { return t.narrow(1, g * Hg_, (g + 1) * Hg_); };
    home_.clear();
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
      SP_RETURN_IF_ERROR(plan_.backend->delta(qh(t_.o), qh(t_.dout), pack.parts[2], s_));
    } else {
      SP_RETURN_IF_ERROR(make_home({BlockKind::kQueryPack, me_}, {qh(t_.q), qh(t_.dout), qh(t_.o), stat_h(t_.lse)}));
    }
    const char* pass_name = pass_ == Pass::kForward ? "fwd" : "bwd";
    const std::string group = std::string(pass_name) + " g" + std::to_string(g) + " ";
    for (size_t i = 0; i < steps_.size(); ++i) {
      const Step& s = steps_[i];
      if (stats) stats->rounds = std::max(stats->rounds, s.round + 1);
      if (s.kind == StepKind::kPost) {
        SP_RETURN_IF_ERROR(post(s));
        SP_RETURN_IF_ERROR(ws_.mark(s_, group + std::to_string(i) + " post"));
      } else if (s.kind == StepKind::kWait) {
        SP_RETURN_IF_ERROR(wait(s));
        SP_RETURN_IF_ERROR(ws_.mark(s_, group + std::to_string(i) + " arrived"));
      } else if (s.kind == StepKind::kConcat || s.kind == StepKind::kSplit || s.kind == StepKind::kPack) {
        SP_RETURN_IF_ERROR(s.kind == StepKind::kPack ? pack(s) : regroup(s));
        SP_RETURN_IF_ERROR(ws_.mark(s_, group + std::to_string(i) + " regrouped"));
      } else {
        SP_RETURN_IF_ERROR(compute(s));
        SP_RETURN_IF_ERROR(ws_.mark(s_, group + std::to_string(i) + " computed"));
        if (stats) ++stats->pairs_computed;
      }
      for (const auto& [block, last] : last_use_)
        if (last == i) {
          auto it = store_.find(block);
          if (it != store_.end()) release(std::move(it->second)), store_.erase(it);
          auto k = kept_.find(block);
          if (k != kept_.end()) k->second->buffer.release(s_), kept_.erase(k);
        }
    }
    SP_CHECK_ARG(pending_.empty(), "internal: the schedule left a batch unwaited");
    // The results, put together from their head parts and (unless held there) rounded once into
    // the caller's tensors.
    for (const auto& [kind, callers] : home_) {
      const Block own{kind, me_};
      SP_RETURN_IF_ERROR(join_parts(own));
      SP_ASSIGN_OR_RETURN(Stored* r, cleared_result(own));
      if (in_callers(own)) continue;
      for (size_t i = 0; i < callers.size(); ++i) SP_RETURN_IF_ERROR(flash_cast(r->parts[i], callers[i], s_));
    }
    return ws_.mark(s_, group + "out");
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
    SP_ASSIGN_OR_RETURN(std::unique_ptr<Stored> part, make_block(b));
    const std::vector<PartShape> shapes = part_shapes(b, 0);
    for (size_t i = 0; i < shapes.size(); ++i)
      SP_RETURN_IF_ERROR(flash_cast(parallel::heads_slice(w->second->parts[first + i], shapes[i].heads,
                                                          heads_of(shapes[i].heads, b.part)),
                                    part->parts[i], s_));
    return (store_[b] = std::move(part)).get();
  }

  // kPack: the query pack from the Q block and the grad pack of the same name.
  Status pack(const Step& s) {
    Block q = s.block, grads = s.block;
    q.kind = BlockKind::kQuery, grads.kind = BlockKind::kGradPack;
    SP_ASSIGN_OR_RETURN(Stored* from_q, input(q));
    SP_ASSIGN_OR_RETURN(Stored* from_grads, input(grads));
    SP_ASSIGN_OR_RETURN(std::unique_ptr<Stored> made, make_block(s.block));
    SP_RETURN_IF_ERROR(flash_cast(from_q->parts[0], made->parts[0], s_));
    for (size_t i = 1; i < made->parts.size(); ++i)
      SP_RETURN_IF_ERROR(flash_cast(from_grads->parts[i - 1], made->parts[i], s_));
    store_[s.block] = std::move(made);
    return Status::Ok();
  }
  StatusOr<Stored*> held_result(const Block& b) {
    auto it = store_.find(b);
    SP_CHECK_ARG(it != store_.end(), "internal: the schedule sends " + block_name(b) + ", which rank " +
                                         std::to_string(me_) + " lacks");
    return it->second.get();
  }

  // The home result's head parts, copied (O, LSE: disjoint heads) or added (dQ, dK/dV: GQA may
  // give two parts one K/V head) into the whole-heads result, and released.
  Status join_parts(const Block& whole) {
    for (int p = 0; p < plan_.schedule.head_parts && plan_.schedule.head_parts > 1; ++p) {
      auto it = store_.find({whole.kind, whole.shard, 1, p});
      if (it == store_.end()) continue;
      SP_ASSIGN_OR_RETURN(Stored* into, cleared_result(whole));
      const std::vector<PartShape> shapes = part_shapes(whole, 0);
      for (size_t i = 0; i < shapes.size(); ++i) {
        const TensorView slice = parallel::heads_slice(into->parts[i], shapes[i].heads, heads_of(shapes[i].heads, p));
        if (whole.kind == BlockKind::kOutput) SP_RETURN_IF_ERROR(flash_cast(it->second->parts[i], slice, s_));
        else SP_RETURN_IF_ERROR(flash_accumulate(it->second->parts[i], slice, s_));
      }
      release(std::move(it->second));
      store_.erase(it);
    }
    return Status::Ok();
  }


  Status compute(const Step& s) {
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
    using Run = parallel::SpanPositions::Run;
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
                                                    stat_rows(out->parts[1], qr), fresh, s_));
          continue;
        }
        const TensorView delta = takes_delta() ? stat_rows(q->parts[2], qr) : rows(q->parts[2], qr);
        SP_RETURN_IF_ERROR(plan_.backend->backward(rows(q->parts[0], qr), k, v, rows(q->parts[1], qr),
                                                   stat_rows(q->parts[3], qr), delta, params, rows(dq->parts[0], qr),
                                                   rows(dkv->parts[0], kr), rows(dkv->parts[1], kr), fresh, s_));
      }
    return Status::Ok();
  }

  // kConcat: the span block from its pieces (the rank's own input pieces cut from its
  // whole-heads block); kSplit: a span result cut into pieces.
  Status regroup(const Step& s) {
    const Block& b = s.block;
    const std::vector<PartShape> shapes = part_shapes(b, 0);
    Stored* whole = nullptr;
    std::unique_ptr<Stored> joined;
    if (s.kind == StepKind::kConcat) {
      SP_ASSIGN_OR_RETURN(joined, make_block(b));
      whole = joined.get();
    } else {
      SP_ASSIGN_OR_RETURN(whole, held_result(b));
    }
    int64_t row = 0;
    for (int x = b.shard; x < b.shard + b.span; ++x) {
      const Block piece{b.kind, x, 1, b.part};
      const int64_t n = plan_.layout.local_len(x);
      Stored* part = nullptr;
      if (s.kind == StepKind::kConcat) {
        SP_ASSIGN_OR_RETURN(part, input(piece));
      } else {
        SP_ASSIGN_OR_RETURN(std::unique_ptr<Stored> made, make_block(piece));
        part = (store_[piece] = std::move(made)).get();
      }
      for (size_t i = 0; i < shapes.size(); ++i) {
        const TensorView rows = parallel::rows_slice(whole->parts[i], shapes[i].heads, row, n);
        if (s.kind == StepKind::kConcat) SP_RETURN_IF_ERROR(flash_cast(part->parts[i], rows, s_));
        else SP_RETURN_IF_ERROR(flash_cast(rows, part->parts[i], s_));
      }
      row += n;
      if (s.kind == StepKind::kConcat && !(x == me_ && piece.part == kAllHeads)) {
        auto it = store_.find(piece);
        if (it != store_.end()) release(std::move(it->second)), store_.erase(it);
      }
    }
    if (s.kind == StepKind::kConcat) {
      store_[b] = std::move(joined);
    } else {
      auto it = store_.find(b);
      release(std::move(it->second)), store_.erase(it);
    }
    return Status::Ok();
  }

  struct Pending {
    std::unique_ptr<PendingExchange> exchange;
    std::vector<std::pair<Transfer, std::unique_ptr<Stored>>> arriving;  // result parts to combine
    std::vector<Block> leaving;                                            // results sent away
    std::vector<std::unique_ptr<Stored>> rounded;                          // fp32 ones' copies sent home
  };
  // Whether results travel home rounded (the inputs are not fp32, as the accumulators are).
  bool rounds_home(const Block& b, int to) const { return dtype_ != DType::kF32 && goes_home(b, to); }
  // Whether a result received from the wire can be the block as this rank holds it.
  bool adoptable(const Block& b) const { return rounds_home(b, me_) == held_rounded(b) && !in_callers(b); }

  Status post(const Step& s) {
    Pending p;
    std::vector<SendSpec> sends;
    std::vector<RecvSpec> recvs;
    for (const Transfer& t : s.sends) {
      Stored* from = nullptr;
      if (is_result(t.block.kind)) {
        SP_ASSIGN_OR_RETURN(from, held_result(t.block));
        p.leaving.push_back(t.block);
        if (rounds_home(t.block, t.peer) && !held_rounded(t.block)) {
          SP_ASSIGN_OR_RETURN(std::unique_ptr<Stored> rounded, make_block(t.block, true));
          for (size_t i = 0; i < rounded->parts.size(); ++i)
            SP_RETURN_IF_ERROR(flash_cast(from->parts[i], rounded->parts[i], s_));
          from = rounded.get();
          p.rounded.push_back(std::move(rounded));
        }
      } else {
        SP_ASSIGN_OR_RETURN(from, input(t.block));
      }
      for (const TensorView& part : from->parts)
        for (const TensorView& piece : t.trimmed() ? parallel::row_pieces(part, t.row_begin, t.row_end)
                                                   : std::vector<TensorView>{part})
          sends.push_back({t.peer, piece.data, view_bytes(piece)});
    }
    for (const Transfer& t : s.recvs) {
      SP_ASSIGN_OR_RETURN(std::unique_ptr<Stored> into,
                          make_block(t.block, rounds_home(t.block, me_), t.trimmed() ? t.row_end - t.row_begin : -1));
      for (const TensorView& part : into->parts)
        for (const TensorView& piece : t.trimmed() ? parallel::row_pieces(part, 0, t.row_end - t.row_begin)
                                                   : std::vector<TensorView>{part})
          recvs.push_back({t.peer, piece.data, view_bytes(piece)});
      if (t.combine == Combine::kReplace && (!is_result(t.block.kind) || adoptable(t.block))) {
        auto& slot = store_[t.block];
        release(std::move(slot));
        slot = std::move(into);
      } else {
        p.arriving.emplace_back(t, std::move(into));
      }
    }
    // Host-driven communicators move device buffers at once: what the stream queued must be done.
    if (!comm_.stream_ordered()) SP_RETURN_IF_ERROR(stream_synchronize(s_));
    comm_.set_stream(s_);
    auto started = comm_.start_exchange(sends, recvs);
    comm_.clear_stream();  // the caller's stream may not outlive this call
    SP_RETURN_IF_ERROR(started.status());
    p.exchange = std::move(started).value();
    pending_[s.batch] = std::move(p);
    return Status::Ok();
  }

  Status wait(const Step& s) {
    auto it = pending_.find(s.batch);
    SP_CHECK_ARG(it != pending_.end(), "internal: a wait for a batch never posted");
    Pending& p = it->second;
    SP_RETURN_IF_ERROR(p.exchange->wait_on_stream(s_));
    for (auto& rounded : p.rounded) release(std::move(rounded));
    for (const Block& b : p.leaving) {
      auto left = store_.find(b);
      if (left != store_.end()) release(std::move(left->second)), store_.erase(left);
    }
    for (auto& [t, got] : p.arriving) {
      auto& slot = store_[t.block];
      if (t.combine == Combine::kReplace) release(std::move(slot));
      if (!slot && adoptable(t.block) && !t.trimmed()) {  // the first part becomes the result
        slot = std::move(got);
        continue;
      }
      bool fresh = false;
      SP_ASSIGN_OR_RETURN(Stored* into, result(t.block, &fresh));
      if (t.trimmed()) {  // some rows of it (dQ or dK/dV, never merged): added into those
        if (fresh) SP_RETURN_IF_ERROR(clear(t.block, *into));
        for (size_t i = 0; i < into->parts.size(); ++i)
          SP_RETURN_IF_ERROR(plan_.backend->accumulate(into->parts[i].narrow(1, t.row_begin, t.row_end), got->parts[i], s_));
        release(std::move(got));
        continue;
      }
      for (size_t i = 0; i < into->parts.size(); ++i) {
        if (fresh) SP_RETURN_IF_ERROR(flash_cast(got->parts[i], into->parts[i], s_));  // the first part, cast in
        else if (t.combine == Combine::kMerge && i == 0)
          SP_RETURN_IF_ERROR(plan_.backend->merge(into->parts[0], into->parts[1], got->parts[0], got->parts[1], s_));
        else if (t.combine != Combine::kMerge) SP_RETURN_IF_ERROR(plan_.backend->accumulate(into->parts[i], got->parts[i], s_));
      }
      release(std::move(got));  // stream order: the next use of its buffer comes after these
    }
    pending_.erase(it);
    return Status::Ok();
  }

  Communicator& comm_;
  const AttentionPlan& plan_;
  const ShardTensors& t_;
  Pass pass_;
  const std::vector<Step>& steps_;
  GpuWorkspace::Impl& ws_;
  cudaStream_t s_;
  int me_;
  int64_t B_ = 0, H_ = 0, Hkv_ = 0, D_ = 0, Hg_ = 0, Hkg_ = 0;
  DType dtype_ = DType::kBF16;
  std::map<Block, std::unique_ptr<Stored>> store_;
  std::map<int, Pending> pending_;
  std::map<Block, size_t> last_use_;
  parallel::SpanPositions positions_{plan_.layout};
  ForwardState* state_;
  std::map<Block, std::shared_ptr<Stored>> kept_;  // the backward's blocks kept by the forward
  std::set<Block> rounded_;                        // results held in the inputs' dtype
  std::map<BlockKind, std::vector<TensorView>> home_;  // the caller's tensors for the group's own results
};

}  // namespace

Status run_forward_gpu(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, GpuWorkspace& ws,
                       void* stream, PassStats* stats, ForwardState* state) {
  return GpuExecutor(comm, plan, t, Pass::kForward, ws.impl(), static_cast<cudaStream_t>(stream), state).run(stats);
}

Status run_backward_gpu(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, GpuWorkspace& ws,
                        void* stream, PassStats* stats, ForwardState* state) {
  return GpuExecutor(comm, plan, t, Pass::kBackward, ws.impl(), static_cast<cudaStream_t>(stream), state)
      .run(stats);
}

}  // namespace seqpar
