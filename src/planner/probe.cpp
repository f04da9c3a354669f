// `seqpar probe`'s device-independent part (probe.hpp): the options' defaults and checks, the
// fits of the link samples and of the shard-step factors, and the cluster description made of the
// measurements.
#include "planner/probe.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "planner/cost_model.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar::planner {
namespace {

constexpr int64_t kKiB = 1024, kMiB = 1024 * 1024;

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

std::string utc_date() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d", &utc);
  return text;
}

}  // namespace

StatusOr<ProbeOptions> probe_defaults(ProbeOptions o) {
  SP_CHECK_ARG(o.device == "cpu" || o.device == "cuda", "--device must be cpu or cuda, got '" + o.device + "'");
  const bool gpu = o.device == "cuda";
  // GPU: the shape the presets were measured at (H = 32, D = 128, GQA 4:1) and the lengths a
  // rank's calls have from 8K to 128K tokens a GPU. CPU: small enough for CI's two cores.
  if (o.heads == 0) o.heads = gpu ? 32 : (o.quick ? 2 : 4);
  if (o.kv_heads == 0) o.kv_heads = gpu ? 8 : (o.quick ? 1 : 2);
  if (o.head_dim == 0) o.head_dim = gpu ? 128 : (o.quick ? 32 : 64);
  if (o.tokens.empty())
    o.tokens = gpu ? (o.quick ? std::vector<int64_t>{4096, 16384} : std::vector<int64_t>{8192, 32768, 131072})
                   : (o.quick ? std::vector<int64_t>{64, 128} : std::vector<int64_t>{256, 512, 1024});
  std::sort(o.tokens.begin(), o.tokens.end());
  // A 4K window and 16 documents on a GPU, the masks the 2-GPU validation runs use; on the host,
  // a window of a quarter of the shortest call, so that it is not the causal mask. No more
  // documents than the shortest call has tokens.
  if (o.masks.empty()) {
    const int64_t shortest = std::max<int64_t>(1, o.tokens.front());
    o.masks = {"causal", "full", "window:" + std::to_string(gpu ? 4096 : std::max<int64_t>(1, shortest / 4)) + ",0",
               "docs:" + std::to_string(std::min<int64_t>(gpu ? 16 : 4, shortest))};
  }
  if (o.message_bytes.empty()) {
    const int64_t smallest = gpu ? 8 * kKiB : kKiB, largest = gpu ? (o.quick ? 16 * kMiB : 256 * kMiB)
                                                                 : (o.quick ? 64 * kKiB : 4 * kMiB);
    for (int64_t b = smallest; b <= largest; b *= 8) o.message_bytes.push_back(b);
  }
  if (o.gemm_size == 0) o.gemm_size = gpu ? (o.quick ? 4096 : 8192) : (o.quick ? 64 : 512);
  if (o.copy_bytes == 0) o.copy_bytes = gpu ? (o.quick ? 256 * kMiB : 1024 * kMiB) : (o.quick ? kMiB : 64 * kMiB);
  if (o.repeats == 0) o.repeats = o.quick ? 2 : (gpu ? 5 : 3);
  // GPU: 64K tokens a GPU, where the 4 x H200 runs' ring family ran 10% (forward) and 5%
  // (backward) over the single calls' rates (docs/PLANNER.md, "Shard steps").
  if (o.schedule_tokens == 0) o.schedule_tokens = gpu ? (o.quick ? 4096 : 65536) : (o.quick ? 64 : 256);
  if (o.ranks == 0) o.ranks = gpu ? std::max(1, cuda_device_count()) : 2;

  SP_CHECK_ARG(o.ranks >= 1, "--ranks/--gpus must be at least 1");
  SP_CHECK_ARG(o.heads >= 1 && o.kv_heads >= 1 && o.head_dim >= 1, "--heads, --kv-heads and --head-dim must be positive");
  SP_CHECK_ARG(o.heads % o.kv_heads == 0, "--heads (" + std::to_string(o.heads) + ") must be a multiple of --kv-heads (" +
                                              std::to_string(o.kv_heads) + ")");
  for (const int64_t s : o.tokens) SP_CHECK_ARG(s >= 1, "--tokens must be positive, got " + std::to_string(s));
  bool has_causal = false;
  for (const std::string& mask : o.masks)
    for (const int64_t s : o.tokens) {
      StatusOr<MaskSpec> spec = parse_mask(mask, s);
      SP_CHECK_ARG(spec.ok(), "--masks (separated by ';'): " + (spec.ok() ? std::string() : spec.status().message()));
      SP_CHECK_ARG(!spec->has_block_pattern(), "--masks: '" + mask + "' is block-sparse, which the planner does not price");
      // A row's kind names it: a band that is not the causal mask but has no left bound would
      // pass for causal rows of another FLOP count.
      const bool exactly_causal = !spec->has_documents() && spec->window_left < 0 && spec->window_right == 0;
      SP_CHECK_ARG(rate_mask_of(spec.value()) != RateMask::kCausal || exactly_causal,
                   "--masks: '" + mask + "' is neither full, causal, a window with a left bound nor documents");
      has_causal = has_causal || exactly_causal;
    }
  SP_CHECK_ARG(has_causal, "--masks must include causal (the workspace and the rows other masks fall back to; "
                           "separate masks with ';')");
  for (const int64_t b : o.message_bytes)
    SP_CHECK_ARG(b >= 1, "--message-bytes must be positive, got " + std::to_string(b));
  std::sort(o.message_bytes.begin(), o.message_bytes.end());
  o.message_bytes.erase(std::unique(o.message_bytes.begin(), o.message_bytes.end()), o.message_bytes.end());
  SP_CHECK_ARG(o.gemm_size >= 1 && o.copy_bytes >= 1, "--gemm-size and --copy-bytes must be positive");
  SP_CHECK_ARG(o.repeats >= 1, "--repeats must be at least 1");
  return o;
}

