// The GPU executor's byte formulas (include/seqpar/ring.hpp, burst.hpp): what the ring and
// Burst schedules of src/parallel/gpu_ring.cpp send, with GPU dtypes and the two-rank return.
// The CPU executor's bytes are walked from its schedules instead (schedule.hpp); these stay
// until the GPU executor runs schedules too.
#include <algorithm>

#include "parallel/ring_common.hpp"
#include "seqpar/block_plan.hpp"
#include "seqpar/burst.hpp"

namespace seqpar {

using parallel::wrap;

TrafficBytes ring_expected_bytes(const Layout& layout, int rank, int64_t batch, int64_t kv_heads,
                                 int64_t head_dim, DType kv_dtype, DType accumulator_dtype) {
  const int P = layout.ranks();
  const int64_t per_token = batch * kv_heads * head_dim;
  TrafficBytes bytes;
  for (int step = 0; step < P - 1; ++step) {
    const int64_t rows = layout.local_len(wrap(rank - step, P));
    bytes.forward += 2 * rows * per_token * dtype_size(kv_dtype);
  }
  bytes.backward = bytes.forward;
  if (P > 1)
    for (int shard = 0; shard < P; ++shard)
      bytes.backward += 2 * layout.local_len(shard) * per_token * dtype_size(accumulator_dtype);
  return bytes;
}

int64_t burst_backward_expected_bytes(const Layout& layout, int rank, int64_t batch,
                                      int64_t heads, int64_t head_dim, DType dtype,
                                      DType accumulator_dtype, BurstPack pack) {
  const int P = layout.ranks();
  int64_t bytes = 0;
  for (int step = 0; step < P - 1; ++step) {
    const int64_t rows = layout.local_len(wrap(rank - step, P));
    const int64_t tensor = batch * rows * heads * head_dim, row_stat = batch * heads * rows;
    bytes += pack == BurstPack::kDeltaLse
                 ? (2 * tensor + 2 * row_stat) * dtype_size(dtype)
                 : 3 * tensor * dtype_size(dtype) + row_stat * dtype_size(DType::kF32);
  }
  if (P > 1)
    for (int shard = 0; shard < P; ++shard)
      bytes += batch * layout.local_len(shard) * heads * head_dim * dtype_size(accumulator_dtype);
  return bytes;
}

const char* backward_schedule_name(BackwardSchedule schedule) {
  return schedule == BackwardSchedule::kRing ? "ring" : "burst";
}

TrafficBytes gpu_expected_bytes(const Layout& layout, int rank, BackwardSchedule schedule,
                                const AttentionParams& params, int64_t batch, int64_t heads,
                                int64_t kv_heads, int64_t head_dim, DType dtype, bool own_kernels) {
  TrafficBytes bytes = ring_expected_bytes(layout, rank, batch, kv_heads, head_dim, dtype, DType::kF32);
  const bool burst = schedule == BackwardSchedule::kBurst;
  if (layout.ranks() != 2) {
    if (burst)
      bytes.backward = burst_backward_expected_bytes(layout, rank, batch, heads, head_dim, dtype,
                                                     DType::kF32, BurstPack::kOutputLse);
    return bytes;
  }
  // Two ranks: the pack once, then what this rank computed for its peer, returned as the one
  // dense call left it (rows of that call, in dtype) or summed in fp32 over every peer row.
  const int peer = 1 - rank;
  const int64_t rows = layout.local_len(rank), peer_rows = layout.local_len(peer);
  const int64_t h = burst ? heads : kv_heads, tensors = burst ? 1 : 2;
  bytes.backward = burst ? batch * rows * (3 * heads * head_dim * dtype_size(dtype) + heads * 4)
                         : 2 * batch * rows * kv_heads * head_dim * dtype_size(dtype);
  const std::vector<int64_t> q_pos = layout.positions(burst ? peer : rank);
  const std::vector<int64_t> k_pos = layout.positions(burst ? rank : peer);
  if (!params.mask.sees_any(q_pos, k_pos)) return bytes;
  const BlockPlan plan = plan_block_pair(q_pos, k_pos, params.mask);
  if (!own_kernels && plan.dense && plan.calls.size() == 1) {
    const BlockCall& c = plan.calls[0];
    const int64_t call_rows = burst ? c.q_end - c.q_begin : c.k_end - c.k_begin;
    bytes.backward += tensors * batch * call_rows * h * head_dim * dtype_size(dtype);
  } else {
    bytes.backward += tensors * batch * peer_rows * h * head_dim * 4;
  }
  return bytes;
}

BackwardSchedule choose_gpu_backward(const Layout& layout, const AttentionParams& params, int64_t batch,
                                     int64_t heads, int64_t kv_heads, int64_t head_dim, DType dtype,
                                     bool own_kernels) {
  int64_t ring = 0, burst = 0;
  for (int r = 0; r < layout.ranks(); ++r) {
    ring = std::max(ring, gpu_expected_bytes(layout, r, BackwardSchedule::kRing, params, batch, heads,
                                             kv_heads, head_dim, dtype, own_kernels).backward);
    burst = std::max(burst, gpu_expected_bytes(layout, r, BackwardSchedule::kBurst, params, batch, heads,
                                               kv_heads, head_dim, dtype, own_kernels).backward);
  }
  return burst <= ring ? BackwardSchedule::kBurst : BackwardSchedule::kRing;
}

}  // namespace seqpar
