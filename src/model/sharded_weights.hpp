// ZeRO-3's weight store (transformer.hpp's WeightStore) for the trainer: a rank keeps its slice
// [rank * slice, (rank + 1) * slice) of the flat parameters' compute copy and of the gradients. A
// unit's weights are all-gathered when it computes (each rank sends its part of the unit, padded
// to the largest part) and dropped after; a unit's gradient is made whole on every rank, then
// reduce-scattered so that each rank adds the sums of its part to its slice.
//
// With `overlap`, those collectives run on a second lane of the training memory (a stream of its
// own on a GPU) under the pass's compute: the weights of the unit the previous pass asked for next
// are gathered as soon as the current one is handed out, and each gradient's reduce-scatter runs
// while the next layer's backward computes. The guess is the previous pass's order of units
// (the same every step), so the first pass gathers every unit when asked; a unit asked out of
// that order is gathered at once, as without overlap. Every rank makes the same calls in the same
// order, so the collectives match.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "model/training_memory.hpp"
#include "seqpar/transformer.hpp"

namespace seqpar::model {

class ShardedWeights final : public WeightStore {
 public:
  // compute and grads: this rank's slice of the compute copy and of the gradients (`slice`
  // elements each, in `memory`).
  ShardedWeights(Communicator& world, TrainingMemory& memory, int64_t slice, const void* compute, float* grads,
                 bool overlap);

  StatusOr<const void*> weights(int64_t begin, int64_t end) override;
  Status release(int64_t begin, int64_t end) override;
  StatusOr<void*> gradient(int64_t begin, int64_t end) override;
  Status gradient_done(int64_t begin, int64_t end) override;

  // After each pass, failed or not: the memory's stream waits for every gradient sum (the
  // optimizer reads them), a gather left unused is dropped, and this pass's order of units
  // becomes the next pass's guess.
  Status end_pass();
  // Units whose weights were gathered ahead and then asked for (the overlap at work).
  int64_t gathered_ahead() const { return gathered_ahead_; }

 private:
  struct Gathered {  // a unit's weights and the buffers its all-gather used
    std::unique_ptr<Buffer> unit, send, recv;
  };
  struct Held {
    std::unique_ptr<Buffer> unit;
    bool on_lane = false;  // from the lane's arenas: given back there, after the pass's last use
  };
  struct Ahead {
    int64_t begin = 0, end = 0;
    Gathered g;
  };

  StatusOr<Gathered> gather(TrainingMemory& on, int64_t begin, int64_t end);
  Status gather_next();
  int64_t mine() const { return world_.rank() * slice_; }
  // Rank r's part of [begin, end): its slice there (possibly empty).
  std::pair<int64_t, int64_t> part(int r, int64_t begin, int64_t end) const;
  int64_t largest_part(int64_t begin, int64_t end) const;

  Communicator& world_;
  TrainingMemory& memory_;
  std::unique_ptr<TrainingMemory> lane_;  // null without overlap
  int64_t slice_;
  size_t element_bytes_;
  const char* compute_;
  float* grads_;
  std::map<int64_t, Held> held_;
  std::map<int64_t, Array<float>> gradients_;
  std::optional<Ahead> ahead_;
  std::vector<std::pair<int64_t, int64_t>> order_, last_order_;  // units asked for, this pass and the last
  int64_t gathered_ahead_ = 0;
};

}  // namespace seqpar::model
