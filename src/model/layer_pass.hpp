// One rank's forward and backward through the model (model.hpp), written once for both devices:
// the layer loop, the weights unit by unit from a WeightStore (ZeRO-3 gathers them), what each
// checkpointing policy keeps (transformer.hpp describes the policies), and the attention through
// a Session. `Dev` is the device's half (llm.c's pattern): its element types and the layers'
// calls, host_layers.hpp (T everywhere: the fp32 trainer and the fp64 oracle) or
// model_pass_cuda.cpp (bf16 weights and products' inputs, fp32 residual stream, statistics and
// gradients). Its arrays come from a TrainingMemory (host, or the stream arenas of one stream).
//   Dev::Weight  weights as the layers read them
//   Dev::Act     the products' inputs: the norms' outputs, q, k, v, o, the MLP's activations
//   Dev::Acc     the residual stream, row statistics (LSE, rstd) and every gradient added to
// A layer's token mixer is softmax attention (the Session's schedules) or TNL's linear attention
// (linear_attention_layer.hpp, LASP or the ulysses baseline over the Session's communicator, the
// contiguous layout).
// Checkpointing keeps a linear layer's attention output and LASP context, so its recompute
// neither sends nor receives a state.
// With offload_checkpoints, what a policy keeps of layer l (all but the last keep_layers layers,
// whose backward comes first; at least the last) waits in host memory (host_offload.hpp): copied
// out under layer l+1's forward, its device arrays given back after it, and copied back under
// layer l+1's backward, so the device holds about max(2, keep_layers) layers' checkpoints at a time.
// With tile_rows > 0 the MLP runs that many rows at a time (mlp_pass.hpp: none of its inner
// activations kept, the backward recomputing each tile from x_mid, so a checkpointing recompute
// stops at x_mid), and so do a linear mixer's backward steps before LASP
// (linear_attention_layer.hpp: LinearMixerShape).
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "model/fault_injection.hpp"
#include "model/host_offload.hpp"
#include "model/layer_activations.hpp"
#include "model/linear_attention_layer.hpp"
#include "model/mlp_pass.hpp"
#include "model/step_profile.hpp"
#include "model/step_progress.hpp"
#include "model/training_memory.hpp"
#include "parallel/linear_ulysses.hpp"
#include "seqpar/session.hpp"
#include "seqpar/transformer.hpp"

namespace seqpar::model {

// The Session's plan of causal attention over `rows` of each of `batch` sequences on this rank of
// `layout`, on tensors of the device's products' dtype (packed documents narrow the mask per batch
// inside the pass).
template <class Dev>
StatusOr<const AttentionPlan*> plan_causal(Dev& dev, const ModelConfig& c, const Layout& layout, int64_t batch,
                                           int64_t rows) {
  const auto like = [&](int64_t heads) {
    return TensorView::contiguous(nullptr, Dev::template dtype<typename Dev::Act>(),
                                  std::vector<int64_t>{batch, rows, heads, c.head_dim()}, dev.device());
  };
  AttentionParams params;
  params.mask = MaskSpec::causal();
  return dev.session().plan(layout, params, like(c.heads), like(c.kv_heads));
}

template <class Dev>
class LayerPass {
 public:
  using W = typename Dev::Weight;
  using A = typename Dev::Act;
  using R = typename Dev::Acc;

  // plan: the attention over this rank's rows; early: the sequence's first half (the sequence
  // policy alone; may be null). Both are copied: the Session's cache may start over (packed
  // documents plan a mask a sequence). chunk: rows of logits the fused LM head makes at once.
  // linear: how linear layers split over the ranks (LASP's chain or all-gather, or ulysses).
  // offload: the policy's checkpoints wait in host memory (a policy other than none), all but
  // the last keep_layers layers' (at least 1). tile_rows: the MLP's rows at a time (0: all of them).
  LayerPass(const ModelConfig& config, Checkpointing policy, Dev& dev, const AttentionPlan& plan,
            const AttentionPlan* early, int64_t chunk, LaspAlgorithm linear, bool offload = false,
            int64_t tile_rows = 0, int64_t keep_layers = 1)
      : c_(config), policy_(policy), dev_(dev), mem_(dev.memory()), plan_(std::make_unique<AttentionPlan>(plan)),
        early_(early ? std::make_unique<AttentionPlan>(*early) : nullptr), chunk_(chunk), linear_(linear),
        offload_checkpoints_(offload), keep_layers_(std::max<int64_t>(1, keep_layers)), tile_rows_(tile_rows), mlp_(config, dev, dev.memory(), tile_rows),
        at_(parameter_offsets(config)), units_(weight_units(config)), lasp_(size_t(config.layers)) {}

