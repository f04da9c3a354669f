// The discrete-event simulation of simulator.hpp. Ranks advance in global time order (a
// priority queue of each rank's clock), so transfers claim their ports in the order they become
// ready and the port queues are first come, first served.
#include "planner/simulator.hpp"

#include <algorithm>
#include <map>
#include <queue>

namespace seqpar::planner {
namespace {

struct TransferState {
  double bytes = 0;
  LinkClass link = LinkClass::kIntra;
  double send_posted = -1, recv_posted = -1;  // -1: not yet
  double arrives = -1;                        // -1: not scheduled yet
};

struct RankState {
  size_t next = 0;
  double clock = 0, compute = 0, waited = 0;
  std::map<int, std::vector<int>> batch_transfers;  // batch -> transfer ids (sends and receives)
};

}  // namespace

StatusOr<SimResult> simulate(const std::vector<std::vector<SimOp>>& programs, const LinkTiming& links) {
  const int ranks = int(programs.size());
  std::vector<RankState> rank(ranks);
  std::vector<TransferState> transfers;
  // Per ordered pair (from, to): transfer ids in order (the k-th send meets the k-th receive),
  // made by whichever side posts first, and how many sends and receives each side has posted.
  std::map<std::pair<int, int>, std::vector<int>> pair_ids;
  std::map<std::pair<int, int>, size_t> sends_posted, recvs_posted;
  std::vector<double> out_free(size_t(ranks) * kNumLinkClasses, 0), in_free(out_free);
  std::map<std::pair<int, int>, double> pair_free;  // when each (from, to) pair's last transfer is through

  const auto port = [&](std::vector<double>& free, int r, LinkClass l) -> double& {
    return free[size_t(r) * kNumLinkClasses + size_t(l)];
  };
  // Called when the later of the two posts is processed: that post's time is the global time
  // now, so transfers are scheduled in the order they become ready.
  const auto schedule = [&](int id, int from, int to) {
    TransferState& t = transfers[id];
    const double ready = std::max(t.send_posted, t.recv_posted);
    double& out = port(out_free, from, t.link);
    double& in = port(in_free, to, t.link);
    const double start = std::max({ready, out, in});
    const double pair_busy = links.occupancy_s(t.link, t.bytes);
    const double port_busy = pair_busy / std::max(1.0, links.port_pairs(t.link));
    out = in = start + port_busy;
    double& pair = pair_free[{from, to}];
    pair = std::max(start + port_busy, std::max(ready, pair) + pair_busy);
    t.arrives = pair + links.latency_s(t.link);
  };

  using Entry = std::pair<double, int>;  // (clock, rank)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> ready;
  for (int r = 0; r < ranks; ++r) ready.push({0.0, r});
  std::vector<bool> queued(ranks, true);
  // A rank blocked at a wait is queued again when a transfer of that batch gets scheduled.
  std::vector<int> blocked_batch(ranks, -1);
  std::map<int, std::vector<int>> transfer_ranks;  // transfer id -> the two ranks

  const auto transfer_id = [&](int from, int to, std::map<std::pair<int, int>, size_t>& posted) {
    std::vector<int>& ids = pair_ids[{from, to}];
    const size_t k = posted[{from, to}]++;
    if (k < ids.size()) return ids[k];
    const int id = int(transfers.size());
    transfers.push_back({});
    ids.push_back(id);
    transfer_ranks[id] = {from, to};
    return id;
  };
  const auto wake = [&](int id) {
    for (int r : transfer_ranks[id])
      if (!queued[r] && blocked_batch[r] >= 0) {
        queued[r] = true;
        ready.push({rank[r].clock, r});
      }
  };

  while (!ready.empty()) {
    const int r = ready.top().second;
    ready.pop();
    queued[r] = false;
    RankState& me = rank[r];
    if (me.next >= programs[r].size()) continue;
    const SimOp& op = programs[r][me.next];
    if (op.kind == SimOp::kCompute) {
      me.clock += op.seconds;
      me.compute += op.seconds;
    } else if (op.kind == SimOp::kPost) {
      me.clock += op.seconds;
      std::vector<int>& ids = me.batch_transfers[op.batch];
      for (const SimSend& s : op.sends) {
        SP_CHECK_ARG(s.to >= 0 && s.to < ranks && s.to != r, "a send to rank " + std::to_string(s.to));
        const int id = transfer_id(r, s.to, sends_posted);
        transfers[id].bytes = s.bytes;
        transfers[id].link = s.link;
        transfers[id].send_posted = me.clock;
        ids.push_back(id);
        if (transfers[id].recv_posted >= 0) schedule(id, r, s.to), wake(id);
      }
      for (int from : op.recv_from) {
        SP_CHECK_ARG(from >= 0 && from < ranks && from != r, "a receive from rank " + std::to_string(from));
        const int id = transfer_id(from, r, recvs_posted);
        transfers[id].recv_posted = me.clock;
        ids.push_back(id);
        if (transfers[id].send_posted >= 0) schedule(id, from, r), wake(id);
      }
    } else {  // kWait
      double done = me.clock;
      bool all = true;
      for (int id : me.batch_transfers[op.batch]) {
        if (transfers[id].arrives < 0) all = false;
        else done = std::max(done, transfers[id].arrives);
      }
      if (!all) {
        blocked_batch[r] = op.batch;
        continue;  // woken when the missing transfers are scheduled
      }
      blocked_batch[r] = -1;
      me.waited += done - me.clock;
      me.clock = done + op.seconds;
    }
    ++me.next;
    if (me.next < programs[r].size()) {
      queued[r] = true;
      ready.push({me.clock, r});
    }
  }

  SimResult result;
  for (int r = 0; r < ranks; ++r) {
    if (rank[r].next < programs[r].size())
      return SP_STATUS(StatusCode::kInvalidArgument,
                       "the simulated ranks deadlock: rank " + std::to_string(r) + " waits forever at op " +
                           std::to_string(rank[r].next));
    result.rank_seconds.push_back(rank[r].clock);
    result.compute_s.push_back(rank[r].compute);
    result.waited_s.push_back(rank[r].waited);
    result.seconds = std::max(result.seconds, rank[r].clock);
  }
  for (const TransferState& t : transfers)
    if (t.send_posted < 0 || t.recv_posted < 0)
      return SP_STATUS(StatusCode::kInvalidArgument, "a simulated send or receive was never matched");
  return result;
}

}  // namespace seqpar::planner
