// Attention2D's process grid and the pieces both of its schedules share (report 003): P = s^2
// ranks on an s x s grid, rank l = r + s c at row r, column c (column-major, as the 1-D cyclic
// input layout numbers them: rank l holds tokens l + iP, the striped layout). Row r's queries
// are the shards {r + s j}, column c's keys and values the shards {c + s i}: rank (r,c)
// computes every visible pair of the two, so each pair is computed by exactly one rank.
// K/V reach column c through the transpose swap (r,c) <-> (c,r) and a column all-gather; the
// partial (O, LSE) of a query shard go home by a ring reduce-scatter along its row whose
// reduction is the softmax merge (AttnFix: Algorithm 7 with its index range corrected).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/algorithms/plan_events.hpp"

namespace seqpar::parallel {

struct Grid {
  int s = 1;
  int row(int rank) const { return rank % s; }
  int col(int rank) const { return rank / s; }
  int rank(int r, int c) const { return r + s * c; }
  // The shard rank (r,c) holds K/V of after the swap: (c,r)'s.
  int transposed(int rank) const { return this->rank(col(rank), row(rank)); }
};

// Empty and the grid when the ranks make a square, else why not.
std::string attention2d_refusal(int ranks);
Grid attention2d_grid(int ranks);

// Whether rank `at` computes with query shard q (some key of its column is visible to q), or
// with K/V shard kv (some query of its row sees kv).
bool grid_needs_query(const Grid& g, const ScheduleRequest& req, int at, int q);
bool grid_needs_kv(const Grid& g, const ScheduleRequest& req, int at, int kv);

// The printed algorithms' errata, to rebuild them for the regression tests (report 003, §8).
struct PrintedErrata {
  bool alg3_reduces_inputs = false;   // Algorithm 3 lines 7-8 reduce-scatter Q_g and K_g, V_g
  bool alg8_no_swap_back = false;     // Algorithm 8 leaves dK/dV in the row-major layout
  bool alg11_drops_own_dkv = false;   // Algorithm 11 line 18 forgets dK_1, dV_1
};

// Algorithm 7 (RowReduceScatter), its index sets: in step i (i = 1 before the first exchange,
// up to s) rank column c holds the partial of the rows idx = {(c + i) % s + j s} of its row's
// gathered queries Q_g (local row k is global token r + k s), j in [0, n) for shards of n rows
// (printed: j in [0, N / sqrt(P)) = [0, s n), rows past Q_g's end).
int attnfix_ring_column(int s, int c, int i);
std::vector<int64_t> attnfix_ring_rows(int s, int64_t rows_per_shard, int c, int i, bool printed_range);

// A ring reduce-scatter over `members` (ring order; each sends to the one before it): step k
// (1 <= k < size) runs in round rounds[k - 1], where member m sends its running block of
// owner attnfix_ring_column(size, m, k) and receives, combining, the block of owner
// (m + k + 1) % size. has[m][x]: whether member m holds owner x's block before the ring (it
// computed some of it); a member with nothing of a block sends nothing. Returns who holds
// each owner's block at the end (its owner, where anyone had some).
std::vector<std::vector<bool>> ring_reduce_scatter(PlanEvents& plan, const std::vector<int>& members,
                                                   const std::vector<Block>& block_of_owner,
                                                   std::vector<std::vector<bool>> has, const std::vector<int>& rounds,
                                                   Combine combine, Collective collective);

// A ring of the grid: the members of row r (one per column) or of column c (one per row), and
// for each member index x the block it owns in the ring: `kind` of query shard (r, x) along a
// row, of K/V shard (c, x) (held by (x, c) after the swap) along a column.
struct GridRing {
  std::vector<int> members;
  std::vector<Block> blocks;
};
GridRing row_ring(const Grid& g, int r, BlockKind kind);
GridRing column_ring(const Grid& g, int c, BlockKind kind);
// After a column ring of dK/dV in round `round`: each rank of column c sends the K/V shard's
// gradient it holds (held[m][m]) to its owner across the diagonal.
void swap_gradients_home(PlanEvents& plan, const Grid& g, int c, const std::vector<std::vector<bool>>& held,
                         int round);

// Whether K/V shard l crosses the diagonal to its transpose: off the diagonal, where some rank
// of its new column computes with it.
bool swapped(const Grid& g, const ScheduleRequest& req, int l);
// What rank l keeps from the forward for the backward (keep_forward_state): the K/V it got in
// the swap (the report's K_t, V_t), so the backward does not swap K/V again.
std::vector<Block> attention2d_kept(const Grid& g, const ScheduleRequest& req, int l);

// Round 0: every rank's K/V to its transpose (where its new column needs them; not in a
// backward that kept them) and `query_kind` blocks along the row (all-gather, to the ranks
// that need them).
void swap_and_row_gather(PlanEvents& plan, const ScheduleRequest& req, const Grid& g, BlockKind query_kind,
                         bool swap_kv = true);

// has[m][x] before a ring: along row r (members: its columns), whether rank (r, m) computes
// some of query shard (r, x)'s rows; along column c (members: its rows), whether rank (m, c)
// computes with K/V shard (c, x), the one (x, c) holds after the swap.
std::vector<std::vector<bool>> row_partials(const Grid& g, const ScheduleRequest& req, int r);
std::vector<std::vector<bool>> column_partials(const Grid& g, const ScheduleRequest& req, int c);

}  // namespace seqpar::parallel