  const AttentionPlan& attention_plan() const { return *plan_; }
  // The attention over another layout of the same length and ranks from the next pass on (the
  // documents layout of each packed batch), keeping the first such layout's auto choice
  // (Session::keep_choice). Not with the sequence policy, whose first-half plan belongs to the
  // layout, nor linear-attention layers on anything but the contiguous layout (LASP).
  Status use_layout(const Layout& layout) {
    const Layout& now = plan_->layout;
    SP_CHECK_ARG(layout.seq_len() == now.seq_len() && layout.ranks() == now.ranks(),
                 "a new layout must split the same " + std::to_string(now.seq_len()) + " tokens over the same " +
                     std::to_string(now.ranks()) + " ranks");
    SP_CHECK_SUPPORTED(!c_.has_linear_layers() || layout.kind() == LayoutKind::kContiguous,
                       "linear-attention layers run LASP, which needs the contiguous layout");
    SP_CHECK_SUPPORTED(!early_, "sequence-level checkpointing keeps one striped layout; a layout per batch "
                                "cannot take it");
    Session& session = dev_.session();
    SP_ASSIGN_OR_RETURN(const AttentionPlan* plan, plan_causal(dev_, c_, layout, plan_->block_bytes.batch,
                                                               layout.local_len(session.comm().rank())));
    session.keep_choice(*plan);  // the first batch's pick serves the rest
    plan_ = std::make_unique<AttentionPlan>(*plan);
    return Status::Ok();
  }

