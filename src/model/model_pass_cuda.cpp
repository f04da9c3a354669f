// The GPU pass of the trainer (model_pass.hpp): one rank's layer loop on the device, in the CPU
// model's order (transformer.cpp), with the layers' CUDA halves (layers_cuda.hpp) and the
// attention through a Session. Weights come unit by unit from the trainer's WeightStore (bf16;
// ZeRO-3 gathers them), gradients go back to it in fp32. Activations are arrays of the training
// memory (the stream arenas of the trainer's stream), kept or dropped per layer by the policy.
#include <cuda_runtime.h>

#include "core/cuda_check.hpp"
#include "model/layers_cuda.hpp"
#include "model/model_pass.hpp"
#include "seqpar/gpu.hpp"
#include "seqpar/session.hpp"

namespace seqpar::model {
namespace {

namespace cu = cuda;
using Half = cuda::bf16_t;  // bf16 storage

// A layer's activations on the device (what the backward reads).
struct Acts {
  Array<float> x_in, rstd1, lse, x_mid, rstd2;
  Array<Half> h1, q, k, v, o, h2, g, u;
  Array<Half> o_late;     // sequence policy: O of the shard's second half
  Array<float> lse_late;  // and its LSE
};

// A layer's weights (bf16) or gradients (fp32), by name.
template <class P>
struct LayerSlots {
  P n1, wq, wk, wv, wo, n2, wg, wu, wd;
};

// `height` rows of `width` bytes from src (rows `spitch` apart) to dst (`dpitch` apart).
Status copy_rows(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height, cudaStream_t s) {
  if (width == 0 || height == 0) return Status::Ok();
  SP_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDeviceToDevice, s));
  return Status::Ok();
}

class CudaModelPass final : public ModelPass {
 public:
  CudaModelPass(const TrainOptions& o, TrainingMemory& memory)
      : o_(o), mem_(memory), s_(static_cast<cudaStream_t>(memory.stream())), at_(parameter_offsets(o.model)),
        units_(weight_units(o.model)) {}

  Status init(const Layout& layout, Communicator& group) {
    SP_CUDA_CHECK(cudaGetDevice(&device_));
    const ModelConfig& c = o_.model;
    B = o_.batch, S = layout.local_len(group.rank()), rows = B * S;
    hid = c.hidden, H = c.heads, Hkv = c.kv_heads, D = c.head_dim(), F = c.ffn;
    AttentionParams params;
    params.mask = MaskSpec::causal();
    SessionOptions session;
    session.plan = o_.plan_options();
    session.deterministic = o_.deterministic;
    session_ = std::make_unique<Session>(group, session);
    SP_ASSIGN_OR_RETURN(plan_, session_->plan(layout, params, view(static_cast<Half*>(nullptr), {B, S, H, D}),
                                              view(static_cast<Half*>(nullptr), {B, S, Hkv, D})));
    if (o_.checkpointing == Checkpointing::kSequence) {  // as the CPU model (transformer.cpp)
      const int P = layout.ranks();
      SP_CHECK_SUPPORTED(layout.kind() == LayoutKind::kStriped && layout.seq_len() % (2 * P) == 0,
                         "sequence-level checkpointing needs the striped layout with the sequence a multiple of twice "
                         "the ranks (" + std::to_string(2 * P) + ")");
      SP_ASSIGN_OR_RETURN(const Layout early, Layout::create(LayoutKind::kStriped, layout.seq_len() / 2, P));
      SP_ASSIGN_OR_RETURN(early_plan_, session_->plan(early, params, view(static_cast<Half*>(nullptr), {B, S / 2, H, D}),
                                                      view(static_cast<Half*>(nullptr), {B, S / 2, Hkv, D})));
    }
    SP_ASSIGN_OR_RETURN(positions_, mem_.make<int64_t>(S));
    return mem_.from_host(positions_.p(), layout.positions(group.rank()).data(), size_t(S) * sizeof(int64_t));
  }

  const AttentionPlan& attention_plan() const override { return *plan_; }

