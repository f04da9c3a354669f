// One rank's pass through the model (include/seqpar/transformer.hpp): the layer loop, what each
// checkpointing policy keeps, and the attention through the CPU executor.
#include "seqpar/transformer.hpp"

#include <algorithm>
#include <cstring>

#include "model/layers.hpp"

namespace seqpar {

StatusOr<Checkpointing> parse_checkpointing(const std::string& name) {
  if (name == "none") return Checkpointing::kNone;
  if (name == "full") return Checkpointing::kFull;
  if (name == "attention") return Checkpointing::kAttention;
  if (name == "sequence") return Checkpointing::kSequence;
  return SP_STATUS(StatusCode::kInvalidArgument,
                   "unknown checkpointing policy '" + name + "' (available: none, full, attention, sequence)");
}

const char* checkpointing_name(Checkpointing policy) {
  switch (policy) {
    case Checkpointing::kNone: return "none";
    case Checkpointing::kFull: return "full";
    case Checkpointing::kAttention: return "attention";
    case Checkpointing::kSequence: return "sequence";
  }
  return "?";
}

namespace {

using model::linear_backward;
using model::linear_forward;

// Where a layer's weights (or their gradients) sit in the flat buffer.
template <class P>
struct LayerSlots {
  P n1, wq, wk, wv, wo, n2, wg, wu, wd;
};

// A layer's activations, all of them (what the backward reads); each policy keeps some.
template <class T>
struct LayerActs {
  std::vector<T> x_in, h1, rstd1, q, k, v, o, lse, x_mid, h2, rstd2, g, u;
  std::vector<T> o_late, lse_late;  // sequence policy: O and LSE of the shard's second half
  int64_t bytes() const {
    size_t n = 0;
    for (const auto* v : {&x_in, &h1, &rstd1, &q, &k, &v, &o, &lse, &x_mid, &h2, &rstd2, &g, &u, &o_late, &lse_late})
      n += v->size();
    return int64_t(n * sizeof(T));
  }
};

}  // namespace

template <class T>
struct Transformer<T>::Impl {
  ModelConfig c;
  Checkpointing policy;
  Communicator& comm;
  AttentionPlan plan;
  std::unique_ptr<AttentionPlan> early_plan;  // sequence policy: the first half of the sequence
  ParameterOffsets at;  // where each tensor starts in the flat buffer
  int64_t embed_at = 0, final_norm_at = 0, head_at = 0;

  // This step's shapes.
  int64_t B = 0, S = 0, rows = 0;
  const std::vector<int64_t>* positions = nullptr;

  Impl(const ModelConfig& config, Checkpointing p, Communicator& cm, AttentionPlan pl)
      : c(config), policy(p), comm(cm), plan(std::move(pl)), at(parameter_offsets(config)),
        embed_at(at.embed), final_norm_at(at.final_norm), head_at(at.head), units(weight_units(config)) {}

  // Layer l's weights (or gradients) in a buffer holding its unit, which starts at flat element
  // unit_begin.
  template <class P>
  LayerSlots<P> slots(P unit, int64_t unit_begin, int64_t l) const {
    const LayerOffsets& s = at.layers[size_t(l)];
    const auto in_unit = [&](int64_t offset) { return unit + (offset - unit_begin); };
    return {in_unit(s.norm1), in_unit(s.q),     in_unit(s.k),  in_unit(s.v),   in_unit(s.o),
            in_unit(s.norm2), in_unit(s.gate), in_unit(s.up), in_unit(s.down)};
  }
  std::vector<std::pair<int64_t, int64_t>> units;  // weight_units(c)

  static constexpr DType dtype() { return sizeof(T) == 8 ? DType::kF64 : DType::kF32; }
  static TensorView view(T* data, std::initializer_list<int64_t> shape) {
    return TensorView::contiguous(data, dtype(), shape);
  }

  // Where a layer's forward gets the attention's (O, LSE): it runs it; a.o and a.lse hold it
  // (attention policy); or it runs it for the first half of the shard alone and takes the second
  // half from a.o_late and a.lse_late (sequence policy).
  enum class Attn { kRun, kKept, kFirstHalf };

