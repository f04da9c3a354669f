// Causal linear attention with a constant per-head decay (no feature map, no normaliser), the
// attention LASP distributes: the fp64 oracle in two forms and the chunked CPU kernels.
//
//   o_i = scale * ( sum_{j<=i} lambda^(i-j) (q_i . k_j) v_j  +  lambda^(i+1) S_in^T q_i )
//   S_out = lambda^n S_in + sum_j lambda^(n-1-j) k_j v_j^T          (n = local length)
//
// i.e. the recurrence S_i = lambda S_{i-1} + k_i v_i^T, o_i = scale S_i^T q_i, started from
// S_{-1} = S_in. The state carries no scale. lambda = 1 is plain causal linear attention.
//
// Shapes (BSHD, last dim contiguous; other strides allowed):
//   q, o, dout, dq: [B, S, H, d_k | d_v]     k, dk: [B, S, H_kv, d_k]     v, dv: [B, S, H_kv, d_v]
//   state_in, state_out, dstate_in, dstate_out: [B, H, d_k, d_v], contiguous
// H must be divisible by H_kv (GQA/MQA; query head h reads K/V head h / (H / H_kv)).
//
// States are per *query* head: the decay is per query head, so two query heads that share a
// K/V head still sum k v^T with different weights and hold different states. A chain message
// is therefore B * H * d_k * d_v elements, H the query heads, whatever H_kv is.
//
// Gradients: dstate_out is dL/dS_out, what arrives from the later chunk; dstate_in is
// dL/dS_in, what goes to the earlier chunk:
//   dS_in = lambda^n dS_out + scale * sum_i lambda^(i+1) q_i dout_i^T.
// Decay factors are exp(-log(1/lambda) * k) for the distance k >= 0 they span, never a
// product of a large and a small power (lambda^C * lambda^-j under- or overflows).
#pragma once

#include <cstdint>
#include <vector>

#include "seqpar/status.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar {

struct LinearAttentionParams {
  // lambda per query head, each in (0, 1]: one value (every head) or H values.
  std::vector<double> decay{1.0};
  double scale = 1.0;
  // Tokens per chunk of the CPU kernel: intra-chunk masked products, state products between.
  int64_t chunk = 64;
};

// Checks decay (count 1 or `heads`, each in (0, 1]), scale (finite) and chunk (>= 1).
Status validate_linear_params(const LinearAttentionParams& params, int64_t heads);
// lambda of query head h (the one value when a single one is given).
double head_decay(const LinearAttentionParams& params, int64_t h);
// lambda_h^k for a distance k >= 0, as exp(-log(1/lambda_h) * k).
double decay_power(const LinearAttentionParams& params, int64_t h, int64_t k);

// ---- the oracle: fp64, obvious on purpose ----------------------------------------------------

enum class LinearOracleForm : uint8_t {
  kQuadratic,  // every output and gradient as its direct masked sum over positions: O(S^2)
  kRecurrent,  // the token-by-token recurrence and its reverse-time adjoint: O(S d_k d_v)
};

// fp64 host tensors: o [B,S,H,d_v], state_out [B,H,d_k,d_v]; with dout, also dq [B,S,H,d_k],
// dk [B,S,H_kv,d_k], dv [B,S,H_kv,d_v], dstate_in [B,H,d_k,d_v].
struct LinearReferenceResult {
  HostTensor o, state_out, dq, dk, dv, dstate_in;
};

// Inputs of any dtype (read through conversion). Empty views (data == nullptr) mean: state_in
// and dstate_out zero; dout absent (forward only).
StatusOr<LinearReferenceResult> linear_attention_reference(
    const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& state_in,
    const TensorView& dout, const TensorView& dstate_out, const LinearAttentionParams& params,
    LinearOracleForm form);

// ---- the chunked CPU kernels (fp32 or fp64; every tensor of one dtype) -----------------------

// Writes o and state_out. An empty state_in is a zero state; an empty o computes the state
// alone; an empty state_out is not written.
Status linear_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& state_in, const LinearAttentionParams& params,
                                const TensorView& o, const TensorView& state_out);

// Writes dq, dk, dv and dstate_in (empty: not written). An empty state_in or dstate_out is zero.
// With dq, dk and dv all empty, only dstate_in is computed (state_in, k and v unread): the dState
// a sequence-parallel rank passes on before a later rank's dState is known.
Status linear_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& state_in, const TensorView& dout,
                                 const TensorView& dstate_out, const LinearAttentionParams& params,
                                 const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                 const TensorView& dstate_in);

// LASP's carried-state combine: a distributed schedule runs each rank's tokens from a zero state
// first (a forward with o empty gives their own state, a backward with no dq, dk, dv their own
// dState), then carries the state arriving from another rank across them:
// out = lambda_h^length * carried + local, per head: a state (or dState) carried across
// `length` tokens plus what those tokens add. out may alias either input.
Status linear_state_combine(const TensorView& carried, const TensorView& local, int64_t length,
                            const LinearAttentionParams& params, const TensorView& out);

}  // namespace seqpar