  Status forward_backward(WeightStore& store, const ShardBatch& batch, double scale, StepLoss* loss) override {
    SP_CHECK_ARG(batch.batch == B && batch.seq == S && int64_t(batch.inputs.size()) == rows &&
                     int64_t(batch.targets.size()) == rows,
                 "this rank trains on " + std::to_string(B) + " sequences of " + std::to_string(S) + " rows");
    const auto weights = [&](int64_t begin, int64_t end) { return unit_weights<Half>(store, begin, end); };
    const auto gradient = [&](int64_t begin, int64_t end) { return unit_gradient<float>(store, begin, end); };
    void* st = s_;
    const bool tied = o_.model.tied;
    const auto [e0, e1] = units_.front();
    const auto [f0, f1] = units_.back();
    SP_ASSIGN_OR_RETURN(Array<int32_t> tok, mem_.make<int32_t>(rows));
    SP_ASSIGN_OR_RETURN(Array<int32_t> tgt, mem_.make<int32_t>(rows));
    SP_RETURN_IF_ERROR(mem_.from_host(tok.p(), batch.inputs.data(), size_t(rows) * 4));
    SP_RETURN_IF_ERROR(mem_.from_host(tgt.p(), batch.targets.data(), size_t(rows) * 4));
    std::vector<Acts> kept(size_t(o_.model.layers));
    SP_ASSIGN_OR_RETURN(Array<float> x, mem_.make<float>(rows * hid));
    {
      SP_ASSIGN_OR_RETURN(const Half* w, weights(e0, e1));
      SP_RETURN_IF_ERROR(cu::embedding_forward(tok.p(), w + (at_.embed - e0), x.p(), rows, hid, st));
      SP_RETURN_IF_ERROR(store.release(e0, e1));
    }
    for (int64_t l = 0; l < o_.model.layers; ++l) {
      Acts& a = kept[size_t(l)];
      a.x_in = std::move(x);
      SP_ASSIGN_OR_RETURN(x, mem_.make<float>(rows * hid));
      const auto [u0, u1] = units_[size_t(1 + l)];
      SP_ASSIGN_OR_RETURN(const Half* w, weights(u0, u1));
      SP_RETURN_IF_ERROR(layer_forward(slots(w, u0, l), a, x, Attn::kRun));
      SP_RETURN_IF_ERROR(store.release(u0, u1));
      SP_RETURN_IF_ERROR(keep_for_policy(a));
    }
    SP_ASSIGN_OR_RETURN(Array<Half> hf, mem_.make<Half>(rows * hid));
    SP_ASSIGN_OR_RETURN(Array<float> rstd_f, mem_.make<float>(rows));
    SP_ASSIGN_OR_RETURN(Array<float> lse, mem_.make<float>(rows));
    SP_ASSIGN_OR_RETURN(Array<float> row_loss, mem_.make<float>(rows));
    SP_ASSIGN_OR_RETURN(const Half* fin, weights(f0, f1));
    const Half* head = tied ? nullptr : fin + (at_.head - f0);
    if (tied) {
      SP_ASSIGN_OR_RETURN(const Half* embed, weights(e0, e1));
      head = embed + (at_.head - e0);
    }
    const Half* final_norm = fin + (at_.final_norm - f0);
    SP_RETURN_IF_ERROR(cu::rmsnorm_forward(x.p(), final_norm, hf.p(), rstd_f.p(), rows, hid, o_.model.norm_eps, st));
    const int64_t chunk = o_.lm_head_chunk > 0 ? o_.lm_head_chunk : rows;
    SP_RETURN_IF_ERROR(cu::lm_head_loss_forward(hf.p(), head, tgt.p(), rows, hid, o_.model.vocab, chunk,
                                                lse.p(), row_loss.p(), st));
    {
      SP_ASSIGN_OR_RETURN(Array<float> dhf, mem_.make<float>(rows * hid));
      SP_ASSIGN_OR_RETURN(Array<float> dx, mem_.make_zeroed<float>(rows * hid));
      SP_ASSIGN_OR_RETURN(float* d_fin, gradient(f0, f1));
      float* d_embed = nullptr;
      if (tied) {
        SP_ASSIGN_OR_RETURN(d_embed, gradient(e0, e1));
      }
      SP_RETURN_IF_ERROR(cu::lm_head_loss_backward(hf.p(), head, tgt.p(), lse.p(), rows, hid, o_.model.vocab,
                                                   chunk, scale, dhf.p(), tied ? d_embed + (at_.head - e0) : d_fin + (at_.head - f0), st));
      SP_RETURN_IF_ERROR(cu::rmsnorm_backward(x.p(), final_norm, rstd_f.p(), dhf.p(), dx.p(),
                                              d_fin + (at_.final_norm - f0), rows, hid, st));
      SP_RETURN_IF_ERROR(store.gradient_done(f0, f1));
      SP_RETURN_IF_ERROR(store.release(f0, f1));
      if (tied) SP_RETURN_IF_ERROR(store.release(e0, e1));
      for (int64_t l = o_.model.layers - 1; l >= 0; --l) {
        Acts& a = kept[size_t(l)];
        const auto [u0, u1] = units_[size_t(1 + l)];
        SP_ASSIGN_OR_RETURN(const Half* w, weights(u0, u1));
        if (o_.checkpointing != Checkpointing::kNone)  // recompute what the policy dropped
          SP_RETURN_IF_ERROR(layer_forward(slots(w, u0, l), a, x,
                                           o_.checkpointing == Checkpointing::kAttention  ? Attn::kKept
                                           : o_.checkpointing == Checkpointing::kSequence ? Attn::kFirstHalf
                                                                                          : Attn::kRun));
        SP_ASSIGN_OR_RETURN(float* dw, gradient(u0, u1));
        SP_RETURN_IF_ERROR(layer_backward(slots(w, u0, l), slots(dw, u0, l), a, dx));
        SP_RETURN_IF_ERROR(store.gradient_done(u0, u1));
        SP_RETURN_IF_ERROR(store.release(u0, u1));
        a = {};
      }
      if (!tied) {
        SP_ASSIGN_OR_RETURN(d_embed, gradient(e0, e1));
      }
      SP_RETURN_IF_ERROR(cu::embedding_backward(batch.inputs.data(), dx.p(), d_embed + (at_.embed - e0), rows, hid, st));
      SP_RETURN_IF_ERROR(store.gradient_done(e0, e1));
    }
    std::vector<float> losses(static_cast<size_t>(rows));
    SP_RETURN_IF_ERROR(mem_.to_host(losses.data(), row_loss.p(), size_t(rows) * 4));  // waits for the pass
    loss->loss_sum = 0, loss->counted = 0;
    for (float l : losses) loss->loss_sum += l;
    for (int32_t t : batch.targets) loss->counted += t >= 0;
    loss->activation_bytes_peak = mem_.peak_bytes();
    return Status::Ok();
  }