  // Rows [from, to) of each batch entry of a [B, S, cols] array, as a contiguous [B, to - from, cols].
  std::vector<T> rows_of(const std::vector<T>& x, int64_t cols, int64_t from, int64_t to) const {
    std::vector<T> out(size_t(B * (to - from) * cols));
    for (int64_t b = 0; b < B; ++b)
      std::copy(x.begin() + (b * S + from) * cols, x.begin() + (b * S + to) * cols, out.begin() + b * (to - from) * cols);
    return out;
  }
  // The LSE's columns [from, to) of each (batch, head) row of a [B, H, S] array.
  std::vector<T> stat_cols(const std::vector<T>& x, int64_t from, int64_t to) const {
    const int64_t H = c.heads;
    std::vector<T> out(size_t(B * H * (to - from)));
    for (int64_t r = 0; r < B * H; ++r) std::copy(x.begin() + r * S + from, x.begin() + r * S + to, out.begin() + r * (to - from));
    return out;
  }

  // The attention of the shard's first half (global positions below N/2 under the striped
  // layout, which see only keys there) into a.o and a.lse, the second half from what was kept.
  Status first_half_attention(LayerActs<T>& a) {
    const int64_t H = c.heads, Hkv = c.kv_heads, D = c.head_dim(), half = S / 2;
    std::vector<T> q = rows_of(a.q, H * D, 0, half), k = rows_of(a.k, Hkv * D, 0, half), v = rows_of(a.v, Hkv * D, 0, half);
    std::vector<T> o(q.size()), lse(size_t(B * H * half));
    const ShardTensors t{view(q.data(), {B, half, H, D}),   view(k.data(), {B, half, Hkv, D}),
                         view(v.data(), {B, half, Hkv, D}), view(o.data(), {B, half, H, D}),
                         view(lse.data(), {B, H, half}),    {}, {}, {}, {}};
    SP_RETURN_IF_ERROR(run_forward_cpu(comm, *early_plan, t));
    a.o.resize(size_t(rows * H * D)), a.lse.resize(size_t(B * H * S));
    for (int64_t b = 0; b < B; ++b) {
      std::copy(o.begin() + b * half * H * D, o.begin() + (b + 1) * half * H * D, a.o.begin() + b * S * H * D);
      std::copy(a.o_late.begin() + b * (S - half) * H * D, a.o_late.begin() + (b + 1) * (S - half) * H * D,
                a.o.begin() + (b * S + half) * H * D);
    }
    for (int64_t r = 0; r < B * H; ++r) {
      std::copy(lse.begin() + r * half, lse.begin() + (r + 1) * half, a.lse.begin() + r * S);
      std::copy(a.lse_late.begin() + r * (S - half), a.lse_late.begin() + (r + 1) * (S - half), a.lse.begin() + r * S + half);
    }
    a.o_late = {}, a.lse_late = {};
    return Status::Ok();
  }