  // Forward (and with `backward` the backward, adding scale * the gradient into the store) of
  // this rank's shard.
  Status run(WeightStore& store, bool backward, const ShardBatch& b, double scale, StepLoss* loss) {
    SP_RETURN_IF_ERROR(check_batch(b));
    const auto weights = [&](int64_t begin, int64_t end) { return unit_weights<W>(store, begin, end); };
    const auto gradient = [&](int64_t begin, int64_t end) { return unit_gradient<R>(store, begin, end); };
    const auto [e0, e1] = units_.front();
    const auto [f0, f1] = units_.back();
    SP_ASSIGN_OR_RETURN(const typename Dev::Tokens tok, dev_.tokens(b));
    SP_ASSIGN_OR_RETURN(positions_, dev_.positions(b));
    row_positions_ = !b.rope_positions.empty();
    documents_ = b.documents.empty() ? nullptr : &b.documents;
    std::vector<Acts> kept(size_t(c_.layers));
    const bool offloading = backward && offload_checkpoints_ && policy_ != Checkpointing::kNone;
    if (offloading && !offload_) {
      SP_ASSIGN_OR_RETURN(offload_, make_host_offload(mem_));
    }
    // The last layers' checkpoints stay: their backward comes first.
    const auto offloaded = [&](int64_t l) { return offloading && l < c_.layers - keep_layers_; };
    // Destroyed before `kept`: on a failed pass no array is given back under a copy still using it.
    const CopiesEnd copies_end{offloading ? offload_.get() : nullptr};
    SP_ASSIGN_OR_RETURN(Array<R> x, mem_.template make<R>(rows_ * hid()));
    {
      SP_ASSIGN_OR_RETURN(const W* embed, weights(e0, e1));
      SP_RETURN_IF_ERROR(dev_.embedding_forward(tok.inputs, embed + (at_.embed - e0), x.p(), rows_, hid()));
      SP_RETURN_IF_ERROR(store.release(e0, e1));
    }
    int64_t kept_bytes = 0, peak = 0;
    for (int64_t l = 0; l < c_.layers; ++l) {
      Acts& a = kept[size_t(l)];
      a.x_in = std::move(x);
      SP_ASSIGN_OR_RETURN(x, mem_.template make<R>(rows_ * hid()));
      const auto [u0, u1] = units_[size_t(1 + l)];
      SP_ASSIGN_OR_RETURN(const W* unit, weights(u0, u1));
      SP_RETURN_IF_ERROR(layer_forward(l, slots(unit, u0, l), a, x, Attn::kRun));
      SP_RETURN_IF_ERROR(store.release(u0, u1));
      if (l == 0) fault_point("forward");
      report_layer("forward", l + 1, c_.layers);
      peak = std::max(peak, kept_bytes + a.bytes());
      if (backward) {
        SP_RETURN_IF_ERROR(keep_for_policy(l, a));
      } else {
        a = {};
      }
      kept_bytes += a.bytes();
      if (offloaded(l)) SP_RETURN_IF_ERROR(offload_to_host(*offload_, l, a));
      if (l >= 1 && offloaded(l - 1)) {  // its copies ran under this layer's forward
        kept_bytes -= kept[size_t(l - 1)].bytes();
        SP_RETURN_IF_ERROR(drop_offloaded(*offload_, l - 1, kept[size_t(l - 1)]));
      }
    }
    SP_ASSIGN_OR_RETURN(Array<A> hf, mem_.template make<A>(rows_ * hid()));
    SP_ASSIGN_OR_RETURN(Array<R> rstd_f, mem_.template make<R>(rows_));
    SP_ASSIGN_OR_RETURN(const W* fin, weights(f0, f1));
    const W* head = c_.tied ? nullptr : fin + (at_.head - f0);
    if (c_.tied) {
      SP_ASSIGN_OR_RETURN(const W* embed, weights(e0, e1));
      head = embed + (at_.head - e0);
    }
    const W* final_norm = fin + (at_.final_norm - f0);
    SP_RETURN_IF_ERROR(dev_.rmsnorm_forward(x.p(), final_norm, hf.p(), rstd_f.p(), rows_, hid(), c_.norm_eps));
    const int64_t chunk = chunk_ > 0 ? chunk_ : rows_;
    typename Dev::LossParts parts;
    int64_t backward_bytes = 0;
    if (backward) {
      SP_ASSIGN_OR_RETURN(Array<R> dhf, mem_.template make<R>(rows_ * hid()));
      SP_ASSIGN_OR_RETURN(Array<R> dx, mem_.template make_zeroed<R>(rows_ * hid()));
      backward_bytes = int64_t(dhf.n * sizeof(R) + dx.n * sizeof(R));
      SP_ASSIGN_OR_RETURN(R* d_fin, gradient(f0, f1));
      R* d_embed = nullptr;
      if (c_.tied) {
        SP_ASSIGN_OR_RETURN(d_embed, gradient(e0, e1));
      }
      R* d_head = c_.tied ? d_embed + (at_.head - e0) : d_fin + (at_.head - f0);
      // The loss and its gradient in one pass over the logits.
      SP_RETURN_IF_ERROR(dev_.lm_head(hf.p(), head, tok.targets, rows_, hid(), c_.vocab, chunk, &parts, scale, dhf.p(),
                                      d_head));
      SP_RETURN_IF_ERROR(dev_.rmsnorm_backward(x.p(), final_norm, rstd_f.p(), dhf.p(), dx.p(),
                                               d_fin + (at_.final_norm - f0), rows_, hid()));
      dhf.buffer.reset(), hf.buffer.reset();  // read for the last time: not held under the layers' backward
      SP_RETURN_IF_ERROR(store.gradient_done(f0, f1));
      SP_RETURN_IF_ERROR(store.release(f0, f1));
      if (c_.tied) SP_RETURN_IF_ERROR(store.release(e0, e1));
      for (int64_t l = c_.layers - 1; l >= 0; --l) {
        Acts& a = kept[size_t(l)];
        if (l >= 1 && offloaded(l - 1)) {  // comes back under this layer's backward
          SP_RETURN_IF_ERROR(offload_from_host(mem_, *offload_, l - 1, kept[size_t(l - 1)]));
          kept_bytes += kept[size_t(l - 1)].bytes();
        }
        if (offloaded(l)) SP_RETURN_IF_ERROR(offload_->wait(l));
        const int64_t kept_l = a.bytes();
        const auto [u0, u1] = units_[size_t(1 + l)];
        SP_ASSIGN_OR_RETURN(const W* unit, weights(u0, u1));
        if (policy_ != Checkpointing::kNone)  // recompute what the policy dropped (a tiled MLP: nothing)
          SP_RETURN_IF_ERROR(layer_forward(l, slots(unit, u0, l), a, x,
                                           linear(l) || policy_ == Checkpointing::kAttention ? Attn::kKept
                                           : policy_ == Checkpointing::kSequence            ? Attn::kFirstHalf
                                                                                            : Attn::kRun,
                                           /*mlp=*/tile_rows_ == 0));
        peak = std::max(peak, kept_bytes - kept_l + a.bytes());
        SP_ASSIGN_OR_RETURN(R* grad_unit, gradient(u0, u1));
        SP_RETURN_IF_ERROR(layer_backward(l, slots(unit, u0, l), slots(grad_unit, u0, l), a, dx));
        SP_RETURN_IF_ERROR(store.gradient_done(u0, u1));
        SP_RETURN_IF_ERROR(store.release(u0, u1));
        if (l == 0) fault_point("backward");
        report_layer("backward", c_.layers - l, c_.layers);
        kept_bytes -= kept_l;
        a = {};
      }
      if (!c_.tied) {
        SP_ASSIGN_OR_RETURN(d_embed, gradient(e0, e1));
      }
      SP_RETURN_IF_ERROR(dev_.embedding_backward(b.inputs.data(), dx.p(), d_embed + (at_.embed - e0), rows_, hid()));
      SP_RETURN_IF_ERROR(store.gradient_done(e0, e1));
    } else {
      SP_RETURN_IF_ERROR(dev_.lm_head(hf.p(), head, tok.targets, rows_, hid(), c_.vocab, chunk, &parts, 0.0, nullptr,
                                      nullptr));
      SP_RETURN_IF_ERROR(store.release(f0, f1));
      if (c_.tied) SP_RETURN_IF_ERROR(store.release(e0, e1));
    }
    SP_ASSIGN_OR_RETURN(loss->loss_sum, dev_.loss_sum(parts));  // waits for the pass
    loss->work_ms = named(dev_.take_profile());
    loss->counted = 0;
    for (int32_t t : b.targets) loss->counted += t >= 0;
    // Counted for the whole pass, though the backward's layers run without hf and dhf.
    const int64_t held = int64_t((2 * x.n + rstd_f.n) * sizeof(R) + hf.n * sizeof(A)) + backward_bytes;
    loss->activation_bytes_peak = dev_.activation_peak(peak + held);
    return Status::Ok();
  }

