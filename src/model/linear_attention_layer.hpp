// The TransNormerLLM-style token mixer (Qin et al. 2307.14995, the model LASP trains): a model
// layer, CPU half, templated on float (training) and double (the fp64 version tests hold it to);
// the CUDA half (bf16) is linear_attention_layer_cuda.hpp.
// On this rank's rows x [B, S_local, hidden]:
//   q = silu(x Wq^T), k = silu(x Wk^T), v = x Wv^T, g = x Wg^T      [B, S_local, H, D]
//   o = causal linear attention of (q, k, v), per-head decay         [B, S_local, H, D]
//   n = o / sqrt(mean(o^2) + eps)   over each row's H * D values     (TNL's SimpleRMSNorm)
//   a = n * gate(g)                 gate: identity (TNL) or silu
//   y = a Wo^T                                                       [B, S_local, hidden]
// Choices, after TNL's released NormLinearAttention (the LASP report leaves Norm, the feature map
// and the gate to TNL, sections A5-A7): SiLU on q and k only (v stays linear, so o can change
// sign); the norm spans the whole row (H * D), not each head, and has no weight, because a
// per-channel weight before Wo folds into Wo's columns; the gate is linear by default, SiLU on
// request (GLA-style); no RoPE (TNL's LRPE is off by default); no attention scale (scale 1).
// The attention is LASP (seqpar/lasp.hpp; or its ulysses baseline, by `algorithm`) over `comm`
// and a contiguous `layout`: with one rank it is the whole sequence, and the same call runs a
// sequence split over ranks, each one's rows.
#pragma once

#include <cstdint>

#include "seqpar/comm.hpp"
#include "seqpar/lasp.hpp"
#include "seqpar/layout.hpp"
#include "seqpar/linear_attention.hpp"

namespace seqpar::model {

enum class MixerGate : uint8_t {
  kIdentity,  // a = n * g (TNL's released code)
  kSilu,      // a = n * silu(g)
};

struct LinearMixerShape {
  int64_t batch = 0, seq = 0;  // seq: this rank's rows of each sequence (layout.local_len)
  int64_t hidden = 0, heads = 0, head_dim = 0;
  double norm_eps = 1e-6;  // TNL's SimpleRMSNorm eps
  MixerGate gate = MixerGate::kIdentity;
  // Rows the backward's row-wise steps before LASP (the output product's backward, the gate's and
  // the norm's) take at a time, their scratch one tile's (0: all rows at once). Wo's gradient then
  // sums tile by tile: the same to round-off.
  int64_t tile_rows = 0;

  int64_t rows() const { return batch * seq; }
  int64_t width() const { return heads * head_dim; }  // H * D
};

// The mixer's weights (P = const T*) or their gradients (P = T*), row-major like linear.cpp's:
//   wq, wk, wv, wg: [H * D, hidden]     wo: [hidden, H * D]
template <class P>
struct LinearMixerSlots {
  P wq, wk, wv, wg, wo;
};

// What the forward keeps for the backward; caller-owned arrays, [rows, H * D] unless said:
//   q_in, k_in (before SiLU), q, k, v, g, o (attention output), normed (n), rstd [rows].
// rstd is a row statistic, S: T on the CPU, fp32 on a GPU where the rest is bf16.
template <class T, class S = T>
struct LinearMixerActs {
  T *q_in, *k_in, *q, *k, *v, *g, *o, *normed;
  S* rstd;
};

// How a forward runs: y = or += the output (accumulate: straight into the residual stream); with
// o_given, acts.o and *ctx already hold the attention's output and entering state from an earlier
// forward of the same inputs (a checkpointing recompute), so the forward neither sends nor
// receives a state (the LASP paper's checkpointing caveat): it recomputes the rest around them.
struct LinearMixerRun {
  bool accumulate = false;
  bool o_given = false;
};

// The shape and the decays checked against this rank's rows of `layout` (both halves' first step).
Status check_linear_mixer(const Layout& layout, int rank, const LinearMixerShape& shape,
                          const LinearAttentionParams& params);

// Forward on this rank: fills acts and *ctx (the entering LASP state the backward reuses) and
// writes y [rows, hidden]. params: the attention's per-head decays (and scale, 1 for TNL).
// Collective over comm (LASP's state chain or all-gather, ulysses's all-to-alls) unless run.o_given.
template <class T>
Status linear_mixer_forward(Communicator& comm, const Layout& layout, LaspAlgorithm algorithm,
                            const LinearAttentionParams& params, const LinearMixerShape& shape,
                            const LinearMixerSlots<const T*>& w, const T* x,
                            const LinearMixerActs<T>& acts, T* y, LaspContext* ctx, LinearMixerRun run = {});

// Backward on this rank from dy [rows, hidden]: writes dx [rows, hidden] (overwritten) and adds
// the weights' gradients into dw. Collective over comm (the forward's algorithm), the same ctx.
template <class T>
Status linear_mixer_backward(Communicator& comm, const Layout& layout,
                             const LinearAttentionParams& params, const LinearMixerShape& shape,
                             const LinearMixerSlots<const T*>& w, const T* x,
                             const LinearMixerActs<T>& acts, const T* dy, T* dx,
                             const LinearMixerSlots<T*>& dw, LaspContext* ctx);

}  // namespace seqpar::model
