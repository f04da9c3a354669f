// The training checkpoint file, one format for every device's trainer: "SEQPARCK", a version,
// the parameter count, the steps taken, the optimizer's steps and the data position, then the
// parameters and AdamW's two moments, whole and in fp32, then (version 2) a checksum of it all.
// Written to PATH.tmp and moved into place, so the last good checkpoint stays whole until the
// new one is; a write that fails (a full disk) removes PATH.tmp and leaves PATH as it was.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "seqpar/status.hpp"

namespace seqpar::model {

struct TrainingState {
  int64_t steps = 0;            // steps taken
  int64_t optimizer_steps = 0;  // AdamW's (bias corrections)
  uint64_t data_position = 0;   // TrainingData::position()
  std::vector<float> params, first_moment, second_moment;  // whole, one size
};

Status write_checkpoint(const std::string& path, const TrainingState& state);
// Refuses a file that is not a checkpoint, is truncated or corrupt (checksum), or holds another
// count of parameters.
StatusOr<TrainingState> read_checkpoint(const std::string& path, int64_t parameter_count);

}  // namespace seqpar::model
