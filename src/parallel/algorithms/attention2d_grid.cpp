// Attention2D's grid and shared schedule pieces (attention2d_grid.hpp).
#include "parallel/algorithms/attention2d_grid.hpp"

#include <cmath>

namespace seqpar::parallel {

std::string attention2d_refusal(int ranks) {
  const int s = int(std::lround(std::sqrt(double(ranks))));
  if (s * s == ranks) return {};
  return "attention2d needs a square number of ranks (1, 4, 9, 16, ...), not " + std::to_string(ranks) +
         ": a rectangular grid gives each rank staircase masks and no transpose swap (report 003, §8.18); "
         "use ring, burst or ulysses-ring";
}

Grid attention2d_grid(int ranks) { return {int(std::lround(std::sqrt(double(ranks))))}; }

bool grid_needs_query(const Grid& g, const ScheduleRequest& req, int at, int q) {
  for (int i = 0; i < g.s; ++i)
    if (req.visible[q][g.rank(g.col(at), i)]) return true;
  return false;
}

bool grid_needs_kv(const Grid& g, const ScheduleRequest& req, int at, int kv) {
  for (int j = 0; j < g.s; ++j)
    if (req.visible[g.rank(g.row(at), j)][kv]) return true;
  return false;
}

int attnfix_ring_column(int s, int c, int i) { return (c + i) % s; }

std::vector<int64_t> attnfix_ring_rows(int s, int64_t rows_per_shard, int c, int i, bool printed_range) {
  const int64_t count = printed_range ? s * rows_per_shard : rows_per_shard;
  std::vector<int64_t> rows;
  for (int64_t j = 0; j < count; ++j) rows.push_back(attnfix_ring_column(s, c, i) + j * s);
  return rows;
}

std::vector<std::vector<bool>> ring_reduce_scatter(PlanEvents& plan, const std::vector<int>& members,
                                                   const std::vector<Block>& block_of_owner,
                                                   std::vector<std::vector<bool>> has, const std::vector<int>& rounds,
                                                   Combine combine, Collective collective) {
  const int n = int(members.size());
  for (int k = 1; k < n; ++k) {
    std::vector<std::pair<int, int>> arrived;
    for (int m = 0; m < n; ++m) {
      const int x = attnfix_ring_column(n, m, k), left = (m + n - 1) % n;
      if (!has[m][x]) continue;
      plan.move(members[m], members[left], rounds[k - 1], rounds[k - 1], block_of_owner[x], combine, collective);
      has[m][x] = false;
      arrived.emplace_back(left, x);
    }
    for (const auto& [m, x] : arrived) has[m][x] = true;
  }
  return has;
}

GridRing row_ring(const Grid& g, int r, BlockKind kind) {
  GridRing ring;
  for (int m = 0; m < g.s; ++m) ring.members.push_back(g.rank(r, m)), ring.blocks.push_back({kind, g.rank(r, m)});
  return ring;
}

GridRing column_ring(const Grid& g, int c, BlockKind kind) {
  GridRing ring;
  for (int m = 0; m < g.s; ++m) ring.members.push_back(g.rank(m, c)), ring.blocks.push_back({kind, g.rank(c, m)});
  return ring;
}

void swap_gradients_home(PlanEvents& plan, const Grid& g, int c, const std::vector<std::vector<bool>>& held,
                         int round) {
  for (int m = 0; m < g.s; ++m)
    if (m != c && held[m][m])
      plan.move(g.rank(m, c), g.rank(c, m), round, round, {BlockKind::kDKV, g.rank(c, m)}, Combine::kAdd,
                Collective::kSwap);
}

bool swapped(const Grid& g, const ScheduleRequest& req, int l) {
  if (g.row(l) == g.col(l)) return false;
  for (int i = 0; i < g.s; ++i)  // does some rank of column r (where K/V[l] goes) compute with it?
    if (grid_needs_kv(g, req, g.rank(i, g.row(l)), l)) return true;
  return false;
}

std::vector<Block> attention2d_kept(const Grid& g, const ScheduleRequest& req, int l) {
  if (!req.keep_forward_state || !swapped(g, req, g.transposed(l))) return {};
  return {{BlockKind::kKV, g.transposed(l)}};
}

void swap_and_row_gather(PlanEvents& plan, const ScheduleRequest& req, const Grid& g, BlockKind query_kind,
                         bool swap_kv) {
  for (int l = 0; l < req.ranks; ++l) {
    const int r = g.row(l), c = g.col(l), t = g.transposed(l);
    if (swap_kv && swapped(g, req, l))
      plan.move(l, t, 0, 0, {BlockKind::kKV, l}, Combine::kReplace, Collective::kSwap);
    for (int j = 0; j < g.s; ++j) {
      const int to = g.rank(r, j);
      if (j != c && grid_needs_query(g, req, to, l))
        plan.move(l, to, 0, 0, {query_kind, l}, Combine::kReplace, Collective::kRowAllGather);
    }
  }
}

std::vector<std::vector<bool>> row_partials(const Grid& g, const ScheduleRequest& req, int r) {
  std::vector<std::vector<bool>> has(g.s, std::vector<bool>(g.s, false));
  for (int m = 0; m < g.s; ++m)
    for (int x = 0; x < g.s; ++x) has[m][x] = grid_needs_query(g, req, g.rank(r, m), g.rank(r, x));
  return has;
}

std::vector<std::vector<bool>> column_partials(const Grid& g, const ScheduleRequest& req, int c) {
  std::vector<std::vector<bool>> has(g.s, std::vector<bool>(g.s, false));
  for (int m = 0; m < g.s; ++m)
    for (int x = 0; x < g.s; ++x) has[m][x] = grid_needs_kv(g, req, g.rank(m, c), g.rank(c, x));
  return has;
}

}  // namespace seqpar::parallel
