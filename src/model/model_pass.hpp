// One rank's forward and backward through the model, as the trainer (trainer.cpp) drives it on
// either device: weights and gradients through a WeightStore (transformer.hpp), attention through
// the rank's sequence-parallel group. The CPU pass is Transformer<float> (transformer.cpp); the
// GPU pass (model_pass_cuda.cpp) runs the layers' CUDA halves on the training memory's stream.
#pragma once

#include <memory>

#include "model/training_memory.hpp"
#include "seqpar/trainer.hpp"

namespace seqpar::model {

class ModelPass {
 public:
  virtual ~ModelPass() = default;
  // Adds scale * d(sum of this shard's losses)/d(weights) into the store's gradients; fills loss
  // (its activation_bytes_peak: on a GPU, the device's peak).
  virtual Status forward_backward(WeightStore& store, const ShardBatch& batch, double scale, StepLoss* loss) = 0;
  virtual const AttentionPlan& attention_plan() const = 0;
  // The attention over another layout of the same length and ranks from the next pass on (the
  // documents layout of each batch's packed documents).
  virtual Status use_layout(const Layout& layout) = 0;
};

// The pass of options.device for this rank of `group` over `layout` (group.size() ranks); its
// arrays live in `memory`, which outlives it.
StatusOr<std::unique_ptr<ModelPass>> make_model_pass(const TrainOptions& options, const Layout& layout,
                                                     Communicator& group, TrainingMemory& memory);
StatusOr<std::unique_ptr<ModelPass>> make_cuda_model_pass(const TrainOptions& options, const Layout& layout,
                                                          Communicator& group, TrainingMemory& memory);

}  // namespace seqpar::model