 private:
  using Acts = LayerActs<A, R>;
  // A layer's weights or their gradients, by name (mg: a linear layer's output gate, else null).
  template <class P>
  struct Slots {
    P n1, wq, wk, wv, mg, wo, n2, wg, wu, wd;
  };
  // Where a layer's forward gets the attention's (O, LSE): it runs it; a.o and a.lse hold it
  // (attention policy); or it runs it for the first half of the shard alone and takes the second
  // half from a.o_late and a.lse_late (sequence policy).
  enum class Attn { kRun, kKept, kFirstHalf };

  int64_t hid() const { return c_.hidden; }
  int64_t H() const { return c_.heads; }
  int64_t Hkv() const { return c_.kv_heads; }
  int64_t D() const { return c_.head_dim(); }
  int64_t F() const { return c_.ffn; }
  bool linear(int64_t l) const { return c_.mixer(l) == MixerKind::kLinear; }

  // Layer l's tensors in its unit's array, which starts at flat element `begin`.
  template <class P>
  Slots<P*> slots(P* unit, int64_t begin, int64_t l) const {
    const LayerOffsets& s = at_.layers[size_t(l)];
    const auto in = [&](int64_t offset) { return unit + (offset - begin); };
    P* mg = s.mix_gate >= 0 ? in(s.mix_gate) : nullptr;
    return {in(s.norm1), in(s.q), in(s.k), in(s.v), mg, in(s.o), in(s.norm2), in(s.gate), in(s.up), in(s.down)};
  }

  Status check_batch(const ShardBatch& b) {
    SP_CHECK_ARG(b.batch >= 1 && b.seq >= 1, "a shard needs at least one sequence and one row");
    SP_CHECK_ARG(int64_t(b.inputs.size()) == b.batch * b.seq && int64_t(b.targets.size()) == b.batch * b.seq &&
                     int64_t(b.positions.size()) == b.seq,
                 "a shard's inputs and targets are [batch, seq] and its positions [seq]");
    const int64_t local = plan_->layout.local_len(plan_->rank);
    SP_CHECK_ARG(b.seq == local, "this rank holds " + std::to_string(local) + " rows of each sequence, not " +
                                     std::to_string(b.seq));
    for (int32_t t : b.inputs)
      SP_CHECK_ARG(t >= 0 && t < c_.vocab, "input token " + std::to_string(t) + " is outside the vocabulary of " +
                                               std::to_string(c_.vocab));
    for (int32_t t : b.targets)
      SP_CHECK_ARG(t < c_.vocab, "target token " + std::to_string(t) + " is outside the vocabulary of " +
                                     std::to_string(c_.vocab));
    if (!b.documents.empty()) {
      const int64_t N = plan_->layout.seq_len();
      SP_CHECK_ARG(int64_t(b.documents.size()) == b.batch, "packed documents need one offset list per sequence");
      for (const std::vector<int64_t>& d : b.documents)
        SP_CHECK_ARG(d.size() >= 2 && d.front() == 0 && d.back() == N && std::is_sorted(d.begin(), d.end()) &&
                         std::adjacent_find(d.begin(), d.end()) == d.end(),
                     "a sequence's documents are offsets rising from 0 to its length " + std::to_string(N));
      SP_CHECK_SUPPORTED(policy_ != Checkpointing::kSequence,
                         "sequence-level checkpointing recomputes one causal document a sequence; with packed "
                         "documents take another policy");
    }
    SP_CHECK_ARG(b.rope_positions.empty() || int64_t(b.rope_positions.size()) == b.batch * b.seq,
                 "RoPE positions are one per row of the shard");
    if (c_.has_linear_layers()) {
      SP_CHECK_SUPPORTED(plan_->layout.kind() == LayoutKind::kContiguous,
                         "linear-attention layers run LASP, which needs the contiguous layout (--layout contiguous)");
      SP_CHECK_SUPPORTED(b.documents.empty(), "linear-attention layers do not reset their state at document "
                                              "boundaries yet: packed documents need softmax layers");
      // Before any rank sends: ulysses gives each rank a part of the heads (q, k, v: H each).
      const std::string why =
          linear_ == LaspAlgorithm::kUlysses ? linear_ulysses::refusal(plan_->layout.ranks(), H(), H()) : "";
      SP_CHECK_SUPPORTED(why.empty(), why + " (lasp and lasp2 take any rank count)");
    }
    B_ = b.batch, S_ = b.seq, rows_ = B_ * S_;
    return Status::Ok();
  }

