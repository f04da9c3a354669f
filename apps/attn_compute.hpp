// `seqpar attn`'s computation on one rank: plans the job through a Session (session.hpp: the
// backend for the device, the plan) and runs forward + backward through the one executor on CPU
// ranks (host tensors) or GPU ranks (device tensors), timing each pass.
#pragma once

#include <optional>
#include <string>

#include "attn_inputs.hpp"
#include "seqpar/distributed_attention.hpp"

namespace seqpar::app {

// What one rank ran and computed: the plan, its shard of every output (host memory), the pass
// times and the forward's counts.
struct RankRun {
  std::optional<AttentionPlan> plan;  // set once planned
  std::string backend;  // the local-attention backend's name
  // With "auto": how many calls each backend ran, ("forward hopper", n), ... (calls_by_backend)
  std::vector<std::pair<std::string, int64_t>> backend_calls;
  HostTensor out, lse, dq, dk, dv;
  double times[2] = {0, 0};
  PassStats fwd_stats;
};

// CPU ranks (fp32/fp64): the plan for `algo` on the CPU kernels, then forward + backward.
Status run_cpu_rank(Communicator& comm, const Job& job, const Layout& layout, const AttentionParams& params,
                    const std::string& algo, const Inputs& in, RankRun* run);

// GPU ranks (bf16/fp16): uploads the inputs (releasing the host copies unless keep_inputs),
// plans `algo` on the GPU backend for the problem (Session's choice: "auto" on sm_90, else cuDNN
// where it takes it, else our kernels),
// runs forward + backward and copies the results home. `who` prefixes the progress lines.
Status run_gpu_rank(Communicator& comm, const Job& job, const Layout& layout, const AttentionParams& params,
                    const std::string& algo, Inputs& in, bool keep_inputs, const std::string& who, RankRun* run);

// How blocks travel between CPU ranks: every tensor in the compute dtype, the pack carries D.
BlockBytes cpu_block_bytes(const Job& job);
// The planner's options from the command line, for `algo` (the job's, or "single").
PlanOptions plan_options(const Job& job, const std::string& algo);

}  // namespace seqpar::app
