// Planning a distributed attention problem (include/seqpar/distributed_attention.hpp): the
// schedule request from the layout and mask, the algorithm (named, or auto's choice), and this
// rank's steps. The executors run what this hands them.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>

#include "parallel/forward_state.hpp"
#include "planner/auto_choice.hpp"
#include "seqpar/distributed_attention.hpp"

namespace seqpar {
namespace {

// Bytes of the batches a rank waits for with no compute between their post and their wait: the
// transfers nothing hides.
int64_t exposed_bytes(const std::vector<Step>& steps, int rank, const Layout& layout, const BlockBytes& bytes,
                      const Topology& topology, int head_parts) {
  std::map<int, size_t> posted_at;
  int64_t exposed = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].kind == StepKind::kPost) posted_at[steps[i].batch] = i;
    if (steps[i].kind != StepKind::kWait) continue;
    const size_t post = posted_at.at(steps[i].batch);
    bool hidden = false;
    for (size_t j = post + 1; j < i && !hidden; ++j) hidden = steps[j].kind == StepKind::kCompute;
    if (!hidden) exposed += walk_bytes({steps[post]}, rank, layout, bytes, topology, head_parts).total;
  }
  return exposed;
}

// The busiest rank's pairs (compute steps), and its bytes over both passes with the exposed
// ones counted twice (sent, then waited for).
struct Cost {
  double work = 0;  // shard pairs of all heads
  int64_t bytes = 0;
};
Cost cost_of(const Algorithm& a, const ScheduleRequest& req, const Layout& layout, const BlockBytes& bytes) {
  Cost c;
  const std::vector<RankSchedule> all = all_rank_schedules(a, req);
  for (int r = 0; r < req.ranks; ++r) {
    c.work = std::max(c.work, compute_work(all[r].forward, req, all[r].head_parts));
    int64_t b = 0;
    for (Pass p : {Pass::kForward, Pass::kBackward}) {
      const std::vector<Step>& steps = all[r].pass(p);
      b += walk_bytes(steps, r, layout, bytes, req.topology, all[r].head_parts).total +
           exposed_bytes(steps, r, layout, bytes, req.topology, all[r].head_parts);
    }
    c.bytes = std::max(c.bytes, b);
  }
  return c;
}

// The head groups of a device plan: every rank computes the same count (the groups' messages
// must match), from every rank's peak.
StatusOr<int> head_groups_for(const PlanOptions& o, const Algorithm& a, const ScheduleRequest& req,
                              const Layout& layout, const BlockBytes& bytes) {
  const std::vector<RankSchedule> all = all_rank_schedules(a, req);
  const int parts = all.empty() ? 1 : all[0].head_parts;
  // Groups split the heads first, head parts each group's heads: both must divide.
  const auto refusal = [&](int g) {
    if (bytes.kv_heads % g) return std::string("must divide the K/V heads (") + std::to_string(bytes.kv_heads) + ")";
    const std::string why = head_parts_refusal(parts, bytes.heads / g, bytes.kv_heads / g);
    return why.empty() ? why : "leave heads for the " + std::to_string(parts) + " head parts: " + why;
  };
  if (o.head_groups > 0) {
    const std::string why = refusal(o.head_groups);
    SP_CHECK_ARG(why.empty(), "head groups (" + std::to_string(o.head_groups) + ") " + why);
    return o.head_groups;
  }
  const double shard = double(bytes.of(BlockKind::kQuery, layout.max_local_len()));
  const double limit = std::min(double(o.workspace_limit_bytes),
                                std::max(double(o.workspace_floor_bytes), o.workspace_limit_shards * shard));
  int most = 1;  // where no count fits the budget: the most groups the heads allow
  for (int g = 1; g <= bytes.kv_heads; ++g) {
    if (!refusal(g).empty()) continue;
    BlockBytes group = bytes;
    group.heads /= g, group.kv_heads /= g;
    int64_t peak = 0;
    for (int r = 0; r < req.ranks; ++r)
      for (Pass p : {Pass::kForward, Pass::kBackward})
        peak = std::max(peak, peak_block_bytes(all[r].pass(p), p, r, layout, group, parts));
    if (double(peak) <= limit) return g;
    most = g;
  }
  return most;
}

}  // namespace

StatusOr<PlanOptions> plan_options_from_spec(const std::string& spec, Topology topology) {
  const size_t colon = spec.find(':');
  PlanOptions o(spec.substr(0, colon), topology);
  SP_CHECK_ARG(o.algorithm == "auto" || find_algorithm(o.algorithm),
               "unknown algorithm '" + o.algorithm + "' (one of " + algorithm_names() + "|auto)");
  if (colon == std::string::npos) return o;
  std::string rest = spec.substr(colon + 1);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string item = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    SP_CHECK_ARG(eq != std::string::npos, "algorithm option '" + item + "' in '" + spec + "' is not KEY=VALUE");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "ulysses") {
      char* end = nullptr;
      const long u = std::strtol(value.c_str(), &end, 10);
      SP_CHECK_ARG(!value.empty() && *end == 0 && u >= 0 && u < (1 << 20),
                   "ulysses=" + value + " in '" + spec + "' is not a degree (0: the algorithm chooses)");
      o.ulysses = int(u);
    } else if (key == "ring") {
      SP_CHECK_ARG(find_algorithm(value), "ring=" + value + " in '" + spec + "' names no algorithm (one of " +
                                              algorithm_names() + ")");
      o.ring_algorithm = value;
    } else {
      return SP_STATUS(StatusCode::kInvalidArgument,
                       "unknown algorithm option '" + key + "' in '" + spec + "' (ulysses=N, ring=NAME)");
    }
  }
  return o;
}

