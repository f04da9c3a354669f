// BurstAttention: the ring forward; the backward keeps K, V, dK, dV at home and circulates the
// query pack (Q, dO, D or O, LSE), with dQ one round behind and a last hop home: the
// corrected schedule of report 000 (the printed Algorithm 4 sends dQ before adding to it).
#include "parallel/algorithms/travel.hpp"
#include "seqpar/algorithm.hpp"

namespace seqpar::parallel::algorithms {
namespace {

RankSchedule make(const ScheduleRequest& req, int rank) {
  const VisitOrder fwd = ring_order(req.ranks, cheaper_ring_direction(req, Travelling::kKeys));
  const VisitOrder bwd = ring_order(req.ranks, cheaper_ring_direction(req, Travelling::kQueries));
  return {project(travel_forward(fwd, req), rank),
          project(travel_backward(bwd, req, Travelling::kQueries, ResultRoute::kFollow), rank)};
}

}  // namespace

extern const Algorithm burst{"burst", "ring forward; the query pack travels, dQ follows it home (backward)",
                             [](const ScheduleRequest&) { return std::string(); }, make};

}  // namespace seqpar::parallel::algorithms
