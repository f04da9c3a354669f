// Layouts: every token on exactly one rank, the zigzag/striped/contiguous patterns, uneven
// lengths, shard/unshard round trips, and refusals.
#include <gtest/gtest.h>

#include <set>

#include "seqpar/layout.hpp"
#include "test_util.hpp"

namespace seqpar {
namespace {

class Layouts : public ::testing::TestWithParam<std::tuple<LayoutKind, int, int64_t>> {};

TEST_P(Layouts, CoverEveryTokenOnceAndRoundTrip) {
  const auto [kind, P, S] = GetParam();
  auto layout = Layout::create(kind, S, P);
  ASSERT_TRUE(layout.ok()) << layout.status().to_string();
  std::vector<int> owner(S, -1);
  for (int r = 0; r < P; ++r)
    for (int64_t t : layout->positions(r)) {
      ASSERT_TRUE(t >= 0 && t < S);
      EXPECT_EQ(owner[t], -1) << "token " << t << " twice";
      owner[t] = r;
    }
  for (int64_t t = 0; t < S; ++t) EXPECT_NE(owner[t], -1) << "token " << t << " missing";
  // Balance: local lengths differ by at most 1 (contiguous/striped) or 2 (zigzag).
  EXPECT_LE(layout->max_local_len() - layout->local_len(P - 1), kind == LayoutKind::kZigzag ? 2 : 1);

  const HostTensor global = testing::random_tensor(DType::kF32, {2, S, 3, 4}, 9);
  const HostTensor global_lse = testing::random_tensor(DType::kF64, {2, 3, S}, 10);
  HostTensor back(DType::kF32, {2, S, 3, 4}), back_lse(DType::kF64, {2, 3, S});
  for (int r = 0; r < P; ++r) {
    HostTensor local(DType::kF32, {2, layout->local_len(r), 3, 4});
    HostTensor local_lse(DType::kF64, {2, 3, layout->local_len(r)});
    ASSERT_TRUE(layout->shard(global.view(), 1, r, local.view()).ok());
    ASSERT_TRUE(layout->shard(global_lse.view(), 2, r, local_lse.view()).ok());
    // Row i of the shard is global row positions(r)[i].
    const int64_t t = layout->positions(r).back(), i = layout->local_len(r) - 1;
    EXPECT_EQ(local.data<float>()[((1 * layout->local_len(r) + i) * 3 + 2) * 4 + 3],
              global.data<float>()[((1 * S + t) * 3 + 2) * 4 + 3]);
    ASSERT_TRUE(layout->unshard(local.view(), 1, r, back.view()).ok());
    ASSERT_TRUE(layout->unshard(local_lse.view(), 2, r, back_lse.view()).ok());
  }
  EXPECT_EQ(testing::max_abs_diff(back, global), 0.0);
  EXPECT_EQ(testing::max_abs_diff(back_lse, global_lse), 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    All, Layouts,
    ::testing::Combine(::testing::Values(LayoutKind::kContiguous, LayoutKind::kZigzag,
                                         LayoutKind::kStriped),
                       ::testing::Values(1, 2, 3, 4, 8), ::testing::Values(16, 53, 64)));

TEST(Layout, Patterns) {
  auto zz = Layout::create(LayoutKind::kZigzag, 16, 2).value();  // chunks of 4
  EXPECT_EQ(zz.positions(0), (std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(zz.positions(1), (std::vector<int64_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  auto st = Layout::create(LayoutKind::kStriped, 7, 3).value();
  EXPECT_EQ(st.positions(1), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(st.positions(0), (std::vector<int64_t>{0, 3, 6}));
  auto ct = Layout::create(LayoutKind::kContiguous, 10, 4).value();  // 3, 3, 2, 2
  EXPECT_EQ(ct.positions(1), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(ct.positions(3), (std::vector<int64_t>{8, 9}));
}

TEST(Layout, Refusals) {
  EXPECT_FALSE(Layout::create(LayoutKind::kZigzag, 7, 4).ok());  // needs 8 chunks
  EXPECT_FALSE(Layout::create(LayoutKind::kContiguous, 3, 4).ok());
  EXPECT_FALSE(Layout::create(LayoutKind::kStriped, 10, 0).ok());
  EXPECT_FALSE(parse_layout("diagonal").ok());
  auto ct = Layout::create(LayoutKind::kContiguous, 10, 2).value();
  HostTensor global(DType::kF32, {1, 10, 1, 2}), wrong(DType::kF32, {1, 4, 1, 2});
  EXPECT_EQ(ct.shard(global.view(), 1, 0, wrong.view()).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace seqpar
