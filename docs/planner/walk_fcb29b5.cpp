// The bytes the GPU executor of fcb29b5 sent (issue 35, validation): that commit's schedules walked
// with that commit's GPU wire: bf16 inputs, every result (O, dQ, dK/dV) and row stat in fp32, the
// query pack carrying O for cuDNN (D for our kernels). The runs of 2026-11-26 were measured there;
// ef065c1 changed the wire (results home in bf16), so today's planner cannot walk it. Built against
// fcb29b5's sources, not this tree's:
//
//   git archive fcb29b5 src include | tar -x -C /tmp/fcb29b5
//   cd /tmp/fcb29b5 && g++ -std=c++20 -O1 -Iinclude -Isrc -o /tmp/walk_fcb29b5 \
//     /work/main/docs/planner/walk_fcb29b5.cpp src/parallel/algorithms/*.cpp src/parallel/schedule.cpp \
//     src/parallel/layout.cpp src/parallel/block_lifetimes.cpp src/core/{mask,block_pattern,status,dtype,tensor,gpu_stub}.cpp
//   python3 docs/planner/causes.py /tmp/walk_fcb29b5     # every 2026-11-26 line against its walk
//
// Usage: walk_fcb29b5 ALGO SEQ RANKS HEADS KV_HEADS HEAD_DIM MASK LAYOUT HEAD_GROUPS PACK_HAS_DELTA
// prints the busiest rank's forward and backward bytes.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "seqpar/algorithm.hpp"
#include "seqpar/layout.hpp"
#include "seqpar/mask.hpp"
#include "seqpar/schedule.hpp"

using namespace seqpar;

int main(int argc, char** argv) {
  if (argc != 11) {
    std::fprintf(stderr, "usage: %s ALGO SEQ RANKS HEADS KV_HEADS HEAD_DIM MASK LAYOUT HEAD_GROUPS PACK_HAS_DELTA\n", argv[0]);
    return 2;
  }
  const std::string algo = argv[1], mask_text = argv[7], layout_name = argv[8];
  const int64_t seq = std::atoll(argv[2]), heads = std::atoll(argv[4]), kv_heads = std::atoll(argv[5]),
                head_dim = std::atoll(argv[6]);
  const int ranks = std::atoi(argv[3]), groups = std::atoi(argv[9]);
  const bool delta = std::atoi(argv[10]) != 0;
  auto kind = parse_layout(layout_name);
  if (!kind.ok()) return std::fprintf(stderr, "%s\n", kind.status().message().c_str()), 2;
  auto layout = Layout::create(kind.value(), seq, ranks);
  auto mask = parse_mask(mask_text, seq);
  if (!layout.ok() || !mask.ok()) return std::fprintf(stderr, "bad layout or mask\n"), 2;
  const ScheduleRequest request = make_schedule_request(layout.value(), mask.value(), heads, kv_heads, Topology{});
  const Algorithm* algorithm = find_algorithm(algo);
  if (!algorithm) return std::fprintf(stderr, "no algorithm %s\n", algo.c_str()), 2;
  if (const std::string why = algorithm->supports(request); !why.empty())
    return std::fprintf(stderr, "refused: %s\n", why.c_str()), 2;
  // fcb29b5's block_bytes_for on a device: accumulators and stats fp32 (src/parallel/plan.cpp there).
  BlockBytes bytes{1, heads, kv_heads, head_dim, DType::kBF16, DType::kF32, DType::kF32, delta};
  bytes.head_groups = groups;
  int64_t forward = 0, backward = 0;
  for (int r = 0; r < ranks; ++r) {
    const RankSchedule s = algorithm->make_schedule(request, r);
    forward = std::max(forward, walk_bytes(s.forward, r, layout.value(), bytes, Topology{}, s.head_parts).total);
    backward = std::max(backward, walk_bytes(s.backward, r, layout.value(), bytes, Topology{}, s.head_parts).total);
  }
  std::printf("%lld %lld\n", static_cast<long long>(forward), static_cast<long long>(backward));
  return 0;
}
