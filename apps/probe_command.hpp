// `seqpar probe`: measures this machine (local attention rates by backend, length and mask; link
// bandwidth and latency by message size; launch, post and wait overheads; GEMM rate; memory
// bandwidth and size) and writes a cluster description that `seqpar plan --cluster FILE` reads.
// The measuring is src/planner/probe*.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "planner/probe.hpp"

namespace seqpar::app {

struct ProbeCliOptions {
  planner::ProbeOptions probe;  // device empty until parsed: cuda where a GPU is visible, else cpu
  int gpus = 0;                 // cuda: GPUs whose links are measured (0: every visible one)
  int ranks = 0;                // cpu: thread ranks whose links are measured (0: 2)
  std::string out;              // the JSON's file; empty: stdout
};

void add_probe_command(CLI::App& app, ProbeCliOptions& options, int* exit_code);
int run_probe(ProbeCliOptions options);

}  // namespace seqpar::app