LinkSpec fit_link(std::span<const LinkSample> samples) {
  std::vector<LinkSample> sorted(samples.begin(), samples.end());
  std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.bytes < b.bytes; });
  LinkSpec link;
  // Latency: least squares of time = latency + bytes * seconds_per_byte over the three smallest
  // sizes, where the fixed cost shows. Noise can push the intercept to zero or below: then half
  // the smallest message's time stands in (a latency cannot exceed that time, nor be nothing).
  const size_t n = std::min<size_t>(3, sorted.size());
  double latency = 0;
  if (n >= 2) {
    double mx = 0, my = 0;
    for (size_t i = 0; i < n; ++i) mx += sorted[i].bytes / n, my += sorted[i].seconds / n;
    double sxy = 0, sxx = 0;
    for (size_t i = 0; i < n; ++i)
      sxy += (sorted[i].bytes - mx) * (sorted[i].seconds - my), sxx += (sorted[i].bytes - mx) * (sorted[i].bytes - mx);
    latency = sxx > 0 ? my - sxy / sxx * mx : 0;
  }
  const double smallest_s = sorted.front().seconds;
  if (!(latency > 0) || latency > smallest_s) latency = 0.5 * smallest_s;
  link.latency_s = latency;
  // Each point is the bandwidth that LinkSpec::seconds turns back into the measured time. A small
  // message is mostly latency, so its transfer is a sliver of its time; only noise that leaves
  // none (a time under the fitted latency) is held at a thousandth of the time.
  for (const LinkSample& s : sorted) {
    const double transfer_s = std::max(s.seconds - latency, 1e-3 * s.seconds);
    link.bandwidth.push_back({s.bytes, s.bytes / transfer_s / 1e9});
  }
  return link;
}

double fit_port_pairs(const LinkSpec& pair_link, double bytes_per_peer, double seconds, int ranks) {
  if (ranks < 3 || bytes_per_peer <= 0 || seconds <= 0) return 1.0;
  const double all_to_all_gbps = bytes_per_peer * (ranks - 1) / seconds / 1e9;
  return std::clamp(all_to_all_gbps / pair_link.gbps_at(bytes_per_peer), 1.0, double(ranks - 1));
}

