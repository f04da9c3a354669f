// The training loop on one rank. The world's W ranks form data_parallel groups of W / G
// consecutive ranks; each group trains on its own sequences of the step's global batch, each rank
// on its shard of those sequences (sequence parallel through the attention algorithms), and the
// gradients are summed over the whole world before the optimizer step. ZeRO: stage 1 shards the
// optimizer's moments over the world (each rank updates its slice of the parameters, then an
// all-gather); stage 2 also reduce-scatters the gradients instead of all-reducing them; stage 3
// keeps each rank's slice of the parameters alone, gathering a unit's (the embedding, a layer)
// when it computes and reduce-scattering its gradient when done.
// One loop for both devices (TrainOptions::device): on the CPU every array is fp32 (the model in
// fp64 is the tests' oracle); on a GPU the weights compute in bf16 from fp32 master weights, and
// gradients, AdamW's moments and the residual stream stay fp32, all on the device (one GPU per
// rank, or thread ranks sharing one GPU for tests). Checkpoints are one format for both.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "seqpar/optimizer.hpp"
#include "seqpar/train_data.hpp"
#include "seqpar/transformer.hpp"

namespace seqpar {

namespace model {
// Threads BLAS (OpenBLAS's own pool) may use for one matrix product: 1 when ranks are threads.
void set_blas_threads(int threads);
}  // namespace model

struct TrainOptions {
  DeviceKind device = DeviceKind::kCpu;  // where this rank trains (kCuda: the current GPU)
  ModelConfig model;
  std::string data = "recall";
  int64_t seq = 256;
  int64_t batch = 8;  // sequences per step and data-parallel group
  int data_parallel = 1;  // G: groups (the world's size must be a multiple)
  int zero_stage = 0;     // 0, 1, 2 or 3 (parameters sharded too, gathered unit by unit)
  // ZeRO-3: each unit's gather and gradient sum on a second stream under the layers' compute (the
  // next unit gathered ahead: one unit's weights more on the device); false: in line.
  bool zero_overlap = true;
  int64_t steps = 100;
  std::string algorithm = "auto";
  int ulysses = 0;                       // ulysses-ring's degree (0: the largest that fits a node)
  std::string ring_algorithm = "ring";   // ulysses-ring's ring dimension
  // Linear-attention layers over the sequence-parallel ranks: LASP's chain or all-gather, the
  // LASP paper's ulysses baseline, or auto (seqpar/lasp.hpp).
  LaspAlgorithm linear_sp = LaspAlgorithm::kAuto;
  LayoutKind layout = LayoutKind::kZigzag;
  int ranks_per_node = 0;
  Checkpointing checkpointing = Checkpointing::kNone;
  // What the policy keeps of a layer (not none) waits in host memory (GPU: pinned, copied on a
  // stream of its own under the neighbouring layers' compute) from the layer's forward to its
  // backward; the same bits as without.
  bool offload_checkpoints = false;
  // With offload_checkpoints, the last layers whose checkpoints stay on the device (at least 1,
  // the last, whose backward comes first): fewer host bytes for more device bytes.
  int offload_keep_layers = 1;
  AdamWOptions optimizer;
  uint64_t seed = 1234;  // parameters and data
  // Packing: >= 0 ends a document at each input of this token (train_data.hpp: pack_documents);
  // attention stays within documents and RoPE restarts in each unless pack_global_positions.
  int32_t pack_eod = -1;
  bool pack_global_positions = false;
  int64_t lm_head_chunk = 1024;  // GPU: rows of logits made at once (0: all of them, the unfused head)
  // A rank's rows the MLP runs at a time, its inner activations made and recomputed one tile at a
  // time, and a linear mixer's backward steps before LASP too (layer_pass.hpp; 0: all rows at
  // once, the MLP's inner activations kept for the backward; -1, the default: tile_rows()'s
  // choice). Measured on GPUs (docs/MEMORY.md): tnl-1b at 256K on one H100 peaks at 46.6 GiB with
  // it against 75.1 without, at the same speed.
  int64_t tile_tokens = -1;
  // GPU: the same bits every run, so that a resumed run equals a straight one (the attention's
  // backward through cuDNN's deterministic algorithm: Session::deterministic says its cost).
  bool deterministic = false;
  // Time each step's work by kind (StepReport::work_ms): an event pair a device op on a GPU.
  bool profile = false;
  // Rank 0 prints where a long step's pass is (phase, layers done, seconds in) at most this often
  // (model/step_progress.hpp); 0: every layer; below 0: never.
  double progress_s = 30;

  // The tile tile_tokens makes: -1 takes 8192 rows under a checkpointing policy, where a tiled
  // backward also skips the MLP's recompute (its down product), and none without one, where
  // tiles would recompute gate and up (about a fifth more products on the 1b preset).
  int64_t tile_rows() const {
    if (tile_tokens >= 0) return tile_tokens;
    return checkpointing == Checkpointing::kNone ? 0 : 8192;
  }

  // The attention planner's options these make.
  PlanOptions plan_options() const {
    PlanOptions o(algorithm, Topology{ranks_per_node});
    o.ulysses = ulysses;
    o.ring_algorithm = ring_algorithm;
    return o;
  }
};

// The options checked (model, optimizer, batch and steps) and their data source opened, its
// tokens within the model's vocabulary.
StatusOr<std::unique_ptr<TrainingData>> open_training_data(const TrainOptions& options);

struct StepReport {
  int64_t step = 0;           // 0-based, the step just taken
  double loss = 0;            // mean over the batch's counted targets, every rank
  double grad_norm = 0;       // before clipping
  double lr = 0;
  int64_t tokens = 0;         // tokens in the global batch (every group)
  double seconds = 0;         // this step, wall clock
  int64_t activation_bytes = 0;  // this rank's peak of activations (GPU: of the device's memory)
  int64_t bytes_sent = 0;     // this rank's attention traffic this step
  // With TrainOptions::profile: this rank's milliseconds by kind of work (StepLoss::work_ms).
  std::vector<std::pair<std::string, double>> work_ms;
};

class Trainer {
 public:
  static StatusOr<std::unique_ptr<Trainer>> create(const TrainOptions& options, Communicator& comm);
  ~Trainer();
  Status step(StepReport* report);
  int64_t steps_done() const;
  // The whole parameter set. Every rank calls it (under ZeRO-3 it gathers the slices).
  StatusOr<std::vector<float>> gather_parameters() const;
  // Replaces the parameters (every rank, the same values): a model loaded from safetensors.
  Status set_parameters(const std::vector<float>& params);
  // The last step's gradient summed over the ranks, before clipping (ZeRO 0 and 1: whole; with
  // ZeRO 2 a rank holds the sums of its slice alone, and this refuses).
  StatusOr<std::vector<float>> last_gradient() const;
  // The last step's global batch (every group's sequences): [sequences][seq] inputs and targets.
  const std::vector<std::vector<int32_t>>& last_inputs() const;
  const std::vector<std::vector<int32_t>>& last_targets() const;
  const AttentionPlan& attention_plan() const;
  // Device bytes taken at most since the trainer was made (weights, optimizer, activations,
  // scratch, the attention's blocks; not cuBLAS's or cuDNN's own). 0 on the CPU.
  int64_t peak_device_bytes() const;

  // Saves (rank 0 writes; every rank calls) and restores the whole state: fp32 parameters, the
  // optimizer's moments and steps, the data position, whole whatever the ZeRO stage (a file
  // resumes on either device and any rank count). Resuming continues bit for bit.
  Status save(const std::string& path) const;
  Status load(const std::string& path);

  struct Impl;

 private:
  explicit Trainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace seqpar
