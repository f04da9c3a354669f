// `seqpar attn`: one distributed attention forward + backward on N ranks (threads, or MPI
// processes under mpirun), checked against the fp64 oracle, with timings and byte counts.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace seqpar::app {

struct AttnOptions {
  std::string algo = "ring";
  std::string layout = "zigzag";
  std::string mask = "causal";
  std::string dtype;  // empty: fp32 on cpu, bf16 on cuda
  std::string device = "cpu";
  std::string check = "auto";  // auto | full | sampled | none
  int64_t seq = 4096;
  int64_t batch = 1;
  int64_t heads = 8;
  int64_t kv_heads = 0;  // 0: same as heads
  int64_t head_dim = 64;
  int ranks = 4;
  int ranks_per_node = 0;   // nodes of this many consecutive ranks (double ring, link classes); 0: one node
  int print_schedule = -1;  // >= 0: print this rank's steps and exit
  int threads_per_rank = 0;  // 0: cores / ranks
  int64_t sample_rows = 64;
  int head_groups = 0;  // cuda: 0 = automatic
  int64_t max_call_rows = 0;  // cuda: 0 = no limit on the rows of one cuDNN call
  uint64_t seed = 1234;
  bool json = false;
  std::string dump_dir;
};

// Adds the `attn` subcommand to `app`; the callback runs it and stores the exit code.
void add_attn_command(CLI::App& app, AttnOptions& options, int* exit_code);

// Runs the job; returns the process exit code (0 ok, 1 failed check or runtime error).
int run_attn(const AttnOptions& options, bool ranks_given);

}  // namespace seqpar::app
