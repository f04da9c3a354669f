// Ulysses x ring schedules (ulysses_grid.hpp): the all-to-alls around a ring-family schedule
// whose steps are widened from one rank's shard to a Ulysses group's head-part span; and
// Ulysses with its heads in two halves whose all-to-alls overlap the other half's attention.
#include "parallel/algorithms/ulysses_grid.hpp"

#include <optional>

namespace seqpar::parallel {
namespace {

struct UlyssesGrid {
  int u = 1;
  int member(int rank) const { return rank % u; }
  int group(int rank) const { return rank / u; }
  int rank(int member, int group) const { return group * u + member; }
};

Step wait_step(int batch, int round) {
  Step s;
  s.kind = StepKind::kWait, s.batch = batch, s.round = round;
  return s;
}

bool any_in_row(const ScheduleRequest& req, int group, int u) {
  for (int q = group * u; q < (group + 1) * u; ++q)
    for (int kv = 0; kv < req.ranks; ++kv)
      if (req.visible[q][kv]) return true;
  return false;
}
bool any_in_column(const ScheduleRequest& req, int group, int u) {
  for (int kv = group * u; kv < (group + 1) * u; ++kv)
    for (int q = 0; q < req.ranks; ++q)
      if (req.visible[q][kv]) return true;
  return false;
}

// The all-to-all from sequence shards to head parts `first` + member: every other member of
// the group gets its head part of this rank's `kinds`; with `into_span`, straight into the span
// block it joins them into (Transfer::into_span).
Step shards_to_parts_post(const UlyssesGrid& g, int l, const std::vector<BlockKind>& kinds, int batch, int first,
                          bool into_span) {
  const int a = g.member(l), b = g.group(l);
  Step post;
  post.kind = StepKind::kPost, post.batch = batch, post.collective = Collective::kAllToAll;
  const auto span = [&](BlockKind k, int part) -> std::optional<Block> {
    if (!into_span) return std::nullopt;
    return Block{k, b * g.u, g.u, part};
  };
  for (int m = 0; m < g.u; ++m) {
    if (m == a) continue;
    for (BlockKind k : kinds) {
      Transfer send{g.rank(m, b), {k, l, 1, first + m}}, recv{g.rank(m, b), {k, g.rank(m, b), 1, first + a}};
      send.into_span = span(k, first + m), recv.into_span = span(k, first + a);
      post.sends.push_back(send), post.recvs.push_back(recv);
    }
  }
  return post;
}
// The span blocks of head part `part` joined from the group's shards.
void concat_part(std::vector<Step>& steps, const UlyssesGrid& g, int l, const std::vector<BlockKind>& kinds,
                 int part) {
  for (BlockKind k : kinds) {
    Step concat;
    concat.kind = StepKind::kConcat, concat.block = {k, g.group(l) * g.u, g.u, part};
    steps.push_back(concat);
  }
}
void shards_to_parts(std::vector<Step>& steps, const UlyssesGrid& g, int l, const std::vector<BlockKind>& kinds,
                     int batch, bool into_span) {
  steps.push_back(shards_to_parts_post(g, l, kinds, batch, 0, into_span));
  steps.push_back(wait_step(batch, 0));
  concat_part(steps, g, l, kinds, g.member(l));
}

// The all-to-all back: each span result of head part `part` split into its shards' pieces,
// sent home (no wait: the caller places it).
void parts_to_shards_post(std::vector<Step>& steps, const UlyssesGrid& g, int l, const std::vector<BlockKind>& kinds,
                          int batch, int round, int part) {
  if (kinds.empty()) return;
  const int a = g.member(l), b = g.group(l);
  Step post;
  post.kind = StepKind::kPost, post.batch = batch, post.collective = Collective::kAllToAll, post.round = round;
  for (BlockKind k : kinds) {
    Step split;
    split.kind = StepKind::kSplit, split.block = {k, b * g.u, g.u, part}, split.round = round;
    steps.push_back(split);
    for (int m = 0; m < g.u; ++m) {
      if (m == a) continue;
      post.sends.push_back({g.rank(m, b), {k, g.rank(m, b), 1, part}});
      post.recvs.push_back({g.rank(m, b), {k, l, 1, part - a + m}, k == BlockKind::kOutput ? Combine::kMerge : Combine::kAdd});
    }
  }
  steps.push_back(post);
}
void parts_to_shards(std::vector<Step>& steps, const UlyssesGrid& g, int l, const std::vector<BlockKind>& kinds,
                     int batch, int round) {
  if (kinds.empty()) return;
  parts_to_shards_post(steps, g, l, kinds, batch, round, g.member(l));
  steps.push_back(wait_step(batch, round));
}

// The ring dimension's steps of group b, widened to member a's span blocks of head part `part`
// and peers.
void widen(std::vector<Step>& steps, const std::vector<Step>& inner, const UlyssesGrid& g, int a, int part,
           int batch_base) {
  const auto block = [&](Block x) { return Block{x.kind, x.shard * g.u, g.u, part}; };
  for (Step s : inner) {
    s.round += 1;
    if (s.kind == StepKind::kCompute) {
      s.q_shard *= g.u, s.kv_shard *= g.u, s.q_span = s.kv_span = g.u, s.part = part;
    } else if (s.kind == StepKind::kPost || s.kind == StepKind::kWait) {
      s.batch += batch_base;
      for (auto* list : {&s.sends, &s.recvs})
        for (Transfer& t : *list) t.peer = g.rank(a, t.peer), t.block = block(t.block);
    }
    steps.push_back(std::move(s));
  }
}

int last_batch(const std::vector<Step>& steps) {
  int last = -1;
  for (const Step& s : steps) last = std::max(last, s.batch);
  return last;
}

}  // namespace

std::string ulysses_refusal(const ScheduleRequest& req, int u) {
  if (u < 1 || req.ranks % u != 0)
    return "the Ulysses degree (" + std::to_string(u) + ") must divide the ranks (" + std::to_string(req.ranks) + ")";
  if (u == 1) return {};
  return head_parts_refusal(u, req.heads, req.kv_heads);
}

int ulysses_degree(const ScheduleRequest& req) {
  if (req.ulysses > 0) return req.ulysses;
  const int L = req.topology.ranks_per_node;
  for (int u = req.ranks; u > 1; --u)
    if ((L <= 0 || L % u == 0) && ulysses_refusal(req, u).empty()) return u;
  return 1;
}

const Algorithm* ring_dimension_algorithm(const ScheduleRequest& req, std::string* why_not) {
  const Algorithm* a = find_algorithm(req.ring_algorithm);
  const std::string name = req.ring_algorithm;
  if (!a || name.rfind("ulysses", 0) == 0 || name.rfind("attention2d", 0) == 0) {
    *why_not = "the ring dimension runs a ring-family algorithm (ring, burst, ring-return, burst-return, distflash, "
               "double-ring), not '" + name + "'";
    return nullptr;
  }
  return a;
}

ScheduleRequest ring_dimension_request(const ScheduleRequest& req, int u) {
  ScheduleRequest inner = req;
  inner.ranks = req.ranks / u;
  const int L = req.topology.ranks_per_node;
  inner.topology.ranks_per_node = L <= 0 ? 0 : L % u == 0 ? L / u : 1;
  inner.heads = req.heads / u;
  inner.kv_heads = std::max<int64_t>(req.kv_heads / u, 1);
  inner.visible.assign(inner.ranks, std::vector<bool>(inner.ranks, false));
  for (int q = 0; q < req.ranks; ++q)
    for (int kv = 0; kv < req.ranks; ++kv)
      if (req.visible[q][kv]) inner.visible[q / u][kv / u] = true;
  // The rows a pair touches are worked out per shard; a group's blocks span u shards, so the
  // ring dimension trims nothing (its returns carry every row).
  if (u > 1) inner.pair_rows.clear(), inner.shard_rows.clear();
  return inner;
}

RankSchedule ulysses_schedule(const ScheduleRequest& req, int rank, int u, const Algorithm& ring) {
  const ScheduleRequest inner_req = ring_dimension_request(req, u);
  if (u == 1) return ring.make_schedule(inner_req, rank);
  const UlyssesGrid g{u};
  const int a = g.member(rank), b = g.group(rank);
  const RankSchedule inner = ring.make_schedule(inner_req, b);
  RankSchedule out;
  out.head_parts = u;
  // Forward.
  shards_to_parts(out.forward, g, rank, {BlockKind::kQuery, BlockKind::kKV}, 0, req.receive_into_spans);
  widen(out.forward, inner.forward, g, a, a, 1);
  int round = 2;
  for (const Step& s : out.forward) round = std::max(round, s.round + 1);
  std::vector<BlockKind> home;
  if (any_in_row(req, b, u)) home.push_back(BlockKind::kOutput);
  parts_to_shards(out.forward, g, rank, home, last_batch(out.forward) + 1, round);
  // Backward: the query pack and K/V cross again, or (kept forward state) only dO and the row
  // stats, which join the kept Q into the pack.
  if (req.keep_forward_state) {
    out.kept = {{BlockKind::kQuery, b * u, u, a}, {BlockKind::kKV, b * u, u, a}};
    shards_to_parts(out.backward, g, rank, {BlockKind::kGradPack}, 0, req.receive_into_spans);
    Step pack;
    pack.kind = StepKind::kPack, pack.block = {BlockKind::kQueryPack, b * u, u, a};
    out.backward.push_back(pack);
  } else {
    shards_to_parts(out.backward, g, rank, {BlockKind::kQueryPack, BlockKind::kKV}, 0, req.receive_into_spans);
  }
  widen(out.backward, inner.backward, g, a, a, 1);
  round = 2;
  for (const Step& s : out.backward) round = std::max(round, s.round + 1);
  home.clear();
  if (any_in_row(req, b, u)) home.push_back(BlockKind::kDQ);
  if (any_in_column(req, b, u)) home.push_back(BlockKind::kDKV);
  parts_to_shards(out.backward, g, rank, home, last_batch(out.backward) + 1, round);
  return out;
}

std::string ulysses_overlap_refusal(const ScheduleRequest& req) {
  if (req.ranks == 1) return {};
  return head_parts_refusal(2 * req.ranks, req.heads, req.kv_heads);
}

RankSchedule ulysses_overlap_schedule(const ScheduleRequest& req, int rank) {
  const int u = req.ranks;
  const ScheduleRequest one_group = ring_dimension_request(req, u);
  const RankSchedule inner = find_algorithm("ring")->make_schedule(one_group, 0);  // the whole-sequence compute
  if (u == 1) return inner;
  const UlyssesGrid g{u};
  const int a = g.member(rank);
  const int parts[2] = {a, u + a};  // this rank's head parts: one of each half of the heads
  RankSchedule out;
  out.head_parts = 2 * u;
  const bool rows = any_in_row(req, 0, u), columns = any_in_column(req, 0, u);
  // Both halves' all-to-alls go out first; each half computes once its own has arrived (the
  // second's arriving under the first's compute), and sends its results home at once (under the
  // second's compute); the pass ends waiting for both.
  const auto pass = [&](std::vector<Step>& steps, const std::vector<Step>& computes, bool backward) {
    const bool kept = backward && req.keep_forward_state;
    // What crosses to head parts: the forward's Q and K/V; the backward's query pack and K/V, or
    // with the forward's kept, dO and the row stats (the grad pack) alone.
    const std::vector<BlockKind> in = kept       ? std::vector<BlockKind>{BlockKind::kGradPack}
                                      : backward ? std::vector<BlockKind>{BlockKind::kQueryPack, BlockKind::kKV}
                                                 : std::vector<BlockKind>{BlockKind::kQuery, BlockKind::kKV};
    // The pieces arrive in buffers of their own even with receive_into_spans: received straight
    // into the spans, the first half's send buffers lie between the two halves' spans, and the
    // stream arena model maps 532 MiB it never holds at 256K on 4 x H200 (344 MiB so).
    for (int c = 0; c < 2; ++c) steps.push_back(shards_to_parts_post(g, rank, in, c, c * u, false));
    std::vector<BlockKind> home;
    if (rows) home.push_back(backward ? BlockKind::kDQ : BlockKind::kOutput);
    if (backward && columns) home.push_back(BlockKind::kDKV);
    for (int c = 0; c < 2; ++c) {
      steps.push_back(wait_step(c, 0));
      concat_part(steps, g, rank, in, parts[c]);
      if (kept) {
        Step pack;
        pack.kind = StepKind::kPack, pack.block = {BlockKind::kQueryPack, 0, u, parts[c]};
        steps.push_back(pack);
      }
      widen(steps, computes, g, a, parts[c], 2);
      parts_to_shards_post(steps, g, rank, home, 2 + c, 2 + c, parts[c]);
    }
    if (!home.empty())
      for (int c = 0; c < 2; ++c) steps.push_back(wait_step(2 + c, 2 + c));
  };
  pass(out.forward, inner.forward, false);
  pass(out.backward, inner.backward, true);
  if (req.keep_forward_state)
    for (int part : parts)
      out.kept.insert(out.kept.end(), {{BlockKind::kQuery, 0, u, part}, {BlockKind::kKV, 0, u, part}});
  return out;
}

}  // namespace seqpar::parallel