namespace {

// The shard-step factors (Cluster::shard_step_fwd, _bwd): the timed ring-family pass over what the
// cluster, with the factors at 1, predicts for it. The pass is mostly its shard steps' compute at
// the probed lengths, so the ratio stands for theirs (as docs/planner/fit_shard_steps.py fits it
// from benchmark runs).
void fit_shard_steps(const ProbeMeasurements& m, const std::string& by, Cluster* c) {
  c->shard_step_fwd = c->shard_step_bwd = 1.0;
  if (m.schedules.empty()) {
    c->sources.push_back("shard_step_factor 1: no schedule timed (one rank, or --schedule-tokens below 0); "
                         "docs/planner/fit_shard_steps.py fits it from bench_gpu_ring runs");
    return;
  }
  const ScheduleSample& s = m.schedules.front();
  if (m.quick) {  // overheads rule at these sizes (factors of 2 and more): a smoke test, not a fit
    c->sources.push_back("shard_step_factor 1: " + s.algorithm + " timed at --quick sizes (" + fixed(s.fwd_s * 1e3, 3) +
                         " / " + fixed(s.bwd_s * 1e3, 3) + " ms), not fitted");
    return;
  }
  Problem problem;
  problem.seq = s.seq, problem.heads = m.heads, problem.kv_heads = m.kv_heads, problem.head_dim = m.head_dim;
  problem.wire = s.wire;
  const Prediction p = predict(*c, problem, Candidate{s.algorithm, 0, "ring", 1, LayoutKind::kZigzag});
  if (!p.refusal.empty() || !(p.fwd_s > 0 && p.bwd_s > 0 && s.fwd_s > 0 && s.bwd_s > 0)) {
    c->sources.push_back("shard_step_factor 1: the planner did not price the timed " + s.algorithm + " pass (" +
                         p.refusal + ")");
    return;
  }
  const double fwd = s.fwd_s / p.fwd_s, bwd = s.bwd_s / p.bwd_s;
  const std::string timed = s.algorithm + " over " + std::to_string(m.ranks) + " ranks, " + std::to_string(s.seq) +
                            " tokens causal (zigzag), " + fixed(s.fwd_s * 1e3, 3) + " / " + fixed(s.bwd_s * 1e3, 3) +
                            " ms forward / backward against " + fixed(p.fwd_s * 1e3, 3) + " / " +
                            fixed(p.bwd_s * 1e3, 3) + " predicted from the figures above, " + by;
  // A step among exchanges runs somewhat slower than its call alone (1.0-1.2 on H200s); a ratio
  // far outside that says the other figures misprice the pass (a noisy link table: thread ranks
  // on a busy host), not the steps.
  constexpr double kLow = 0.5, kHigh = 2.0;
  if (fwd < kLow || fwd > kHigh || bwd < kLow || bwd > kHigh) {
    c->sources.push_back("shard_step_factor 1: " + timed + ", ratios " + fixed(fwd, 3) + " / " + fixed(bwd, 3) +
                         " outside [0.5, 2]: not fitted");
    return;
  }
  c->shard_step_fwd = fwd, c->shard_step_bwd = bwd;
  c->sources.push_back("shard_step_factor: " + timed);
}

}  // namespace

Cluster cluster_from_probe(const ProbeMeasurements& m, const std::string& date) {
  const std::string by = "measured by seqpar probe on " + m.device_name + " " + date;
  Cluster c;
  c.name = "probe " + m.device_name + " x" + std::to_string(m.ranks);
  c.gpus_per_node = m.ranks;
  c.nodes = 1;
  c.attention = m.attention;
  c.backend = m.backend;
  c.sources.push_back("attention (" + m.backend + " and the rows' backends), launch, GEMM, memory copy, memory: " + by);
  if (!m.pair.empty()) {
    c.intra = fit_link(m.pair);
    c.intra.port_pairs = fit_port_pairs(c.intra, m.all_to_all_bytes_per_peer, m.all_to_all_seconds, m.ranks);
    c.sources.push_back("intra-node link (" + m.comm_name + ", " + std::to_string(m.ranks) +
                        " ranks in pairs, both directions at once), post and wait: " + by);
    if (m.ranks >= 3)
      c.sources.push_back("port_pairs " + fixed(c.intra.port_pairs, 2) + ": an all-to-all of " +
                          std::to_string(int64_t(m.all_to_all_bytes_per_peer)) + " bytes a peer against one pair's "
                          "bandwidth at that size, " + by);
  } else {
    c.intra = cluster_preset("h100x2").value().intra;
    c.sources.push_back("intra-node link: not measured (one rank): the h100x2 preset's NVLink figures");
  }
  c.inter = cluster_preset("generic:16").value().inter;
  c.sources.push_back("inter-node link: not measured (one node): the generic 50 GB/s network");
  c.launch_s = m.launch_s;
  c.post_s = m.post_s;
  c.wait_s = m.wait_s;
  c.gemm_tflops = m.gemm_tflops;
  c.hbm_gbps = m.hbm_gbps;
  c.memory_bytes = m.memory_bytes;
  if (m.call_workspace_bytes_per_query_element >= 0) {
    c.call_workspace_bytes_per_query_element = m.call_workspace_bytes_per_query_element;
    c.workspace_bytes_per_element = 0;  // measured instead of the presets' fitted term
    c.sources.push_back("call_workspace_bytes_per_query_element: the " + m.backend + " calls' own peak at " +
                        std::to_string(m.workspace_tokens) + " tokens, " + by +
                        "; workspace_bytes_per_element 0: the fitted term it replaces");
  } else {
    c.sources.push_back("call_workspace_bytes_per_query_element: not measured (the device does not count its "
                        "memory): 0");
  }
  fit_shard_steps(m, by, &c);
  c.sources.insert(c.sources.end(), m.notes.begin(), m.notes.end());
  return c;
}

StatusOr<Cluster> probe_cluster(const ProbeOptions& options, const ProbeLog& log) {
  SP_ASSIGN_OR_RETURN(const ProbeOptions o, probe_defaults(options));
  SP_ASSIGN_OR_RETURN(ProbeMeasurements m, o.device == "cuda" ? measure_cuda(o, log) : measure_cpu(o, log));
  m.heads = o.heads, m.kv_heads = o.kv_heads, m.head_dim = o.head_dim, m.quick = o.quick;
  return cluster_from_probe(m, utc_date());
}

}  // namespace seqpar::planner