  template <class X>
  TensorView view(X* p, std::initializer_list<int64_t> shape) const {
    return TensorView::contiguous(p, Dev::template dtype<X>(), shape, dev_.device());
  }
  // One pass of the attention; with packed documents, one call a sequence under its documents'
  // mask (the Session plans each mask once and keeps it).
  Status attention(const AttentionPlan& plan, Pass pass, const ShardTensors& t) {
    const auto timed = dev_.time(Work::kAttention);
    if (!documents_) return dev_.session().run(plan, pass, t, {dev_.stream()});
    for (int64_t e = 0; e < B_; ++e) {
      const auto one = [&](const TensorView& v) { return v.data ? v.narrow(0, e, e + 1) : v; };
      const ShardTensors te{one(t.q), one(t.k), one(t.v), one(t.o), one(t.lse), one(t.dout), one(t.dq), one(t.dk), one(t.dv)};
      AttentionParams params;
      params.mask = MaskSpec::documents((*documents_)[size_t(e)]);
      SP_ASSIGN_OR_RETURN(const AttentionPlan* mine, dev_.session().plan(plan.layout, params, te.q, te.k));
      SP_RETURN_IF_ERROR(dev_.session().run(*mine, pass, te, {dev_.stream()}));
    }
    return Status::Ok();
  }
  // RoPE on [B, S, heads, D]: the shard's positions for every sequence, or each row's own.
  Status rope(A* x, int64_t heads, bool inverse) {
    if (!row_positions_) return dev_.rope_apply(x, positions_, B_, S_, heads, D(), c_.rope_theta, inverse);
    for (int64_t e = 0; e < B_; ++e)
      SP_RETURN_IF_ERROR(dev_.rope_apply(x + e * S_ * heads * D(), positions_ + e * S_, 1, S_, heads, D(), c_.rope_theta,
                                         inverse));
    return Status::Ok();
  }

  // The attention of the shard's first half (global positions below N/2 under the striped
  // layout, which see only keys there) into a.o and a.lse, the second half from what was kept.
  Status first_half_attention(Acts& a) {
    const int64_t half = S_ / 2, late = S_ - half;
    const size_t q_row = size_t(H() * D()) * sizeof(A), kv_row = size_t(Hkv() * D()) * sizeof(A), l = sizeof(R);
    SP_ASSIGN_OR_RETURN(Array<A> q, mem_.template make<A>(B_ * half * H() * D()));
    SP_ASSIGN_OR_RETURN(Array<A> k, mem_.template make<A>(B_ * half * Hkv() * D()));
    SP_ASSIGN_OR_RETURN(Array<A> v, mem_.template make<A>(B_ * half * Hkv() * D()));
    SP_ASSIGN_OR_RETURN(Array<A> oh, mem_.template make<A>(B_ * half * H() * D()));
    SP_ASSIGN_OR_RETURN(Array<R> lh, mem_.template make<R>(B_ * H() * half));
    SP_RETURN_IF_ERROR(mem_.copy_rows(q.p(), half * q_row, a.q.p(), S_ * q_row, half * q_row, size_t(B_)));
    SP_RETURN_IF_ERROR(mem_.copy_rows(k.p(), half * kv_row, a.k.p(), S_ * kv_row, half * kv_row, size_t(B_)));
    SP_RETURN_IF_ERROR(mem_.copy_rows(v.p(), half * kv_row, a.v.p(), S_ * kv_row, half * kv_row, size_t(B_)));
    const ShardTensors t{view(q.p(), {B_, half, H(), D()}),  view(k.p(), {B_, half, Hkv(), D()}),
                         view(v.p(), {B_, half, Hkv(), D()}), view(oh.p(), {B_, half, H(), D()}),
                         view(lh.p(), {B_, H(), half}),       {}, {}, {}, {}};
    SP_RETURN_IF_ERROR(attention(*early_, Pass::kForward, t));
    SP_ASSIGN_OR_RETURN(a.o, mem_.template make<A>(rows_ * H() * D()));
    SP_ASSIGN_OR_RETURN(a.lse, mem_.template make<R>(B_ * H() * S_));
    char* o = reinterpret_cast<char*>(a.o.p());
    SP_RETURN_IF_ERROR(mem_.copy_rows(o, S_ * q_row, oh.p(), half * q_row, half * q_row, size_t(B_)));
    SP_RETURN_IF_ERROR(mem_.copy_rows(o + half * q_row, S_ * q_row, a.o_late.p(), late * q_row, late * q_row, size_t(B_)));
    char* ls = reinterpret_cast<char*>(a.lse.p());
    SP_RETURN_IF_ERROR(mem_.copy_rows(ls, S_ * l, lh.p(), half * l, half * l, size_t(B_ * H())));
    SP_RETURN_IF_ERROR(mem_.copy_rows(ls + half * l, S_ * l, a.lse_late.p(), late * l, late * l, size_t(B_ * H())));
    a.o_late = {}, a.lse_late = {};
    return Status::Ok();
  }

