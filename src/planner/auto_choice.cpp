// `--algo auto` by predicted time (auto_choice.hpp).
#include "planner/auto_choice.hpp"

#include <cstdio>
#include <cstdlib>

#include "planner/planner.hpp"

namespace seqpar::planner {

std::string auto_cluster_name(const PlanOptions& options, const Layout& layout, const AttentionBackend& backend) {
  (void)layout, (void)backend;
  if (!options.cluster.empty()) return options.cluster;
  // Named only, for now: this machine's preset (h100x2, h100x4) is not taken by default until a
  // same-call GPU run shows the planner's pick within 3% of the fastest schedule (issue 35); the
  // presets' predictions miss window and document masks by up to 54% (docs/PLANNER.md).
  if (const char* env = std::getenv("SEQPAR_CLUSTER"); env && *env) return env;
  return {};
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
