// DistFlashAttn's balanced causal schedule (report 002, section 2.3): floor(P/2) + 1 rounds
// instead of P. In round t >= 1 rank p computes its own queries against shard p - t's K/V
// (sent straight from p - t) when p >= t; otherwise it helps rank r = p - t + P by computing
// r's queries against its own K/V and returning the partial (O, LSE) the round after, which r
// merges. The printed Algorithm 2 skips the helpers' last round for every P (t != floor(P/2));
// only even P may skip it (t != P/2), else odd P loses pairs (test DistflashErratum). The
// backward runs over the same pairs: the owner returns dK/dV parts, a helper dQ parts.
// Inputs for round t travel in round t - 1 (prefetch). It computes only pairs whose key
// shard is not after the query shard, so it runs causal-like masks on the contiguous layout.
#include "parallel/algorithms/plan_events.hpp"
#include "seqpar/algorithm.hpp"

namespace seqpar::parallel::algorithms {
namespace {

std::string supports(const ScheduleRequest& req) {
  for (int a = 0; a < req.ranks; ++a)
    for (int b = a + 1; b < req.ranks; ++b)
      if (req.visible[a][b])
        return "distflash computes only pairs whose keys come before the queries (causal masks on the contiguous "
               "layout), but rank " + std::to_string(a) + "'s queries see rank " + std::to_string(b) +
               "'s keys: use ring or burst";
  return {};
}

// Who computes pair (q_shard, kv_shard) in round t, for every t; calls add(rank, round, q, kv).
template <class Add>
void balanced_pairs(int P, Add&& add) {
  for (int p = 0; p < P; ++p) add(p, 0, p, p);
  for (int t = 1; t <= P / 2; ++t)
    for (int p = 0; p < P; ++p) {
      if (p >= t) add(p, t, p, p - t);                     // own queries, keys of p - t
      else if (!(P % 2 == 0 && t == P / 2)) add(p, t, p - t + P, p);  // helper for p - t + P
    }
}

PlanEvents plan_pass(const ScheduleRequest& req, Pass pass) {
  PlanEvents plan;
  const bool forward = pass == Pass::kForward;
  balanced_pairs(req.ranks, [&](int rank, int t, int q, int kv) {
    if (!req.visible[q][kv]) return;
    plan.compute(rank, t, q, kv);
    if (q == kv) return;
    const bool helper = rank == kv;  // computes another rank's queries against its own keys
    if (helper) {  // the queries come from their owner; the result goes back to it
      plan.move(q, rank, t - 1, t - 1, {forward ? BlockKind::kQuery : BlockKind::kQueryPack, q});
      plan.move(rank, q, t + 1, t + 1, {forward ? BlockKind::kOutput : BlockKind::kDQ, q},
                forward ? Combine::kMerge : Combine::kAdd);
    } else {  // the keys come from their owner; the backward returns their gradients
      plan.move(kv, rank, t - 1, t - 1, {BlockKind::kKV, kv});
      if (!forward) plan.move(rank, kv, t + 1, t + 1, {BlockKind::kDKV, kv}, Combine::kAdd);
    }
  });
  return plan;
}

RankSchedule make(const ScheduleRequest& req, int rank) {
  return {project(plan_pass(req, Pass::kForward), rank), project(plan_pass(req, Pass::kBackward), rank)};
}

}  // namespace

extern const Algorithm distflash{"distflash",
                                 "DistFlashAttn: balanced causal pairs in floor(P/2)+1 rounds, idle ranks help",
                                 supports, make};

}  // namespace seqpar::parallel::algorithms
