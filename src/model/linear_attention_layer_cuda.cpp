// The TransNormerLLM-style token mixer's CUDA half (linear_attention_layer_cuda.hpp): the CPU
// half's steps in the same order, each a CUDA layer piece or LASP on device tensors.
#include "model/linear_attention_layer_cuda.hpp"

#include <algorithm>
#include <vector>

namespace seqpar::model::cuda {
namespace {

// [B, S_local, H, D] bf16 on `device`, as LASP takes q, k, v, o and their gradients.
TensorView heads_view(const LinearMixerShape& s, const bf16_t* p, Device device) {
  return TensorView::contiguous(const_cast<bf16_t*>(p), DType::kBF16,
                                {s.batch, s.seq, s.heads, s.head_dim}, device);
}

}  // namespace

StatusOr<const bf16_t*> LinearMixer::norm_weight(int64_t width) {
  if (ones_.n != width) {
    SP_ASSIGN_OR_RETURN(ones_, memory_.make<bf16_t>(width));
    const std::vector<bf16_t> host(size_t(width), bf16_t(0x3F80));  // 1.0 in bf16
    SP_RETURN_IF_ERROR(memory_.from_host(ones_.p(), host.data(), host.size() * sizeof(bf16_t)));
  }
  return static_cast<const bf16_t*>(ones_.p());
}

StatusOr<Array<float>> LinearMixer::widened(const bf16_t* o, int64_t n) {
  SP_ASSIGN_OR_RETURN(Array<float> o32, memory_.make<float>(n));
  SP_RETURN_IF_ERROR(to_f32(o, o32.p(), n, memory_.stream()));
  return o32;
}

Status LinearMixer::forward(Communicator& comm, const Layout& layout, LaspAlgorithm algorithm,
                            const LinearAttentionParams& params, const LinearMixerShape& s,
                            const LinearMixerSlots<const bf16_t*>& w, const bf16_t* x,
                            const LinearMixerActs<bf16_t, float>& a, float* y, LaspContext* ctx,
                            LinearMixerRun run) {
  SP_RETURN_IF_ERROR(check_linear_mixer(layout, comm.rank(), s, params));
  SP_CHECK_ARG(!run.o_given || ctx->forwarded(),
               "internal: a recompute needs the forward's LASP context");
  void* stream = memory_.stream();
  const int64_t rows = s.rows(), width = s.width(), n = rows * width;
  SP_RETURN_IF_ERROR(linear_forward(x, w.wq, a.q_in, rows, s.hidden, width, stream));
  SP_RETURN_IF_ERROR(linear_forward(x, w.wk, a.k_in, rows, s.hidden, width, stream));
  SP_RETURN_IF_ERROR(linear_forward(x, w.wv, a.v, rows, s.hidden, width, stream));
  SP_RETURN_IF_ERROR(linear_forward(x, w.wg, a.g, rows, s.hidden, width, stream));
  SP_RETURN_IF_ERROR(silu_forward(a.q_in, a.q, n, stream));
  SP_RETURN_IF_ERROR(silu_forward(a.k_in, a.k, n, stream));
  if (!run.o_given) {
    const auto view = [&](const bf16_t* p) { return heads_view(s, p, device_); };
    SP_RETURN_IF_ERROR(lasp_forward(comm, layout, params, algorithm, view(a.q), view(a.k),
                                    view(a.v), view(a.o), ctx, stream));
  }
  SP_ASSIGN_OR_RETURN(const bf16_t* ones, norm_weight(width));
  {
    SP_ASSIGN_OR_RETURN(const Array<float> o32, widened(a.o, n));
    SP_RETURN_IF_ERROR(
        rmsnorm_forward(o32.p(), ones, a.normed, a.rstd, rows, width, s.norm_eps, stream));
  }
  SP_ASSIGN_OR_RETURN(const Array<bf16_t> gated, memory_.make<bf16_t>(n));
  SP_RETURN_IF_ERROR(
      mixer_gate_forward(s.gate == MixerGate::kSilu, a.g, a.normed, gated.p(), n, stream));
  // The output product adds into fp32: y is cleared first unless it accumulates.
  if (!run.accumulate) SP_RETURN_IF_ERROR(memory_.zero(y, size_t(rows * s.hidden) * sizeof(float)));
  return linear_forward_add(gated.p(), w.wo, y, rows, width, s.hidden, stream);
}

Status LinearMixer::backward(Communicator& comm, const Layout& layout,
                             const LinearAttentionParams& params, const LinearMixerShape& s,
                             const LinearMixerSlots<const bf16_t*>& w, const bf16_t* x,
                             const LinearMixerActs<bf16_t, float>& a, const bf16_t* dy, float* dx,
                             const LinearMixerSlots<float*>& dw, LaspContext* ctx) {
  SP_RETURN_IF_ERROR(check_linear_mixer(layout, comm.rank(), s, params));
  void* stream = memory_.stream();
  const int64_t rows = s.rows(), width = s.width(), n = rows * width;
  const bool silu_gate = s.gate == MixerGate::kSilu;
  const int64_t tile = s.tile_rows > 0 ? std::min(s.tile_rows, rows) : rows;
  // [rows, H * D] bf16: d_o (LASP's dout) and dg (until the end).
  SP_ASSIGN_OR_RETURN(const Array<bf16_t> d_o, memory_.make<bf16_t>(n));
  SP_ASSIGN_OR_RETURN(const Array<bf16_t> dg, memory_.make<bf16_t>(n));
  {
    // A tile's scratch: `gated` the recomputed gate output; `grad` da, then do in fp32 (each dead
    // once the next step has read it); dnormed; o widened to fp32.
    const int64_t tn = tile * width;
    SP_ASSIGN_OR_RETURN(const Array<bf16_t> gated, memory_.make<bf16_t>(tn));
    SP_ASSIGN_OR_RETURN(const Array<float> grad, memory_.make<float>(tn));
    SP_ASSIGN_OR_RETURN(const Array<float> dnormed, memory_.make<float>(tn));
    SP_ASSIGN_OR_RETURN(const Array<float> o32, memory_.make<float>(tn));
    // The norm's weight is ones; its gradient goes to scratch (there is no weight).
    SP_ASSIGN_OR_RETURN(const bf16_t* ones, norm_weight(width));
    SP_ASSIGN_OR_RETURN(const Array<float> unused_weight_grad, memory_.make_zeroed<float>(width));
    for (int64_t r0 = 0; r0 < rows; r0 += tile) {
      const int64_t tile_rows = std::min(tile, rows - r0), m = tile_rows * width, at = r0 * width;
      // y = gated Wo^T: gated is recomputed (elementwise) rather than kept.
      SP_RETURN_IF_ERROR(mixer_gate_forward(silu_gate, a.g + at, a.normed + at, gated.p(), m, stream));
      SP_RETURN_IF_ERROR(linear_backward(gated.p(), w.wo, dy + r0 * s.hidden, grad.p(), dw.wo, tile_rows, width,
                                         s.hidden, false, stream));
      SP_RETURN_IF_ERROR(
          mixer_gate_backward(silu_gate, a.g + at, a.normed + at, grad.p(), dg.p() + at, dnormed.p(), m, stream));
      // The norm: do = 0 + d(normed)/do^T dnormed.
      SP_RETURN_IF_ERROR(to_f32(a.o + at, o32.p(), m, stream));
      SP_RETURN_IF_ERROR(memory_.zero(grad.p(), size_t(m) * sizeof(float)));
      SP_RETURN_IF_ERROR(rmsnorm_backward(o32.p(), ones, a.rstd + r0, dnormed.p(), grad.p(), unused_weight_grad.p(),
                                          tile_rows, width, stream));
      SP_RETURN_IF_ERROR(to_bf16(grad.p(), d_o.p() + at, m, stream));
    }
  }
  SP_ASSIGN_OR_RETURN(const Array<bf16_t> dq, memory_.make<bf16_t>(n));
  SP_ASSIGN_OR_RETURN(const Array<bf16_t> dk, memory_.make<bf16_t>(n));
  SP_ASSIGN_OR_RETURN(const Array<bf16_t> dv, memory_.make<bf16_t>(n));
  const auto view = [&](const bf16_t* p) { return heads_view(s, p, device_); };
  SP_RETURN_IF_ERROR(lasp_backward(comm, layout, params, ctx, view(a.q), view(a.k), view(a.v),
                                   view(d_o.p()), view(dq.p()), view(dk.p()), view(dv.p()), stream));
  // Through SiLU back to the projections' outputs (in place: dq, dk become d(q_in), d(k_in)).
  SP_RETURN_IF_ERROR(silu_backward(a.q_in, dq.p(), dq.p(), n, stream));
  SP_RETURN_IF_ERROR(silu_backward(a.k_in, dk.p(), dk.p(), n, stream));
  SP_RETURN_IF_ERROR(
      linear_backward(x, w.wq, dq.p(), dx, dw.wq, rows, s.hidden, width, false, stream));
  SP_RETURN_IF_ERROR(
      linear_backward(x, w.wk, dk.p(), dx, dw.wk, rows, s.hidden, width, true, stream));
  SP_RETURN_IF_ERROR(
      linear_backward(x, w.wv, dv.p(), dx, dw.wv, rows, s.hidden, width, true, stream));
  return linear_backward(x, w.wg, dg.p(), dx, dw.wg, rows, s.hidden, width, true, stream);
}

}  // namespace seqpar::model::cuda