  // A linear layer's mixer, its shape and its decays.
  LinearMixerShape mixer_shape() const {
    LinearMixerShape m;
    m.batch = B_, m.seq = S_, m.hidden = c_.hidden, m.heads = c_.heads, m.head_dim = c_.head_dim();
    m.norm_eps = c_.norm_eps;
    m.gate = c_.linear_silu_gate ? MixerGate::kSilu : MixerGate::kIdentity;
    m.tile_rows = tile_rows_;  // the backward's row-wise steps before LASP, as the MLP
    return m;
  }
  LinearAttentionParams mixer_params(int64_t l) const {
    LinearAttentionParams p;
    p.decay = c_.linear_decays(l);
    return p;
  }
  template <class P>
  static LinearMixerSlots<P> mixer_slots(const Slots<P>& w) {
    return {w.wq, w.wk, w.wv, w.mg, w.wo};
  }
  LinearMixerActs<A, R> mixer_acts(Acts& a) {
    return {a.q_in.p(), a.k_in.p(), a.q.p(), a.k.p(), a.v.p(), a.mix_g.p(), a.o.p(), a.normed.p(), a.rstd_o.p()};
  }
  // x_mid = x_in + mixer(h1), linear_ over the ranks, from the layer's context (o_given: the kept o
  // and context).
  Status linear_mixer_forward(int64_t l, const Slots<const W*>& w, Acts& a, bool o_given) {
    const int64_t rows = rows_, width = c_.heads * c_.head_dim();
    for (Array<A>* t : {&a.q_in, &a.k_in, &a.q, &a.k, &a.v, &a.mix_g, &a.normed}) {
      SP_ASSIGN_OR_RETURN(*t, mem_.template make<A>(rows * width));
    }
    if (!o_given) {
      SP_ASSIGN_OR_RETURN(a.o, mem_.template make<A>(rows * width));
    }
    SP_ASSIGN_OR_RETURN(a.rstd_o, mem_.template make<R>(rows));
    SP_RETURN_IF_ERROR(mem_.copy(a.x_mid.p(), a.x_in.p(), size_t(rows * c_.hidden) * sizeof(R)));
    return dev_.linear_mixer_forward(dev_.session().comm(), plan_->layout, linear_, mixer_params(l),
                                     mixer_shape(), mixer_slots(w), a.h1.p(), mixer_acts(a), a.x_mid.p(),
                                     &lasp_[size_t(l)], LinearMixerRun{true, o_given});
  }

