// BurstAttention with results returned once: the query pack travels as in Burst's backward,
// and each dQ part a rank computes for another shard goes straight home the round after.
#include "parallel/algorithms/travel.hpp"
#include "seqpar/algorithm.hpp"

namespace seqpar::parallel::algorithms {
namespace {

RankSchedule make(const ScheduleRequest& req, int rank) {
  const VisitOrder fwd = ring_order(req.ranks, cheaper_ring_direction(req, Travelling::kKeys));
  const VisitOrder bwd = ring_order(req.ranks, cheaper_ring_direction(req, Travelling::kQueries));
  return {project(travel_forward(fwd, req), rank),
          project(travel_backward(bwd, req, Travelling::kQueries, ResultRoute::kHome), rank)};
}

}  // namespace

extern const Algorithm burst_return{"burst-return", "ring forward; the query pack travels, each dQ part goes home once",
                                    [](const ScheduleRequest&) { return std::string(); }, make};

}  // namespace seqpar::parallel::algorithms
