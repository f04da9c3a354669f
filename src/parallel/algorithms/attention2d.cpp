// Attention2D without overlap (report 003, Algorithms 1, 3 and 7; errata applied): on an
// s x s grid (attention2d_grid.hpp) each pass gathers, computes, then reduce-scatters.
// Forward: K/V swap (r,c) <-> (c,r) with Q's row all-gather, then K/V's column all-gather; the
// rank computes its row's query shards against its column's K/V shards, the shard sent first
// first; the partial (O, LSE) go home by the AttnFix ring along the row (Algorithm 7, its
// index range fixed), each step overlapping the next shard's computes. The ring moves
// (s-1)(N/P)(H+1) words a rank; max-all-reduce + sum-reduce-scatter would move (s-1)(N/P)(H+3),
// so the ring it is. Backward: the same gathers (the query pack: Q, dO, D, LSE: global row
// stats make every tile's gradient exact), dQ summed home along the row as it is computed, then
// dK/dV summed along the column and swapped back to their owner (Algorithm 3 reduce-scatters
// the gradients, not Q_g and K_g, V_g as printed). Words a rank sends a head (D: head dim,
// n = N/P): forward (s-1) n (4D+1) and backward (s-1) n (7D+2) (the report's (4H+2) and
// (8H+2) carry M and D for the LSE, and O for D), plus off the diagonal 2nD forward and 4nD
// backward: the backward swaps K/V again; with keep_forward_state the forward keeps the
// swapped K/V (the report's K_t, V_t) and the backward's swap is dK/dV's alone (2nD).
#include "parallel/algorithms/attention2d.hpp"

#include "seqpar/algorithm.hpp"

namespace seqpar::parallel {
namespace {

// Round 1: the column all-gather of the K/V each rank holds after the swap.
void column_gather(PlanEvents& plan, const ScheduleRequest& req, const Grid& g) {
  for (int l = 0; l < req.ranks; ++l) {
    const int r = g.row(l), c = g.col(l), x = g.transposed(l);
    for (int i = 0; i < g.s; ++i) {
      const int to = g.rank(i, c);
      if (i != r && grid_needs_kv(g, req, to, x))
        plan.move(l, to, 1, 1, {BlockKind::kKV, x}, Combine::kReplace, Collective::kColumnAllGather);
    }
  }
}

}  // namespace

PlanEvents attention2d_pass(const ScheduleRequest& req, Pass pass, const PrintedErrata& printed) {
  const Grid g = attention2d_grid(req.ranks);
  const int s = g.s;
  const bool forward = pass == Pass::kForward;
  PlanEvents plan;
  swap_and_row_gather(plan, req, g, forward ? BlockKind::kQuery : BlockKind::kQueryPack,
                      forward || !req.keep_forward_state);
  column_gather(plan, req, g);
  // Computes: column (c + k)'s query shard in round 1 + k, k = 1..s (the own one last).
  for (int l = 0; l < req.ranks; ++l)
    for (int k = 1; k <= s; ++k) {
      const int q = g.rank(g.row(l), attnfix_ring_column(s, g.col(l), k));
      for (int i = 0; i < s; ++i) {
        const int kv = g.rank(g.col(l), i);
        if (req.visible[q][kv]) plan.compute(l, 1 + k, q, kv);
      }
    }
  // Row ring of the partials: step k in round 2 + k, after that column's computes.
  std::vector<int> rounds;
  for (int k = 1; k < s; ++k) rounds.push_back(2 + k);
  const BlockKind row_result = forward ? BlockKind::kOutput : printed.alg3_reduces_inputs ? BlockKind::kQueryPack
                                                                                         : BlockKind::kDQ;
  for (int r = 0; r < s; ++r) {
    const GridRing ring = row_ring(g, r, row_result);
    ring_reduce_scatter(plan, ring.members, ring.blocks, row_partials(g, req, r), rounds,
                        forward ? Combine::kMerge : Combine::kAdd, Collective::kRowReduceScatter);
  }
  if (forward) return plan;
  // Column ring of dK/dV after every compute (rounds s + 2 ...), then the swap home.
  rounds.clear();
  for (int k = 1; k < s; ++k) rounds.push_back(s + 1 + k);
  const BlockKind column_result = printed.alg3_reduces_inputs ? BlockKind::kKV : BlockKind::kDKV;
  for (int c = 0; c < s; ++c) {
    const GridRing ring = column_ring(g, c, column_result);
    const auto held = ring_reduce_scatter(plan, ring.members, ring.blocks, column_partials(g, req, c), rounds,
                                          Combine::kAdd, Collective::kColumnReduceScatter);
    swap_gradients_home(plan, g, c, held, 2 * s + 1);
  }
  return plan;
}

namespace algorithms {
namespace {

RankSchedule make(const ScheduleRequest& req, int rank) {
  return {project(attention2d_pass(req, Pass::kForward, {}), rank),
          project(attention2d_pass(req, Pass::kBackward, {}), rank), 1,
          attention2d_kept(attention2d_grid(req.ranks), req, rank)};
}

}  // namespace

extern const Algorithm attention2d{
    "attention2d", "Attention2D on an s x s grid: gather rows and columns, compute, AttnFix ring home",
    [](const ScheduleRequest& req) { return attention2d_refusal(req.ranks); }, make};

}  // namespace algorithms
}  // namespace seqpar::parallel
