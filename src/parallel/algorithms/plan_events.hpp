// An algorithm's schedule over all ranks at once, as the algorithm files build it: computes
// and transfers by round. project() cuts one rank's steps out of it, so every rank's steps
// come from one description and sends always meet their receives.
#pragma once

#include <vector>

#include "seqpar/schedule.hpp"

namespace seqpar::parallel {

struct PlanEvents {
  struct Compute {
    int rank, round, q_shard, kv_shard;
  };
  // A transfer starts at the beginning of round `post` and completes at the end of round `wait`
  // (>= post): it overlaps the computes of the rounds in between.
  struct Move {
    int from, to, post, wait;
    Block block;
    Combine combine;
    Collective collective;
    int64_t row_begin = 0, row_end = -1;  // a result's rows sent (Transfer::trimmed); -1: all
  };
  std::vector<Compute> computes;
  std::vector<Move> moves;

  void compute(int rank, int round, int q_shard, int kv_shard) {
    computes.push_back({rank, round, q_shard, kv_shard});
  }
  // Activations replace (the receiver's copy of an input); results add (dQ, dK/dV) or merge
  // (running O, LSE) into the receiver's block of the same name.
  void move(int from, int to, int post, int wait, Block block, Combine combine = Combine::kReplace,
            Collective collective = Collective::kPointToPoint) {
    moves.push_back({from, to, post, wait, block, combine, collective});
  }
  // A result sent home with only rows [row_begin, row_end) of it.
  void move_rows(int from, int to, int round, Block block, int64_t row_begin, int64_t row_end) {
    moves.push_back({from, to, round, round, block, Combine::kAdd, Collective::kPointToPoint, row_begin, row_end});
  }
};

// One rank's steps: per round, its batches that start there (one per distinct completion
// round and collective, in the order the moves were added), its computes, then the batches
// that complete.
std::vector<Step> project(const PlanEvents& plan, int rank);

}  // namespace seqpar::parallel
