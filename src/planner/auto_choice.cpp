// `--algo auto` by predicted time (auto_choice.hpp).
#include "planner/auto_choice.hpp"

#include <cstdio>
#include <cstdlib>

#include "planner/planner.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar::planner {

std::string auto_cluster_name(const PlanOptions& options, const Layout& layout, const AttentionBackend& backend) {
  if (!options.cluster.empty()) return options.cluster;
  if (const char* env = std::getenv("SEQPAR_CLUSTER"); env && *env) return env;
  // This machine's preset, on one node of 4 GPUs: there the planner's pick measured 0.99-1.29x
  // the fastest schedule, mean 1.075x, against 1.00-1.51x, mean 1.14x, for the old rule
  // (4 x H100, same call, 16K-256K, MHA and GQA 8:1; docs/PLANNER.md "Auto on 4 GPUs").
  // On 2 GPUs the old rule already picks well and nothing measured the planner's pick there.
  // Every rank must pick alike without talking, so nothing rank-local (free memory) decides:
  // the H100 preset serves H200s too; SEQPAR_CLUSTER=h200x4 gives an H200's memory.
  const int P = layout.ranks();
  if (!backend.caps().device || options.topology.ranks_per_node > 0 || P != 4) return {};
  if (cuda_device_count() < P) return {};
  return "h100x" + std::to_string(P);
}

std::optional<AutoChoice> choose_by_predicted_time(const PlanOptions& options, const Layout& layout,
                                                    const AttentionParams& params, const BlockBytes& bytes,
                                                    const AttentionBackend& backend) {
  const std::string name = auto_cluster_name(options, layout, backend);
  if (name.empty()) return std::nullopt;
  StatusOr<Cluster> cluster = load_cluster(name);
  if (!cluster.ok() || cluster->gpus() != layout.ranks()) return std::nullopt;
  Problem problem;
  problem.seq = layout.seq_len();
  problem.batch = bytes.batch, problem.heads = bytes.heads, problem.kv_heads = bytes.kv_heads;
  problem.head_dim = bytes.head_dim;
  problem.mask_spec = params.mask;
  problem.wire = bytes;
  problem.layout = layout;  // the real shards: the documents layout's follow the documents
  PlannerOptions o;
  o.layout = layout.kind();
  o.head_groups = options.head_groups;
  const PlanTable table = plan_table(cluster.value(), problem, o);
  if (table.pick < 0) return std::nullopt;
  const Candidate& c = table.rows[size_t(table.pick)].candidate;
  return AutoChoice{c.algorithm, c.ulysses, c.ring, c.head_groups,
                    "auto chose by predicted time on cluster " + cluster->name + ": " + table.why};
}

}  // namespace seqpar::planner
