// Dense-call planning for a (query shard, key shard) pair: see src/parallel/block_plan.hpp.
// Under a causal-like band every query row sees a prefix of the (increasing) keys; the plan
// looks for pieces of the pair where that prefix length grows by exactly one key per row
// (top-left causal after a full block) or stays fixed (a full block), trying the whole pair
// first and then its arithmetic runs, so a pair becomes one or two large calls where it can.
#include "parallel/block_plan.hpp"

#include <algorithm>
#include <limits>
#include <optional>

namespace seqpar {
namespace {

struct Range {
  int64_t begin, end;
};

// Calls for query rows `q` x key rows `k`, or nothing if this piece needs positions.
std::optional<std::vector<BlockCall>> piece_calls(const std::vector<int64_t>& qp,
                                                  const std::vector<int64_t>& kp, Range q,
                                                  Range k, int64_t right) {
  const int64_t n = q.end - q.begin, m = k.end - k.begin;
  auto visible = [&](int64_t i) -> int64_t {  // keys of this piece that query row i sees
    const int64_t limit = qp[q.begin + i] > std::numeric_limits<int64_t>::max() - right
                              ? std::numeric_limits<int64_t>::max()
                              : qp[q.begin + i] + right;
    const auto first = kp.begin() + k.begin, last = kp.begin() + k.end;
    return std::upper_bound(first, last, limit) - first;
  };
  int64_t t0 = 0;
  while (t0 < n && visible(t0) == 0) ++t0;
  if (t0 == n) return std::vector<BlockCall>{};
  const int64_t d = visible(t0);
  bool fixed = true, diagonal = true;
  for (int64_t i = t0; i < n && (fixed || diagonal); ++i) {
    const int64_t c = visible(i);
    fixed = fixed && c == d;
    diagonal = diagonal && c == std::min(m, d + i - t0);
  }
  const int64_t rows = q.begin + t0;
  if (fixed) return std::vector<BlockCall>{{rows, q.end, k.begin, k.begin + d, false}};
  if (!diagonal) return std::nullopt;
  std::vector<BlockCall> calls;
  if (d > 1) calls.push_back({rows, q.end, k.begin, k.begin + d - 1, false});
  calls.push_back({rows, q.end, k.begin + d - 1, k.end, true});
  return calls;
}

bool increasing(const std::vector<int64_t>& p) {
  for (size_t i = 1; i < p.size(); ++i)
    if (p[i] <= p[i - 1]) return false;
  return true;
}

std::vector<Range> run_ranges(const std::vector<int64_t>& positions) {
  std::vector<Range> ranges;
  for (const PositionRunSpan& r : arithmetic_runs(positions)) ranges.push_back({r.begin, r.end});
  return ranges;
}

}  // namespace

std::vector<PositionRunSpan> arithmetic_runs(const std::vector<int64_t>& positions) {
  std::vector<PositionRunSpan> runs;
  const int64_t n = static_cast<int64_t>(positions.size());
  for (int64_t i = 0; i < n;) {
    PositionRunSpan run{i, i + 1, positions[i], 1};
    if (i + 1 < n && positions[i + 1] > positions[i]) {
      run.stride = positions[i + 1] - positions[i];
      while (run.end < n && positions[run.end] - positions[run.end - 1] == run.stride) ++run.end;
    }
    runs.push_back(run);
    i = run.end;
  }
  return runs;
}

BlockPlan plan_block_pair(const std::vector<int64_t>& q_positions,
                          const std::vector<int64_t>& k_positions, const MaskSpec& mask) {
  BlockPlan plan;
  if (mask.has_documents() || mask.has_block_pattern() || mask.window_left >= 0 ||
      !increasing(q_positions) || !increasing(k_positions)) {
    plan.dense = false;
    return plan;
  }
  const int64_t right =
      mask.window_right < 0 ? std::numeric_limits<int64_t>::max() : mask.window_right;
  const std::vector<Range> whole_q{{0, int64_t(q_positions.size())}};
  const std::vector<Range> whole_k{{0, int64_t(k_positions.size())}};
  const std::vector<Range> q_runs = run_ranges(q_positions), k_runs = run_ranges(k_positions);
  // A few pieces at most: more runs than this means scattered positions.
  constexpr size_t kMaxRuns = 8;
  const std::pair<const std::vector<Range>*, const std::vector<Range>*> levels[] = {
      {&whole_q, &whole_k}, {&whole_q, &k_runs}, {&q_runs, &whole_k}, {&q_runs, &k_runs}};
  for (const auto& [qs, ks] : levels) {
    if (qs->size() > kMaxRuns || ks->size() > kMaxRuns) continue;
    std::vector<BlockCall> calls;
    bool ok = true;
    for (const Range& q : *qs)
      for (const Range& k : *ks) {
        if (!ok) break;
        auto piece = piece_calls(q_positions, k_positions, q, k, right);
        if (!piece) ok = false;
        else calls.insert(calls.end(), piece->begin(), piece->end());
      }
    if (ok) {
      plan.calls = std::move(calls);
      return plan;
    }
  }
  plan.dense = false;
  return plan;
}

BlockPlan limit_call_rows(BlockPlan plan, int64_t max_rows) {
  if (max_rows <= 0 || !plan.dense) return plan;
  std::vector<BlockCall> calls;
  for (const BlockCall& c : plan.calls) {
    const int64_t nq = c.q_end - c.q_begin, nk = c.k_end - c.k_begin;
    for (int64_t qa = 0; qa < nq; qa += max_rows)
      for (int64_t ka = 0; ka < nk; ka += max_rows) {
        if (c.causal && ka > qa) break;  // every key of this tile and the next comes after every query
        calls.push_back({c.q_begin + qa, c.q_begin + std::min(nq, qa + max_rows), c.k_begin + ka,
                         c.k_begin + std::min(nk, ka + max_rows), c.causal && ka == qa});
      }
  }
  plan.calls = std::move(calls);
  return plan;
}

}  // namespace seqpar
