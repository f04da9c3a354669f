// The planner's enumeration and pick (planner.hpp).
#include "planner/planner.hpp"

#include <algorithm>
#include <cstdio>

#include "seqpar/algorithm.hpp"
#include "seqpar/distributed_attention.hpp"

namespace seqpar::planner {
namespace {

// The layouts the executors run each algorithm with in docs/results: DistFlashAttn balances a
// contiguous layout itself; the rest take zigzag (which balances causal work).
LayoutKind layout_for(const std::string& algorithm) {
  return algorithm == "distflash" ? LayoutKind::kContiguous : LayoutKind::kZigzag;
}

std::vector<Candidate> candidates(const Cluster& cluster, const Problem& problem, const PlannerOptions& o) {
  std::vector<Candidate> out;
  const int P = cluster.gpus();
  for (const Algorithm* a : all_algorithms()) {
    const std::string name = a->name;
    if (!o.algorithms.empty() && std::find(o.algorithms.begin(), o.algorithms.end(), name) == o.algorithms.end())
      continue;
    const LayoutKind layout = problem.layout ? problem.layout->kind() : o.layout.value_or(layout_for(name));
    if (name != "ulysses-ring") {
      out.push_back({name, 0, "ring", 1, layout});
      continue;
    }
    // Ulysses x ring: every proper degree (1 is the ring, P plain Ulysses) whose groups stay in
    // a node, with the two return rings (the fastest ring-family schedules measured) across; or
    // the grid asked for (a measured run's, which may be degenerate: the executors' default
    // degree is the largest the heads allow, P on one node, with `ring` across).
    std::vector<int> degrees;
    if (o.ulysses > 0)
      degrees = {o.ulysses};
    else
      for (int u = 2; u < P; ++u)
        if (P % u == 0 && problem.heads % u == 0 &&
            (cluster.nodes <= 1 || cluster.gpus_per_node % u == 0))
          degrees.push_back(u);
    const std::vector<std::string> rings =
        o.ring_algorithm.empty() ? std::vector<std::string>{"ring-return", "burst-return"}
                                 : std::vector<std::string>{o.ring_algorithm};
    for (int u : degrees)
      for (const std::string& ring : rings) out.push_back({name, u, ring, 1, layout});
  }
  return out;
}

}  // namespace

double dense_step_seconds(const Cluster& cluster, const Problem& problem, const ModelShape& m) {
  if (m.layers <= 0) return 0;
  const double kv_width = double(problem.kv_heads * problem.head_dim);
  const double per_layer = double(m.hidden) * (2.0 * double(m.hidden) + 2.0 * kv_width + 3.0 * double(m.ffn));
  const double params = double(m.layers) * per_layer + double(m.hidden) * double(m.vocab);
  const double tokens = double(problem.seq) * double(problem.batch) / cluster.gpus();
  return 6.0 * params * tokens / (cluster.gemm_tflops * 1e12);
}

PlanTable plan_table(const Cluster& cluster, const Problem& problem, const PlannerOptions& o) {
  PlanTable table;
  const double dense = dense_step_seconds(cluster, problem, o.model);
  for (Candidate c : candidates(cluster, problem, o)) {
    // Head groups: the count asked for, or the fewest (1, 2, 4, ... dividing the K/V heads)
    // whose peak fits: more groups only add launches and waits.
    std::vector<int> counts;
    if (o.head_groups > 0) counts = {o.head_groups};
    else
      for (int g = 1; g <= problem.kv_heads; g *= 2)
        if (problem.kv_heads % g == 0) counts.push_back(g);
    PlanRow row{c, {}, 0};
    for (int g : counts) {
      c.head_groups = g;
      Prediction p = predict(cluster, problem, c, o.cost);
      row = {c, p, 0};
      if (!p.refusal.empty() && g == counts.front()) {
        if (p.refusal.rfind("head groups", 0) == 0) continue;  // a larger count may split evenly
        break;
      }
      if (p.refusal.empty() && p.fits) break;
    }
    if (o.model.layers > 0 && row.prediction.refusal.empty())
      row.step_s = double(o.model.layers) * row.prediction.total_s() + dense;
    table.rows.push_back(row);
  }
  for (size_t i = 0; i < table.rows.size(); ++i) {
    const Prediction& p = table.rows[i].prediction;
    if (!p.refusal.empty() || !p.fits) continue;
    if (table.pick < 0 || p.total_s() < table.rows[size_t(table.pick)].prediction.total_s()) table.pick = int(i);
  }
  if (table.pick < 0) {
    table.why = "no candidate runs the problem within device memory";
  } else {
    const PlanRow& r = table.rows[size_t(table.pick)];
    char line[256];
    std::snprintf(line, sizeof line, "%s with %d head group%s: %.3f ms forward + backward predicted",
                  r.candidate.label().c_str(), r.candidate.head_groups, r.candidate.head_groups > 1 ? "s" : "",
                  r.prediction.total_s() * 1e3);
    table.why = line;
  }
  return table;
}

}  // namespace seqpar::planner
