// Progress lines for long training steps: a step of the 8B preset at 1M tokens takes minutes, so
// rank 0 says where its pass is (forward or backward, layers done, seconds into the step) at most
// once every `every_s` seconds. The trainer sets the context per step on each rank's thread; the
// layer pass reports each layer as its host loop finishes it (on a GPU that is the layer's work
// queued, which the host's waits on the attention's exchanges keep within about a layer of the
// device).
#pragma once

#include <cstdint>

namespace seqpar::model {

// This thread's step and reporting interval: every_s < 0 turns the lines off (ranks other than
// 0), 0 prints every layer.
void set_step_progress(int64_t step, double every_s);
// Layer `done` of `layers` (1-based, in the order the phase runs them) finished its `phase`
// ("forward", "backward"): a line on stderr when every_s has passed since the step's start or the
// last line.
void report_layer(const char* phase, int64_t done, int64_t layers);

}  // namespace seqpar::model
