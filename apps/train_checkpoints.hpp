// seqpar train's checkpoints for restarts: a folder of step-NNNNNNNN.ckpt files (the one
// checkpoint format, model/checkpoint_file.hpp), the newest that reads whole taken by
// `--resume auto` (torn, truncated or corrupt ones skipped with a line saying so), all but the
// newest K removed after each save; and SIGTERM (a preempted job) turned into a request to save
// and stop that every rank sees at the same step.
#pragma once

#include <cstdint>
#include <string>

#include "seqpar/comm.hpp"
#include "seqpar/status.hpp"

namespace seqpar::app {

// DIR/step-00000012.ckpt.
std::string checkpoint_path(const std::string& dir, int64_t step);
// The newest checkpoint in dir for a model of parameter_count that reads whole; "" when there
// is none (a missing folder included). Skipped files are named on stderr with the reason.
StatusOr<std::string> newest_checkpoint(const std::string& dir, int64_t parameter_count);
// After saving step `saved`: removes all but the newest `keep` checkpoints up to it (keep <= 0:
// keeps all), and sets aside as .stale those of later steps, left by a run this one rolled back
// from, so that --resume auto never returns to them.
void prune_checkpoints(const std::string& dir, int keep, int64_t saved);
// --resume auto on every rank: rank 0 picks (newest_checkpoint) and every rank gets its choice
// ("" when none), so that ranks never resume from different steps.
StatusOr<std::string> agreed_checkpoint(Communicator& comm, const std::string& dir, int64_t parameter_count);

// From now on SIGTERM asks the run to save and stop instead of killing the process.
void catch_termination();
// Whether any rank of comm was asked to stop (collective: every rank calls it after a step).
StatusOr<bool> termination_requested(Communicator& comm);
// The exit status of a run stopped by SIGTERM after saving: 128 + 15, as a shell reports it.
inline constexpr int kTerminatedExit = 143;

}  // namespace seqpar::app
