// `seqpar linear-attn`: causal linear attention with decay, forward + backward over N ranks
// (threads, or the processes of mpirun) with LASP or LASP-2, checked against the fp64 oracle,
// with byte counts per rank.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace seqpar::app {

struct LinearAttnOptions {
  std::string algo = "lasp";
  std::string dtype = "fp32";
  std::string decay = "1";  // one value, or a comma list with one per query head
  int64_t seq = 4096;
  int64_t batch = 1;
  int64_t heads = 8;
  int64_t kv_heads = 0;  // 0: same as heads
  int64_t dk = 64;
  int64_t dv = 64;
  int64_t chunk = 64;
  double scale = 1.0;
  int ranks = 4;
  uint64_t seed = 1234;
  bool check = false;
  bool json = false;
  std::string dump_dir;
};

// Adds the `linear-attn` subcommand to `app`; the callback runs it and stores the exit code.
void add_linear_attn_command(CLI::App& app, LinearAttnOptions& options, int* exit_code);

// Runs the job; returns the exit code (0 ok, 1 failed check or bytes, 2 bad arguments).
// ranks_given: --ranks was on the command line (under mpirun it must equal the process count).
int run_linear_attn(const LinearAttnOptions& options, bool ranks_given);

}  // namespace seqpar::app