  // The layer's forward from a.x_in; fills every activation and writes the output to x_out.
  Status layer_forward(const T* unit, int64_t l, LayerActs<T>& a, T* x_out, Attn attention) {
    const auto w = slots(unit, units[size_t(1 + l)].first, l);
    const int64_t hid = c.hidden, H = c.heads, Hkv = c.kv_heads, D = c.head_dim(), F = c.ffn;
    a.h1.resize(size_t(rows * hid)), a.rstd1.resize(size_t(rows));
    model::rmsnorm_forward(a.x_in.data(), w.n1, a.h1.data(), a.rstd1.data(), rows, hid, c.norm_eps);
    a.q.resize(size_t(rows * H * D)), a.k.resize(size_t(rows * Hkv * D)), a.v.resize(size_t(rows * Hkv * D));
    linear_forward(a.h1.data(), w.wq, a.q.data(), rows, hid, H * D);
    linear_forward(a.h1.data(), w.wk, a.k.data(), rows, hid, Hkv * D);
    linear_forward(a.h1.data(), w.wv, a.v.data(), rows, hid, Hkv * D);
    model::rope_apply(a.q.data(), positions->data(), B, S, H, D, c.rope_theta, false);
    model::rope_apply(a.k.data(), positions->data(), B, S, Hkv, D, c.rope_theta, false);
    if (attention == Attn::kFirstHalf) SP_RETURN_IF_ERROR(first_half_attention(a));
    if (attention == Attn::kRun) {
      a.o.resize(size_t(rows * H * D)), a.lse.resize(size_t(B * H * S));
      const ShardTensors t{view(a.q.data(), {B, S, H, D}),   view(a.k.data(), {B, S, Hkv, D}),
                           view(a.v.data(), {B, S, Hkv, D}), view(a.o.data(), {B, S, H, D}),
                           view(a.lse.data(), {B, H, S}),    {}, {}, {}, {}};
      SP_RETURN_IF_ERROR(run_forward_cpu(comm, plan, t));
    }
    a.x_mid.resize(size_t(rows * hid));
    linear_forward(a.o.data(), w.wo, a.x_mid.data(), rows, H * D, hid);
    for (int64_t i = 0; i < rows * hid; ++i) a.x_mid[size_t(i)] += a.x_in[size_t(i)];
    a.h2.resize(size_t(rows * hid)), a.rstd2.resize(size_t(rows));
    model::rmsnorm_forward(a.x_mid.data(), w.n2, a.h2.data(), a.rstd2.data(), rows, hid, c.norm_eps);
    a.g.resize(size_t(rows * F)), a.u.resize(size_t(rows * F));
    linear_forward(a.h2.data(), w.wg, a.g.data(), rows, hid, F);
    linear_forward(a.h2.data(), w.wu, a.u.data(), rows, hid, F);
    std::vector<T> act(size_t(rows * F));
    model::swiglu_forward(a.g.data(), a.u.data(), act.data(), rows * F);
    linear_forward(act.data(), w.wd, x_out, rows, F, hid);
    for (int64_t i = 0; i < rows * hid; ++i) x_out[i] += a.x_mid[size_t(i)];
    return Status::Ok();
  }

  // dx: in, the gradient at the layer's output; out, at its input. Adds the weights' gradients.
  Status layer_backward(const T* unit, T* grad_unit, int64_t l, LayerActs<T>& a, std::vector<T>& dx) {
    const int64_t begin = units[size_t(1 + l)].first;
    const auto w = slots(unit, begin, l);
    const auto dw = slots(grad_unit, begin, l);
    const int64_t hid = c.hidden, H = c.heads, Hkv = c.kv_heads, D = c.head_dim(), F = c.ffn;
    // MLP: x_out = x_mid + down(silu(g) * u).
    std::vector<T> act(size_t(rows * F)), dact(size_t(rows * F)), dg(size_t(rows * F)), du(size_t(rows * F));
    model::swiglu_forward(a.g.data(), a.u.data(), act.data(), rows * F);
    linear_backward(act.data(), w.wd, dx.data(), dact.data(), dw.wd, rows, F, hid, false);
    model::swiglu_backward(a.g.data(), a.u.data(), dact.data(), dg.data(), du.data(), rows * F);
    std::vector<T> dh(size_t(rows * hid));
    linear_backward(a.h2.data(), w.wg, dg.data(), dh.data(), dw.wg, rows, hid, F, false);
    linear_backward(a.h2.data(), w.wu, du.data(), dh.data(), dw.wu, rows, hid, F, true);
    model::rmsnorm_backward(a.x_mid.data(), w.n2, a.rstd2.data(), dh.data(), dx.data(), dw.n2, rows, hid);
    // Attention: x_mid = x_in + o_proj(attention(q, k, v)).
    std::vector<T> dout(size_t(rows * H * D)), dq(size_t(rows * H * D)), dk(size_t(rows * Hkv * D)),
        dv(size_t(rows * Hkv * D));
    linear_backward(a.o.data(), w.wo, dx.data(), dout.data(), dw.wo, rows, H * D, hid, false);
    const ShardTensors t{view(a.q.data(), {B, S, H, D}),   view(a.k.data(), {B, S, Hkv, D}),
                         view(a.v.data(), {B, S, Hkv, D}), view(a.o.data(), {B, S, H, D}),
                         view(a.lse.data(), {B, H, S}),    view(dout.data(), {B, S, H, D}),
                         view(dq.data(), {B, S, H, D}),    view(dk.data(), {B, S, Hkv, D}),
                         view(dv.data(), {B, S, Hkv, D})};
    SP_RETURN_IF_ERROR(run_backward_cpu(comm, plan, t));
    model::rope_apply(dq.data(), positions->data(), B, S, H, D, c.rope_theta, true);
    model::rope_apply(dk.data(), positions->data(), B, S, Hkv, D, c.rope_theta, true);
    linear_backward(a.h1.data(), w.wq, dq.data(), dh.data(), dw.wq, rows, hid, H * D, false);
    linear_backward(a.h1.data(), w.wk, dk.data(), dh.data(), dw.wk, rows, hid, Hkv * D, true);
    linear_backward(a.h1.data(), w.wv, dv.data(), dh.data(), dw.wv, rows, hid, Hkv * D, true);
    model::rmsnorm_backward(a.x_in.data(), w.n1, a.rstd1.data(), dh.data(), dx.data(), dw.n1, rows, hid);
    return Status::Ok();
  }