  // The layer's forward from a.x_in; fills every activation and writes the output to x_out. Without
  // `mlp` it stops at x_mid (a tiled MLP's backward recomputes the rest itself; x_out unwritten).
  Status layer_forward(int64_t l, const Slots<const W*>& w, Acts& a, Array<R>& x_out, Attn attention_from,
                       bool mlp = true) {
    const int64_t rows = rows_, hid = c_.hidden, H = c_.heads, Hkv = c_.kv_heads, D = c_.head_dim();
    const double eps = c_.norm_eps;
    SP_ASSIGN_OR_RETURN(a.h1, mem_.template make<A>(rows * hid));
    SP_ASSIGN_OR_RETURN(a.rstd1, mem_.template make<R>(rows));
    SP_RETURN_IF_ERROR(dev_.rmsnorm_forward(a.x_in.p(), w.n1, a.h1.p(), a.rstd1.p(), rows, hid, eps));
    SP_ASSIGN_OR_RETURN(a.x_mid, mem_.template make<R>(rows * hid));
    if (linear(l)) {
      SP_RETURN_IF_ERROR(linear_mixer_forward(l, w, a, attention_from == Attn::kKept));
      return mlp ? mlp_forward(w, a, x_out) : Status::Ok();
    }
    SP_ASSIGN_OR_RETURN(a.q, mem_.template make<A>(rows * H * D));
    SP_ASSIGN_OR_RETURN(a.k, mem_.template make<A>(rows * Hkv * D));
    SP_ASSIGN_OR_RETURN(a.v, mem_.template make<A>(rows * Hkv * D));
    SP_RETURN_IF_ERROR(dev_.linear_forward(a.h1.p(), w.wq, a.q.p(), rows, hid, H * D));
    SP_RETURN_IF_ERROR(dev_.linear_forward(a.h1.p(), w.wk, a.k.p(), rows, hid, Hkv * D));
    SP_RETURN_IF_ERROR(dev_.linear_forward(a.h1.p(), w.wv, a.v.p(), rows, hid, Hkv * D));
    SP_RETURN_IF_ERROR(rope(a.q.p(), H, false));
    SP_RETURN_IF_ERROR(rope(a.k.p(), Hkv, false));
    if (attention_from == Attn::kFirstHalf) SP_RETURN_IF_ERROR(first_half_attention(a));
    if (attention_from == Attn::kRun) {
      SP_ASSIGN_OR_RETURN(a.o, mem_.template make<A>(rows * H * D));
      SP_ASSIGN_OR_RETURN(a.lse, mem_.template make<R>(B_ * H * S_));
      const ShardTensors t{view(a.q.p(), {B_, S_, H, D}), view(a.k.p(), {B_, S_, Hkv, D}),
                           view(a.v.p(), {B_, S_, Hkv, D}), view(a.o.p(), {B_, S_, H, D}),
                           view(a.lse.p(), {B_, H, S_}),     {}, {}, {}, {}};
      SP_RETURN_IF_ERROR(attention(*plan_, Pass::kForward, t));
    }
    // x_mid = x_in + o_proj(o).
    SP_RETURN_IF_ERROR(mem_.copy(a.x_mid.p(), a.x_in.p(), size_t(rows * hid) * sizeof(R)));
    SP_RETURN_IF_ERROR(dev_.linear_forward_add(a.o.p(), w.wo, a.x_mid.p(), rows, H * D, hid));
    return mlp ? mlp_forward(w, a, x_out) : Status::Ok();
  }

  // The layer's MLP half (mlp_pass.hpp) on this call's rows; untiled, its inner activations kept in a.
  typename MlpPass<Dev>::Kept mlp_kept(Acts& a) { return {a.h2, a.g, a.u, a.rstd2}; }
  template <class P>
  static typename MlpPass<Dev>::template Weights<P> mlp_weights(const Slots<P>& w) {
    return {w.n2, w.wg, w.wu, w.wd};
  }
  Status mlp_forward(const Slots<const W*>& w, Acts& a, Array<R>& x_out) {
    return mlp_.forward(mlp_weights(w), a.x_mid.p(), rows_, mlp_kept(a), x_out.p());
  }
  Status mlp_backward(const Slots<const W*>& w, const Slots<R*>& dw, Acts& a, Array<R>& dx) {
    return mlp_.backward(mlp_weights(w), mlp_weights(dw), a.x_mid.p(), rows_, mlp_kept(a), dx.p());
  }

