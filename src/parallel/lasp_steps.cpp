// LASP's pass order as steps (lasp_steps.hpp), and the walk of their bytes.
#include "parallel/lasp_steps.hpp"

namespace seqpar::lasp {

int slot_count(LaspAlgorithm algorithm, int ranks) {
  return kGathered + (algorithm == LaspAlgorithm::kAllGather ? ranks : 0);
}

std::vector<Step> pass_steps(LaspAlgorithm algorithm, Pass pass, int rank, int ranks) {
  const bool forward = pass == Pass::kForward;
  const int toward = forward ? 1 : -1;  // the direction states travel
  const int up = rank - toward, down = rank + toward;
  const bool has_up = up >= 0 && up < ranks, has_down = down >= 0 && down < ranks;
  const int in = forward ? kEntering : kArriving, out = forward ? kLeaving : kDeparting;
  // Only the forward keeps what leaves a rank: the state the next layer or the caller reads
  // (the last rank's is the final state). The dState leaving rank 0 has no reader.
  const bool keeps_out = forward;
  const int kept = forward || rank == 0 ? kNoSlot : kEntering;
  std::vector<Step> s;
  auto full = [&](bool writes_out) {
    s.push_back({.op = Op::kFull, .carried = has_up ? in : kNoSlot, .out = writes_out ? out : kNoSlot, .kept = kept});
  };
  if (algorithm == LaspAlgorithm::kChain) {
    if (has_up) {
      s.push_back({.op = Op::kPostRecv, .slot = in, .peer = up, .batch = 0});
    } else {
      s.push_back({.op = Op::kZero, .slot = in});  // the kept entering state of rank 0 reads zero
    }
    if (has_down) {
      // Without an upstream state the own contribution is what leaves.
      s.push_back({.op = Op::kOwn, .slot = has_up ? kOwn : out});
      if (has_up) {
        s.push_back({.op = Op::kWait, .batch = 0});
        s.push_back({.op = Op::kCombine, .slot = kOwn, .carried = in, .out = out, .peer = rank});
      }
      s.push_back({.op = Op::kPostSend, .slot = out, .peer = down, .batch = 1});
    } else if (has_up) {
      s.push_back({.op = Op::kWait, .batch = 0});
    }
    full(!has_down && keeps_out);  // the last rank's full pass gives what leaves it
    if (has_down) s.push_back({.op = Op::kWait, .batch = 1});
    return s;
  }
  // All-gather: every rank's own contribution, gathered; the entering state combines the
  // upstream ones, farthest first (forward: ranks 0..rank-1; backward: ranks-1..rank+1).
  s.push_back({.op = Op::kZero, .slot = in});
  if (ranks > 1) {
    s.push_back({.op = Op::kOwn, .slot = kOwn});
    s.push_back({.op = Op::kGather, .slot = kOwn});
    for (int r = forward ? 0 : ranks - 1; r != rank; r += toward)
      s.push_back({.op = Op::kCombine, .slot = kGathered + r, .carried = in, .out = in, .peer = r});
    if (keeps_out) s.push_back({.op = Op::kCombine, .slot = kOwn, .carried = in, .out = out, .peer = rank});
  }
  full(ranks == 1 && keeps_out);
  return s;
}

int64_t walk_bytes(const std::vector<Step>& steps, int ranks, int64_t state_bytes) {
  int64_t bytes = 0;
  for (const Step& s : steps) {
    if (s.op == Op::kPostSend) bytes += state_bytes;
    if (s.op == Op::kGather) bytes += (ranks - 1) * state_bytes;
  }
  return bytes;
}

}  // namespace seqpar::lasp
