// `seqpar plan`: the planner's table for a cluster (a preset or a JSON description), an
// attention shape or a model preset, a length and a mask: every algorithm and grid with its
// predicted forward and backward time, bytes per rank per link class, peak memory, whether it
// fits, and the pick; `--layout documents` prices every candidate on the documents layout the
// mask's documents make. `--json` prints one JSON object instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace seqpar::app {

struct PlanCliOptions {
  std::string cluster = "h100x4";  // preset name (h100x4, h200x2, generic:N) or JSON file
  std::string model;               // a model preset (its heads, K/V heads, head dim, layers)
  int64_t seq = 131072, batch = 1, heads = 32, kv_heads = 0, head_dim = 128;
  std::string mask = "causal";
  std::string layout;              // every candidate on this layout (empty: each its own)
  std::string backend = "auto";   // whose packs: auto (D, O where its backward runs cuDNN), cudnn (O), hopper (D)
  std::vector<std::string> algos;  // empty: all
  int head_groups = 0;
  int ulysses = 0;                 // ulysses-ring: only this degree (0: each proper one in a node)
  std::string ring_algo;           // ulysses-ring: only this ring dimension (empty: the return rings)
  int max_simulated_ranks = 64;
  bool json = false;
  std::string write_cluster;       // write the cluster description as JSON to this file
};

void add_plan_command(CLI::App& app, PlanCliOptions& options, int* exit_code);
int run_plan(const PlanCliOptions& options);

}  // namespace seqpar::app
