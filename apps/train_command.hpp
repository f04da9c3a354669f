// `seqpar train`: trains the LLaMA-style model of include/seqpar/model.hpp with each sequence
// split over the ranks (threads, or MPI processes under mpirun; on GPUs, threads sharing GPU 0,
// one thread per GPU with --gpus, or one process per GPU under torchrun), printing a line per
// step, JSON lines with --json, and the loss curve as an SVG at the end.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace seqpar::app {

struct TrainCliOptions {
  std::string model = "tiny";  // preset
  std::string config;          // JSON model config (overrides the preset)
  int64_t vocab = 0;           // > 0: overrides the model's vocabulary
  std::string data = "recall";
  int64_t seq = 256;
  int64_t batch = 32;
  int64_t steps = 250;
  int ranks = 2;
  bool ranks_given = false;  // --ranks on the command line
  int gpus = 0;              // cuda: > 0 ranks, one GPU each (threads, NCCL between them)
  int data_parallel = 1;
  int zero = 0;
  bool zero_overlap = true;
  std::string algo = "auto";
  int ulysses = 0;                  // ulysses-ring's degree (0: the largest that fits a node)
  std::string ring_algo = "ring";   // ulysses-ring's ring dimension
  std::string linear_sp = "auto";   // linear-attention layers: lasp, lasp2, ulysses or auto
  std::string layout = "auto";  // zigzag; contiguous for models with linear-attention layers (LASP)
  int ranks_per_node = 0;
  std::string checkpointing = "none";
  bool offload_checkpoints = false;  // the kept checkpoints wait in host memory
  int offload_keep_layers = 1;       // but the last this many layers' stay on the device
  double lr = 3e-3;
  int64_t warmup = 10;
  double weight_decay = 0.1;
  double clip = 1.0;
  uint64_t seed = 1234;
  int threads_per_rank = 0;
  std::string save;
  int64_t save_every = 0;
  std::string resume;          // a checkpoint file, or "auto": the newest whole one in checkpoint_dir
  std::string checkpoint_dir;  // step-numbered checkpoints for restarts
  int keep = 3;                // checkpoints kept in checkpoint_dir
  std::string plot;
  std::string init_from;  // safetensors weights to start from
  std::string export_dir;  // model.safetensors + config.json at the end
  std::string dump_dir;    // the run's record for comparing with another implementation
  bool json = false;
  std::string device = "cpu";
  int64_t lm_head_chunk = 1024;
  int64_t tile_tokens = -1;
  bool deterministic = false;
  bool profile = false;  // --profile: each step's work by kind
  double progress = 30;   // --progress: seconds between rank 0's lines inside a long step
  int32_t pack = -1;
  bool pack_global_positions = false;
};

void add_train_command(CLI::App& app, TrainCliOptions& options, int* exit_code);
int run_train(const TrainCliOptions& options);

}  // namespace seqpar::app
