// Attention2D with overlap (report 003, Algorithms 4-6 forward, 8-11 backward; errata applied):
// the gathers and reduce-scatters become rings of point-to-point steps, each under a compute.
// Forward: after the K/V swap the rank's own Q block starts along the row (Algorithm 4 line 4);
// K/V blocks circulate up the column, one a round, while the own queries meet each
// (GthrCmpt); then the row's other query blocks arrive one a round (double buffered), each
// meets every K/V block, and its partial (O, LSE) is merged and passed left (GthrCmptSctr)
// until, s - 1 rounds later, each partial reaches its owner. Backward: the query pack instead
// of Q, dQ summed along the row like the partials; in the last query block (CmptSctrBwd) the
// dK/dV of each K/V block go up the column as soon as that block's gradient is complete, the
// rank's own block (dK_1, dV_1, accumulated over all earlier query blocks) is added to what
// arrives (Algorithm 11 line 18 forgets it), and dK/dV are swapped back to their owner
// (Algorithm 8 forgets that). Same bytes as attention2d, in more, overlapped rounds.
#include "parallel/algorithms/attention2d.hpp"
#include "seqpar/algorithm.hpp"

namespace seqpar::parallel {
namespace {

// A block relayed along a ring from `origin`: hop d (1 <= d < size) goes from member
// origin - d + 1 to origin - d in round rounds(d) (posted and waited there, or from post to
// wait). Hops stop after the last member that needs the block.
template <class Needs, class Rounds>
void relay(PlanEvents& plan, const std::vector<int>& members, int origin, const Block& block, Collective collective,
           Needs&& needs, Rounds&& rounds) {
  const int n = int(members.size());
  int last = 0;
  for (int d = 1; d < n; ++d)
    if (needs(members[(origin - d + n) % n])) last = d;
  for (int d = 1; d <= last; ++d) {
    const auto [post, wait] = rounds(d);
    plan.move(members[(origin - d + 1 + n) % n], members[(origin - d + n) % n], post, wait, block, Combine::kReplace,
              collective);
  }
}

}  // namespace

PlanEvents attention2d_overlap_pass(const ScheduleRequest& req, Pass pass, const PrintedErrata& printed) {
  const Grid g = attention2d_grid(req.ranks);
  const int s = g.s;
  const bool forward = pass == Pass::kForward;
  const BlockKind query = forward ? BlockKind::kQuery : BlockKind::kQueryPack;
  PlanEvents plan;
  // The swap (round 0; a backward whose forward kept the swapped K/V skips it).
  for (int l = 0; l < req.ranks && (forward || !req.keep_forward_state); ++l)
    if (swapped(g, req, l)) plan.move(l, g.transposed(l), 0, 0, {BlockKind::kKV, l}, Combine::kReplace, Collective::kSwap);
  // Query blocks left along each row: the first hop from round 0 to round s (under the K/V
  // ring), hop d >= 2 in round s + d - 1, while the block is in use there.
  for (int l = 0; l < req.ranks; ++l) {
    std::vector<int> row;
    for (int m = 0; m < s; ++m) row.push_back(g.rank(g.row(l), m));
    relay(plan, row, g.col(l), {query, l}, Collective::kRowAllGather,
          [&](int at) { return grid_needs_query(g, req, at, l); },
          [&](int d) { return d == 1 ? std::pair{0, s} : std::pair{s + d - 1, s + d - 1}; });
  }
  // K/V blocks up each column from their holder after the swap: hop d in round d; rank (r,c)
  // holds K_i, the block of row (r + i - 1), in round i.
  for (int l = 0; l < req.ranks; ++l) {
    std::vector<int> column;
    for (int m = 0; m < s; ++m) column.push_back(g.rank(m, g.col(l)));
    const int x = g.transposed(l);
    relay(plan, column, g.row(l), {BlockKind::kKV, x}, Collective::kColumnAllGather,
          [&](int at) { return grid_needs_kv(g, req, at, x); }, [](int d) { return std::pair{d, d}; });
  }
  // The final query block's rounds of the backward: K_2 .. K_s, then K_1 (one later when the
  // printed line 18 replaces dK_1 by what arrives).
  const int first_final = 2 * s - 1;
  const int own_kv_round = forward ? 0 : printed.alg11_drops_own_dkv ? 3 * s - 1 : 3 * s - 2;
  const int final_sends = own_kv_round + 1;
  for (int l = 0; l < req.ranks; ++l) {
    const int r = g.row(l), c = g.col(l);
    const auto kv_i = [&](int i) { return g.rank(c, (r + i - 1) % s); };  // K_i
    for (int i = 1; i <= s; ++i)  // GthrCmpt: the own queries against K_i in round i
      if (req.visible[l][kv_i(i)]) plan.compute(l, i, l, kv_i(i));
    for (int i = 1; i < s; ++i) {  // GthrCmptSctr: the block of column c + i
      const int q = g.rank(r, attnfix_ring_column(s, c, i));
      const bool final_block = !forward && i == s - 1;
      for (int j = 1; j <= s; ++j) {
        if (!req.visible[q][kv_i(j)]) continue;
        const int round = !final_block ? s + i : j == 1 ? own_kv_round : first_final + j - 2;
        plan.compute(l, round, q, kv_i(j));
      }
    }
  }
  // Partials (O, LSE) or dQ left along each row: step k in the round after column c + k's
  // computes (the final block's, in the backward, after its last).
  std::vector<int> rounds;
  for (int k = 1; k < s; ++k) rounds.push_back(!forward && k == s - 1 ? final_sends : s + k + 1);
  for (int r = 0; r < s; ++r) {
    const GridRing ring = row_ring(g, r, forward ? BlockKind::kOutput : BlockKind::kDQ);
    ring_reduce_scatter(plan, ring.members, ring.blocks, row_partials(g, req, r), rounds,
                        forward ? Combine::kMerge : Combine::kAdd, Collective::kRowReduceScatter);
  }
  if (forward) return plan;
  // dK/dV up each column during the final query block: K_{k+1}'s after its compute, step k in
  // round first_final + k; the last (each rank's own K_1) is added to (printed: replaces) the
  // rank's accumulated dK_1, dV_1; then swapped back to their owner.
  rounds.clear();
  for (int k = 1; k < s; ++k) rounds.push_back(first_final + k);
  for (int c = 0; c < s; ++c) {
    const GridRing ring = column_ring(g, c, BlockKind::kDKV);
    const size_t before = plan.moves.size();
    const auto held = ring_reduce_scatter(plan, ring.members, ring.blocks, column_partials(g, req, c), rounds,
                                          Combine::kAdd, Collective::kColumnReduceScatter);
    if (printed.alg11_drops_own_dkv)
      for (size_t i = before; i < plan.moves.size(); ++i)
        if (plan.moves[i].post == rounds.back()) plan.moves[i].combine = Combine::kReplace;
    if (!printed.alg8_no_swap_back) swap_gradients_home(plan, g, c, held, final_sends);
  }
  return plan;
}

namespace algorithms {
namespace {

RankSchedule make(const ScheduleRequest& req, int rank) {
  return {project(attention2d_overlap_pass(req, Pass::kForward, {}), rank),
          project(attention2d_overlap_pass(req, Pass::kBackward, {}), rank), 1,
          attention2d_kept(attention2d_grid(req.ranks), req, rank)};
}

}  // namespace

extern const Algorithm attention2d_overlap{
    "attention2d-overlap", "Attention2D with its gathers and reduce-scatters as rings under the computes",
    [](const ScheduleRequest& req) { return attention2d_refusal(req.ranks); }, make};

}  // namespace algorithms
}  // namespace seqpar::parallel
