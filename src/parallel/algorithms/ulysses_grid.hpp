// Ulysses and its hybrid with a ring (USP, LoongTrain): P = u x R ranks, Ulysses groups of u
// consecutive ranks (rank l = b u + a: member a of group b), so with nodes of a multiple of u
// ranks each group's all-to-alls stay inside a node. An all-to-all turns each group's
// sequence shards into head parts: member a then holds head part a (1/u of the heads; with
// GQA the K/V heads those queries read, copied where u exceeds the K/V heads) of the group's
// u shards, joined into one span block. Along the ring dimension the members a of every group
// run a ring-family schedule over those span blocks (as if each group were one rank of an
// R-rank ring); then another all-to-all sends each shard's results home, where its u head
// parts make the result. Forward: Q, K, V and (O, LSE) cross the all-to-alls; backward: the
// query pack (Q, dO, D, LSE) and K, V, then dQ, dK, dV; or, where the forward keeps its
// head-part Q and K/V spans (keep_forward_state, as DeepSpeed's autograd does), only dO and the
// row stats, then dQ, dK, dV: four all-to-alls of the sequence shard a pass.
#pragma once

#include <string>

#include "seqpar/algorithm.hpp"

namespace seqpar::parallel {

// Empty when u divides the ranks and the heads split into u parts, else why not.
std::string ulysses_refusal(const ScheduleRequest& req, int u);
// The degree `ulysses-ring` runs with: the request's, or the largest the heads allow that
// fits in a node (any, without nodes); 1 (the ring alone) when none does.
int ulysses_degree(const ScheduleRequest& req);
// The ring-family algorithm the request names for the ring dimension, or why it cannot be.
const Algorithm* ring_dimension_algorithm(const ScheduleRequest& req, std::string* why_not);
// The R-rank request the ring dimension runs (groups as ranks, visible where any pair is).
ScheduleRequest ring_dimension_request(const ScheduleRequest& req, int u);
// Rank l's steps for degree u with `ring` along the ring dimension.
RankSchedule ulysses_schedule(const ScheduleRequest& req, int rank, int u, const Algorithm& ring);
// Ulysses over all ranks with the heads in two halves (2P head parts, two per rank) whose
// all-to-alls overlap the other half's attention; empty when the heads split so, else why not.
std::string ulysses_overlap_refusal(const ScheduleRequest& req);
RankSchedule ulysses_overlap_schedule(const ScheduleRequest& req, int rank);

}  // namespace seqpar::parallel
