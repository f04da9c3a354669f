// Layouts: every token on exactly one rank, the zigzag/striped/contiguous/documents patterns,
// uneven lengths, shard/unshard round trips, and refusals. The documents layout's balance on
// long sequences is test_document_layout's.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "seqpar/layout.hpp"
#include "test_util.hpp"

namespace seqpar {
namespace {

class Layouts : public ::testing::TestWithParam<std::tuple<LayoutKind, int, int64_t>> {};

TEST_P(Layouts, CoverEveryTokenOnceAndRoundTrip) {
  const auto [kind, P, S] = GetParam();
  // Documents of 1, 1, 7 and 11 tokens, then one of the rest (only the documents layout reads them).
  auto layout = Layout::create(kind, S, P, {0, 1, 2, 9, std::min<int64_t>(20, S), S});
  ASSERT_TRUE(layout.ok()) << layout.status().to_string();
  std::vector<int> owner(S, -1);
  for (int r = 0; r < P; ++r)
    for (int64_t t : layout->positions(r)) {
      ASSERT_TRUE(t >= 0 && t < S);
      EXPECT_EQ(owner[t], -1) << "token " << t << " twice";
      owner[t] = r;
    }
  for (int64_t t = 0; t < S; ++t) EXPECT_NE(owner[t], -1) << "token " << t << " missing";
  // Balance: local lengths differ by at most 1 (contiguous/striped) or 2 (zigzag); the documents
  // layout balances work, and leaves no rank empty.
  if (kind != LayoutKind::kDocuments)
    EXPECT_LE(layout->max_local_len() - layout->local_len(P - 1), kind == LayoutKind::kZigzag ? 2 : 1);
  for (int r = 0; r < P; ++r) {
    EXPECT_GE(layout->local_len(r), 1) << "rank " << r;
    EXPECT_TRUE(std::is_sorted(layout->positions(r).begin(), layout->positions(r).end())) << "rank " << r;
  }

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
                                         LayoutKind::kStriped, LayoutKind::kDocuments),
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

// The documents layout: one document is a zigzag (its shards, on some order of the ranks);
// equal short documents are dealt whole, as many to each rank; a long document among short ones
// is cut into zigzag pieces and the short ones fill the other ranks, every rank within 5% of the
// mean work (rank_visible_work, which counts what MaskSpec::allows allows).
TEST(Layout, DocumentsBalanceVisibleWork) {
  const auto shards = [](const Layout& l) {
    std::set<std::vector<int64_t>> s;
    for (int r = 0; r < l.ranks(); ++r) s.insert(l.positions(r));
    return s;
  };
  for (int P : {1, 2, 3, 4}) {
    const Layout one = Layout::create(LayoutKind::kDocuments, 53, P, {}).value();
    EXPECT_EQ(shards(one), shards(Layout::create(LayoutKind::kZigzag, 53, P).value())) << "P = " << P;
  }
  const Layout eight = Layout::create(LayoutKind::kDocuments, 64, 4, {0, 8, 16, 24, 32, 40, 48, 56, 64}).value();
  for (int r = 0; r < 4; ++r) {
    const std::vector<int64_t>& p = eight.positions(r);
    ASSERT_EQ(p.size(), 16u);
    EXPECT_TRUE(p[0] % 8 == 0 && p[7] == p[0] + 7 && p[8] % 8 == 0 && p[15] == p[8] + 7) << "rank " << r;
  }
  // 600 tokens: a document of 400, seven of 10 to 40, then documents of one token.
  std::vector<int64_t> offsets{0, 400};
  for (int64_t len : {40, 30, 20, 10, 10, 10, 20}) offsets.push_back(offsets.back() + len);
  while (offsets.back() < 600) offsets.push_back(offsets.back() + 1);
  const MaskSpec docs = MaskSpec::documents(offsets);
  for (int P : {2, 3, 4, 8}) {
    const Layout l = Layout::create(LayoutKind::kDocuments, 600, P, offsets).value();
    const std::vector<double> work = rank_visible_work(l, docs);
    const double total = std::accumulate(work.begin(), work.end(), 0.0);
    EXPECT_EQ(total, docs.visible_pairs(600));
    EXPECT_LE(*std::max_element(work.begin(), work.end()), 1.05 * total / P) << "P = " << P;
    // The zigzag of the whole sequence balances tokens: the ranks holding the long document's
    // later chunks do most of its triangle.
    const std::vector<double> zigzag = rank_visible_work(Layout::create(LayoutKind::kZigzag, 600, P).value(), docs);
    EXPECT_GT(*std::max_element(zigzag.begin(), zigzag.end()), 1.1 * total / P) << "P = " << P;
  }
}

// rank_visible_work counts what MaskSpec::allows allows, pair by pair, for windows, documents
// and block patterns on any layout.
TEST(Layout, VisibleWorkCountsAllowedPairs) {
  const int64_t S = 45;
  const std::vector<int64_t> offsets{0, 3, 4, 20, 45};
  std::vector<MaskSpec> masks{MaskSpec::none(), MaskSpec::causal(), MaskSpec::window(5, 2),
                              MaskSpec::documents(offsets), MaskSpec::documents(offsets, false),
                              parse_mask("bigbird-causal:1,1,1,B=4", S).value()};
  masks.push_back(masks.back());
  masks.back().doc_offsets = offsets;
  for (const MaskSpec& mask : masks)
    for (LayoutKind kind : {LayoutKind::kContiguous, LayoutKind::kStriped, LayoutKind::kDocuments}) {
      const Layout l = Layout::create(kind, S, 3, offsets).value();
      const std::vector<double> work = rank_visible_work(l, mask);
      for (int r = 0; r < 3; ++r) {
        double pairs = 0;
        for (const int64_t q : l.positions(r))
          for (int64_t k = 0; k < S; ++k) pairs += mask.allows(q, k);
        EXPECT_EQ(work[r], pairs) << mask.describe() << " " << layout_name(kind) << " rank " << r;
      }
    }
}

TEST(Layout, Refusals) {
  EXPECT_FALSE(Layout::create(LayoutKind::kZigzag, 7, 4).ok());  // needs 8 chunks
  EXPECT_FALSE(Layout::create(LayoutKind::kContiguous, 3, 4).ok());
  EXPECT_FALSE(Layout::create(LayoutKind::kStriped, 10, 0).ok());
  EXPECT_FALSE(parse_layout("diagonal").ok());
  EXPECT_EQ(parse_layout("documents").value(), LayoutKind::kDocuments);
  // The documents layout needs its documents, well formed, and a token a rank.
  EXPECT_FALSE(Layout::create(LayoutKind::kDocuments, 10, 2).ok());
  EXPECT_FALSE(Layout::create(LayoutKind::kDocuments, 10, 2, {0, 6, 4, 10}).ok());
  EXPECT_FALSE(Layout::create(LayoutKind::kDocuments, 10, 2, {0, 6}).ok());
  EXPECT_FALSE(Layout::create(LayoutKind::kDocuments, 3, 4, {0, 3}).ok());
  EXPECT_TRUE(Layout::create(LayoutKind::kDocuments, 4, 4, {0, 3, 3, 4}).ok());
  auto ct = Layout::create(LayoutKind::kContiguous, 10, 2).value();
  HostTensor global(DType::kF32, {1, 10, 1, 2}), wrong(DType::kF32, {1, 4, 1, 2});
  EXPECT_EQ(ct.shard(global.view(), 1, 0, wrong.view()).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace seqpar
