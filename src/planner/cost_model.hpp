// The planner's cost model: one candidate (algorithm, grid, head groups) of one attention
// problem on one cluster, priced by simulating every rank's schedule (simulator.hpp): time per
// pass, bytes per rank per link class (walked from the same schedules: walk_bytes), and peak
// memory per rank (peak_block_bytes plus the rank's own tensors).
//
// Scale: schedules are built for all ranks at once, so up to max_simulated_ranks ranks are
// simulated whole. Beyond that a candidate is simulated at the two largest rank counts that fit
// the cap and its structure (whole nodes of the same size; a square grid for Attention2D) with
// the real problem's tokens per rank, and every figure is extrapolated linearly in the ring
// length: P for the ring family, Ulysses x ring and DistFlashAttn, sqrt(P) for Attention2D's
// bytes and memory (its time, dominated by its P-proportional compute, linearly in P).
// Long sequences are simulated on a proxy layout of fewer rows per shard (a power-of-two
// factor k, at least 512 rows a chunk): bytes scale exactly (the batch is multiplied by k),
// visible pairs by k^2, windows and document offsets are divided by k. The documents layout has
// no proxy (its shards follow the documents, which a division by k would merge and move): it is
// priced on the real length, on the layout the problem gives, else the one its mask's documents
// make (Layout::create with the mask's offsets: the same function the executors call).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "planner/cluster.hpp"
#include "seqpar/layout.hpp"
#include "seqpar/mask.hpp"

namespace seqpar::planner {

struct Problem {
  int64_t seq = 0, batch = 1, heads = 32, kv_heads = 32, head_dim = 128;
  std::string mask = "causal";  // parse_mask's syntax (mask_spec, where set, wins)
  std::optional<MaskSpec> mask_spec;
  // How blocks travel (dtypes, what the query pack carries, rounded results): the cuDNN
  // backend's on a GPU (block_bytes_for with bf16 inputs); its dims and groups are ignored.
  BlockBytes wire{1, 1, 1, 1, DType::kBF16, DType::kF32, DType::kF32, false, true};
  // The layout the schedules will run on (`--algo auto` passes its plan's). Set, every candidate
  // is priced on its kind, whatever its own; a documents layout as is (its positions decide which
  // shard pairs see each other, so which K/V transfers a ring skips and each step's work), the
  // token-balanced kinds on their proxy (the same split of fewer rows).
  std::optional<Layout> layout;
};

struct Candidate {
  std::string algorithm;         // a registry name (algorithm.hpp)
  int ulysses = 0;               // ulysses-ring: the Ulysses degree
  std::string ring = "ring";     // ulysses-ring: the ring dimension's algorithm
  int head_groups = 1;
  LayoutKind layout = LayoutKind::kZigzag;
  std::string label() const;     // "ulysses-ring(u=4,burst-return)"
};

struct Prediction {
  std::string refusal;           // non-empty: the candidate cannot run the problem
  double fwd_s = 0, bwd_s = 0;
  int64_t fwd_bytes = 0, bwd_bytes = 0;      // the busiest rank's, per pass
  int64_t link_bytes[kNumLinkClasses] = {};  // the busiest rank's per link class, both passes
  int64_t peak_block_bytes = 0;  // blocks held beyond the rank's tensors (peak_block_bytes, and
                                 // with head groups a group's own inputs copied out of them)
  int64_t workspace_bytes = 0;   // the backend's workspace (Cluster::workspace_bytes_per_element and
                                 // call_workspace_bytes_per_query_element)
  int64_t tensor_bytes = 0;      // the rank's own q, k, v, o, lse, dO, dq, dk, dv
  bool fits = true;
  int simulated_ranks = 0;       // ranks simulated (less than the cluster's: extrapolated)
  double total_s() const { return fwd_s + bwd_s; }
  int64_t extra_bytes() const { return peak_block_bytes + workspace_bytes; }  // beyond the tensors
};

struct CostOptions {
  int max_simulated_ranks = 64;
};

Prediction predict(const Cluster& cluster, const Problem& problem, const Candidate& candidate,
                   const CostOptions& options = {});

// The same on `ranks` ranks of the cluster's node size, never extrapolated (the fold's parts).
Prediction predict_on(const Cluster& cluster, int ranks, const Problem& problem, const Candidate& candidate);

}  // namespace seqpar::planner
