// `seqpar attn`'s report: progress lines on stderr, and on stdout the table (times, GFLOP/s,
// bytes sent per rank against the bytes walked from the schedules, the pairs each rank
// computed, the check) and with --json one JSON object.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn_check.hpp"

namespace seqpar::app {

// "1.50 GiB".
std::string human_bytes(double bytes);
// A line on stderr, with the seconds since the first one (stdout stays the table and JSON).
void progress(const std::string& text);

// What each rank measured, gathered on rank 0.
struct RankFigures {
  int64_t sent[2] = {0, 0};  // bytes, forward and backward
  int64_t pairs = 0;         // forward pairs computed
  int64_t inter = 0;         // bytes sent to other nodes, both passes
};

// Prints the table (and the JSON with --json). run0: rank 0's run (the plan every rank shares
// but for its rank); times: the slowest rank's. Returns whether every rank's measured bytes
// equal the bytes walked from its schedule.
bool print_report(const Job& job, const RankRun& run0, const std::vector<RankFigures>& ranks, const double times[2],
                  const CheckResult& check);

}  // namespace seqpar::app
