// `--algo auto` by predicted time: when a cluster description is named (PlanOptions::cluster,
// else the SEQPAR_CLUSTER environment variable: a preset such as h100x4, or a JSON file; every
// rank must name the same one; on 4 local GPUs of one node, the h100x4 preset), plan_attention
// takes the planner's pick (algorithm, Ulysses degree and ring dimension, head groups) on the
// plan's own layout. Without one, auto keeps its work-and-bytes rule.
#pragma once

#include <optional>
#include <string>

#include "seqpar/distributed_attention.hpp"

namespace seqpar::planner {

struct AutoChoice {
  std::string algorithm;
  int ulysses = 0;
  std::string ring = "ring";
  int head_groups = 1;
  std::string why;  // for AttentionPlan::choice
};

// The cluster description auto would use for this plan, by name or path ("" when none).
std::string auto_cluster_name(const PlanOptions& options, const Layout& layout, const AttentionBackend& backend);

// The planner's pick for this problem, or nothing when no description is at hand or no
// candidate runs it (auto then falls back to its old rule).
std::optional<AutoChoice> choose_by_predicted_time(const PlanOptions& options, const Layout& layout,
                                                    const AttentionParams& params, const BlockBytes& bytes,
                                                    const AttentionBackend& backend);

}  // namespace seqpar::planner
