// Ring attention and BurstAttention on GPU ranks: the schedules of ring.hpp and burst.hpp,
// run by one executor over device memory.
//   - Transfers are double-buffered and overlap compute: with a stream-ordered communicator
//     (NCCL) every exchange runs on the communicator's stream after the compute that filled
//     its buffers, and the compute stream waits for it only where it reads the data; with a
//     host-driven one (local threads sharing or splitting GPUs) the host orders them.
//   - Sums round once: parts from cuDNN (bf16/fp16) are added in fp32. With more than two
//     ranks the running (O, LSE), dQ and the travelling dK/dV (ring) or dQ (Burst) are fp32
//     accumulators. With two, a result has at most two parts: the first is written into the
//     caller's output and the second summed (merged) into it in place, and what a rank
//     computes for its peer goes home once, as its call left it (gpu_expected_bytes counts
//     it). K/V are never gathered.
//   - Local steps: each (query shard, K/V shard) pair is planned once (block_plan.hpp) into
//     dense cuDNN calls whose partial (O, LSE) are merged, or, for masks cuDNN cannot take
//     (windows with a left bound, documents), run by our own kernels over position runs.
//   - Memory: heads are processed in groups so the workspace stays under a limit; every
//     buffer is allocated once per shape and reused (GpuRingContext).
//
// Local shapes on rank r (device memory, bf16 or fp16, S_r = layout.local_len(r)):
//   q, o, dout, dq: [B, S_r, H, D]   k, v, dk, dv: [B, S_r, H_kv, D]   lse: [B, H, S_r] fp32
// Outputs (o, lse; dq, dk, dv) must not share memory with the inputs: they are written while
// the inputs are still read, and the functions refuse overlapping views.
// Work is queued on `stream`; the functions return once it is queued and the communicator's
// synchronize(stream) (or a stream sync) waits for it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "seqpar/burst.hpp"
#include "seqpar/ring.hpp"
#include "seqpar/status.hpp"

namespace seqpar {

struct GpuRingOptions {
  // 0: the fewest head groups whose workspace fits under both limits below. Seven q shards
  // keep the peak extra memory near 36% of PyTorch context parallel's on two GPUs (measured,
  // docs/RESULTS.md); more groups cost speed.
  int head_groups = 0;
  double workspace_limit_shards = 7.0;         // in units of this rank's q shard (bf16 bytes),
  int64_t workspace_floor_bytes = 256LL << 20;  // but never split a smaller workspace,
  int64_t workspace_limit_bytes = 16LL << 30;   // and never keep a larger one
  bool use_cudnn = true;                      // false: our own kernels for every step
  // > 0: no cuDNN call spans more query or key rows than this (a shard pair's calls are tiled;
  // a diagnostic and a guard for very long shards). 0: one call per dense block.
  int64_t max_call_rows = 0;
  bool trace = false;  // record a CUDA event at each step's milestones (GpuRingContext::take_trace)
};

// Per-rank state reused across calls: device buffers (grown, never shrunk), the block plans
// of each shard pair, and a side stream that finishes a head group's results while the next
// group computes.
class GpuRingContext {
 public:
  explicit GpuRingContext(GpuRingOptions options = {});
  ~GpuRingContext();
  GpuRingContext(const GpuRingContext&) = delete;
  GpuRingContext& operator=(const GpuRingContext&) = delete;

  const GpuRingOptions& options() const { return options_; }

  // Head groups of the last call, and how many local calls went to cuDNN / our kernels.
  struct Counters {
    int head_groups = 1;
    int64_t cudnn_calls = 0, own_kernel_calls = 0;
  };
  Counters counters;

  // With options().trace: the milestones the calls since the last take_trace() passed on their
  // stream, as (label, ms after the first), once the stream has reached them all. Labels read
  // "fwd|bwd g<group> s<step> <what>": sent (the step's exchange queued), computed (its local
  // attention), arrived (the exchange waited for), added / out / hop (results moved on).
  StatusOr<std::vector<std::pair<std::string, double>>> take_trace();

  struct Impl;  // buffers, plans, streams (src/parallel/gpu_ring.cpp)
  Impl& impl() { return *impl_; }

 private:
  GpuRingOptions options_;
  std::unique_ptr<Impl> impl_;
};

// Whether the executor runs this problem on our own kernels rather than cuDNN (cuDNN not
// built, turned off in the options, refused, or a mask that needs positions).
bool gpu_ring_uses_own_kernels(const GpuRingOptions& options, DType dtype, int64_t head_dim,
                               const AttentionParams& params);

// The head-group count the executor uses for a backward `schedule` (the forward uses the
// backward auto picks) on P ranks of `rows` tokens each, with cuDNN or our own kernels
// (gpu_ring_uses_own_kernels): options.head_groups when set (it must divide kv_heads), else
// the fewest groups whose workspace fits the options' limits.
StatusOr<int> gpu_ring_head_groups(const GpuRingOptions& options, int P, int64_t batch, int64_t rows,
                                   int64_t heads, int64_t kv_heads, int64_t head_dim,
                                   BackwardSchedule schedule, bool own_kernels = false);

Status gpu_ring_attention_forward(Communicator& comm, const Layout& layout,
                                  const AttentionParams& params, const TensorView& q,
                                  const TensorView& k, const TensorView& v, const TensorView& o,
                                  const TensorView& lse, GpuRingContext& ctx, void* stream,
                                  RingStats* stats = nullptr);

// Writes dq, dk, dv (the inputs' dtype) with the ring or the Burst backward.
Status gpu_attention_backward(Communicator& comm, const Layout& layout,
                              const AttentionParams& params, BackwardSchedule schedule,
                              const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& o, const TensorView& lse, const TensorView& dout,
                              const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              GpuRingContext& ctx, void* stream, RingStats* stats = nullptr);

}  // namespace seqpar
