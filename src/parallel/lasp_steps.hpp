// One rank's LASP pass as data (seqpar/lasp.hpp): the chain and the all-gather, forward and
// backward, in one pass order for both devices. lasp.cpp runs the steps over the linear backend
// table and the communicator; walking them gives the bytes each rank sends, which the byte
// formula and the counters must equal.
//
// The backward is the forward with time reversed: its dState enters a rank from the *later*
// ranks and leaves for the earlier ones, so "upstream" is rank - 1 in the forward and rank + 1 in
// the backward, and one builder writes both. The order, on every rank and device:
//   1. post the receive of the entering state from upstream (chain);
//   2. the rank's own contribution from a zero start, the cheap half of its pass (the state
//      alone; the dState alone), so that what the downstream rank waits on is that and a combine;
//   3. the entering state (received, or combined from the gathered contributions), and the
//      leaving one = decay^n entering + own, sent downstream (chain);
//   4. the full pass from the entering state: outputs (gradients); the forward's last rank's
//      full pass also gives the final state.
#pragma once

#include <cstdint>
#include <vector>

#include "seqpar/lasp.hpp"

namespace seqpar::lasp {

// The state buffers of a pass, one state each ([B, H, d_k, d_v]); kGathered + r is rank r's
// contribution in the all-gather. The forward's entering and leaving states are kept for the
// backward (and the caller), so the backward's dStates have buffers of their own.
enum Slot : int {
  kNoSlot = -1,  // an absent (zero) state, or one not written
  kEntering = 0,  // forward: the state entering this rank's tokens
  kLeaving,       // forward: the state leaving them
  kArriving,      // backward: the dState arriving from the later ranks
  kDeparting,     // backward: the dState leaving for the earlier ones
  kOwn,           // this rank's own contribution from a zero start
  kGathered,      // + r: rank r's own contribution, gathered
};
// Slots a pass over `ranks` ranks may use with this algorithm.
int slot_count(LaspAlgorithm algorithm, int ranks);

enum class Op : uint8_t {
  kZero,     // slot <- 0
  kOwn,      // slot <- this rank's own contribution (forward: state; backward: dState)
  kPostRecv, // batch `batch`: receive slot from `peer`
  kPostSend, // batch `batch`: send slot to `peer`
  kWait,     // complete batch `batch`
  kGather,   // all-gather slot from every rank into kGathered + r
  kCombine,  // out <- decay^(tokens of rank `peer`) carried + slot
  kFull,     // the full pass from `carried` (kNoSlot: zero): forward o and, if out, the final
             // state; backward dq, dk, dv against `kept` (the forward's entering state)
};

struct Step {
  Op op = Op::kZero;
  int slot = kNoSlot;
  int carried = kNoSlot;
  int out = kNoSlot;
  int kept = kNoSlot;
  int peer = -1;
  int batch = -1;
};

enum class Pass : uint8_t { kForward, kBackward };

// The steps of rank `rank` of `ranks` (algorithm kChain or kAllGather).
std::vector<Step> pass_steps(LaspAlgorithm algorithm, Pass pass, int rank, int ranks);

// Bytes the steps send: one state per send; an all-gather sends (ranks - 1) states, as the
// Communicator's ring counts it.
int64_t walk_bytes(const std::vector<Step>& steps, int ranks, int64_t state_bytes);

}  // namespace seqpar::lasp