  // What a policy keeps of a layer's activations after its forward.
  void keep_for_policy(LayerActs<T>& a) const {
    if (policy == Checkpointing::kNone) return;
    LayerActs<T> kept;
    kept.x_in = std::move(a.x_in);
    if (policy == Checkpointing::kAttention) kept.o = std::move(a.o), kept.lse = std::move(a.lse);
    if (policy == Checkpointing::kSequence)
      kept.o_late = rows_of(a.o, c.heads * c.head_dim(), S / 2, S), kept.lse_late = stat_cols(a.lse, S / 2, S);
    a = std::move(kept);
  }

  Status check_batch(const ShardBatch& b) {
    SP_CHECK_ARG(b.batch >= 1 && b.seq >= 1, "a shard needs at least one sequence and one row");
    SP_CHECK_ARG(int64_t(b.inputs.size()) == b.batch * b.seq && int64_t(b.targets.size()) == b.batch * b.seq &&
                     int64_t(b.positions.size()) == b.seq,
                 "a shard's inputs and targets are [batch, seq] and its positions [seq]");
    SP_CHECK_ARG(b.seq == plan.layout.local_len(plan.rank),
                 "this rank holds " + std::to_string(plan.layout.local_len(plan.rank)) + " rows of each sequence, not " +
                     std::to_string(b.seq));
    for (int32_t t : b.inputs) SP_CHECK_ARG(t >= 0 && t < c.vocab, "input token " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(c.vocab));
    for (int32_t t : b.targets) SP_CHECK_ARG(t < c.vocab, "target token " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(c.vocab));
    B = b.batch, S = b.seq, rows = B * S, positions = &b.positions;
    return Status::Ok();
  }

