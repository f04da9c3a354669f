// Cutting one rank's steps out of an algorithm's all-ranks plan (plan_events.hpp).
#include "parallel/algorithms/plan_events.hpp"

#include <algorithm>
#include <map>

namespace seqpar::parallel {

std::vector<Step> project(const PlanEvents& plan, int rank) {
  int last_round = -1;
  for (const auto& c : plan.computes) last_round = std::max(last_round, c.round);
  for (const auto& m : plan.moves) last_round = std::max(last_round, m.wait);
  std::vector<Step> steps;
  int batches = 0;
  std::map<int, std::vector<int>> waits_at;  // round -> batch ids completing there
  for (int round = 0; round <= last_round; ++round) {
    // Batches starting now, ordered by completion round, their transfers in plan order.
    std::map<std::pair<int, Collective>, Step> starting;
    for (const auto& m : plan.moves) {
      if (m.post != round || (m.from != rank && m.to != rank)) continue;
      Step& s = starting[{m.wait, m.collective}];
      s.kind = StepKind::kPost;
      s.round = round;
      s.collective = m.collective;
      if (m.from == rank) s.sends.push_back({m.to, m.block, Combine::kReplace, m.row_begin, m.row_end});
      if (m.to == rank) s.recvs.push_back({m.from, m.block, m.combine, m.row_begin, m.row_end});
    }
    for (auto& [key, s] : starting) {
      s.batch = batches++;
      waits_at[key.first].push_back(s.batch);
      steps.push_back(std::move(s));
    }
    for (const auto& c : plan.computes)
      if (c.rank == rank && c.round == round) {
        Step s;
        s.kind = StepKind::kCompute;
        s.round = round;
        s.q_shard = c.q_shard;
        s.kv_shard = c.kv_shard;
        steps.push_back(s);
      }
    for (int id : waits_at[round]) {
      Step s;
      s.kind = StepKind::kWait;
      s.round = round;
      s.batch = id;
      steps.push_back(s);
    }
  }
  return steps;
}

}  // namespace seqpar::parallel
