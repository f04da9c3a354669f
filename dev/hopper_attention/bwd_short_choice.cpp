// bwd_short_choice.cpp: CPU-only look at the backward's key tile per mask for short64 (hopper_bwd_short.cuh,
// session u): per mask and length, the backward plans of base (128-key tiles x 64-row query tiles) and
// short64 (64-key tiles x 64-row query tiles), their entries per head (boundary), visible / computed
// scores, the ratio of computed scores (64 x 64 x entries over 128 x 64 x entries) and the library's
// rule short_bwd_pays (hopper_tiles.hpp: short64 where it computes at most 0.85 of base's scores). Masks as ab_masks.py draws them (plan_choice.cpp's generator,
// so the cuts differ from a timed draw). Runs here, no GPU needed:
//   g++ -std=c++20 -O2 -I src dev/hopper_attention/bwd_short_choice.cpp -o /tmp/bwd_short_choice && /tmp/bwd_short_choice
#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/hopper/hopper_tiles.hpp"
#include "../../tests/hopper_mask_draws.hpp"

using namespace seqpar::hopper;

static PairMask make(const std::string& name, int S, std::mt19937_64& rng) { return seqpar::testing::draw_mask(name, S, rng); }

int main(int argc, char** argv) {
  std::vector<std::string> masks = {"docs16",     "docs32",     "docs64",     "docs128",     "docs256",    "docs512",
                                    "docs1024",   "window128",  "window256",  "window512",   "window1024", "window4096",
                                    "bigbird64",  "bigbird128", "bigbird256"};
  std::vector<int> seqs = {32768, 65536, 131072};
  if (argc > 1) masks = {argv[1]};
  std::printf("| S | mask | base entries (bnd) | vis/computed | short64 entries (bnd) | vis/computed | "
              "computed short64 / base | rule |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (int S : seqs)
    for (const std::string& name : masks) {
      std::mt19937_64 rng(S);
      const PairMask m = make(name, S, rng);
      const std::vector<int32_t> rows = row_intervals(m);
      const std::vector<int32_t> cols = column_intervals(rows, S, S);
      const SideTiles base = side_tiles(m, cols, S, S, 128, 64, 0, 0, true);
      const SideTiles sh = side_tiles(m, cols, S, S, 64, 64, 0, 0, true);
      auto bnd = [](const SideTiles& t) { return (long long)flagged_entries(t); };
      const double vis = visible_pairs(m);
      const double cb = 128.0 * 64 * base.entry_count(), cs = 64.0 * 64 * sh.entry_count();
      std::printf("| %dK | %s | %lld (%lld) | %.2f | %lld (%lld) | %.2f | %.3f | %s |\n", S / 1024, name.c_str(),
                  (long long)base.entry_count(), bnd(base), vis / cb, (long long)sh.entry_count(), bnd(sh), vis / cs,
                  cs / cb, short_bwd_pays(base, sh) ? "short64" : "base");
    }
}
