// The cuDNN backend: fused flash attention from cuDNN 9 through its frontend graph API.
// Forward returns LSE (cuDNN's "Stats"); backward takes a *given* O and LSE, so a distributed
// step can pass the global ones. Graphs are built once per shape, mask, dtype and strides and
// cached per thread and device; one workspace per thread and device is reused.
//
// Shapes (device memory, BSHD with contiguous last dim; other strides allowed):
//   q, o, dout, dq: [B, S_q, H, D] bf16|fp16    k, v, dk, dv: [B, S_k, H_kv, D] same dtype
//   lse: [B, H, S_q] fp32, contiguous
// Masks: none, causal and sliding windows (window_right >= 0), top-left or bottom-right
// aligned. Not supported by cuDNN and refused with a reason: documents, explicit positions,
// a left window without a right bound, fp32/fp64.
#pragma once

#include <string>

#include "seqpar/attention.hpp"
#include "seqpar/status.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar {

// Empty when cuDNN can run this problem; otherwise why not.
std::string cudnn_attention_unsupported_reason(const TensorView& q, const AttentionParams& params);

Status cudnn_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const AttentionParams& params, const TensorView& o,
                               const TensorView& lse, void* stream = nullptr);

// Writes (overwrites) dq, dk, dv. D = rowsum(dO * O) is computed inside cuDNN from o and dout.
// deterministic: the same bits every run (cuDNN's dP-workspace algorithm, whose workspace is
// B * H * S_q * S_k * 2 bytes a call; by default dQ is summed over key tiles in no fixed order).
Status cudnn_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& o, const TensorView& dout,
                                const TensorView& lse, const AttentionParams& params,
                                const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                void* stream = nullptr, bool deterministic = false);


// Frees what this thread's cuDNN calls keep on the current device (compact copies of long
// calls) and trims the stream arenas their workspaces come from (gpu.hpp: trim_stream_arenas): a
// benchmark counts each configuration's own memory this way.
Status cudnn_release_workspace();

}  // namespace seqpar
