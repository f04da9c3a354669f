// Block-sparse masks: the bigbird and blocks:PATH syntax (good and bad input, file format
// errors naming the line), BigBird's structure, validation, sees_any against brute force on
// random position sets, and MaskEvaluator's per-element test and tile classes against the
// per-element definition (never wrongly empty or full; exact for a pattern alone).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <set>

#include "kernels/cpu/attention_common.hpp"
#include "parallel/block_plan.hpp"
#include "seqpar/layout.hpp"
#include "seqpar/mask.hpp"
#include "test_util.hpp"

namespace seqpar {
namespace {

MaskSpec parsed(const std::string& text, int64_t seq) {
  StatusOr<MaskSpec> m = parse_mask(text, seq);
  EXPECT_TRUE(m.ok()) << text << ": " << m.status().to_string();
  return m.ok() ? m.value() : MaskSpec::none();
}

TEST(BlockSparseMask, ParseAndDescribe) {
  const MaskSpec bb = parsed("bigbird:1,1,2", 1000);
  ASSERT_TRUE(bb.has_block_pattern());
  EXPECT_FALSE(bb.is_full());
  EXPECT_EQ(bb.window_left, -1);
  EXPECT_EQ(bb.window_right, -1);
  EXPECT_EQ(bb.block_pattern->block_size(), kDefaultMaskBlock);
  EXPECT_EQ(bb.block_pattern->blocks(), 16);  // ceil(1000 / 64)
  EXPECT_EQ(bb.describe(), "bigbird:1,1,2,B=64");
  const MaskSpec bc = parsed("bigbird-causal:2,1,1,B=4", 21);
  EXPECT_EQ(bc.window_left, -1);
  EXPECT_EQ(bc.window_right, 0);
  EXPECT_EQ(bc.block_pattern->blocks(), 6);
  EXPECT_EQ(bc.describe(), "bigbird-causal:2,1,1,B=4");
  EXPECT_FALSE(parsed("causal", 10).has_block_pattern());
  // Copies share the pattern.
  const MaskSpec copy = bc;
  EXPECT_EQ(copy.block_pattern.get(), bc.block_pattern.get());
  // Other bands and documents are named where the text alone does not say them.
  MaskSpec windowed = bb;
  windowed.window_left = 8;
  windowed.window_right = 0;
  EXPECT_EQ(windowed.describe(), "bigbird:1,1,2,B=64+window:8,0");
  MaskSpec docs = bc;
  docs.doc_offsets = make_document_offsets(21, 3);
  EXPECT_EQ(docs.describe(), "docs:3+bigbird-causal:2,1,1,B=4");
  for (const char* bad :
       {"bigbird:1,1", "bigbird:1,1,2,3", "bigbird:-1,1,2", "bigbird:1,1,2,B=0", "bigbird:1,1,2,",
        "bigbird:a,1,2", "bigbird:1,1,2,C=4", "bigbird:1,1,2,B=4,5", "bigbird",
        "bigbird-causal:", "blocks:", "blocks-causal:/no/such/seqpar/file"}) {
    const StatusOr<MaskSpec> m = parse_mask(bad, 100);
    EXPECT_FALSE(m.ok()) << bad;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(parse_mask("bigbird:1,1", 100).status().message().find("W,G,R[,B=N]"),
            std::string::npos);
  EXPECT_NE(parse_mask("triangle", 100).status().message().find("bigbird[-causal]:W,G,R"),
            std::string::npos);
}

// The ITC form: windows, global rows and columns, R random blocks a row drawn from a fixed seed.
TEST(BlockSparseMask, BigBirdStructure) {
  for (const bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "bidirectional");
    const int64_t n = 40, W = 2, G = 3, R = 4;
    const BlockPattern p = bigbird_pattern(n * 8, W, G, R, 8, causal).value();
    ASSERT_EQ(p.blocks(), n);
    for (int64_t qb = 0; qb < n; ++qb) {
      const auto row = p.row(qb);
      const int64_t last = causal ? qb : n - 1;
      for (const int64_t kb : row) EXPECT_LE(kb, last) << qb;
      if (qb < G) {
        EXPECT_EQ(static_cast<int64_t>(row.size()), last + 1) << qb;  // global rows see all
        continue;
      }
      int64_t fixed = 0;  // window and global columns, all present
      for (int64_t kb = 0; kb <= last; ++kb)
        if (kb < G || std::abs(kb - qb) <= W) {
          EXPECT_TRUE(p.allows_blocks(qb, kb)) << qb << " " << kb;
          ++fixed;
        }
      EXPECT_EQ(static_cast<int64_t>(row.size()), fixed + std::min(R, last + 1 - fixed)) << qb;
    }
    // The same pattern every time.
    const BlockPattern again = bigbird_pattern(n * 8, W, G, R, 8, causal).value();
    for (int64_t qb = 0; qb < n; ++qb) {
      const auto a = p.row(qb), b = again.row(qb);
      EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << qb;
    }
  }
  // Random rows differ between rows (not one column repeated).
  const BlockPattern p = bigbird_pattern(64 * 4, 0, 0, 1, 4, false).value();
  std::set<int64_t> picked;
  for (int64_t qb = 0; qb < p.blocks(); ++qb)
    for (const int64_t kb : p.row(qb))
      if (kb != qb) picked.insert(kb);
  EXPECT_GT(picked.size(), 10u);
  EXPECT_FALSE(bigbird_pattern(0, 1, 1, 1, 4, false).ok());
  EXPECT_FALSE(bigbird_pattern(10, 1, 1, 1, 0, false).ok());
}

TEST(BlockSparseMask, PatternFile) {
  const testing::TempFile good("seqpar_pattern_good",
                               "# a 3-block pattern\n"
                               "\n"
                               "block_size 4   # tokens a block\n"
                               "1 0 0\n"
                               "110\n"
                               "  1 0 1  \r\n");
  const MaskSpec m = parsed("blocks:" + good.path.string(), 12);
  ASSERT_TRUE(m.has_block_pattern());
  const BlockPattern& p = *m.block_pattern;
  EXPECT_EQ(p.block_size(), 4);
  EXPECT_EQ(p.blocks(), 3);
  EXPECT_EQ(p.pair_count(), 5);
  const bool want[3][3] = {{1, 0, 0}, {1, 1, 0}, {1, 0, 1}};
  for (int q = 0; q < 3; ++q)
    for (int k = 0; k < 3; ++k) EXPECT_EQ(p.allows_blocks(q, k), want[q][k]) << q << " " << k;
  EXPECT_TRUE(p.allows(9, 2));    // block 2 sees block 0
  EXPECT_FALSE(p.allows(9, 5));   // block 2 does not see block 1
  EXPECT_FALSE(p.allows(12, 0));  // outside the grid
  EXPECT_EQ(m.describe(), "blocks:" + good.path.string());
  const MaskSpec mc = parsed("blocks-causal:" + good.path.string(), 12);
  EXPECT_EQ(mc.window_right, 0);
  EXPECT_EQ(mc.describe(), "blocks-causal:" + good.path.string());
  EXPECT_TRUE(m.validate(12).ok());
  EXPECT_TRUE(m.validate(9).ok());
  const Status short_grid = m.validate(13);  // 3 blocks of 4 do not cover 13 tokens
  EXPECT_FALSE(short_grid.ok());
  EXPECT_NE(short_grid.message().find("covers 12 tokens"), std::string::npos)
      << short_grid.message();
  EXPECT_FALSE(parse_mask("blocks:" + good.path.string(), 13).ok());  // parsed for 13 tokens

  // Malformed files: the error names PATH:LINE and what is wrong.
  const std::pair<const char*, const char*> bad[] = {
      {"1 0\n0 1\n", ":1: expected the header 'block_size N'"},
      {"# c\nblock_size 0\n1\n", ":2: expected the header"},
      {"block_size four\n1\n", ":1: expected the header"},
      {"blocksize 4\n1\n", ":1: expected the header"},
      {"block_size 4 5\n1\n", ":1: expected the header"},
      {"block_size 4\n1 0\n1 2\n", ":3: unexpected '2'"},
      {"block_size 4\n1 0 1\n1 1\n1 1 1\n",
       ":3: row of 2 entries, but the first row (line 2) has 3"},
      {"block_size 4\n1 0\n1 1\n1 1\n", ":4: 3 rows of 2 entries: the grid must be square"},
      {"block_size 4\n# nothing\n", ":2: no rows after the header"},
      {"# only a comment\n", "no 'block_size N' header"},
  };
  for (const auto& [text, expected] : bad) {
    const testing::TempFile file("seqpar_pattern_bad", text);
    const StatusOr<MaskSpec> r = parse_mask("blocks:" + file.path.string(), 8);
    ASSERT_FALSE(r.ok()) << text;
    const std::string want = (expected[0] == ':' ? file.path.string() : "") + expected;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << text << "\n"
                                                                  << r.status().message();
  }
  const StatusOr<MaskSpec> missing = parse_mask("blocks:/no/such/seqpar/pattern", 8);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(
      missing.status().message().find("cannot read block pattern file '/no/such/seqpar/pattern'"),
      std::string::npos);
}

TEST(BlockSparseMask, PositionsOutsideTheGridAreRefused) {
  AttentionParams params;
  params.mask = parsed("bigbird:1,0,0,B=4", 10);  // 3 blocks: positions [0, 12)
  std::vector<int64_t> qp{0, 11}, kp{3, 12};
  params.q_positions = qp.data();
  params.k_positions = kp.data();
  const Status s = cpu::validate_mask_positions(params, 2, 2);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("key position 12 lies outside the block pattern's grid [0, 12)"),
            std::string::npos)
      << s.message();
  kp[1] = 11;
  EXPECT_TRUE(cpu::validate_mask_positions(params, 2, 2).ok());
  // Without positions the grid must cover the longer of S_q and S_k.
  params.q_positions = params.k_positions = nullptr;
  EXPECT_TRUE(cpu::validate_mask_positions(params, 12, 5).ok());
  EXPECT_FALSE(cpu::validate_mask_positions(params, 5, 13).ok());
}

// Masks with patterns: alone, with causal, with a window, with documents, and a random pattern.
std::vector<MaskSpec> pattern_masks(int64_t seq, std::mt19937_64& rng) {
  std::vector<MaskSpec> masks{parsed("bigbird:1,1,1,B=4", seq),
                              parsed("bigbird-causal:1,1,2,B=3", seq),
                              parsed("bigbird:0,0,1,B=5", seq)};
  MaskSpec windowed = parsed("bigbird:0,1,2,B=4", seq);
  windowed.window_left = 6;
  windowed.window_right = 2;
  masks.push_back(windowed);
  MaskSpec docs = parsed("bigbird-causal:1,1,1,B=4", seq);
  docs.doc_offsets = make_document_offsets(seq, 3);
  masks.push_back(docs);
  const int64_t B = 3, n = (seq + B - 1) / B;
  std::vector<std::vector<int64_t>> rows(n);
  for (auto& row : rows)
    for (int64_t kb = 0; kb < n; ++kb)
      if (rng() % 5 == 0) row.push_back(kb);
  masks.push_back(
      MaskSpec::block_sparse(BlockPattern::from_rows(B, rows, "blocks:random").value(), false));
  return masks;
}

// Position sets as the layouts make them, and random subsets (sorted or not).
std::vector<std::vector<int64_t>> position_sets(int64_t seq, std::mt19937_64& rng) {
  std::vector<std::vector<int64_t>> sets;
  for (LayoutKind kind : {LayoutKind::kContiguous, LayoutKind::kZigzag, LayoutKind::kStriped})
    for (int P : {2, 3, 5}) {
      const Layout layout = Layout::create(kind, seq, P).value();
      for (int r = 0; r < P; ++r) sets.push_back(layout.positions(r));
    }
  for (int i = 0; i < 30; ++i) {
    std::vector<int64_t> s;
    const int64_t size = 1 + rng() % 6;
    for (int64_t j = 0; j < size; ++j) s.push_back(rng() % seq);
    sets.push_back(s);
  }
  return sets;
}

TEST(BlockSparseMask, SeesAnyMatchesBruteForce) {
  std::mt19937_64 rng(7);
  const int64_t seq = 53;
  const auto sets = position_sets(seq, rng);
  int64_t seen = 0, unseen = 0;
  for (const MaskSpec& mask : pattern_masks(seq, rng)) {
    SCOPED_TRACE(mask.describe());
    for (const auto& q : sets)
      for (const auto& k : sets) {
        bool brute = false;
        for (const int64_t qp : q)
          for (const int64_t kp : k) brute = brute || mask.allows(qp, kp);
        ASSERT_EQ(mask.sees_any(q, k), brute);
        (brute ? seen : unseen) += 1;
      }
  }
  EXPECT_GT(seen, 100);  // both answers are exercised
  EXPECT_GT(unseen, 100);
}

// MaskSpec::allows is band AND documents AND pattern, element by element.
TEST(BlockSparseMask, AllowsIsTheConjunction) {
  MaskSpec m = parsed("bigbird-causal:0,1,1,B=4", 30);
  m.doc_offsets = make_document_offsets(30, 2);
  for (int64_t qp = 0; qp < 30; ++qp)
    for (int64_t kp = 0; kp < 30; ++kp) {
      const bool same_doc = (qp < m.doc_offsets[1]) == (kp < m.doc_offsets[1]);
      EXPECT_EQ(m.allows(qp, kp),
                kp <= qp && same_doc && m.block_pattern->allows_blocks(qp / 4, kp / 4))
          << qp << " " << kp;
    }
}

// Tiles of every size over contiguous, zigzag, striped and scattered positions: the per-element
// test equals MaskSpec::allows; a tile called empty has no visible pair and one called full has
// no hidden pair; with a pattern alone the class is exact.
TEST(BlockSparseMask, ClassifyIsNeverWrong) {
  std::mt19937_64 rng(11);
  const int64_t seq = 53;
  const auto sets = position_sets(seq, rng);
  std::vector<MaskSpec> masks = pattern_masks(seq, rng);
  int64_t empty = 0, full = 0, partial = 0;
  for (size_t mi = 0; mi < masks.size(); ++mi) {
    const MaskSpec& mask = masks[mi];
    SCOPED_TRACE(mask.describe());
    const bool pattern_alone =
        mask.window_left < 0 && mask.window_right < 0 && !mask.has_documents();
    for (size_t a = 0; a < sets.size(); a += 3)
      for (size_t b = 0; b < sets.size(); b += 2) {
        const auto& q = sets[a];
        const auto& k = sets[b];
        AttentionParams params;
        params.mask = mask;
        params.q_positions = q.data();
        params.k_positions = k.data();
        const cpu::MaskEvaluator eval(params, q.size(), k.size());
        const int64_t nq = q.size(), nk = k.size();
        for (int64_t i = 0; i < nq; ++i)
          for (int64_t j = 0; j < nk; ++j) ASSERT_EQ(eval.allowed(i, j), mask.allows(q[i], k[j]));
        for (int trial = 0; trial < 20; ++trial) {
          const int64_t i0 = rng() % nq, i1 = i0 + 1 + rng() % (nq - i0);
          const int64_t j0 = rng() % nk, j1 = j0 + 1 + rng() % (nk - j0);
          int64_t visible = 0;
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = j0; j < j1; ++j) visible += eval.allowed(i, j);
          const int64_t total = (i1 - i0) * (j1 - j0);
          const cpu::TileKind kind = eval.classify(i0, i1, j0, j1);
          SCOPED_TRACE(std::to_string(i0) + ".." + std::to_string(i1) + " x " + std::to_string(j0) +
                       ".." + std::to_string(j1));
          if (kind == cpu::TileKind::kEmpty) {
            ASSERT_EQ(visible, 0);
          } else if (kind == cpu::TileKind::kFull) {
            ASSERT_EQ(visible, total);
          }
          if (pattern_alone) {
            const cpu::TileKind exact = visible == 0       ? cpu::TileKind::kEmpty
                                        : visible == total ? cpu::TileKind::kFull
                                                           : cpu::TileKind::kPartial;
            ASSERT_EQ(kind, exact);
          }
          (kind == cpu::TileKind::kEmpty  ? empty
           : kind == cpu::TileKind::kFull ? full
                                          : partial) += 1;
        }
      }
  }
  EXPECT_GT(empty, 100);  // every class is exercised
  EXPECT_GT(full, 100);
  EXPECT_GT(partial, 100);
}

