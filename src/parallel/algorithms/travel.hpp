// The ring family's common machinery: every rank visits every shard once, one per round, in
// the order a VisitOrder gives; a block reaches a rank by one delivery (from whom, starting in
// which round). The travelling plans keep only the deliveries some later holder needs (masks
// that skip transfers), and route results (dQ or dK/dV) either along the holders, one round
// behind (BurstAttention's corrected overlap), or straight home once.
#pragma once

#include <vector>

#include "parallel/algorithms/plan_events.hpp"

namespace seqpar::parallel {

struct VisitOrder {
  int ranks = 1;
  // held[x][r]: the shard rank x holds in round r (held[x][0] == x); every round is a permutation.
  std::vector<std::vector<int>> held;
  // For r >= 1: the rank that sends held[x][r] to x, and the round that transfer starts in
  // (it completes by the end of round r - 1).
  std::vector<std::vector<int>> from, posted;
};

// The flat ring: rank x holds shard x - r in round r, received from x - 1 in round r - 1.
// `direction` -1 reverses it (x holds x + r, from x + 1).
VisitOrder ring_order(int ranks, int direction = +1);

// BurstEngine's topology-aware double ring over nodes of L consecutive ranks (I = P / L
// nodes): an inner ring inside each node every round, and every L rounds the block that began
// the node cycle arrives over the outer ring from the same local rank of the previous node
// (sent at the cycle's start, so it has L rounds to travel).
VisitOrder double_ring_order(int ranks, int ranks_per_node);

// What circulates in the backward: K/V (dK/dV follow; the ring backward) or the query pack
// (dQ follows; BurstAttention's backward).
enum class Travelling { kKeys, kQueries };
// Where the results a rank computes for another shard go: along the holders, accumulating,
// then home (kFollow), or straight home, once per holder that computed (kHome).
enum class ResultRoute { kFollow, kHome };

// The forward: K/V travel, each rank merges every visible shard into its own (O, LSE).
PlanEvents travel_forward(const VisitOrder& order, const ScheduleRequest& request);
PlanEvents travel_backward(const VisitOrder& order, const ScheduleRequest& request,
                           Travelling travelling, ResultRoute route);

// The bytes a full-mask ring of this order moves per rank do not depend on the direction;
// with a mask, the direction whose deliveries reach fewer ranks moves fewer: the one whose
// forward keeps fewer deliveries.
int cheaper_ring_direction(const ScheduleRequest& request, Travelling travelling);

}  // namespace seqpar::parallel
