// Local (single-device) attention on the CPU: the fp64 oracle and the fast blocked
// online-softmax kernels, plus the -inf-safe merge of partial results.
//
// Shapes (BSHD, last dim contiguous; other strides allowed):
//   q, o, dout, dq: [B, S_q, H, D]      k, v, dk, dv: [B, S_k, H_kv, D]
//   lse, delta:     [B, H, S_q]         H must be divisible by H_kv (GQA/MQA).
// LSE is the natural-log log-sum-exp of the *scaled* scores; a row with no visible key has
// LSE = -inf and output 0. The CPU backend computes in fp32 or fp64 (inputs, outputs and
// LSE all of one dtype); it has no bf16/fp16 kernels and refuses them.
#pragma once

#include <cstdint>
#include <vector>

#include "seqpar/mask.hpp"
#include "seqpar/status.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar {

struct AttentionParams {
  double scale = 0.0;  // 0 means 1/sqrt(D)
  MaskSpec mask;
  // Global positions of the local query rows [S_q] and key rows [S_k] (shared by every batch
  // entry and head). nullptr means 0..S-1, shifted for a bottom-right mask alignment.
  const int64_t* q_positions = nullptr;
  const int64_t* k_positions = nullptr;
};

// ---- the oracle: plain attention in fp64 -------------------------------------------------

// Which rows the oracle's backward fills; empty lists mean all rows (no row may repeat). The
// forward runs over every row because dK/dV of any key row needs LSE and D of every query row.
// With query_side_only it runs over query_rows alone, dK/dV are not computed, and o, lse, dq
// hold those rows alone, in list order ([B, rows, H, D] and [B, H, rows]): O(rows * S_k) work
// and memory for the query side, how million-token results are checked.
struct ReferenceRows {
  std::vector<int64_t> query_rows;  // rows of dq (and with query_side_only of o, lse) to compute
  std::vector<int64_t> key_rows;    // rows of dk, dv to compute
  bool query_side_only = false;     // needs query_rows; dk, dv stay empty tensors
};

// q, k, v, dout of any dtype (read through conversion). Outputs are fp64 host tensors:
// o, dq [B,S_q,H,D], lse [B,H,S_q], dk, dv [B,S_k,H_kv,D]. Rows not requested stay 0.
// Pass an empty dout view (data == nullptr) to skip the backward.
struct ReferenceResult {
  HostTensor o, lse, dq, dk, dv;
};
StatusOr<ReferenceResult> reference_attention(const TensorView& q, const TensorView& k,
                                              const TensorView& v, const TensorView& dout,
                                              const AttentionParams& params,
                                              const ReferenceRows& rows = {});

// ---- the fast CPU kernels ------------------------------------------------------------------

// Forward. With accumulate = false, writes o and lse. With accumulate = true, (o, lse) hold a
// running normalised result over earlier keys (lse = -inf and o = 0 for none yet) and are
// updated to cover these keys too, exactly as if all keys had been seen in one call.
Status cpu_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                             const AttentionParams& params, const TensorView& o,
                             const TensorView& lse, bool accumulate);

// delta[b,h,i] = sum_d dout[b,i,h,d] * o[b,i,h,d]   (FlashAttention's D).
Status cpu_attention_delta(const TensorView& o, const TensorView& dout, const TensorView& delta);

// Backward against a given (global) lse and delta; *adds* into dq, dk, dv.
Status cpu_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& dout, const TensorView& lse,
                              const TensorView& delta, const AttentionParams& params,
                              const TensorView& dq, const TensorView& dk, const TensorView& dv);

// Merges a partial result into a running one, in place: (o, lse) <- merge((o, lse),
// (o_part, lse_part)). Safe when either or both LSEs are -inf (or +inf from a backend).
Status merge_attention_partials(const TensorView& o, const TensorView& lse,
                                const TensorView& o_part, const TensorView& lse_part);

}  // namespace seqpar