  // dx: in, the gradient at the layer's output; out, at its input. Adds the weights' gradients.
  Status layer_backward(int64_t l, const Slots<const W*>& w, const Slots<R*>& dw, Acts& a, Array<R>& dx) {
    const int64_t rows = rows_, hid = c_.hidden, H = c_.heads, Hkv = c_.kv_heads, D = c_.head_dim();
    SP_RETURN_IF_ERROR(mlp_backward(w, dw, a, dx));  // its scratch given back before the mixer's
    a.x_mid = {}, a.h2 = {}, a.g = {}, a.u = {}, a.rstd2 = {};  // read for the last time
    Array<A> scratch;  // the products' dy where Act is narrower than Acc
    SP_ASSIGN_OR_RETURN(Array<R> dh, mem_.template make<R>(rows * hid));
    if (linear(l)) {  // x_mid = x_in + mixer(h1): dh = the mixer's dx (overwritten)
      SP_ASSIGN_OR_RETURN(const A* dy_mix, dev_.as_act(dx.p(), rows * hid, scratch));
      SP_RETURN_IF_ERROR(dev_.linear_mixer_backward(dev_.session().comm(), plan_->layout, mixer_params(l),
                                                    mixer_shape(), mixer_slots(w), a.h1.p(), mixer_acts(a), dy_mix,
                                                    dh.p(), mixer_slots(dw), &lasp_[size_t(l)]));
      return dev_.rmsnorm_backward(a.x_in.p(), w.n1, a.rstd1.p(), dh.p(), dx.p(), dw.n1, rows, hid);
    }
    // Attention: x_mid = x_in + o_proj(attention(q, k, v)).
    SP_ASSIGN_OR_RETURN(Array<A> dout, mem_.template make<A>(rows * H * D));  // dO, straight from the product
    SP_ASSIGN_OR_RETURN(Array<A> dq, mem_.template make<A>(rows * H * D));
    SP_ASSIGN_OR_RETURN(Array<A> dk, mem_.template make<A>(rows * Hkv * D));
    SP_ASSIGN_OR_RETURN(Array<A> dv, mem_.template make<A>(rows * Hkv * D));
    SP_ASSIGN_OR_RETURN(const A* dy, dev_.as_act(dx.p(), rows * hid, scratch));
    SP_RETURN_IF_ERROR(dev_.linear_backward_act(a.o.p(), w.wo, dy, dout.p(), dw.wo, rows, H * D, hid));
    const ShardTensors t{view(a.q.p(), {B_, S_, H, D}),  view(a.k.p(), {B_, S_, Hkv, D}),
                         view(a.v.p(), {B_, S_, Hkv, D}), view(a.o.p(), {B_, S_, H, D}),
                         view(a.lse.p(), {B_, H, S_}),     view(dout.p(), {B_, S_, H, D}),
                         view(dq.p(), {B_, S_, H, D}),     view(dk.p(), {B_, S_, Hkv, D}),
                         view(dv.p(), {B_, S_, Hkv, D})};
    SP_RETURN_IF_ERROR(attention(*plan_, Pass::kBackward, t));
    SP_RETURN_IF_ERROR(rope(dq.p(), H, true));
    SP_RETURN_IF_ERROR(rope(dk.p(), Hkv, true));
    SP_RETURN_IF_ERROR(dev_.linear_backward(a.h1.p(), w.wq, dq.p(), dh.p(), dw.wq, rows, hid, H * D, false));
    SP_RETURN_IF_ERROR(dev_.linear_backward(a.h1.p(), w.wk, dk.p(), dh.p(), dw.wk, rows, hid, Hkv * D, true));
    SP_RETURN_IF_ERROR(dev_.linear_backward(a.h1.p(), w.wv, dv.p(), dh.p(), dw.wv, rows, hid, Hkv * D, true));
    return dev_.rmsnorm_backward(a.x_in.p(), w.n1, a.rstd1.p(), dh.p(), dx.p(), dw.n1, rows, hid);
  }

  // What a policy keeps of a layer's activations after its forward (a linear layer's context
  // stays in lasp_ whatever the policy).
  Status keep_for_policy(int64_t l, Acts& a) {
    if (policy_ == Checkpointing::kNone) return Status::Ok();
    Acts kept;
    kept.x_in = std::move(a.x_in);
    if (linear(l)) {  // every policy keeps its o: the recompute runs no LASP forward
      kept.o = std::move(a.o);
      a = std::move(kept);
      return Status::Ok();
    }
    if (policy_ == Checkpointing::kAttention) kept.o = std::move(a.o), kept.lse = std::move(a.lse);
    if (policy_ == Checkpointing::kSequence) {  // the second half of O and LSE
      const int64_t half = S_ / 2, late = S_ - half;
      const size_t q_row = size_t(H() * D()) * sizeof(A), l = sizeof(R);
      SP_ASSIGN_OR_RETURN(kept.o_late, mem_.template make<A>(B_ * late * H() * D()));
      SP_ASSIGN_OR_RETURN(kept.lse_late, mem_.template make<R>(B_ * H() * late));
      SP_RETURN_IF_ERROR(mem_.copy_rows(kept.o_late.p(), late * q_row, reinterpret_cast<char*>(a.o.p()) + half * q_row,
                                        S_ * q_row, late * q_row, size_t(B_)));
      SP_RETURN_IF_ERROR(mem_.copy_rows(kept.lse_late.p(), late * l, reinterpret_cast<char*>(a.lse.p()) + half * l,
                                        S_ * l, late * l, size_t(B_ * H())));
    }
    a = std::move(kept);
    return Status::Ok();
  }

  ModelConfig c_;
  Checkpointing policy_;
  Dev& dev_;
  TrainingMemory& mem_;
  std::unique_ptr<const AttentionPlan> plan_, early_;
  int64_t chunk_;
  LaspAlgorithm linear_;
  bool offload_checkpoints_;
  int64_t keep_layers_;  // the last layers whose checkpoints stay on the device when offloading
  int64_t tile_rows_;  // the MLP's rows at a time (0: all)
  MlpPass<Dev> mlp_;
  std::unique_ptr<HostOffload> offload_;  // made at the first pass that offloads
  ParameterOffsets at_;
  std::vector<std::pair<int64_t, int64_t>> units_;  // weight_units
  std::vector<LaspContext> lasp_;                   // a linear layer's, from its forward to its backward
  // This call's shapes, RoPE positions ([S], or [B, S] with row_positions_) and documents.
  int64_t B_ = 0, S_ = 0, rows_ = 0;
  const int64_t* positions_ = nullptr;
  bool row_positions_ = false;
  const std::vector<std::vector<int64_t>>* documents_ = nullptr;
};

}  // namespace seqpar::model
