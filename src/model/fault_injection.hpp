// Test hooks of the fault suite: SEQPAR_FAULT_KILL makes a rank kill its own process with SIGKILL
// at a named point of a given step, as a crashed node would, so the restart tests need no
// timing luck. The variable holds comma-separated WHERE:STEP:RANK[:ATTEMPT] entries; WHERE is
// forward (after the first layer's forward), backward (after the first layer's backward, the
// last of the backward), optimizer (before the update) or save (the checkpoint of STEP steps,
// its file half written); an entry fires only in
// the launcher's attempt ATTEMPT (TORCHELASTIC_RESTART_COUNT, default 0), so a killed run that
// restarts and replays the step is not killed again. Unset: the points cost a thread-local read.
#pragma once

#include <cstdint>

namespace seqpar::model {

// The step and world rank this thread's next fault points belong to (the trainer sets them).
void set_fault_context(int64_t step, int rank);
// SIGKILLs this process when an entry of SEQPAR_FAULT_KILL names this point, step (-1: the
// context's), rank and attempt.
void fault_point(const char* where, int64_t step = -1);

}  // namespace seqpar::model