ForwardState::ForwardState() : impl_(std::make_unique<Impl>()) {}
ForwardState::~ForwardState() = default;
ForwardState::ForwardState(ForwardState&&) noexcept = default;
ForwardState& ForwardState::operator=(ForwardState&&) noexcept = default;
bool ForwardState::empty() const { return impl_->blocks.empty(); }

BlockBytes block_bytes_for(const TensorView& q, const TensorView& k, const AttentionBackend& backend) {
  const BackendCaps caps = backend.caps();
  const DType rounded = caps.device ? DType::kF32 : q.dtype;
  BlockBytes b{q.shape[0], q.shape[2], k.shape[2], q.shape[3], q.dtype, rounded, rounded, caps.takes_delta};
  b.results_rounded = caps.writes_parts && q.dtype != DType::kF32;
  return b;
}

std::vector<RankSchedule> all_rank_schedules(const Algorithm& algorithm, const ScheduleRequest& request) {
  std::vector<RankSchedule> all;
  for (int r = 0; r < request.ranks; ++r) all.push_back(algorithm.make_schedule(request, r));
  return all;
}

StatusOr<AttentionPlan> plan_attention(const PlanOptions& options, const Layout& layout,
                                       const AttentionParams& params, const BlockBytes& bytes, int rank,
                                       const AttentionBackend& backend) {
  SP_CHECK_ARG(!params.q_positions && !params.k_positions,
               "distributed attention takes positions from the layout; leave q/k_positions null");
  SP_CHECK_ARG(rank >= 0 && rank < layout.ranks(), "rank " + std::to_string(rank) + " is not one of the layout's " +
                                                       std::to_string(layout.ranks()));
  SP_CHECK_ARG(options.topology.ranks_per_node >= 0, "ranks per node must be positive (0: one node)");
  SP_CHECK_ARG(bytes.kv_heads > 0 && bytes.heads % bytes.kv_heads == 0,
               "query heads (" + std::to_string(bytes.heads) + ") must be a multiple of K/V heads (" +
                   std::to_string(bytes.kv_heads) + ")");
  SP_RETURN_IF_ERROR(params.mask.validate(layout.seq_len()));
  AttentionPlan plan{nullptr, layout, params, {}, {}, 0, nullptr, {}, 1, {}};
  plan.rank = rank;
  plan.backend = &backend;
  plan.block_bytes = bytes;
  plan.request = make_schedule_request(layout, params.mask, bytes.heads, bytes.kv_heads, options.topology);
  SP_CHECK_ARG(options.ulysses >= 0, "the Ulysses degree must be positive (0: the algorithm chooses)");
  plan.request.ulysses = options.ulysses;
  plan.request.ring_algorithm = options.ring_algorithm;
  plan.request.keep_forward_state = options.keep_forward_state;
  plan.request.receive_into_spans = receives_into_spans(bytes);
  std::optional<planner::AutoChoice> predicted;
  if (options.algorithm == "auto")
    predicted = planner::choose_by_predicted_time(options, layout, params, bytes, backend);
  if (predicted) {
    plan.algorithm = find_algorithm(predicted->algorithm);
    plan.request.ulysses = predicted->ulysses;
    plan.request.ring_algorithm = predicted->ring;
    plan.choice = predicted->why;
  } else if (options.algorithm == "auto") {
    Cost best{std::numeric_limits<double>::max(), std::numeric_limits<int64_t>::max()};
    for (const Algorithm* a : all_algorithms()) {
      if (!a->supports(plan.request).empty()) continue;
      const Cost c = cost_of(*a, plan.request, layout, bytes);
      if (c.work < best.work - 1e-9 || (c.work <= best.work + 1e-9 && c.bytes < best.bytes)) {
        best = c;
        plan.algorithm = a;
      }
    }
    char work[32];
    std::snprintf(work, sizeof work, "%.3g", best.work);
    plan.choice = std::string("auto chose ") + plan.algorithm->name + ": the busiest rank computes " + work +
                  " shard pairs (of all heads) and sends " + std::to_string(best.bytes) +
                  " bytes, counting those no compute hides twice";
  } else {
    plan.algorithm = find_algorithm(options.algorithm);
    SP_CHECK_ARG(plan.algorithm, "unknown algorithm '" + options.algorithm + "' (one of " + algorithm_names() + "|auto)");
    const std::string why_not = plan.algorithm->supports(plan.request);
    SP_CHECK_SUPPORTED(why_not.empty(), why_not);
  }
  plan.schedule = plan.algorithm->make_schedule(plan.request, rank);
  // Device backends split the heads to fit the workspace budget; host ones only when asked
  // (the one executor runs the same group loop on either device, and CPU tests exercise it).
  if (predicted && (backend.caps().device || options.head_groups > 0)) {
    plan.head_groups = predicted->head_groups;  // the planner's: the fewest that fit the device
    plan.block_bytes.head_groups = plan.head_groups;
  } else if (backend.caps().device || options.head_groups > 0) {
    SP_ASSIGN_OR_RETURN(plan.head_groups, head_groups_for(options, *plan.algorithm, plan.request, layout, bytes));
    plan.block_bytes.head_groups = plan.head_groups;
  }
  return plan;
}

}  // namespace seqpar
