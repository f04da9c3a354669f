// The GPU entry points of the one executor (src/parallel/executor.cpp): any plan of
// distributed_attention.hpp on device tensors, its blocks in CUDA stream buffers, over any
// communicator (NCCL between GPUs, or thread ranks sharing one GPU through the local
// communicator), computing through the plan's GPU backend (backend.hpp: cuDNN or our own
// kernels).
//   - Head groups are an outer loop around the schedule: the plan's head_groups split the K/V
//     heads (and their query heads) so the blocks held at once fit the workspace budget.
//   - Blocks live in stream buffers (gpu.hpp), each taken when first named and given back in
//     stream order after its last use, so blocks that never live at once share memory with
//     each other and with the backend's part buffers and cuDNN's workspace. Inputs travel in
//     the tensors' dtype; results are fp32 or, where at most two parts reach them, held in it.
//   - Overlap: with a stream-ordered communicator (NCCL) a post queues its batch on the
//     communicator's stream after the compute already queued, and a wait makes the compute
//     stream wait for it, so transfers run under the computes between them; a host-driven
//     communicator drains the stream before it posts.
// Local shapes on rank r (device memory, bf16 or fp16; S_r = layout.local_len(r)):
//   q, o, dout, dq: [B, S_r, H, D]   k, v, dk, dv: [B, S_r, H_kv, D]   lse: [B, H, S_r] fp32
// Work is queued on `stream`; the calls return once it is queued, and the communicator's
// synchronize(stream) (or a stream sync) waits for it. Outputs are written last, after every
// read of the inputs was queued.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "seqpar/distributed_attention.hpp"

namespace seqpar {

// Per-rank state reused across calls: the last call's stream, and with tracing the milestones.
class GpuWorkspace {
 public:
  explicit GpuWorkspace(bool trace = false);
  ~GpuWorkspace();
  GpuWorkspace(const GpuWorkspace&) = delete;
  GpuWorkspace& operator=(const GpuWorkspace&) = delete;

  // With tracing: the milestones the calls since the last take_trace() passed on their stream,
  // as (label, ms after the first), once the stream reached them all. Labels read
  // "fwd|bwd g<group> <step> post|computed|arrived|regrouped" and "... g<group> out".
  StatusOr<std::vector<std::pair<std::string, double>>> take_trace();
  struct Impl;  // trace, stream order (src/parallel/gpu_workspace.hpp)
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// `state` carries what the forward keeps (required where plan.schedule.kept is not empty).
Status run_forward_gpu(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, GpuWorkspace& ws,
                       void* stream, PassStats* stats = nullptr, ForwardState* state = nullptr);
Status run_backward_gpu(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, GpuWorkspace& ws,
                        void* stream, PassStats* stats = nullptr, ForwardState* state = nullptr);

}  // namespace seqpar
