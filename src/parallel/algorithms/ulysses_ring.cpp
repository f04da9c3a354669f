// Ulysses x ring (USP / LoongTrain): Ulysses groups of u consecutive ranks (--ulysses, or the
// largest degree the heads allow inside a node), and along the other dimension any
// ring-family schedule (--ring-algo) over the groups' head-part spans. ulysses_grid.hpp.
#include "parallel/algorithms/ulysses_grid.hpp"

namespace seqpar::parallel::algorithms {
namespace {

std::string supports(const ScheduleRequest& req) {
  std::string why;
  const Algorithm* ring = ring_dimension_algorithm(req, &why);
  if (!ring) return why;
  const int u = ulysses_degree(req);
  why = ulysses_refusal(req, u);
  if (!why.empty()) return why;
  why = ring->supports(ring_dimension_request(req, u));
  return why.empty() ? why : "along the ring dimension: " + why;
}

RankSchedule make(const ScheduleRequest& req, int rank) {
  std::string why;
  return ulysses_schedule(req, rank, ulysses_degree(req), *ring_dimension_algorithm(req, &why));
}

}  // namespace

extern const Algorithm ulysses_ring{"ulysses-ring",
                                    "Ulysses groups (all-to-all to head parts) x a ring-family schedule across them",
                                    supports, make};

}  // namespace seqpar::parallel::algorithms
