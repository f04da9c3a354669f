// Ring attention: K/V travel around the ring in both passes; in the backward the dK/dV sums
// follow their K/V one round behind and go home after the last rank that sees them. Blocks
// travel only as far as some rank needs them, in the direction that keeps fewer transfers.
#include "parallel/algorithms/travel.hpp"
#include "seqpar/algorithm.hpp"

namespace seqpar::parallel::algorithms {
namespace {

RankSchedule make(const ScheduleRequest& req, int rank) {
  const VisitOrder order = ring_order(req.ranks, cheaper_ring_direction(req, Travelling::kKeys));
  return {project(travel_forward(order, req), rank),
          project(travel_backward(order, req, Travelling::kKeys, ResultRoute::kFollow), rank)};
}

}  // namespace

extern const Algorithm ring{"ring", "K/V travel the ring; dK/dV follow them home (backward)",
                            [](const ScheduleRequest&) { return std::string(); }, make};

}  // namespace seqpar::parallel::algorithms
