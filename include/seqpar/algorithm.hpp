// The registry of distributed attention algorithms. Each algorithm is one file under
// src/parallel/algorithms/ that fills an Algorithm (nccl-tests' per-collective table is the
// model): its name, whether it can run a request (and why not), and its schedule for a rank.
// Adding one: write that file and its tests, and add its name to SEQPAR_ALGORITHMS in
// src/parallel/algorithms/registry.cpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "seqpar/schedule.hpp"

namespace seqpar {

struct Algorithm {
  const char* name;
  const char* summary;  // one line for --help and --print-schedule
  // Empty when the algorithm can run this request, else the reason it refuses.
  std::string (*supports)(const ScheduleRequest& request);
  // The forward and backward steps of `rank` (the request must be supported).
  RankSchedule (*make_schedule)(const ScheduleRequest& request, int rank);
};

const std::vector<const Algorithm*>& all_algorithms();
// nullptr when no algorithm has this name.
const Algorithm* find_algorithm(std::string_view name);
// "ring|burst|..." (for help texts).
std::string algorithm_names();

}  // namespace seqpar
