// The single algorithm API: plan a distributed attention problem once (algorithm, schedule,
// backend), then run its forward and backward on each rank through the executor of the
// tensors' device. Every algorithm of algorithm.hpp runs through these calls.
//
// Local shapes on rank r (S_r = layout.local_len(r)), as in attention.hpp:
//   q, o, dout, dq: [B, S_r, H, D]   k, v, dk, dv: [B, S_r, H_kv, D]   lse: [B, H, S_r]
// CPU ranks compute in fp32 or fp64 (lse, o and the gradients in q's dtype).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "seqpar/algorithm.hpp"
#include "seqpar/attention.hpp"
#include "seqpar/backend.hpp"
#include "seqpar/comm.hpp"
#include "seqpar/layout.hpp"

namespace seqpar {

struct PlanOptions {
  PlanOptions(std::string algorithm_name = "auto", Topology nodes = {})
      : algorithm(std::move(algorithm_name)), topology(nodes) {}
  std::string algorithm;           // a name from algorithm.hpp, or auto
  // auto: a cluster description (preset name or JSON path, src/planner/cluster.hpp) to pick by
  // predicted time; empty: SEQPAR_CLUSTER, else this machine's preset on a GPU, else none (auto
  // then picks by the busiest rank's work and bytes).
  std::string cluster;
  Topology topology;               // nodes, for the double ring and the per-link byte counts
  int ulysses = 0;                 // ulysses-ring: the Ulysses degree (0: the largest that fits)
  std::string ring_algorithm = "ring";  // ulysses-ring: the ring-family schedule across groups
  // Algorithms that can keep forward blocks for the backward (Ulysses: its head-part Q and K/V;
  // Attention2D: the swapped K/V) do: the backward then moves less, and the executors need a
  // ForwardState between the passes.
  bool keep_forward_state = false;
  // The schedule runs once per head group. Device backends, 0: the fewest groups whose peak
  // block bytes (peak_block_bytes, every rank) fit under the budget below; else this many (it
  // must divide the K/V heads). Seven q shards kept the peak near 36% of PyTorch context
  // parallel's on two GPUs (docs/RESULTS.md); more groups cost speed. The floor keeps small
  // problems whole: at 8K tokens a GPU (H = 32, D = 128, 2 x H200) two groups cost 0.75-0.9 ms
  // of a 9.7-10.5 ms fwd+bwd for 0.35-0.5 GiB saved, while the whole peak is under 1 GiB
  // (ring-return's backward, the largest: 896 MiB, 14 bf16 q shards of 64 MiB). Host backends
  // run whole heads unless a count is given.
  int head_groups = 0;
  double workspace_limit_shards = 7.0;          // in units of this rank's q shard (input dtype),
  int64_t workspace_floor_bytes = 1LL << 30;    // but never split a smaller workspace,
  int64_t workspace_limit_bytes = 16LL << 30;   // and never keep a larger one
};

// The planner's options from an algorithm spec, "NAME[:KEY=VALUE,...]" (for bindings that pass
// one string): NAME from algorithm.hpp or auto; keys ulysses=N (ulysses-ring's degree) and
// ring=NAME (its ring dimension). Unknown names, keys or values are refused with the reason.
StatusOr<PlanOptions> plan_options_from_spec(const std::string& spec, Topology topology = {});

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
  int head_groups = 1;     // the schedule runs once per group of heads (device backends)
  std::string choice;      // with auto: what it chose and why
};

// Plans `rank`'s part of the problem. `bytes` describes the blocks (dims, dtypes); auto, with a
// cluster description (PlanOptions::cluster), takes the planner's pick by predicted time
// (src/planner/auto_choice.hpp: algorithm, grid and head groups); without one it picks
// among the supported algorithms the one whose busiest rank does the least work (compute_work), then
// sends the fewest bytes (forward + backward), counting twice the batches it waits for with no
// compute between post and wait (nothing hides them). A named algorithm that cannot run the problem
// is refused with its reason.
StatusOr<AttentionPlan> plan_attention(const PlanOptions& options, const Layout& layout,
                                       const AttentionParams& params, const BlockBytes& bytes, int rank,
                                       const AttentionBackend& backend);

// How blocks travel for tensors like q and k computed by `backend`: inputs in q's dtype; on a
// device backend fp32 accumulators and row stats, on a CPU one q's dtype; the query pack
// carries D where the backend takes it, else O.
BlockBytes block_bytes_for(const TensorView& q, const TensorView& k, const AttentionBackend& backend);

// Every rank's schedules of a request (for validation, printing and byte walks).
std::vector<RankSchedule> all_rank_schedules(const Algorithm& algorithm, const ScheduleRequest& request);

struct ShardTensors {
  TensorView q, k, v;     // inputs
  TensorView o, lse;      // forward outputs, backward inputs
  TensorView dout;        // backward input
  TensorView dq, dk, dv;  // backward outputs (overwritten)
};

// What a plan's forward keeps for its backward (the plan's schedule.kept, per head group on a
// GPU), from the forward's end to the backward's start. One per rank, plan and layer; the
// backward empties it. Plans that keep nothing need none.
class ForwardState {
 public:
  ForwardState();
  ~ForwardState();
  ForwardState(ForwardState&&) noexcept;
  ForwardState& operator=(ForwardState&&) noexcept;
  bool empty() const;
  struct Impl;  // the blocks, type-erased (each executor stores its own kind)
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

struct PassStats {
  int pairs_computed = 0;  // shard pairs this rank ran the backend on
  int rounds = 0;          // rounds of the schedule
};

// Runs the plan's forward (writes o, lse) or backward (writes dq, dk, dv) on host tensors, through
// the one executor (the GPU entry points, src/parallel/gpu_executor.hpp, run it over device memory).
// `state` carries what the forward keeps (required where plan.schedule.kept is not empty).
Status run_forward_cpu(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t,
                       PassStats* stats = nullptr, ForwardState* state = nullptr);
Status run_backward_cpu(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t,
                        PassStats* stats = nullptr, ForwardState* state = nullptr);

}  // namespace seqpar