 private:
  enum class Attn { kRun, kKept, kFirstHalf };

  // Layer l's tensors in its unit's array, which starts at flat element `begin`.
  template <class P>
  LayerSlots<P*> slots(P* unit, int64_t begin, int64_t l) const {
    const LayerOffsets& s = at_.layers[size_t(l)];
    const auto in = [&](int64_t offset) { return unit + (offset - begin); };
    return {in(s.norm1), in(s.q), in(s.k), in(s.v), in(s.o), in(s.norm2), in(s.gate), in(s.up), in(s.down)};
  }
  TensorView view(Half* p, std::initializer_list<int64_t> shape) const {
    return TensorView::contiguous(p, DType::kBF16, shape, Device{DeviceKind::kCuda, device_});
  }
  TensorView view(float* p, std::initializer_list<int64_t> shape) const {
    return TensorView::contiguous(p, DType::kF32, shape, Device{DeviceKind::kCuda, device_});
  }

  // Sequence policy (BurstEngine's): the attention of the shard's first half alone (under the
  // striped layout, the sequence's first half, which sees no key beyond it) into a.o and a.lse,
  // the second half from a.o_late and a.lse_late.
  Status first_half_attention(Acts& a) {
    const int64_t half = S / 2, late = S - half;
    const size_t q_row = size_t(H * D) * 2, kv_row = size_t(Hkv * D) * 2;
    SP_ASSIGN_OR_RETURN(Array<Half> q, mem_.make<Half>(B * half * H * D));
    SP_ASSIGN_OR_RETURN(Array<Half> k, mem_.make<Half>(B * half * Hkv * D));
    SP_ASSIGN_OR_RETURN(Array<Half> v, mem_.make<Half>(B * half * Hkv * D));
    SP_ASSIGN_OR_RETURN(Array<Half> oh, mem_.make<Half>(B * half * H * D));
    SP_ASSIGN_OR_RETURN(Array<float> lh, mem_.make<float>(B * H * half));
    SP_RETURN_IF_ERROR(copy_rows(q.p(), half * q_row, a.q.p(), S * q_row, half * q_row, size_t(B), s_));
    SP_RETURN_IF_ERROR(copy_rows(k.p(), half * kv_row, a.k.p(), S * kv_row, half * kv_row, size_t(B), s_));
    SP_RETURN_IF_ERROR(copy_rows(v.p(), half * kv_row, a.v.p(), S * kv_row, half * kv_row, size_t(B), s_));
    const ShardTensors t{view(q.p(), {B, half, H, D}), view(k.p(), {B, half, Hkv, D}), view(v.p(), {B, half, Hkv, D}),
                         view(oh.p(), {B, half, H, D}), view(lh.p(), {B, H, half}),    {}, {}, {}, {}};
    SP_RETURN_IF_ERROR(session_->run(*early_plan_, Pass::kForward, t, {s_}));
    SP_ASSIGN_OR_RETURN(a.o, mem_.make<Half>(rows * H * D));
    SP_ASSIGN_OR_RETURN(a.lse, mem_.make<float>(B * H * S));
    char* o = reinterpret_cast<char*>(a.o.p());
    SP_RETURN_IF_ERROR(copy_rows(o, S * q_row, oh.p(), half * q_row, half * q_row, size_t(B), s_));
    SP_RETURN_IF_ERROR(copy_rows(o + half * q_row, S * q_row, a.o_late.p(), late * q_row, late * q_row, size_t(B), s_));
    char* l = reinterpret_cast<char*>(a.lse.p());
    SP_RETURN_IF_ERROR(copy_rows(l, S * 4, lh.p(), half * 4, half * 4, size_t(B * H), s_));
    SP_RETURN_IF_ERROR(copy_rows(l + half * 4, S * 4, a.lse_late.p(), late * 4, late * 4, size_t(B * H), s_));
    a.o_late = {}, a.lse_late = {};  // back to the arena: reuse comes later on this stream
    return Status::Ok();
  }

