// `seqpar attn`: one distributed attention forward + backward on N ranks (threads, MPI
// processes under mpirun, GPUs), checked against the fp64 oracle, with timings and byte counts.
#pragma once

#include <CLI/CLI.hpp>

#include "attn_options.hpp"

namespace seqpar::app {

// Adds the `attn` subcommand to `app`; the callback runs it and stores the exit code.
void add_attn_command(CLI::App& app, AttnOptions& options, int* exit_code);

// Runs the job; returns the process exit code (0 ok, 1 failed check or runtime error, 2 bad
// arguments).
int run_attn(const AttnOptions& options, bool ranks_given);

}  // namespace seqpar::app
