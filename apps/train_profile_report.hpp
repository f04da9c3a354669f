// `seqpar train --profile`'s output: a step's work by kind (StepReport::work_ms) as --json's
// work_ms object and as the text line under the step's line.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "seqpar/trainer.hpp"

namespace seqpar::app {

// Each kind's milliseconds, the pass's span, "outside_pass" (the step's wall clock less that
// span: batch, gradient sums, optimizer) and the step.
nlohmann::ordered_json work_object(const StepReport& r);
// The same as one line: each kind's share of the step, the largest first, none under 0.5%.
std::string work_line(const StepReport& r);

}  // namespace seqpar::app
