// The ring with results returned once: K/V travel as in the ring, and each dK/dV a rank
// computes for another shard goes straight home the round after, instead of travelling on
// with its K/V. On two ranks this is the GPU executor's default: what a rank computes for its
// peer crosses once, not twice.
#include "parallel/algorithms/travel.hpp"
#include "seqpar/algorithm.hpp"

namespace seqpar::parallel::algorithms {
namespace {

RankSchedule make(const ScheduleRequest& req, int rank) {
  const VisitOrder order = ring_order(req.ranks, cheaper_ring_direction(req, Travelling::kKeys));
  return {project(travel_forward(order, req), rank),
          project(travel_backward(order, req, Travelling::kKeys, ResultRoute::kHome), rank)};
}

}  // namespace

extern const Algorithm ring_return{"ring-return", "K/V travel the ring; each dK/dV part goes straight home once",
                                   [](const ScheduleRequest&) { return std::string(); }, make};

}  // namespace seqpar::parallel::algorithms
