// Our CUDA kernels for causal linear attention with per-head decay (the math, the state and
// gradient conventions of seqpar/linear_attention.hpp): bf16/fp16 inputs, fp32 states and
// accumulation, tensor cores through mma.sync m16n8k16 (any sm_80+ GPU).
//
// Algorithm (chunks of 64 tokens, grouped into spans of several chunks):
//   1. per span, in parallel: the span's own state from a zero start (chunk by chunk);
//   2. a scan over spans per (batch, head): the state entering every span, and state_out;
//   3. per span, in parallel: the outputs, sweeping its chunks from the scanned state: the
//      intra-chunk masked, decay-weighted products plus the inter-chunk state product.
// The backward runs the same three steps for the state (forward in time) and for dState
// (backward in time), then one sweep each for dq, dv and dk.
//
// Shapes (device memory, BSHD with contiguous last dim, rows 16-byte aligned):
//   q, o, dout, dq: [B, S, H, d_k | d_v] bf16|fp16    k, dk: [B, S, H_kv, d_k] same dtype
//   v, dv: [B, S, H_kv, d_v] same dtype               d_k, d_v in {64, 128}, H <= 256
//   state_in, state_out, dstate_in, dstate_out: [B, H, d_k, d_v] fp32, contiguous
// params.chunk is not read (the chunk is 64); decay and scale are as on the CPU.
// Every call is asynchronous on `stream` (nullptr: the default stream).
#pragma once

#include <cstdint>

#include "seqpar/gpu.hpp"
#include "seqpar/linear_attention.hpp"
#include "seqpar/status.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar {

struct LinearCudaOptions {
  // Chunks (of 64 tokens) per span; 0 picks a length that fills the GPU while keeping the
  // span states (B * H * spans * d_k * d_v fp32) small. Tests set it to exercise many spans.
  int64_t chunks_per_span = 0;
  // Grown as needed and kept for the next call; nullptr allocates one for the call (whose
  // cudaFree then waits for the device).
  DeviceBuffer* workspace = nullptr;
  void* stream = nullptr;
  // Copy the next chunk's tiles while computing this one (two shared-memory stages; for
  // d = 128 outputs that leaves one CTA per SM instead of two). Off until measured faster.
  bool pipelined = false;
};

// Writes o and state_out (either empty: not written). An empty state_in is a zero state. With
// o empty the output sweep is skipped (state_out alone: the span states and their scan).
Status linear_attention_forward_cuda(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& state_in, const LinearAttentionParams& params,
                                     const TensorView& o, const TensorView& state_out,
                                     const LinearCudaOptions& options = {});

// Writes dq, dk, dv (q's dtype) and dstate_in (empty: not written). An empty state_in or
// dstate_out is zero. Under GQA, dk and dv are summed over each group in fp32 first. With dq,
// dk and dv all empty, only dstate_in is computed (one sweep and a scan; state_in and v unread):
// the dState a sequence parallel rank passes on before a later rank's dState is known.
Status linear_attention_backward_cuda(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& state_in, const TensorView& dout,
                                      const TensorView& dstate_out,
                                      const LinearAttentionParams& params, const TensorView& dq,
                                      const TensorView& dk, const TensorView& dv,
                                      const TensorView& dstate_in,
                                      const LinearCudaOptions& options = {});

// LASP's carried-state combine, asynchronous on `stream` (states fp32 contiguous):
//   out = lambda_h^length carried + local (out may alias either)
Status linear_state_combine_cuda(const TensorView& carried, const TensorView& local, int64_t length,
                                 const LinearAttentionParams& params, const TensorView& out, void* stream);

}  // namespace seqpar
