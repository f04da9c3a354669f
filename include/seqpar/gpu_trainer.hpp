// Training on a GPU: the model of model.hpp with bf16 weights and activations, fp32 master
// weights, gradients, optimizer state and residual stream (the layers' CUDA halves,
// src/model/*.cu), attention through the GPU executor (any --algo; cuDNN or our kernels), the
// fused LM head + cross-entropy, AdamW on the device. Ranks: one, or thread ranks sharing the
// GPU (the local communicator; the gradients are summed through host memory, for tests).
// Checkpoint files as the CPU trainer's; data parallel groups and ZeRO are the CPU trainer's so far.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "seqpar/trainer.hpp"

namespace seqpar {

class GpuTrainer {
 public:
  static StatusOr<std::unique_ptr<GpuTrainer>> create(const TrainOptions& options, Communicator& comm);
  ~GpuTrainer();
  Status step(StepReport* report);
  int64_t steps_done() const;
  StatusOr<std::vector<float>> gather_parameters() const;  // the fp32 master weights
  Status set_parameters(const std::vector<float>& params);
  StatusOr<std::vector<float>> last_gradient() const;
  const std::vector<std::vector<int32_t>>& last_inputs() const;
  const std::vector<std::vector<int32_t>>& last_targets() const;
  const AttentionPlan& attention_plan() const;
  // Device bytes our buffers held at most since the trainer was made (weights, optimizer,
  // activations, the head's scratch, the attention's blocks; not cuBLAS's or cuDNN's own).
  int64_t peak_device_bytes() const;
  // Saves (rank 0 writes; every rank calls) and restores the whole state in the CPU trainer's
  // checkpoint format (trainer.hpp): fp32 master weights, AdamW's moments and steps, the data
  // position. Either trainer resumes the other's file.
  Status save(const std::string& path) const;
  Status load(const std::string& path);

  struct Impl;

 private:
  explicit GpuTrainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace seqpar
