// The documents layout's balance on long packed sequences (issue 37): documents with lognormal
// lengths (mean 8K, a heavy tail: some over 128K) packed into 256K, 512K and 1M tokens on P = 2,
// 4, 8 ranks. Under the documents layout the busiest rank's visible work (rank_visible_work) must
// be at most 1.1x the mean, its tokens at most 1.25x, and its ring bytes (forward + backward,
// walked from the schedules) at most 1.1x the causal ring's on the same tokens; the table printed
// beside it gives the token-balanced layouts' figures too.
// docs/RESULTS.md quotes the table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "seqpar/distributed_attention.hpp"

namespace seqpar {
namespace {

// Offsets of documents packed into `seq` tokens: lognormal lengths with mean 8192 (sigma 2, so
// the median is about 1.1K and one document in a hundred passes 128K), at least one token, the
// last one cut at the end. One stream from a fixed seed: longer sequences extend shorter ones.
std::vector<int64_t> lognormal_documents(int64_t seq) {
  const double sigma = 2.0, mu = std::log(8192.0) - sigma * sigma / 2;
  std::mt19937_64 rng(37);
  std::lognormal_distribution<double> length(mu, sigma);
  std::vector<int64_t> offsets{0};
  while (offsets.back() < seq)
    offsets.push_back(std::min(seq, offsets.back() + std::max<int64_t>(1, std::llround(length(rng)))));
  return offsets;
}

double max_over_mean(const std::vector<double>& x) {
  return *std::max_element(x.begin(), x.end()) / (std::accumulate(x.begin(), x.end(), 0.0) / double(x.size()));
}

// The busiest rank's ring bytes, forward + backward, walked from its schedules.
int64_t busiest_ring_bytes(const Layout& layout, const MaskSpec& mask, const BlockBytes& bytes) {
  const ScheduleRequest req = make_schedule_request(layout, mask, bytes.heads, bytes.kv_heads);
  int64_t most = 0;
  for (int r = 0; r < layout.ranks(); ++r) {
    const RankSchedule s = find_algorithm("ring")->make_schedule(req, r);
    most = std::max(most, walk_bytes(s.forward, r, layout, bytes, {}, s.head_parts).total +
                              walk_bytes(s.backward, r, layout, bytes, {}, s.head_parts).total);
  }
  return most;
}

TEST(DocumentBalance, BusiestRankWithinTenPercentOfTheMean) {
  // GPU blocks of the design's shape (bf16 inputs, fp32 accumulators; GQA 32:8, D = 128). The
  // ratio to the causal ring does not depend on it.
  const BlockBytes bytes{1, 32, 8, 128, DType::kBF16, DType::kF32, DType::kF32, false};
  std::printf(
      "| tokens | P | documents (> 128K) | busiest / mean visible work: contiguous | zigzag | striped | documents "
      "| documents: busiest / mean tokens | ring bytes of the busiest rank / causal ring's: zigzag | striped | "
      "documents |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const int64_t S : {int64_t(256) << 10, int64_t(512) << 10, int64_t(1) << 20}) {
    const std::vector<int64_t> offsets = lognormal_documents(S);
    const MaskSpec docs = MaskSpec::documents(offsets);
    int64_t long_docs = 0;
    for (size_t d = 0; d + 1 < offsets.size(); ++d) long_docs += offsets[d + 1] - offsets[d] > (int64_t(128) << 10);
    for (const int P : {2, 4, 8}) {
      SCOPED_TRACE(std::to_string(S) + " tokens, P = " + std::to_string(P));
      double busiest[4];
      std::vector<Layout> layouts;
      for (LayoutKind kind :
           {LayoutKind::kContiguous, LayoutKind::kZigzag, LayoutKind::kStriped, LayoutKind::kDocuments}) {
        layouts.push_back(Layout::create(kind, S, P, offsets).value());
        const std::vector<double> work = rank_visible_work(layouts.back(), docs);
        EXPECT_DOUBLE_EQ(std::accumulate(work.begin(), work.end(), 0.0), docs.visible_pairs(S));
        busiest[int(kind)] = max_over_mean(work);
      }
      EXPECT_LE(busiest[int(LayoutKind::kDocuments)], 1.1);
      std::vector<double> tokens;
      for (int r = 0; r < P; ++r) tokens.push_back(double(layouts[3].local_len(r)));
      const Layout causal_layout = Layout::create(LayoutKind::kZigzag, S, P).value();
      const double causal_ring = double(busiest_ring_bytes(causal_layout, MaskSpec::causal(), bytes));
      const double documents_bytes = busiest_ring_bytes(layouts[3], docs, bytes) / causal_ring;
      EXPECT_LE(max_over_mean(tokens), 1.25);  // the layout's token target
      EXPECT_LE(documents_bytes, 1.1);         // never much above the causal ring's traffic
      std::printf("| %lldK | %d | %zu (%lld) | %.2f | %.2f | %.2f | %.3f | %.2f | %.2f | %.2f | %.2f |\n",
                  (long long)(S >> 10), P, offsets.size() - 1, (long long)long_docs, busiest[0], busiest[1], busiest[2],
                  busiest[3], max_over_mean(tokens), busiest_ring_bytes(layouts[1], docs, bytes) / causal_ring,
                  busiest_ring_bytes(layouts[2], docs, bytes) / causal_ring, documents_bytes);
    }
  }
}

}  // namespace
}  // namespace seqpar
