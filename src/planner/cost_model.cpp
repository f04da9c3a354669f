// The cost model (cost_model.hpp): schedules -> simulator programs -> time; the same schedules
// walked for bytes and held blocks; the fold for clusters larger than the simulation cap.
#include "planner/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "planner/simulator.hpp"
#include "seqpar/algorithm.hpp"
#include "seqpar/distributed_attention.hpp"
#include "seqpar/mask.hpp"

namespace seqpar::planner {
namespace {

constexpr int64_t kProxyChunkRows = 512;  // the fewest rows of a layout chunk the proxy keeps
constexpr int kSampledQueries = 256;      // query rows sampled per shard pair for visible counts
// With documents, per query shard and rank count: a documents-layout shard is many runs of
// causal ramps of very unequal heights (a 45K-token document beside 4-token ones), which 256
// samples of 64K rows miss by a few percent; 16384 / P keeps the cost at 64 ranks where it was.
constexpr int kSampledDocumentRows = 16384;

// The largest power of two k dividing seq that leaves every layout chunk kProxyChunkRows rows.
int64_t proxy_factor(int64_t seq, int ranks, LayoutKind kind) {
  const int64_t chunks = kind == LayoutKind::kZigzag ? 2LL * ranks : ranks;
  int64_t k = 1;
  while (seq % (2 * k) == 0 && seq / (2 * k) >= chunks * kProxyChunkRows) k *= 2;
  return k;
}

MaskSpec proxy_mask(MaskSpec m, int64_t k) {
  if (m.window_left > 0) m.window_left = (m.window_left + k - 1) / k;
  if (m.window_right > 0) m.window_right = (m.window_right + k - 1) / k;
  for (int64_t& o : m.doc_offsets) o /= k;
  return m;
}

// Visible (query, key) pairs of every visible shard pair on the proxy layout, counted per
// query by binary search over the key shard's sorted positions (a band intersected with the
// query's document is one interval), on at most kSampledQueries evenly spaced queries.
std::vector<std::vector<double>> visible_pairs(const Layout& layout, const MaskSpec& mask, const ScheduleRequest& req) {
  const int P = layout.ranks();
  std::vector<std::vector<int64_t>> keys(P);
  for (int b = 0; b < P; ++b) {
    keys[b] = layout.positions(b);
    std::sort(keys[b].begin(), keys[b].end());
  }
  constexpr int64_t lowest = std::numeric_limits<int64_t>::min() / 4, highest = std::numeric_limits<int64_t>::max() / 4;
  std::vector<std::vector<double>> vis(P, std::vector<double>(P, 0));
  for (int a = 0; a < P; ++a) {
    const std::vector<int64_t>& q = layout.positions(a);
    const int samples = mask.has_documents() ? std::max(kSampledQueries, kSampledDocumentRows / P) : kSampledQueries;
    const int64_t stride = std::max<int64_t>(1, int64_t(q.size()) / samples);
    for (int b = 0; b < P; ++b) {
      if (!req.visible[a][b]) continue;
      int64_t counted = 0, sampled = 0;
      for (size_t i = 0; i < q.size(); i += size_t(stride), ++sampled) {
        const int64_t p = q[i];
        int64_t lo = mask.window_left < 0 ? lowest : p - mask.window_left;
        int64_t hi = mask.window_right < 0 ? highest : p + mask.window_right;
        if (mask.has_documents()) {
          const auto& off = mask.doc_offsets;
          const size_t d = size_t(std::upper_bound(off.begin(), off.end(), p) - off.begin()) - 1;
          lo = std::max(lo, off[d]);
          if (d + 1 < off.size()) hi = std::min(hi, off[d + 1] - 1);
        }
        if (hi < lo) continue;
        counted += std::upper_bound(keys[b].begin(), keys[b].end(), hi) -
                   std::lower_bound(keys[b].begin(), keys[b].end(), lo);
      }
      vis[a][b] = sampled ? double(counted) * double(q.size()) / double(sampled) : 0;
    }
  }
  return vis;
}

class ClusterLinks final : public LinkTiming {
 public:
  explicit ClusterLinks(const Cluster& c) : c_(c) {}
  double occupancy_s(LinkClass l, double bytes) const override {
    return bytes <= 0 ? 0 : bytes / (c_.link(l).gbps_at(bytes) * 1e9);
  }
  double latency_s(LinkClass l) const override { return c_.link(l).latency_s; }
  double port_pairs(LinkClass l) const override { return c_.link(l).port_pairs; }

