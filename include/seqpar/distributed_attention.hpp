// The single algorithm API: plan a distributed attention problem once (algorithm, schedule,
// backend), then run its forward and backward on each rank through the executor of the
// tensors' device. Every algorithm of algorithm.hpp runs through these calls.
//
// Local shapes on rank r (S_r = layout.local_len(r)), as in attention.hpp:
//   q, o, dout, dq: [B, S_r, H, D]   k, v, dk, dv: [B, S_r, H_kv, D]   lse: [B, H, S_r]
// CPU ranks compute in fp32 or fp64 (lse, o and the gradients in q's dtype).
#pragma once

#include <string>

#include "seqpar/algorithm.hpp"
#include "seqpar/attention.hpp"
#include "seqpar/backend.hpp"
#include "seqpar/comm.hpp"
#include "seqpar/layout.hpp"

namespace seqpar {

struct PlanOptions {
  std::string algorithm = "auto";  // a name from algorithm.hpp, or auto
  Topology topology;               // nodes, for the double ring and the per-link byte counts
};

// A finished plan: the executor runs it as it is and never plans again.
struct AttentionPlan {
  const Algorithm* algorithm = nullptr;
  Layout layout;
  AttentionParams params;  // mask in global positions; q/k_positions null (the layout has them)
  ScheduleRequest request;
  RankSchedule schedule;   // this rank's steps
  int rank = 0;
  const AttentionBackend* backend = nullptr;
  BlockBytes block_bytes;  // how this plan's blocks travel (counted by the communicator)
  std::string choice;      // with auto: what it chose and why
};

// Plans `rank`'s part of the problem. `bytes` describes the blocks (dims, dtypes); auto picks
// among the supported algorithms the one whose busiest rank computes the fewest pairs, then
// sends the fewest bytes (forward + backward). A named algorithm that cannot run the problem
// is refused with its reason.
StatusOr<AttentionPlan> plan_attention(const PlanOptions& options, const Layout& layout,
                                       const AttentionParams& params, const BlockBytes& bytes, int rank,
                                       const AttentionBackend& backend);

// Every rank's schedules of a request (for validation, printing and byte walks).
std::vector<RankSchedule> all_rank_schedules(const Algorithm& algorithm, const ScheduleRequest& request);

struct ShardTensors {
  TensorView q, k, v;     // inputs
  TensorView o, lse;      // forward outputs, backward inputs
  TensorView dout;        // backward input
  TensorView dq, dk, dv;  // backward outputs (overwritten)
};

struct PassStats {
  int pairs_computed = 0;  // shard pairs this rank ran the backend on
  int rounds = 0;          // rounds of the schedule
};

// Runs the plan's forward (writes o, lse) or backward (writes dq, dk, dv) on host tensors.
Status run_forward_cpu(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t,
                       PassStats* stats = nullptr);
Status run_backward_cpu(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t,
                        PassStats* stats = nullptr);

}  // namespace seqpar
