// Dense-call planning: for every layout, rank pair and causal-like mask, the calls cover each
// visible (query, key) pair exactly once and nothing else, also when limited to a few rows
// each; zigzag causal pairs take one call;
// windows and documents are handed to the positions-aware kernel.
#include <gtest/gtest.h>

#include "parallel/block_plan.hpp"
#include "seqpar/layout.hpp"

namespace seqpar {
namespace {

// Counts how often each (query row, key row) is covered by the plan's calls.
std::vector<int> coverage(const BlockPlan& plan, int64_t n, int64_t m) {
  std::vector<int> count(n * m, 0);
  for (const BlockCall& c : plan.calls) {
    EXPECT_TRUE(0 <= c.q_begin && c.q_begin < c.q_end && c.q_end <= n);
    EXPECT_TRUE(0 <= c.k_begin && c.k_begin < c.k_end && c.k_end <= m);
    for (int64_t i = c.q_begin; i < c.q_end; ++i)
      for (int64_t j = c.k_begin; j < c.k_end; ++j)
        if (!c.causal || j - c.k_begin <= i - c.q_begin) ++count[i * m + j];
  }
  return count;
}

class PlanCoversMask
    : public ::testing::TestWithParam<std::tuple<LayoutKind, int, int64_t, int64_t>> {};

TEST_P(PlanCoversMask, EveryVisiblePairOnce) {
  const auto [kind, P, S, right] = GetParam();  // right: -1 full, else causal band bound
  const MaskSpec mask = MaskSpec::window(-1, right);
  auto layout = Layout::create(kind, S, P);
  ASSERT_TRUE(layout.ok());
  for (int r = 0; r < P; ++r)
    for (int s = 0; s < P; ++s) {
      const auto& qp = layout->positions(r);
      const auto& kp = layout->positions(s);
      const BlockPlan whole = plan_block_pair(qp, kp, mask);
      ASSERT_TRUE(whole.dense) << "pair " << r << "," << s;
      EXPECT_LE(whole.calls.size(), 4u);
      const int64_t n = qp.size(), m = kp.size();
      // And the same pairs in calls of at most 5 or 16 rows (limit_call_rows).
      for (int64_t cap : {0, 5, 16}) {
        const BlockPlan plan = limit_call_rows(whole, cap);
        for (const BlockCall& c : plan.calls)
          if (cap > 0) EXPECT_TRUE(c.q_end - c.q_begin <= cap && c.k_end - c.k_begin <= cap) << cap;
        const std::vector<int> count = coverage(plan, n, m);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < m; ++j)
            ASSERT_EQ(count[i * m + j], mask.band_allows(qp[i], kp[j]) ? 1 : 0)
                << "q row " << i << " (pos " << qp[i] << "), k row " << j << " (pos " << kp[j]
                << "), ranks " << r << "," << s << ", at most " << cap << " rows";
      }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PlanCoversMask,
    ::testing::Combine(::testing::Values(LayoutKind::kContiguous, LayoutKind::kZigzag,
                                         LayoutKind::kStriped),
                       ::testing::Values(1, 2, 3, 4), ::testing::Values(int64_t{37}, int64_t{64}),
                       ::testing::Values(int64_t{-1}, int64_t{0}, int64_t{5})));

TEST(BlockPlan, ZigzagCausalIsOneCallPerPair) {
  auto layout = Layout::create(LayoutKind::kZigzag, 4096, 4);
  ASSERT_TRUE(layout.ok());
  for (int r = 0; r < 4; ++r)
    for (int s = 0; s < 4; ++s) {
      const BlockPlan plan = plan_block_pair(layout->positions(r), layout->positions(s),
                                             MaskSpec::causal());
      ASSERT_TRUE(plan.dense);
      ASSERT_EQ(plan.calls.size(), 1u) << r << "," << s;
      EXPECT_EQ(plan.calls[0].causal, r == s);
      // Off the diagonal, half the rows see half the keys: 1/4 of the block.
      const BlockCall& c = plan.calls[0];
      if (r != s) {
        EXPECT_EQ((c.q_end - c.q_begin) * (c.k_end - c.k_begin), 512 * 1024);
      }
    }
}

TEST(BlockPlan, WindowsAndDocumentsNeedPositions) {
  const std::vector<int64_t> pos{0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_FALSE(plan_block_pair(pos, pos, MaskSpec::window(2, 0)).dense);
  EXPECT_FALSE(plan_block_pair(pos, pos, MaskSpec::documents({0, 3, 8})).dense);
  EXPECT_TRUE(plan_block_pair(pos, pos, MaskSpec::causal()).dense);
}

TEST(BlockPlan, ArithmeticRuns) {
  const auto runs = arithmetic_runs({0, 1, 2, 10, 11, 20, 23, 26});
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].end, 3);
  EXPECT_EQ(runs[1].offset, 10);
  EXPECT_EQ(runs[2].stride, 3);
  EXPECT_EQ(runs[2].end, 8);
}

}  // namespace
}  // namespace seqpar
