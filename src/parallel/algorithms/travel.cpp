// The ring family's visit orders and travelling plans (travel.hpp).
#include "parallel/algorithms/travel.hpp"

namespace seqpar::parallel {
namespace {

int wrap(int r, int p) { return ((r % p) + p) % p; }

VisitOrder sized(int ranks) {
  VisitOrder o;
  o.ranks = ranks;
  o.held.assign(ranks, std::vector<int>(ranks, 0));
  o.from = o.posted = o.held;
  return o;
}

// need[x][b]: rank x computes with shard b's travelling block.
std::vector<std::vector<bool>> needs(const ScheduleRequest& req, Travelling travelling) {
  std::vector<std::vector<bool>> need(req.ranks, std::vector<bool>(req.ranks));
  for (int x = 0; x < req.ranks; ++x)
    for (int b = 0; b < req.ranks; ++b)
      need[x][b] = travelling == Travelling::kKeys ? req.visible[x][b] : req.visible[b][x];
  return need;
}

// keep[x][r]: the delivery of held[x][r] to x is needed, by x or by a rank it passes it on to.
std::vector<std::vector<bool>> kept_deliveries(const VisitOrder& o, const std::vector<std::vector<bool>>& need) {
  const int P = o.ranks;
  std::vector<std::vector<int>> round_of(P, std::vector<int>(P));
  for (int x = 0; x < P; ++x)
    for (int r = 0; r < P; ++r) round_of[x][o.held[x][r]] = r;
  std::vector<std::vector<bool>> keep(P, std::vector<bool>(P, false));
  for (int x = 0; x < P; ++x)
    for (int r = 1; r < P; ++r) keep[x][r] = need[x][o.held[x][r]];
  // A sender receives what it sends before it sends it, so walking the rounds down reaches
  // every delivery after all the ones it feeds.
  for (int r = P - 1; r >= 1; --r)
    for (int x = 0; x < P; ++x)
      if (keep[x][r]) {
        const int sender = o.from[x][r], sender_round = round_of[sender][o.held[x][r]];
        if (sender_round >= 1) keep[sender][sender_round] = true;
      }
  return keep;
}

void add_deliveries(const VisitOrder& o, const std::vector<std::vector<bool>>& keep, BlockKind kind,
                    PlanEvents* plan) {
  for (int r = 1; r < o.ranks; ++r)
    for (int x = 0; x < o.ranks; ++x)
      if (keep[x][r]) plan->move(o.from[x][r], x, o.posted[x][r], r - 1, {kind, o.held[x][r]});
}

}  // namespace

VisitOrder ring_order(int ranks, int direction) {
  VisitOrder o = sized(ranks);
  for (int x = 0; x < ranks; ++x)
    for (int r = 0; r < ranks; ++r) {
      o.held[x][r] = wrap(x - direction * r, ranks);
      o.from[x][r] = wrap(x - direction, ranks);
      o.posted[x][r] = r - 1;
    }
  return o;
}

VisitOrder double_ring_order(int ranks, int ranks_per_node) {
  const int L = ranks_per_node, I = ranks / L;
  VisitOrder o = sized(ranks);
  for (int x = 0; x < ranks; ++x) {
    const int n = x / L, l = x % L;
    for (int r = 0; r < ranks; ++r) {
      o.held[x][r] = wrap(n - r / L, I) * L + wrap(l - r, L);
      if (r % L != 0) {  // inner ring: from the previous local rank, sent last round
        o.from[x][r] = n * L + wrap(l - 1, L);
        o.posted[x][r] = r - 1;
      } else {  // outer ring: from the same local rank of the previous node, sent L rounds ago
        o.from[x][r] = wrap(n - 1, I) * L + l;
        o.posted[x][r] = r - L;
      }
    }
  }
  return o;
}

PlanEvents travel_forward(const VisitOrder& order, const ScheduleRequest& request) {
  const auto need = needs(request, Travelling::kKeys);
  PlanEvents plan;
  add_deliveries(order, kept_deliveries(order, need), BlockKind::kKV, &plan);
  for (int r = 0; r < order.ranks; ++r)
    for (int x = 0; x < order.ranks; ++x)
      if (need[x][order.held[x][r]]) plan.compute(x, r, x, order.held[x][r]);
  return plan;
}

PlanEvents travel_backward(const VisitOrder& order, const ScheduleRequest& request, Travelling travelling,
                           ResultRoute route) {
  const bool keys = travelling == Travelling::kKeys;
  const auto need = needs(request, travelling);
  const int P = order.ranks;
  PlanEvents plan;
  add_deliveries(order, kept_deliveries(order, need), keys ? BlockKind::kKV : BlockKind::kQueryPack, &plan);
  // holders[b]: the (rank, round) pairs that compute with shard b's block, in round order.
  std::vector<std::vector<std::pair<int, int>>> holders(P);
  for (int r = 0; r < P; ++r)
    for (int x = 0; x < P; ++x) {
      const int b = order.held[x][r];
      if (!need[x][b]) continue;
      holders[b].push_back({x, r});
      plan.compute(x, r, keys ? x : b, keys ? b : x);
    }
  const BlockKind result = keys ? BlockKind::kDKV : BlockKind::kDQ;
  for (int b = 0; b < P; ++b) {
    const auto& h = holders[b];
    if (route == ResultRoute::kHome) {
      // Each part comes from one pair: only the rows that pair touched go home.
      for (const auto& [x, r] : h) {
        if (x == b) continue;
        int64_t begin = 0, end = -1;
        if (!request.pair_rows.empty()) {
          const ScheduleRequest::PairRows& rows = keys ? request.pair_rows[x][b] : request.pair_rows[b][x];
          begin = keys ? rows.k_begin : rows.q_begin, end = keys ? rows.k_end : rows.q_end;
          if (begin == 0 && end == request.shard_rows[b]) end = -1;  // every row
        }
        if (end < 0) plan.move(x, b, r + 1, r + 1, {result, b}, Combine::kAdd);
        else plan.move_rows(x, b, r + 1, {result, b}, begin, end);
      }
      continue;
    }
    // Along the holders: each one's sum leaves in the round the next holder computes its part.
    for (size_t i = 1; i < h.size(); ++i)
      plan.move(h[i - 1].first, h[i].first, h[i].second, h[i].second, {result, b}, Combine::kAdd);
    if (!h.empty() && h.back().first != b)
      plan.move(h.back().first, b, h.back().second + 1, h.back().second + 1, {result, b}, Combine::kAdd);
  }
  return plan;
}

int cheaper_ring_direction(const ScheduleRequest& request, Travelling travelling) {
  const auto need = needs(request, travelling);
  int count[2] = {0, 0};
  for (int d = 0; d < 2; ++d) {
    const auto keep = kept_deliveries(ring_order(request.ranks, d == 0 ? +1 : -1), need);
    for (const auto& row : keep)
      for (bool k : row) count[d] += k;
  }
  return count[1] < count[0] ? -1 : +1;
}

}  // namespace seqpar::parallel