  Status run(WeightStore& store, bool backward, const ShardBatch& b, double scale, StepLoss* loss) {
    SP_RETURN_IF_ERROR(check_batch(b));
    const auto weights = [&](int64_t begin, int64_t end) { return unit_weights<T>(store, begin, end); };
    const auto gradient = [&](int64_t begin, int64_t end) { return unit_gradient<T>(store, begin, end); };
    const int64_t hid = c.hidden;
    const auto [e0, e1] = units.front();
    const auto [f0, f1] = units.back();
    std::vector<LayerActs<T>> kept(size_t(c.layers));
    std::vector<T> x(size_t(rows * hid)), next(size_t(rows * hid));
    {
      SP_ASSIGN_OR_RETURN(const T* embed, weights(e0, e1));
      model::embedding_forward(b.inputs.data(), embed + (embed_at - e0), x.data(), rows, hid);
      SP_RETURN_IF_ERROR(store.release(e0, e1));
    }
    int64_t kept_bytes = 0, peak = 0;
    for (int64_t l = 0; l < c.layers; ++l) {
      LayerActs<T>& a = kept[size_t(l)];
      a.x_in = x;
      const auto [u0, u1] = units[size_t(1 + l)];
      SP_ASSIGN_OR_RETURN(const T* unit, weights(u0, u1));
      SP_RETURN_IF_ERROR(layer_forward(unit, l, a, next.data(), Attn::kRun));
      SP_RETURN_IF_ERROR(store.release(u0, u1));
      peak = std::max(peak, kept_bytes + a.bytes());
      if (backward) keep_for_policy(a);
      else a = {};
      kept_bytes += a.bytes();
      std::swap(x, next);
    }
    std::vector<T> hf(static_cast<size_t>(rows * hid)), rstd_f(static_cast<size_t>(rows)), lse(static_cast<size_t>(rows));
    SP_ASSIGN_OR_RETURN(const T* fin, weights(f0, f1));
    const T* embed = nullptr;  // the tied head
    if (c.tied) {
      SP_ASSIGN_OR_RETURN(embed, weights(e0, e1));
    }
    const T* final_norm = fin + (final_norm_at - f0);
    const T* head = c.tied ? embed + (head_at - e0) : fin + (head_at - f0);
    model::rmsnorm_forward(x.data(), final_norm, hf.data(), rstd_f.data(), rows, hid, c.norm_eps);
    const int64_t chunk = 1024;
    model::lm_head_loss_forward(hf.data(), head, b.targets.data(), rows, hid, c.vocab, chunk, lse.data(),
                                &loss->loss_sum, &loss->counted);
    if (backward) {
      std::vector<T> dhf(size_t(rows * hid)), dx(size_t(rows * hid), T(0));
      SP_ASSIGN_OR_RETURN(T* d_fin, gradient(f0, f1));
      T* d_embed = nullptr;
      if (c.tied) {
        SP_ASSIGN_OR_RETURN(d_embed, gradient(e0, e1));
      }
      T* d_head = c.tied ? d_embed + (head_at - e0) : d_fin + (head_at - f0);
      model::lm_head_loss_backward(hf.data(), head, b.targets.data(), lse.data(), rows, hid, c.vocab, chunk, scale,
                                   dhf.data(), d_head);
      model::rmsnorm_backward(x.data(), final_norm, rstd_f.data(), dhf.data(), dx.data(), d_fin + (final_norm_at - f0),
                              rows, hid);
      SP_RETURN_IF_ERROR(store.gradient_done(f0, f1));
      SP_RETURN_IF_ERROR(store.release(f0, f1));
      if (c.tied) SP_RETURN_IF_ERROR(store.release(e0, e1));
      for (int64_t l = c.layers - 1; l >= 0; --l) {
        LayerActs<T>& a = kept[size_t(l)];
        const auto [u0, u1] = units[size_t(1 + l)];
        SP_ASSIGN_OR_RETURN(const T* unit, weights(u0, u1));
        if (policy != Checkpointing::kNone)  // recompute what was dropped
          SP_RETURN_IF_ERROR(layer_forward(unit, l, a, next.data(),
                                           policy == Checkpointing::kAttention  ? Attn::kKept
                                           : policy == Checkpointing::kSequence ? Attn::kFirstHalf
                                                                                : Attn::kRun));
        peak = std::max(peak, kept_bytes + (policy == Checkpointing::kNone ? 0 : a.bytes()));
        SP_ASSIGN_OR_RETURN(T* grad_unit, gradient(u0, u1));
        SP_RETURN_IF_ERROR(layer_backward(unit, grad_unit, l, a, dx));
        SP_RETURN_IF_ERROR(store.gradient_done(u0, u1));
        SP_RETURN_IF_ERROR(store.release(u0, u1));
        kept_bytes -= a.bytes();
        a = {};
      }
      if (!c.tied) {
        SP_ASSIGN_OR_RETURN(d_embed, gradient(e0, e1));
      }
      model::embedding_backward(b.inputs.data(), dx.data(), d_embed + (embed_at - e0), rows, hid);
      SP_RETURN_IF_ERROR(store.gradient_done(e0, e1));
    } else {
      SP_RETURN_IF_ERROR(store.release(f0, f1));
      if (c.tied) SP_RETURN_IF_ERROR(store.release(e0, e1));
    }
    loss->activation_bytes_peak = peak + int64_t((x.size() + next.size() + hf.size() + rstd_f.size() + lse.size()) * sizeof(T));
    return Status::Ok();
  }
};

namespace {

// Every rank holds the whole buffer: weights and gradients are views into it.
template <class T>
class FlatWeights final : public WeightStore {
 public:
  FlatWeights(const T* params, T* grads) : params_(params), grads_(grads) {}
  StatusOr<const void*> weights(int64_t begin, int64_t) override { return static_cast<const void*>(params_ + begin); }
  Status release(int64_t, int64_t) override { return Status::Ok(); }
  StatusOr<void*> gradient(int64_t begin, int64_t) override {
    SP_CHECK_ARG(grads_ != nullptr, "internal: a gradient asked for in a forward-only pass");
    return static_cast<void*>(grads_ + begin);
  }
  Status gradient_done(int64_t, int64_t) override { return Status::Ok(); }

