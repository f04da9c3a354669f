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
#include "../../tests/hopper_mask_draws.hpp"

using namespace seqpar::hopper;

static PairMask make(const std::string& name, int S, std::mt19937_64& rng) { return seqpar::testing::draw_mask(name, S, rng); }

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
