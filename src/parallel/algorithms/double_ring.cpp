// BurstEngine's topology-aware double ring (report 001, section 2.3): an inner ring inside each
// node every round, an outer ring between nodes every L rounds whose transfer has the L rounds
// of the node cycle to hide behind; forward K/V, backward Burst's query pack with dQ one round
// behind its pack (so gradient sends overlap too) and home at the end. One node, or one rank a
// node, is the flat ring.
#include "parallel/algorithms/travel.hpp"
#include "seqpar/algorithm.hpp"

namespace seqpar::parallel::algorithms {
namespace {

int ranks_per_node(const ScheduleRequest& req) {
  return req.topology.ranks_per_node > 0 ? req.topology.ranks_per_node : req.ranks;
}

std::string supports(const ScheduleRequest& req) {
  const int L = ranks_per_node(req);
  if (req.ranks % L != 0)
    return "the double ring needs whole nodes: " + std::to_string(req.ranks) + " ranks do not split into nodes of " +
           std::to_string(L);
  return {};
}

RankSchedule make(const ScheduleRequest& req, int rank) {
  const VisitOrder order = double_ring_order(req.ranks, ranks_per_node(req));
  return {project(travel_forward(order, req), rank),
          project(travel_backward(order, req, Travelling::kQueries, ResultRoute::kFollow), rank)};
}

}  // namespace

extern const Algorithm double_ring{"double-ring",
                                   "inner ring per node, outer ring between nodes; Burst's backward on both",
                                   supports, make};

}  // namespace seqpar::parallel::algorithms
