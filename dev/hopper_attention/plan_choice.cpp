// plan_choice.cpp: CPU-only look at the backend's per-mask choice of the D = 128 backward's query
// tile (backend_plan / tall_tiles_pay in src/kernels/hopper/hopper_tiles.hpp): per mask and length,
// both backward plans' sizes (query rows 80 x q80's entries over 64 x base's, entries the pattern
// flags), the choice, and what planning costs on the host (the backend plans once per mask and
// shard pair, then caches): the old plan (64-row backward only) against backend_plan (both
// backward plans), then pack_tiles, each the median of 5. Masks as ab_masks.py draws them
// (documents of uniformly random cuts, causal inside; causal windows; BigBird: neighbours, a
// global first block row and column, 3 random blocks per row). Runs here, no GPU needed:
//   g++ -std=c++20 -O2 -I src dev/hopper_attention/plan_choice.cpp -o /tmp/plan_choice && /tmp/plan_choice
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/hopper/hopper_tiles.hpp"

using namespace seqpar::hopper;

static PairMask make(const std::string& name, int S, std::mt19937_64& rng) {
  PairMask m;
  m.seq_q = m.seq_k = S;
  if (name.rfind("docs", 0) == 0) {
    const int n = std::stoi(name.substr(4));
    std::set<int64_t> cuts;
    while (int(cuts.size()) < n - 1) cuts.insert(1 + int64_t(rng() % uint64_t(S - 1)));
    m.doc_offsets = {0};
    m.doc_offsets.insert(m.doc_offsets.end(), cuts.begin(), cuts.end());
    m.doc_offsets.push_back(S);
    m.window_right = 0;
  } else if (name.rfind("window", 0) == 0) {
    m.window_left = std::stoi(name.substr(6)), m.window_right = 0;
  } else {  // bigbirdB
    const int block = std::stoi(name.substr(7));
    const int64_t nb = S / block;
    m.pattern_block = block;
    m.pattern_begin = {0};
    for (int64_t qb = 0; qb < nb; ++qb) {
      std::set<int64_t> row = {0};
      for (int64_t kb = std::max<int64_t>(0, qb - 1); kb <= std::min(nb - 1, qb + 1); ++kb) row.insert(kb);
      for (int r = 0; r < 3; ++r) row.insert(int64_t(rng() % uint64_t(nb)));
      if (qb == 0)
        for (int64_t kb = 0; kb < nb; ++kb) row.insert(kb);
      m.pattern_cols.insert(m.pattern_cols.end(), row.begin(), row.end());
      m.pattern_begin.push_back(int64_t(m.pattern_cols.size()));
    }
  }
  return m;
}

template <class F>
static double median_ms(F&& f) {
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[2];
}

int main() {
  std::printf("| S | mask | rows q80 / base | pattern-flagged base / q80 | chosen rows | plan 64 only ms | "
              "backend_plan ms | pack ms |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (int S : {32768, 131072}) {
    std::mt19937_64 rng{uint64_t(S)};
    for (const char* name : {"docs16", "docs64", "docs256", "window1024", "window4096", "window16384", "bigbird64",
                             "bigbird128", "bigbird256"}) {
      const PairMask m = make(name, S, rng);
      const TileShape ts = tile_shape(128);
      const TilePlan narrow = plan_tiles(m, ts.fwd_bm, ts.fwd_bn, ts.bwd_bm, ts.bwd_bn);
      const TilePlan tall = plan_tiles(m, ts.fwd_bm, ts.fwd_bn, ts.bwd_bm_tall, ts.bwd_bn);
      const auto flagged = [](const SideTiles& t) {
        return std::count_if(t.entries.begin(), t.entries.end(), [](int32_t e) { return (e & kTilePatternMask) != 0; });
      };
      TilePlan chosen;
      const double t_old = median_ms([&] { (void)plan_tiles(m, ts.fwd_bm, ts.fwd_bn, ts.bwd_bm, ts.bwd_bn); });
      const double t_new = median_ms([&] { chosen = backend_plan(m, 128); });
      const double t_pack = median_ms([&] { (void)pack_tiles(chosen, m); });
      std::printf("| %d | %s | %.3f | %ld / %ld | %d | %.1f | %.1f | %.1f |\n", S, name,
                  double(ts.bwd_bm_tall) * double(tall.bwd.entry_count()) /
                      (double(ts.bwd_bm) * double(std::max<int64_t>(1, narrow.bwd.entry_count()))),
                  long(flagged(narrow.bwd)), long(flagged(tall.bwd)), chosen.bwd.other_tile_rows, t_old, t_new, t_pack);
    }
  }
  return 0;
}