 private:
  const T* params_;
  T* grads_;
};

}  // namespace

std::vector<std::pair<int64_t, int64_t>> weight_units(const ModelConfig& config) {
  const std::vector<ParamInfo> t = parameter_table(config);
  std::vector<std::pair<int64_t, int64_t>> units;
  units.push_back({t[0].offset, t[0].offset + t[0].numel});
  const size_t per_layer = 9;
  for (int64_t l = 0; l < config.layers; ++l) {
    const ParamInfo& first = t[1 + size_t(l) * per_layer];
    const ParamInfo& last = t[size_t(l + 1) * per_layer];
    units.push_back({first.offset, last.offset + last.numel});
  }
  units.push_back({t[1 + size_t(config.layers) * per_layer].offset, t.back().offset + t.back().numel});
  return units;
}

template <class T>
StatusOr<std::unique_ptr<Transformer<T>>> Transformer<T>::create(const ModelConfig& config, Checkpointing policy,
                                                                 const PlanOptions& options, const Layout& layout,
                                                                 int64_t batch, Communicator& comm) {
  SP_RETURN_IF_ERROR(config.validate());
  SP_CHECK_ARG(layout.ranks() == comm.size(), "the layout is for " + std::to_string(layout.ranks()) +
                                                  " ranks, the communicator has " + std::to_string(comm.size()));
  AttentionParams params;
  params.mask = MaskSpec::causal();
  const DType t = Impl::dtype();
  const BlockBytes bytes{batch, config.heads, config.kv_heads, config.head_dim(), t, t, t, true};
  SP_ASSIGN_OR_RETURN(AttentionPlan plan, plan_attention(options, layout, params, bytes, comm.rank(), cpu_kernel_backend()));
  auto impl = std::make_unique<Impl>(config, policy, comm, std::move(plan));
  if (policy == Checkpointing::kSequence) {
    // BurstEngine's sequence-level checkpointing: under the striped layout a shard's first half
    // holds exactly the sequence's first half, which attends to nothing beyond it, so the
    // recompute is the same algorithm over the first N/2 tokens.
    const int P = layout.ranks();
    SP_CHECK_SUPPORTED(layout.kind() == LayoutKind::kStriped && layout.seq_len() % (2 * P) == 0,
                       "sequence-level checkpointing needs the striped layout with the sequence a multiple of twice "
                       "the ranks (" + std::to_string(2 * P) + ")");
    SP_ASSIGN_OR_RETURN(const Layout early, Layout::create(LayoutKind::kStriped, layout.seq_len() / 2, P));
    SP_ASSIGN_OR_RETURN(AttentionPlan p, plan_attention(options, early, params, bytes, comm.rank(), cpu_kernel_backend()));
    impl->early_plan = std::make_unique<AttentionPlan>(std::move(p));
  }
  return std::unique_ptr<Transformer>(new Transformer(std::move(impl)));
}

template <class T>
Transformer<T>::Transformer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
template <class T>
Transformer<T>::~Transformer() = default;

template <class T>
Status Transformer<T>::forward_backward(const T* params, T* grads, const ShardBatch& batch, double scale,
                                        StepLoss* loss) {
  SP_CHECK_ARG(grads != nullptr, "forward_backward needs a gradient buffer");
  FlatWeights<T> store(params, grads);
  return impl_->run(store, true, batch, scale, loss);
}

template <class T>
Status Transformer<T>::forward_backward(WeightStore& store, const ShardBatch& batch, double scale, StepLoss* loss) {
  return impl_->run(store, true, batch, scale, loss);
}

template <class T>
Status Transformer<T>::forward(const T* params, const ShardBatch& batch, StepLoss* loss) {
  FlatWeights<T> store(params, nullptr);
  return impl_->run(store, false, batch, 0.0, loss);
}

template <class T>
const AttentionPlan& Transformer<T>::attention_plan() const {
  return impl_->plan;
}

template class Transformer<float>;
template class Transformer<double>;

}  // namespace seqpar