  Status layer_forward(const LayerSlots<const Half*>& w, Acts& a, Array<float>& x_out, Attn attention) {
    void* st = s_;
    const double eps = o_.model.norm_eps, theta = o_.model.rope_theta;
    SP_ASSIGN_OR_RETURN(a.h1, mem_.make<Half>(rows * hid));
    SP_ASSIGN_OR_RETURN(a.rstd1, mem_.make<float>(rows));
    SP_RETURN_IF_ERROR(cu::rmsnorm_forward(a.x_in.p(), w.n1, a.h1.p(), a.rstd1.p(), rows, hid, eps, st));
    SP_ASSIGN_OR_RETURN(a.q, mem_.make<Half>(rows * H * D));
    SP_ASSIGN_OR_RETURN(a.k, mem_.make<Half>(rows * Hkv * D));
    SP_ASSIGN_OR_RETURN(a.v, mem_.make<Half>(rows * Hkv * D));
    SP_RETURN_IF_ERROR(cu::linear_forward(a.h1.p(), w.wq, a.q.p(), rows, hid, H * D, st));
    SP_RETURN_IF_ERROR(cu::linear_forward(a.h1.p(), w.wk, a.k.p(), rows, hid, Hkv * D, st));
    SP_RETURN_IF_ERROR(cu::linear_forward(a.h1.p(), w.wv, a.v.p(), rows, hid, Hkv * D, st));
    SP_RETURN_IF_ERROR(cu::rope_apply(a.q.p(), positions_.p(), B, S, H, D, theta, false, st));
    SP_RETURN_IF_ERROR(cu::rope_apply(a.k.p(), positions_.p(), B, S, Hkv, D, theta, false, st));
    if (attention == Attn::kFirstHalf) SP_RETURN_IF_ERROR(first_half_attention(a));
    if (attention == Attn::kRun) {
      SP_ASSIGN_OR_RETURN(a.o, mem_.make<Half>(rows * H * D));
      SP_ASSIGN_OR_RETURN(a.lse, mem_.make<float>(B * H * S));
      const ShardTensors t{view(a.q.p(), {B, S, H, D}), view(a.k.p(), {B, S, Hkv, D}), view(a.v.p(), {B, S, Hkv, D}),
                           view(a.o.p(), {B, S, H, D}), view(a.lse.p(), {B, H, S}),    {}, {}, {}, {}};
      SP_RETURN_IF_ERROR(session_->run(*plan_, Pass::kForward, t, {s_}));
    }
    SP_ASSIGN_OR_RETURN(a.x_mid, mem_.make<float>(rows * hid));
    SP_RETURN_IF_ERROR(mem_.copy(a.x_mid.p(), a.x_in.p(), size_t(rows * hid) * 4));
    SP_RETURN_IF_ERROR(cu::linear_forward_add(a.o.p(), w.wo, a.x_mid.p(), rows, H * D, hid, st));
    SP_ASSIGN_OR_RETURN(a.h2, mem_.make<Half>(rows * hid));
    SP_ASSIGN_OR_RETURN(a.rstd2, mem_.make<float>(rows));
    SP_RETURN_IF_ERROR(cu::rmsnorm_forward(a.x_mid.p(), w.n2, a.h2.p(), a.rstd2.p(), rows, hid, eps, st));
    SP_ASSIGN_OR_RETURN(a.g, mem_.make<Half>(rows * F));
    SP_ASSIGN_OR_RETURN(a.u, mem_.make<Half>(rows * F));
    SP_RETURN_IF_ERROR(cu::linear_forward(a.h2.p(), w.wg, a.g.p(), rows, hid, F, st));
    SP_RETURN_IF_ERROR(cu::linear_forward(a.h2.p(), w.wu, a.u.p(), rows, hid, F, st));
    SP_ASSIGN_OR_RETURN(Array<Half> act, mem_.make<Half>(rows * F));
    SP_RETURN_IF_ERROR(cu::swiglu_forward(a.g.p(), a.u.p(), act.p(), rows * F, st));
    SP_RETURN_IF_ERROR(mem_.copy(x_out.p(), a.x_mid.p(), size_t(rows * hid) * 4));
    return cu::linear_forward_add(act.p(), w.wd, x_out.p(), rows, F, hid, st);
  }