// The CPU kernel's 64 x 64 tiles on a pattern of 64-token blocks: the blocks the pattern leaves
// out are empty tiles (skipped), the ones it keeps full.
TEST(BlockSparseMask, KernelTilesThePatternEmptiesAreSkipped) {
  const int64_t seq = 64 * 12;
  AttentionParams params;
  params.mask = parsed("bigbird:1,1,1,B=64", seq);
  const cpu::MaskEvaluator eval(params, seq, seq);
  const BlockPattern& p = *params.mask.block_pattern;
  int64_t empty = 0;
  for (int64_t qb = 0; qb < 12; ++qb)
    for (int64_t kb = 0; kb < 12; ++kb) {
      const cpu::TileKind kind = eval.classify(qb * 64, qb * 64 + 64, kb * 64, kb * 64 + 64);
      EXPECT_EQ(kind, p.allows_blocks(qb, kb) ? cpu::TileKind::kFull : cpu::TileKind::kEmpty);
      empty += kind == cpu::TileKind::kEmpty;
    }
  EXPECT_EQ(empty, 12 * 12 - p.pair_count());
  EXPECT_GT(empty, 12 * 12 / 2);
}

// Dense calls cannot express a pattern: the planner hands such pairs to positions-aware kernels.
TEST(BlockSparseMask, BlockPlanIsNotDense) {
  std::vector<int64_t> pos(32);
  for (int64_t i = 0; i < 32; ++i) pos[i] = i;
  EXPECT_TRUE(plan_block_pair(pos, pos, MaskSpec::causal()).dense);
  EXPECT_FALSE(plan_block_pair(pos, pos, parsed("bigbird-causal:1,1,1,B=8", 32)).dense);
}

}  // namespace
}  // namespace seqpar
