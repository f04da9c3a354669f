// LASP on GPUs: the two algorithms of seqpar/lasp.hpp (the state chain, LASP-1; the all-gather
// of state contributions, LASP-2 style) over device tensors, with our CUDA linear-attention
// kernels (seqpar/linear_cuda.hpp) and a communicator that moves device buffers (NCCL, one GPU
// per rank; the local communicator for thread ranks sharing a GPU).
//
// Each rank first computes its own state (dState in the backward) from a zero start, the
// cheaper half of its pass, so that the chain's hops wait on that alone; the entering state,
// once combined (linear_state_combine_cuda), goes into the rank's full pass as the kernels'
// state_in (dstate_out), which applies it on tensor cores. Messages are fp32 states
// [B, H, d_k, d_v], whatever the rows' dtype, so the bytes are lasp_expected_bytes' with 4-byte
// elements.
//
// Shapes: q, o, dout, dq [B, S_local, H, d_k | d_v] and k, dk [B, S_local, H_kv, d_k], v, dv
// [B, S_local, H_kv, d_v], bf16 or fp16 on this rank's device, as linear_cuda.hpp takes them;
// the layout contiguous over comm.size() ranks; the sequence starts from a zero state. Every
// call is ordered on `stream` and returns with its work queued there (host-driven communicators
// synchronise it where they must).
#pragma once

#include "seqpar/comm.hpp"
#include "seqpar/gpu.hpp"
#include "seqpar/lasp.hpp"
#include "seqpar/linear_cuda.hpp"

namespace seqpar {

// What the forward keeps for the backward, and the device buffers both reuse.
struct GpuLaspContext {
  LaspAlgorithm algorithm = LaspAlgorithm::kChain;  // what ran (never kAuto)
  int64_t batch = 0, heads = 0, dk = 0, dv = 0;
  int ranks = 0, device = 0;  // the communicator's size and the GPU the buffers are on
  DeviceBuffer state_in;   // fp32 [B, H, d_k, d_v]: the state entering this rank's tokens
  DeviceBuffer state_out;  // leaving them (the last rank's is the sequence's final state)
  DeviceBuffer scratch;    // local states and dStates, gathered contributions
  DeviceBuffer kernel_workspace;
  TensorView state_in_view() const;
  TensorView state_out_view() const;
};

// Checks the inputs and sizes every buffer of ctx for this problem on `ranks` ranks. The
// forward does it too; a caller that must know whether the problem fits before any rank
// communicates (a benchmark at the edge of memory) calls it first on every rank.
Status lasp_reserve_gpu(GpuLaspContext* ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                        const LinearAttentionParams& params, int ranks);

// Forward on this rank: writes o and fills *ctx.
Status lasp_forward_gpu(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                        LaspAlgorithm algorithm, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& o, GpuLaspContext* ctx, void* stream);

// Backward on this rank (ctx's algorithm): writes dq, dk, dv; no gradient arrives for the final
// state.
Status lasp_backward_gpu(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                         GpuLaspContext* ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                         void* stream);

}  // namespace seqpar