  // dx: the gradient at the layer's output in, at its input out (fp32).
  Status layer_backward(const LayerSlots<const Half*>& w, const LayerSlots<float*>& dw, Acts& a, Array<float>& dx) {
    void* st = s_;
    SP_ASSIGN_OR_RETURN(Array<Half> dx16, mem_.make<Half>(rows * hid));
    SP_ASSIGN_OR_RETURN(Array<Half> act, mem_.make<Half>(rows * F));
    SP_ASSIGN_OR_RETURN(Array<float> dact, mem_.make<float>(rows * F));
    SP_ASSIGN_OR_RETURN(Array<Half> dg, mem_.make<Half>(rows * F));
    SP_ASSIGN_OR_RETURN(Array<Half> du, mem_.make<Half>(rows * F));
    SP_ASSIGN_OR_RETURN(Array<float> dh, mem_.make<float>(rows * hid));
    // MLP: x_out = x_mid + down(silu(g) * u).
    SP_RETURN_IF_ERROR(cu::swiglu_forward(a.g.p(), a.u.p(), act.p(), rows * F, st));
    SP_RETURN_IF_ERROR(cu::to_bf16(dx.p(), dx16.p(), rows * hid, st));
    SP_RETURN_IF_ERROR(cu::linear_backward(act.p(), w.wd, dx16.p(), dact.p(), dw.wd, rows, F, hid, false, st));
    SP_RETURN_IF_ERROR(cu::swiglu_backward(a.g.p(), a.u.p(), dact.p(), dg.p(), du.p(), rows * F, st));
    SP_RETURN_IF_ERROR(cu::linear_backward(a.h2.p(), w.wg, dg.p(), dh.p(), dw.wg, rows, hid, F, false, st));
    SP_RETURN_IF_ERROR(cu::linear_backward(a.h2.p(), w.wu, du.p(), dh.p(), dw.wu, rows, hid, F, true, st));
    SP_RETURN_IF_ERROR(cu::rmsnorm_backward(a.x_mid.p(), w.n2, a.rstd2.p(), dh.p(), dx.p(), dw.n2, rows, hid, st));
    // Attention: x_mid = x_in + o_proj(attention(q, k, v)).
    SP_ASSIGN_OR_RETURN(Array<float> dout32, mem_.make<float>(rows * H * D));
    SP_ASSIGN_OR_RETURN(Array<Half> dout, mem_.make<Half>(rows * H * D));
    SP_ASSIGN_OR_RETURN(Array<Half> dq, mem_.make<Half>(rows * H * D));
    SP_ASSIGN_OR_RETURN(Array<Half> dk, mem_.make<Half>(rows * Hkv * D));
    SP_ASSIGN_OR_RETURN(Array<Half> dv, mem_.make<Half>(rows * Hkv * D));
    SP_RETURN_IF_ERROR(cu::to_bf16(dx.p(), dx16.p(), rows * hid, st));
    SP_RETURN_IF_ERROR(cu::linear_backward(a.o.p(), w.wo, dx16.p(), dout32.p(), dw.wo, rows, H * D, hid, false, st));
    SP_RETURN_IF_ERROR(cu::to_bf16(dout32.p(), dout.p(), rows * H * D, st));
    const ShardTensors t{view(a.q.p(), {B, S, H, D}), view(a.k.p(), {B, S, Hkv, D}), view(a.v.p(), {B, S, Hkv, D}),
                         view(a.o.p(), {B, S, H, D}), view(a.lse.p(), {B, H, S}),    view(dout.p(), {B, S, H, D}),
                         view(dq.p(), {B, S, H, D}),  view(dk.p(), {B, S, Hkv, D}), view(dv.p(), {B, S, Hkv, D})};
    SP_RETURN_IF_ERROR(session_->run(*plan_, Pass::kBackward, t, {s_}));
    const double theta = o_.model.rope_theta;
    SP_RETURN_IF_ERROR(cu::rope_apply(dq.p(), positions_.p(), B, S, H, D, theta, true, st));
    SP_RETURN_IF_ERROR(cu::rope_apply(dk.p(), positions_.p(), B, S, Hkv, D, theta, true, st));
    SP_RETURN_IF_ERROR(cu::linear_backward(a.h1.p(), w.wq, dq.p(), dh.p(), dw.wq, rows, hid, H * D, false, st));
    SP_RETURN_IF_ERROR(cu::linear_backward(a.h1.p(), w.wk, dk.p(), dh.p(), dw.wk, rows, hid, Hkv * D, true, st));
    SP_RETURN_IF_ERROR(cu::linear_backward(a.h1.p(), w.wv, dv.p(), dh.p(), dw.wv, rows, hid, Hkv * D, true, st));
    return cu::rmsnorm_backward(a.x_in.p(), w.n1, a.rstd1.p(), dh.p(), dx.p(), dw.n1, rows, hid, st);
  }