 private:
  const Cluster& c_;
};

// What a rank's pass needs to price its steps.
struct PassPricing {
  const Cluster& cluster;
  const Problem& problem;
  const Layout& layout;
  const Topology& topology;
  const BlockBytes& group;  // one head group's blocks (the proxy's batch)
  const std::vector<std::vector<double>>& vis;
  double pair_scale;  // proxy visible pairs -> real ones (k^2)
  int head_parts;
  RateMask sparse;    // the rate kind of a partly visible step under the problem's mask
  // A shard-pair step's compute factor, forward and backward (Cluster::shard_step_*): fitted on
  // dense masks, applied to windows too, 1 under documents masks (predict_on says why).
  double shard_step[2];
};

double copy_seconds(const Cluster& c, double bytes) { return 2.0 * bytes / (c.hbm_gbps * 1e9); }

// The executor's work around a pass's steps on this rank's own blocks: the forward sets up its
// running (O, LSE), the backward builds its query pack; each ends by rounding its results into
// the caller's tensors (the traces' "out" marks: 0.06-0.3 ms forward, 0.15-0.8 ms backward at
// 16K-64K on 2 GPUs).
double own_blocks_seconds(const PassPricing& p, int rank, Pass pass, bool at_end) {
  const double n = double(p.layout.local_len(rank));
  const BlockBytes& b = p.group;
  const double bytes = pass == Pass::kForward ? double(b.of(BlockKind::kOutput, int64_t(n)))
                       : at_end ? double(b.of(BlockKind::kDQ, int64_t(n)) + b.of(BlockKind::kDKV, int64_t(n)))
                                : double(b.of(BlockKind::kQueryPack, int64_t(n)));
  return (at_end ? 1.5 : pass == Pass::kForward ? 0.5 : 1.0) * copy_seconds(p.cluster, bytes);
}

std::vector<SimOp> program(const std::vector<Step>& steps, int rank, Pass pass, const PassPricing& p) {
  std::vector<SimOp> ops;
  ops.push_back(SimOp::compute(own_blocks_seconds(p, rank, pass, false)));
  std::map<int, double> merge_bytes;  // batch -> bytes of received results merged or added
  for (const Step& s : steps) {
    SimOp op;
    if (s.kind == StepKind::kCompute) {
      double vis = 0, all = 0, queries = 0;
      for (int a = s.q_shard; a < s.q_shard + s.q_span; ++a) {
        queries += double(p.layout.local_len(a));
        for (int b = s.kv_shard; b < s.kv_shard + s.kv_span; ++b) {
          vis += p.vis[a][b];
          all += double(p.layout.local_len(a)) * double(p.layout.local_len(b));
        }
      }
      const double keys_per_query = queries > 0 ? vis * std::sqrt(p.pair_scale) / queries : 0;  // real, not proxy
      const int64_t heads = s.part == kAllHeads ? p.group.heads : head_part_range(s.part, p.head_parts, p.group.heads).count();
      const bool backward = pass == Pass::kBackward;
      const double flops = 4.0 * double(p.problem.batch) * vis * p.pair_scale * double(heads) *
                           double(p.problem.head_dim) * (backward ? 2.5 : 1.0);
      // A shard-pair step runs among the schedule's exchanges, a whole-sequence call (Ulysses') alone.
      const double factor = s.kv_span < p.layout.ranks() ? p.shard_step[backward] : 1.0;
      op.kind = SimOp::kCompute;
      op.seconds = p.cluster.launch_s +
                   factor * p.cluster.attention_seconds(flops, heads, vis < all ? p.sparse : RateMask::kFull,
                                                        p.problem.head_dim, backward, keys_per_query);
    } else if (s.kind == StepKind::kConcat || s.kind == StepKind::kSplit || s.kind == StepKind::kPack) {
      op.kind = SimOp::kCompute;
      op.seconds = copy_seconds(p.cluster, double(p.group.of(s.block, p.layout, p.head_parts)));
    } else if (s.kind == StepKind::kPost) {
      op.kind = SimOp::kPost;
      op.batch = s.batch;
      op.seconds = p.cluster.post_s;
      for (const Transfer& t : s.sends) {
        const LinkClass link =
            p.topology.node_of(t.peer) == p.topology.node_of(rank) ? LinkClass::kIntra : LinkClass::kInter;
        op.sends.push_back({t.peer, double(transfer_bytes(t, t.peer, p.layout, p.group, p.head_parts)), link});
      }
      for (const Transfer& t : s.recvs) {
        op.recv_from.push_back(t.peer);
        if (t.combine != Combine::kReplace)
          merge_bytes[s.batch] += double(transfer_bytes(t, rank, p.layout, p.group, p.head_parts));
      }
    } else {  // kWait: the host waits, then received results merge into the local ones
      op.kind = SimOp::kWait;
      op.batch = s.batch;
      op.seconds = p.cluster.wait_s + 1.5 * copy_seconds(p.cluster, merge_bytes[s.batch]);
    }
    ops.push_back(std::move(op));
  }
  ops.push_back(SimOp::compute(own_blocks_seconds(p, rank, pass, true)));
  return ops;
}

Prediction refused(std::string why, int ranks) {
  Prediction p;
  p.refusal = std::move(why);
  p.simulated_ranks = ranks;
  return p;
}

bool is_attention2d(const std::string& name) { return name.rfind("attention2d", 0) == 0; }

}  // namespace

std::string Candidate::label() const {
  if (algorithm == "ulysses-ring") return algorithm + "(u=" + std::to_string(ulysses) + "," + ring + ")";
  return algorithm;
}

Prediction predict_on(const Cluster& cluster, int ranks, const Problem& problem, const Candidate& cand) {
  const Algorithm* algorithm = find_algorithm(cand.algorithm);
  if (!algorithm) return refused("unknown algorithm '" + cand.algorithm + "'", ranks);
  const Topology topology{cluster.gpus_per_node < ranks ? cluster.gpus_per_node : 0};
  StatusOr<MaskSpec> parsed = problem.mask_spec ? StatusOr<MaskSpec>(*problem.mask_spec)
                                                 : parse_mask(problem.mask, problem.seq);
  if (!parsed.ok()) return refused(parsed.status().message(), ranks);
  const MaskSpec& mask = parsed.value();
  if (mask.has_block_pattern()) return refused("block-sparse patterns are not priced (only band and documents)", ranks);
  // The layout: the documents layout as the problem gives it (auto's), else made from the
  // mask's documents, on the real length; a token-balanced layout (a function of length and
  // ranks alone) as a proxy of the problem's kind, else the candidate's (header).
  const LayoutKind kind = problem.layout ? problem.layout->kind() : cand.layout;
  const bool documents = kind == LayoutKind::kDocuments;
  const bool given = documents && problem.layout && problem.layout->ranks() == ranks && problem.layout->seq_len() == problem.seq;
  if (documents && problem.layout && !given)
    return refused("the documents layout is priced on its own " + std::to_string(problem.layout->ranks()) +
                       " ranks only (its shards follow the documents; no fold)", ranks);
  const int64_t k = documents ? 1 : proxy_factor(problem.seq, ranks, kind);
  StatusOr<Layout> created = given       ? StatusOr<Layout>(*problem.layout)
                             : documents ? Layout::create(kind, problem.seq, ranks, mask.doc_offsets)
                                         : Layout::create(kind, problem.seq / k, ranks);
  if (!created.ok()) return refused(created.status().message(), ranks);
  const Layout& layout = created.value();
  const MaskSpec proxy = proxy_mask(mask, k);
  ScheduleRequest req = make_schedule_request(layout, proxy, problem.heads, problem.kv_heads, topology);
  req.ulysses = cand.ulysses;
  req.ring_algorithm = cand.ring;
  req.receive_into_spans = receives_into_spans(problem.wire);
  if (std::string why = algorithm->supports(req); !why.empty()) return refused(why, ranks);
  const std::vector<RankSchedule> all = all_rank_schedules(*algorithm, req);
  const int parts = all[0].head_parts;
  const int g = cand.head_groups;
  if (g < 1 || problem.kv_heads % g) return refused("head groups must divide the K/V heads", ranks);
  if (std::string why = head_parts_refusal(parts, problem.heads / g, problem.kv_heads / g); !why.empty())
    return refused("head groups leave no whole head parts: " + why, ranks);

  BlockBytes whole = problem.wire;
  whole.batch = problem.batch * k, whole.heads = problem.heads, whole.kv_heads = problem.kv_heads;
  whole.head_dim = problem.head_dim, whole.head_groups = g;
  BlockBytes group = whole;
  group.heads /= g, group.kv_heads /= g, group.head_groups = 1;

  const auto vis = visible_pairs(layout, proxy, req);
  const RateMask sparse = rate_mask_of(mask);
  // The shard-step factor (fitted on dense runs) stretches window steps too: a window's whole
  // calls (Ulysses') meet their rows' pricing (2 x H200: forward +1% .. +7%), while its
  // shard-pair steps ran 7-13% over it unstretched on 2 x H200 and 23-25% on 4, as dense steps
  // do. Not documents steps: their pricing runs slow without it (ring family +10% .. +14%
  // forward on 2 x H200, 64K), so the factor would only add to that error.
  const bool stretched = sparse != RateMask::kDocuments;
  const PassPricing pricing{cluster, problem, layout, topology, group, vis, double(k) * double(k), parts, sparse,
                            {stretched ? cluster.shard_step_fwd : 1.0, stretched ? cluster.shard_step_bwd : 1.0}};
  const ClusterLinks links(cluster);
  Prediction out;
  out.simulated_ranks = ranks;
  // q, o, dO, dq [n, H, D] and k, v, dk, dv [n, H_kv, D] of the rank (n: its longest shard).
  const int64_t n = layout.max_local_len() * k * problem.batch;
  // With head groups, a group's own inputs are slices of the caller's tensors across heads, not
  // contiguous: the executor copies them into a block for the pass (make_home), Q, K, V forward
  // and Q, dO, K, V backward (O too where the query pack carries O instead of D; and LSE,
  // [B, H, S], where B > 1), beside the schedule's blocks.
  const auto own_copies = [&](Pass pass) -> int64_t {
    if (g == 1) return 0;
    const int64_t in = dtype_size(whole.input), q = n * group.heads * problem.head_dim,
                  kv = n * group.kv_heads * problem.head_dim;
    if (pass == Pass::kForward) return (q + 2 * kv) * in;
    return ((problem.wire.pack_has_delta ? 2 : 3) * q + 2 * kv) * in + (problem.batch > 1 ? n * group.heads * int64_t(dtype_size(whole.stats)) : 0);
  };
  for (Pass pass : {Pass::kForward, Pass::kBackward}) {
    std::vector<std::vector<SimOp>> programs;
    for (int r = 0; r < ranks; ++r) programs.push_back(program(all[r].pass(pass), r, pass, pricing));
    StatusOr<SimResult> sim = simulate(programs, links);
    if (!sim.ok()) return refused("simulation: " + sim.status().message(), ranks);
    (pass == Pass::kForward ? out.fwd_s : out.bwd_s) = g * sim->seconds;
    for (int r = 0; r < ranks; ++r) {
      const WalkedBytes w = walk_bytes(all[r].pass(pass), r, layout, whole, topology, parts);
      int64_t& pass_bytes = pass == Pass::kForward ? out.fwd_bytes : out.bwd_bytes;
      pass_bytes = std::max(pass_bytes, w.total);
      const int64_t blocks = peak_block_bytes(all[r].pass(pass), pass, r, layout, group, parts) + own_copies(pass);
      out.peak_block_bytes = std::max(out.peak_block_bytes, blocks);
    }
  }
  for (int r = 0; r < ranks; ++r) {
    int64_t by_link[kNumLinkClasses] = {};
    for (Pass pass : {Pass::kForward, Pass::kBackward}) {
      const WalkedBytes w = walk_bytes(all[r].pass(pass), r, layout, whole, topology, parts);
      for (int l = 0; l < kNumLinkClasses; ++l) by_link[l] += w.by_link[l];
    }
    for (int l = 0; l < kNumLinkClasses; ++l) out.link_bytes[l] = std::max(out.link_bytes[l], by_link[l]);
  }
  // The rank's tensors in the inputs' dtype, lse [H, n].
  out.tensor_bytes = n * problem.head_dim * (4 * problem.heads + 4 * problem.kv_heads) * int64_t(dtype_size(whole.input)) +
                     n * problem.heads * int64_t(dtype_size(whole.stats));
  // Beyond the blocks: the fitted term (presets), the calls' own workspace (probed), and the own
  // query pack's D rows where the pack carries D (its Q, dO and LSE are the caller's tensors).
  // A call computes one head group's heads (n rows of H / g heads, or Ulysses' n P rows of H / g P),
  // so its workspace and D's rows are one group's; the groups run one after another.
  const double group_heads = double(group.heads);
  const double delta_rows =
      problem.wire.pack_has_delta ? double(n) * group_heads * double(dtype_size(whole.stats)) : 0.0;
  out.workspace_bytes = int64_t(cluster.workspace_bytes_per_element * double(n) *
                                    double(problem.heads + 2 * problem.kv_heads) * double(problem.head_dim) +
                                cluster.call_workspace_bytes_per_query_element * double(n) * group_heads *
                                    double(problem.head_dim) +
                                delta_rows);
  out.fits = out.tensor_bytes + out.extra_bytes() <= cluster.memory_bytes;
  return out;
}

Prediction predict(const Cluster& cluster, const Problem& problem, const Candidate& cand, const CostOptions& options) {
  const int P = cluster.gpus();
  if (P <= options.max_simulated_ranks) return predict_on(cluster, P, problem, cand);
  // What depends on P alone (a square grid, the Ulysses degree dividing the heads and ranks,
  // whole nodes) is asked of the algorithm at P itself, on a request with no visibility: the
  // folded simulations below check the mask's pattern.
  if (const Algorithm* a = find_algorithm(cand.algorithm)) {
    ScheduleRequest structural;
    structural.ranks = P;
    structural.topology = {cluster.gpus_per_node < P ? cluster.gpus_per_node : 0};
    structural.visible.assign(P, std::vector<bool>(P, false));
    structural.heads = problem.heads, structural.kv_heads = problem.kv_heads;
    structural.ulysses = cand.ulysses, structural.ring_algorithm = cand.ring;
    if (std::string why = a->supports(structural); !why.empty()) return refused(why, P);
  }
  // The fold: the two largest rank counts under the cap that divide P, fill whole nodes and
  // (Attention2D) make a square grid, each with P's tokens per rank.
  const int node = cluster.gpus_per_node;
  std::vector<std::pair<int, Prediction>> parts;
  for (int q = options.max_simulated_ranks / node * node; q >= 2 * node && parts.size() < 2; q -= node) {
    if (P % q != 0 || problem.seq % (P / q) != 0) continue;
    const int s = int(std::lround(std::sqrt(double(q))));
    if (is_attention2d(cand.algorithm) && s * s != q) continue;
    Problem folded = problem;
    folded.seq = problem.seq / (P / q);
    Prediction p = predict_on(cluster, q, folded, cand);
    if (p.refusal.empty()) parts.push_back({q, p});
  }
  if (parts.size() < 2) {
    Prediction p = refused("no two foldable rank counts under " + std::to_string(options.max_simulated_ranks) +
                               " run this candidate", P);
    if (!parts.empty() && !parts[0].second.refusal.empty()) p.refusal = parts[0].second.refusal;
    return p;
  }
  const auto& [q2, b] = parts[0];
  const auto& [q1, a] = parts[1];
  const bool grid = is_attention2d(cand.algorithm);
  const auto x = [&](int q, bool ring_length) { return ring_length && grid ? std::sqrt(double(q)) : double(q); };
  const auto line = [&](double ya, double yb, bool ring_length) {
    const double xa = x(q1, ring_length), xb = x(q2, ring_length), xp = x(P, ring_length);
    return std::max(0.0, yb + (yb - ya) / (xb - xa) * (xp - xb));
  };
  Prediction out = b;
  out.simulated_ranks = q2;
  out.fwd_s = line(a.fwd_s, b.fwd_s, false);
  out.bwd_s = line(a.bwd_s, b.bwd_s, false);
  out.fwd_bytes = int64_t(line(double(a.fwd_bytes), double(b.fwd_bytes), true));
  out.bwd_bytes = int64_t(line(double(a.bwd_bytes), double(b.bwd_bytes), true));
  for (int l = 0; l < kNumLinkClasses; ++l)
    out.link_bytes[l] = int64_t(line(double(a.link_bytes[l]), double(b.link_bytes[l]), true));
  out.peak_block_bytes = int64_t(line(double(a.peak_block_bytes), double(b.peak_block_bytes), true));
  out.fits = out.tensor_bytes + out.extra_bytes() <= cluster.memory_bytes;
  return out;
}

}  // namespace seqpar::planner
