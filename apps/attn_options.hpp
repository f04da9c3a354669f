// `seqpar attn`'s options: what the user asked for (AttnOptions, filled by CLI11), and the job
// resolved from them (Job: dtype, mask, ranks, communicator, check mode), refused before
// anything large is allocated when it is malformed or cannot fit in memory.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "seqpar/attention.hpp"
#include "seqpar/dtype.hpp"
#include "seqpar/status.hpp"

namespace seqpar::app {

struct AttnOptions {
  std::string algo = "ring";
  std::string layout = "zigzag";
  std::string mask = "causal";
  std::string dtype;  // empty: fp32 on cpu, bf16 on cuda
  std::string device = "cpu";
  std::string check = "auto";  // auto | full | sampled | rows | single | none
  int64_t seq = 4096;
  int64_t batch = 1;
  int64_t heads = 8;
  int64_t kv_heads = 0;  // 0: same as heads
  int64_t head_dim = 64;
  int ranks = 4;
  int ranks_per_node = 0;    // nodes of this many consecutive ranks (double ring, link classes); 0: one node
  int ulysses = 0;           // ulysses-ring: the Ulysses degree (0: the largest the heads allow in a node)
  std::string ring_algo = "ring";  // ulysses-ring: the ring-family algorithm across Ulysses groups
  bool keep_forward_state = false;  // Ulysses, Attention2D: keep forward blocks for the backward
  int print_schedule = -1;   // >= 0: print this rank's steps and exit
  int threads_per_rank = 0;  // 0: cores / ranks
  int64_t sample_rows = 64;
  int head_groups = 0;        // cuda: 0 = the planner's
  int64_t max_call_rows = 0;  // cuda: 0 = no limit on the rows of one cuDNN call
  uint64_t seed = 1234;
  bool json = false;
  bool ignore_memory_estimate = false;  // run even when the estimate exceeds what is available
  std::string dump_dir;
};

// How the ranks talk.
enum class Launch {
  kThreads,         // thread ranks of this process: CPU, or GPUs (one each, NCCL)
  kSharedGpu,       // thread ranks sharing GPU 0 (the local communicator moves device buffers)
  kMpi,             // MPI processes (CPU ranks), or NCCL bootstrapped through MPI
  kTorchrun,        // NCCL processes started by torchrun
};

struct Job {
  AttnOptions opt;
  bool on_gpu = false;
  DType dtype = DType::kF32;
  MaskSpec mask;
  int64_t kv_heads = 0;
  int ranks = 1;
  int threads_per_rank = 1;
  Launch launch = Launch::kThreads;
  std::string comm_backend;  // for the report
  std::string check_mode;    // auto resolved: full, sampled, rows, single or none
  bool need_global = false;  // rank 0 gathers whole tensors (to check or to dump)
};

// Adds the options to the `attn` subcommand, with their help text.
void add_attn_options(CLI::App& cmd, AttnOptions& o);

// Validates the options and resolves the job. ranks_given: --ranks was on the command line.
// Refuses (kInvalidArgument / kUnsupported) with the reason, before any large allocation: a
// problem too large for this machine's memory gets the estimate and what is available; an
// unwritable --dump folder is found here, not after the run.
StatusOr<Job> resolve_job(const AttnOptions& options, bool ranks_given, bool under_mpi, bool under_torchrun);

// Score FLOPs (B H S^2 D) up to which --check auto checks every row, and up to which it checks
// sampled rows; above that it skips the oracle.
inline constexpr double kFullCheckLimit = 2.0e9;
inline constexpr double kSampledCheckLimit = 2.0e12;

}  // namespace seqpar::app
