// The planner: every candidate (algorithm, Ulysses degree and ring dimension, head groups) of an
// attention problem on a cluster priced by the cost model, and the pick: the fastest predicted
// forward + backward among those that fit in device memory.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "planner/cost_model.hpp"

namespace seqpar::planner {

// A model's dense layers, for a training step's estimate (attention comes from the cost model).
struct ModelShape {
  int64_t layers = 0, hidden = 0, ffn = 0, vocab = 0;
};

struct PlanRow {
  Candidate candidate;
  Prediction prediction;
  double step_s = 0;  // with a model: layers x (attention fwd + bwd + GEMMs) + LM head
};

struct PlanTable {
  std::vector<PlanRow> rows;  // every candidate tried, refused ones included
  int pick = -1;              // index into rows; -1: nothing runs the problem
  std::string why;            // one line on the pick
};

struct PlannerOptions {
  CostOptions cost;
  std::vector<std::string> algorithms;  // empty: every registered algorithm
  int head_groups = 0;                  // 0: for each candidate, the fewest groups that fit
  int ulysses = 0;                      // ulysses-ring: only this degree, any the algorithm takes
                                        // (1 and P too); 0: each proper degree in a node
  std::string ring_algorithm;           // ulysses-ring: only this ring dimension (empty: the two
                                        // return rings)
  ModelShape model;                     // layers 0: attention alone
  std::optional<LayoutKind> layout;     // every candidate on this layout (else each its own);
                                        // Problem::layout, where set, wins
};

PlanTable plan_table(const Cluster& cluster, const Problem& problem, const PlannerOptions& options = {});

// Seconds of one training step's dense work (GEMMs of every layer and the LM head, forward and
// backward: 3 x 2 x parameters x tokens a rank) at the cluster's GEMM rate.
double dense_step_seconds(const Cluster& cluster, const Problem& problem, const ModelShape& model);

}  // namespace seqpar::planner
