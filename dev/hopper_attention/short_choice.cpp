// short_choice.cpp: CPU-only look at the forward's tile per mask (short_tiles_pay, hopper_tiles.hpp): per mask and
// length, the forward plans of 128 x 192 tiles (persist192) and 64 x 64 tiles (persist64), their
// entries per head, entries per listed query tile, visible / computed scores, the ratio of
// computed scores (64 x 64 over 128 x 192) and the rule's choice. Masks as ab_masks.py draws them
// (plan_choice.cpp's generator, so the cuts differ from a timed draw). Runs here, no GPU needed:
//   g++ -std=c++20 -O2 -I src dev/hopper_attention/short_choice.cpp -o /tmp/short_choice && /tmp/short_choice
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
                                    "window256",  "window512",  "window1024", "window2048",  "window4096", "bigbird64",
                                    "bigbird128", "bigbird256"};
  std::vector<int> seqs = {32768, 65536, 131072};
  if (argc > 1) masks = {argv[1]};
  std::printf("| S | mask | entries 128x192 (per listed tile) | vis/computed | entries 64x64 (per listed tile) | "
              "vis/computed | computed 64x64 / 128x192 | rule |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (int S : seqs)
    for (const std::string& name : masks) {
      std::mt19937_64 rng(S);
      const PairMask m = make(name, S, rng);
      const std::vector<int32_t> rows = row_intervals(m);
      const SideTiles tall = side_tiles(m, rows, S, S, 128, 192, 0, 0, false);
      const SideTiles sh = side_tiles(m, rows, S, S, 64, 64, 0, 0, false);
      const double vis = visible_pairs(m);
      auto listed = [](const SideTiles& t) {
        int n = 0;
        for (size_t i = 0; i + 1 < t.begin.size(); ++i) n += t.begin[i + 1] > t.begin[i];
        return n;
      };
      const double ct = 128.0 * 192 * tall.entry_count(), cs = 64.0 * 64 * sh.entry_count();
      std::printf("| %dK | %s | %lld (%.1f) | %.2f | %lld (%.1f) | %.2f | %.3f | %s |\n", S / 1024, name.c_str(),
                  (long long)tall.entry_count(), double(tall.entry_count()) / listed(tall), vis / ct,
                  (long long)sh.entry_count(), double(sh.entry_count()) / listed(sh), vis / cs, cs / ct,
                  short_tiles_pay(tall, sh) ? "persist64" : "persist192");
    }
}
