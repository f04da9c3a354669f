// The planner's discrete-event simulation: ranks that each run a program of computes, posted
// batches of sends and receives, and waits, on one compute stream and one communication engine
// per rank. Sends overlap computes between their post and their wait; a transfer starts when
// both its sender and its receiver have posted it and both their ports of its link class are
// free (each rank has one outgoing and one incoming port per link class: concurrent transfers
// on a port queue in the order they become ready, which shares its bandwidth; a port may carry
// more than one pair's bandwidth, as an NVSwitch port does for an all-to-all, but a transfer
// never arrives sooner than its pair's bandwidth allows); a wait holds the
// compute stream until every transfer of its batch has arrived. Programs know nothing of
// attention: cost_model.cpp translates schedules into them, tests write them by hand.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "seqpar/schedule.hpp"
#include "seqpar/status.hpp"

namespace seqpar::planner {

struct SimSend {
  int to = 0;
  double bytes = 0;
  LinkClass link = LinkClass::kIntra;
};

struct SimOp {
  enum Kind : uint8_t { kCompute, kPost, kWait } kind = kCompute;
  double seconds = 0;          // kCompute: its duration; kPost, kWait: the host's overhead
  int batch = -1;              // kPost, kWait
  std::vector<SimSend> sends;  // kPost
  std::vector<int> recv_from;  // kPost: one entry per receive, matched to the peer's sends to
                               // this rank in order
  static SimOp compute(double seconds) { return make(kCompute, seconds, -1); }
  static SimOp post(int batch, double seconds) { return make(kPost, seconds, batch); }
  static SimOp wait(int batch, double seconds) { return make(kWait, seconds, batch); }

 private:
  static SimOp make(Kind kind, double seconds, int batch) {
    SimOp op;
    op.kind = kind, op.seconds = seconds, op.batch = batch;
    return op;
  }
};

// Seconds a transfer of `bytes` takes between one pair of ranks (bandwidth; + latency end to
// end), and how many such transfers a rank's port of that class carries at once at full speed.
struct LinkTiming {
  virtual ~LinkTiming() = default;
  virtual double occupancy_s(LinkClass link, double bytes) const = 0;
  virtual double latency_s(LinkClass link) const = 0;
  virtual double port_pairs(LinkClass) const { return 1.0; }
};

struct SimResult {
  double seconds = 0;                // when the last rank finishes
  std::vector<double> rank_seconds;  // when each rank finishes
  std::vector<double> compute_s;     // each rank's busy compute time
  std::vector<double> waited_s;      // each rank's compute stream idle at waits
};

// Runs every rank's program from time 0. Fails when a receive has no matching send or the
// ranks deadlock.
StatusOr<SimResult> simulate(const std::vector<std::vector<SimOp>>& programs, const LinkTiming& links);

}  // namespace seqpar::planner