  // What a policy keeps of a layer's activations after its forward.
  Status keep_for_policy(Acts& a) {
    if (o_.checkpointing == Checkpointing::kNone) return Status::Ok();
    Acts kept;
    kept.x_in = std::move(a.x_in);
    if (o_.checkpointing == Checkpointing::kAttention) kept.o = std::move(a.o), kept.lse = std::move(a.lse);
    if (o_.checkpointing == Checkpointing::kSequence) {  // the second half of O and LSE
      const int64_t half = S / 2, late = S - half;
      const size_t q_row = size_t(H * D) * 2;
      SP_ASSIGN_OR_RETURN(kept.o_late, mem_.make<Half>(B * late * H * D));
      SP_ASSIGN_OR_RETURN(kept.lse_late, mem_.make<float>(B * H * late));
      SP_RETURN_IF_ERROR(copy_rows(kept.o_late.p(), late * q_row, reinterpret_cast<char*>(a.o.p()) + half * q_row,
                                   S * q_row, late * q_row, size_t(B), s_));
      SP_RETURN_IF_ERROR(copy_rows(kept.lse_late.p(), late * 4, reinterpret_cast<char*>(a.lse.p()) + half * 4, S * 4,
                                   late * 4, size_t(B * H), s_));
    }
    a = std::move(kept);
    return Status::Ok();
  }

  TrainOptions o_;
  TrainingMemory& mem_;
  cudaStream_t s_;
  ParameterOffsets at_;
  std::vector<std::pair<int64_t, int64_t>> units_;  // weight_units
  int device_ = 0;
  std::unique_ptr<Session> session_;  // the attention's backend, plans and workspace
  const AttentionPlan* plan_ = nullptr;
  const AttentionPlan* early_plan_ = nullptr;  // sequence policy: the sequence's first half
  Array<int64_t> positions_;                   // this rank's global positions (RoPE)
  int64_t B = 0, S = 0, rows = 0, hid = 0, H = 0, Hkv = 0, D = 0, F = 0;
};

}  // namespace

StatusOr<std::unique_ptr<ModelPass>> make_cuda_model_pass(const TrainOptions& options, const Layout& layout,
                                                          Communicator& group, TrainingMemory& memory) {
  SP_CHECK_ARG(memory.device() == DeviceKind::kCuda, "internal: the GPU pass needs device training memory");
  auto pass = std::make_unique<CudaModelPass>(options, memory);
  SP_RETURN_IF_ERROR(pass->init(layout, group));
  return std::unique_ptr<ModelPass>(std::move(pass));
}

}  // namespace seqpar::model
