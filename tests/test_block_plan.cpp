// Dense-call planning: for every layout, rank pair and causal-like mask, the calls cover each
// visible (query, key) pair exactly once and nothing else, also when limited to a few rows
// each; zigzag causal pairs take one call;
// windows and documents are handed to the positions-aware kernel; a span of shards (a Ulysses
// group's) keeps its rows in position order where its shards interleave in few pieces.
#include <gtest/gtest.h>

#include <algorithm>

#include "parallel/block_plan.hpp"
#include "parallel/block_views.hpp"
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

// A Ulysses span of zigzag or documents-layout shards is one increasing run (one backend call
// over the group's sequence); striped shards would interleave row by row and stay in shard order.
TEST(SpanPositions, UlyssesSpansAreInPositionOrder) {
  const auto check = [](const Layout& layout, int shard, int span, size_t runs) {
    parallel::SpanPositions spans(layout);
    const Block b{BlockKind::kQuery, shard, span};
    const int64_t* p = spans.of(b);
    std::vector<int64_t> expected;  // the shards' positions, and where each piece says it goes
    std::vector<int64_t> placed(block_rows(b, layout), -1);
    for (const auto& piece : spans.pieces(b))
      for (int64_t i = 0; i < piece.rows; ++i) placed[piece.to + i] = layout.positions(piece.shard)[piece.from + i];
    for (int x = shard; x < shard + span; ++x)
      expected.insert(expected.end(), layout.positions(x).begin(), layout.positions(x).end());
    EXPECT_EQ(std::vector<int64_t>(p, p + placed.size()), placed);  // rows and positions agree
    std::sort(expected.begin(), expected.end());
    std::sort(placed.begin(), placed.end());
    EXPECT_EQ(placed, expected);  // every row of the shards once
    EXPECT_EQ(spans.increasing_runs(b).size(), runs);
  };
  const Layout zigzag = Layout::create(LayoutKind::kZigzag, 64, 4).value();
  check(zigzag, 0, 4, 1);  // the whole sequence in order: one causal call
  check(zigzag, 2, 2, 1);  // a Ulysses x ring group's two shards
  const Layout striped = Layout::create(LayoutKind::kStriped, 1024, 4).value();  // 256 runs a shard
  check(striped, 0, 4, 4);
  const std::vector<int64_t> offsets{0, 5, 40, 41, 90, 128};
  const Layout documents = Layout::create(LayoutKind::kDocuments, 128, 4, offsets).value();
  check(documents, 0, 4, 1);
  parallel::SpanPositions spans(zigzag);
  EXPECT_EQ(spans.pieces({BlockKind::kKV, 0, 4}).size(), 7u);  // 2P chunks, rank 3's two adjacent
  EXPECT_EQ(spans.pieces({BlockKind::kKV, 1, 1}).size(), 1u);   // one shard: its rows as they are
}

}  // namespace
}  // namespace seqpar
