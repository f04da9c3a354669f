// The TransNormerLLM-style token mixer's CPU half (linear_attention_layer.hpp): the projections
// and elementwise steps here, the products through linear.cpp, the norm through rmsnorm.cpp with
// a weight of ones, the gate's SiLU through swiglu.cpp, the attention through LASP.
#include "model/linear_attention_layer.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "model/layers.hpp"

namespace seqpar::model {
namespace {

template <class T>
constexpr DType dtype_of() {
  return std::is_same_v<T, double> ? DType::kF64 : DType::kF32;
}

template <class T>
TensorView heads_view(const LinearMixerShape& s, const T* p) {
  return TensorView::contiguous(const_cast<T*>(p), dtype_of<T>(),
                                {s.batch, s.seq, s.heads, s.head_dim});
}

// The feature map on q and k: y = silu(x) = x * sigmoid(x).
template <class T>
void silu_forward(const T* x, T* y, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (T(1) + std::exp(-x[i]));
}
// dx = dy * silu'(x), silu'(x) = sigmoid(x) * (1 + x * (1 - sigmoid(x))).
template <class T>
void silu_backward(const T* x, const T* dy, T* dx, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T sig = T(1) / (T(1) + std::exp(-x[i]));
    dx[i] = dy[i] * sig * (T(1) + x[i] * (T(1) - sig));
  }
}

// a = n * gate(g).
template <class T>
void gate_forward(MixerGate gate, const T* g, const T* normed, T* a, int64_t n) {
  if (gate == MixerGate::kSilu) return swiglu_forward(g, normed, a, n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = normed[i] * g[i];
}
// From da: dg and dnormed (overwritten).
template <class T>
void gate_backward(MixerGate gate, const T* g, const T* normed, const T* da, T* dg, T* dnormed,
                   int64_t n) {
  if (gate == MixerGate::kSilu) return swiglu_backward(g, normed, da, dg, dnormed, n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    dg[i] = da[i] * normed[i];
    dnormed[i] = da[i] * g[i];
  }
}

}  // namespace

Status check_linear_mixer(const Layout& layout, int rank, const LinearMixerShape& s,
                          const LinearAttentionParams& params) {
  SP_CHECK_ARG(s.batch >= 1 && s.hidden >= 1 && s.heads >= 1 && s.head_dim >= 1,
               "the mixer needs a batch, a hidden size, heads and a head dim");
  SP_CHECK_ARG(s.seq == layout.local_len(rank),
               "this rank holds " + std::to_string(layout.local_len(rank)) +
                   " rows of each sequence, not " + std::to_string(s.seq));
  SP_CHECK_ARG(s.norm_eps > 0, "the output norm's eps must be positive");
  return validate_linear_params(params, s.heads);
}

template <class T>
Status linear_mixer_forward(Communicator& comm, const Layout& layout, LaspAlgorithm algorithm,
                            const LinearAttentionParams& params, const LinearMixerShape& s,
                            const LinearMixerSlots<const T*>& w, const T* x,
                            const LinearMixerActs<T>& a, T* y, LaspContext* ctx, LinearMixerRun run) {
  SP_RETURN_IF_ERROR(check_linear_mixer(layout, comm.rank(), s, params));
  SP_CHECK_ARG(!run.o_given || ctx->forwarded(), "internal: a recompute needs the forward's LASP context");
  const int64_t rows = s.rows(), width = s.width(), n = rows * width;
  linear_forward(x, w.wq, a.q_in, rows, s.hidden, width);
  linear_forward(x, w.wk, a.k_in, rows, s.hidden, width);
  linear_forward(x, w.wv, a.v, rows, s.hidden, width);
  linear_forward(x, w.wg, a.g, rows, s.hidden, width);
  silu_forward(a.q_in, a.q, n);
  silu_forward(a.k_in, a.k, n);
  if (!run.o_given)
    SP_RETURN_IF_ERROR(lasp_forward(comm, layout, params, algorithm, heads_view(s, a.q),
                                    heads_view(s, a.k), heads_view(s, a.v), heads_view(s, a.o), ctx));
  // TNL's norm has no weight: rmsnorm.cpp's with w = 1.
  const std::vector<T> ones(size_t(width), T(1));
  rmsnorm_forward(a.o, ones.data(), a.normed, a.rstd, rows, width, s.norm_eps);
  std::vector<T> gated(static_cast<size_t>(n));
  gate_forward(s.gate, a.g, a.normed, gated.data(), n);
  if (run.accumulate) {
    linear_forward_add(gated.data(), w.wo, y, rows, width, s.hidden);
  } else {
    linear_forward(gated.data(), w.wo, y, rows, width, s.hidden);
  }
  return Status::Ok();
}

template <class T>
Status linear_mixer_backward(Communicator& comm, const Layout& layout,
                             const LinearAttentionParams& params, const LinearMixerShape& s,
                             const LinearMixerSlots<const T*>& w, const T* x,
                             const LinearMixerActs<T>& a, const T* dy, T* dx,
                             const LinearMixerSlots<T*>& dw, LaspContext* ctx) {
  SP_RETURN_IF_ERROR(check_linear_mixer(layout, comm.rank(), s, params));
  const int64_t rows = s.rows(), width = s.width(), n = rows * width;
  const int64_t tile = s.tile_rows > 0 ? std::min(s.tile_rows, rows) : rows;
  // [rows, H * D]: d_o (LASP's dout), dq, dk, dv from the attention, dg until the end. A tile's
  // scratch: `first` holds gated, then dnormed; `second` dgated (each dead once the next step has
  // read it).
  const size_t count = static_cast<size_t>(n), tile_count = static_cast<size_t>(tile * width);
  std::vector<T> d_o(count, T(0)), dq(count), dk(count), dv(count), dg(count);
  std::vector<T> first(tile_count), second(tile_count);
  // TNL's norm has no weight: rmsnorm.cpp's with w = 1, its weight's gradient dropped.
  const std::vector<T> ones(size_t(width), T(1));
  std::vector<T> unused_weight_grad(size_t(width), T(0));
  for (int64_t r0 = 0; r0 < rows; r0 += tile) {
    const int64_t tile_rows = std::min(tile, rows - r0), m = tile_rows * width, at = r0 * width;
    // y = gated Wo^T: gated is recomputed (elementwise) rather than kept.
    gate_forward(s.gate, a.g + at, a.normed + at, first.data(), m);
    linear_backward(first.data(), w.wo, dy + r0 * s.hidden, second.data(), dw.wo, tile_rows, width, s.hidden, false);
    T* dnormed = first.data();
    gate_backward(s.gate, a.g + at, a.normed + at, second.data(), dg.data() + at, dnormed, m);
    // The norm: do = 0 + d(normed)/do^T dnormed.
    rmsnorm_backward(a.o + at, ones.data(), a.rstd + r0, dnormed, d_o.data() + at, unused_weight_grad.data(),
                     tile_rows, width);
  }
  SP_RETURN_IF_ERROR(lasp_backward(comm, layout, params, ctx, heads_view(s, a.q),
                                   heads_view(s, a.k), heads_view(s, a.v), heads_view(s, d_o.data()),
                                   heads_view(s, dq.data()), heads_view(s, dk.data()),
                                   heads_view(s, dv.data())));
  // Through SiLU back to the projections' outputs (in place: dq, dk become d(q_in), d(k_in)).
  silu_backward(a.q_in, dq.data(), dq.data(), n);
  silu_backward(a.k_in, dk.data(), dk.data(), n);
  linear_backward(x, w.wq, dq.data(), dx, dw.wq, rows, s.hidden, width, false);
  linear_backward(x, w.wk, dk.data(), dx, dw.wk, rows, s.hidden, width, true);
  linear_backward(x, w.wv, dv.data(), dx, dw.wv, rows, s.hidden, width, true);
  linear_backward(x, w.wg, dg.data(), dx, dw.wg, rows, s.hidden, width, true);
  return Status::Ok();
}

#define SEQPAR_INSTANTIATE_LINEAR_MIXER(T)                                                       \
  template Status linear_mixer_forward<T>(Communicator&, const Layout&, LaspAlgorithm,           \
                                          const LinearAttentionParams&, const LinearMixerShape&, \
                                          const LinearMixerSlots<const T*>&, const T*,           \
                                          const LinearMixerActs<T>&, T*, LaspContext*,           \
                                          LinearMixerRun);                                       \
  template Status linear_mixer_backward<T>(                                                      \
      Communicator&, const Layout&, const LinearAttentionParams&, const LinearMixerShape&,       \
      const LinearMixerSlots<const T*>&, const T*, const LinearMixerActs<T>&, const T*, T*,      \
      const LinearMixerSlots<T*>&, LaspContext*);
SEQPAR_INSTANTIATE_LINEAR_MIXER(float)
SEQPAR_INSTANTIATE_LINEAR_MIXER(double)
#undef SEQPAR_INSTANTIATE_LINEAR_MIXER

}  // namespace seqpar::model
