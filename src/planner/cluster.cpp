// Cluster descriptions (cluster.hpp): lookups in the rate and bandwidth tables, the presets
// with the measurements behind each figure, and the JSON form.
#include "planner/cluster.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#ifdef SEQPAR_HAVE_JSON
#include <nlohmann/json.hpp>
#endif
#include <sstream>
#include <stdexcept>

namespace seqpar::planner {
namespace {

// Linear interpolation of y in log(x) between the two table points around x; clamped outside.
template <class Points, class X, class Y>
double interpolate_log(const Points& points, double x, X get_x, Y get_y) {
  if (points.empty()) return 0;
  if (x <= get_x(points.front())) return get_y(points.front());
  if (x >= get_x(points.back())) return get_y(points.back());
  for (size_t i = 1; i < points.size(); ++i) {
    const double x0 = get_x(points[i - 1]), x1 = get_x(points[i]);
    if (x > x1) continue;
    const double t = (std::log(x) - std::log(x0)) / (std::log(x1) - std::log(x0));
    return get_y(points[i - 1]) + t * (get_y(points[i]) - get_y(points[i - 1]));
  }
  return get_y(points.back());
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0, kMiB = 1024.0 * 1024.0;

// NVLink 4 (NV18; H100 SXM and H200 alike), as a schedule's sends reach it: the dQ each rank
// sends home at the end of burst-return's backward, waited for with nothing to overlap, took
// 0.534 ms for 64 MiB (docs/results/h200x2_ring_trace_16k_64k_2026-11-27.jsonl:1) and 2.12 ms
// for 256 MiB (h100x2_trace_64k_burst_head_groups_2026-11-27.jsonl:8): about 126 GB/s either
// way. NCCL's own probe of both directions at once reached more (135-283 GB/s at 32-256 MiB,
// h200x2_comm_probe_2026-11-22b.jsonl:1-4), but not inside a schedule.
LinkSpec nvlink4() {
  LinkSpec l;
  l.bandwidth = {{64 * kMiB, 125.7}, {256 * kMiB, 126.6}};
  l.latency_s = 10e-6;  // not measured yet (.carry/session/planner_probe.sh measures it)
  // Ulysses' all-to-all on 4 x H100: 576 MiB out of each rank to 3 peers in 2.1-2.3 ms, 250-275
  // GB/s against one pair's 126 (docs/results/h100x4_j_docs_trace_2026-11-28.jsonl).
  l.port_pairs = 2.0;
  return l;
}

// The generic network: 50 GB/s per GPU between nodes, InfiniBand-like latency.
LinkSpec network_50gbps() {
  LinkSpec l;
  l.bandwidth = {{1.0, 50.0}};
  l.latency_s = 10e-6;
  return l;
}

// A compute step of a zigzag schedule with the cuDNN backend (one shard pair: a few calls),
// B = 1, H = 32, D = 128, bf16, as TFLOP/s (causal at half) keyed by the square call of the
// same FLOPs: the diagonal (causal) and off-diagonal (full) steps of the 2-GPU traces, whose
// per-step times include the calls' launches and tails, and one large call of the kernel
// benchmark where no trace reaches.
std::vector<AttentionRate> cudnn_step_rates() {
  const std::string t16 = "docs/results/h200x2_ring_trace_16k_64k_2026-11-27.jsonl:2";
  const std::string t64 = "docs/results/h100x2_trace_64k_burst_head_groups_2026-11-27.jsonl:7";
  const std::string k22 = "docs/results/h200_kernels_ours_2026-11-22.jsonl";
  return {
      // 16K on 2 GPUs: a step of two 4096-row chunks each (0.55 TFLOP forward): 1.212 / 0.876 ms
      // forward and 3.531 / 2.923 ms backward, diagonal / off-diagonal.
      {"cudnn", 128, 32, 8192, RateMask::kCausal, 453.5, 389.3, t16},
      {"cudnn", 128, 32, 5793, RateMask::kFull, 627.5, 470.2, t16},
      // 64K on 2 GPUs, one head group: 14.858 / 13.788 ms and 45.247 / 42.597 ms.
      {"cudnn", 128, 32, 32768, RateMask::kCausal, 592.0, 486.1, t64},
      {"cudnn", 128, 32, 23170, RateMask::kFull, 637.9, 516.3, t64},
      {"cudnn", 128, 32, 131072, RateMask::kCausal, 556.0, 529.0, k22 + ":19"},
      // One call over a whole 512K causal sequence, 8 heads: Ulysses' local step on 4 x H100
      // (ulysses-overlap, the Hopper kernels under auto), 906 ms forward and 2661 backward with the all-to-alls.
      {"cudnn", 128, 8, 524288, RateMask::kCausal, 620.0, 526.0, "docs/results/h100x4_j3_causal_2026-11-28.jsonl:15"},
      {"cudnn", 128, 32, 131072, RateMask::kFull, 590.0, 543.0, k22 + ":21"},
  };
}

Cluster nvlink_node(const std::string& name, int gpus, int64_t memory, double hbm_gbps) {
  Cluster c;
  c.name = name;
  c.gpus_per_node = gpus;
  c.nodes = 1;
  c.intra = nvlink4();
  c.inter = network_50gbps();
  c.attention = cudnn_step_rates();
  c.memory_bytes = memory;
  c.hbm_gbps = hbm_gbps;
  c.gemm_tflops = 790;  // a large bf16 GEMM on one H200 (DESIGN.md, measured anchors)
  c.launch_s = 10e-6;
  c.post_s = 3e-6;  // the traces' post and wait marks: 2-6 us
  c.wait_s = 3e-6;
  c.sources = {"NVLink: docs/results/h200x2_ring_trace_16k_64k_2026-11-27.jsonl:1 and "
               "h100x2_trace_64k_burst_head_groups_2026-11-27.jsonl:8 (a send home, nothing to overlap)",
               "attention steps: the same traces (lines 2 and 7) and h200_kernels_ours_2026-11-22.jsonl:19,21",
               "launch overhead and link latency: assumed until planner_probe.sh measures them"};
  return c;
}

}  // namespace

double LinkSpec::gbps_at(double bytes) const {
  return interpolate_log(bandwidth, bytes, [](const Point& p) { return p.bytes; },
                         [](const Point& p) { return p.gbps; });
}

const char* rate_mask_name(RateMask mask) {
  switch (mask) {
    case RateMask::kFull: return "full";
    case RateMask::kCausal: return "causal";
    case RateMask::kWindow: return "window";
    case RateMask::kDocuments: return "documents";
  }
  return "causal";
}

std::optional<RateMask> rate_mask_from(const std::string& name) {
  for (RateMask m : {RateMask::kFull, RateMask::kCausal, RateMask::kWindow, RateMask::kDocuments})
    if (name == rate_mask_name(m)) return m;
  return std::nullopt;
}

RateMask rate_mask_of(const MaskSpec& mask) {
  if (mask.has_documents()) return RateMask::kDocuments;
  if (mask.window_left >= 0) return RateMask::kWindow;
  return mask.is_full() ? RateMask::kFull : RateMask::kCausal;
}

double AttentionRate::flops(bool backward) const {
  const double fraction = visible > 0 ? visible : mask == RateMask::kFull ? 1.0 : 0.5;
  const double fwd = 4.0 * double(tokens) * double(tokens) * double(heads) * double(head_dim) * fraction;
  return backward ? 2.5 * fwd : fwd;
}

namespace {

// The rows of `backend` and mask kind `mask` at the head dim nearest `head_dim`; if there are none
// of that kind, every row of the backend.
std::vector<const AttentionRate*> rate_rows(const std::vector<AttentionRate>& attention, const std::string& backend,
                                            RateMask mask, int64_t head_dim) {
  std::vector<const AttentionRate*> rows;
  int64_t best_dim = -1;
  for (const AttentionRate& r : attention)
    if (r.backend == backend && r.mask == mask &&
        (best_dim < 0 || std::llabs(r.head_dim - head_dim) < std::llabs(best_dim - head_dim)))
      best_dim = r.head_dim;
  for (const AttentionRate& r : attention)
    if (r.backend == backend && r.mask == mask && r.head_dim == best_dim) rows.push_back(&r);
  if (rows.empty())
    for (const AttentionRate& r : attention)
      if (r.backend == backend) rows.push_back(&r);
  return rows;
}

// TFLOP/s of `rows` (one mask kind) for a call of `flops_per_head`, interpolated in log FLOPs.
double rate_at(std::vector<const AttentionRate*> rows, double flops_per_head, bool backward) {
  const auto per_head = [&](const AttentionRate* r) { return r->flops(backward) / double(r->heads); };
  std::sort(rows.begin(), rows.end(), [&](auto* a, auto* b) { return per_head(a) < per_head(b); });
  return interpolate_log(rows, flops_per_head, per_head,
                         [&](const AttentionRate* r) { return backward ? r->bwd_tflops : r->fwd_tflops; });
}

// FLOPs per head of a causal call of `length` tokens, as AttentionRate counts them.
double causal_flops_per_head(double length, int64_t head_dim, bool backward) {
  return 4.0 * length * length * 0.5 * double(head_dim) * (backward ? 2.5 : 1.0);
}

}  // namespace

double Cluster::attention_seconds(double flops, int64_t heads, RateMask mask, int64_t head_dim, bool backward,
                                  double keys_per_query) const {
  if (flops <= 0) return 0;
  const bool sparse = mask == RateMask::kWindow || mask == RateMask::kDocuments;
  const std::vector<const AttentionRate*> causal = rate_rows(attention, backend, RateMask::kCausal, head_dim);
  if (causal.empty()) return flops / 500e12;  // an empty description: a nominal Hopper rate
  // A window or documents call does the work of causal calls whose queries see as many keys
  // (2 x keys per query tokens long), at the causal rate of that length times what the cluster's
  // rows of its kind measured against the same.
  const auto causal_rate = [&](double keys) {
    return rate_at(causal, causal_flops_per_head(2.0 * keys, head_dim, backward), backward);
  };
  std::vector<std::pair<double, double>> efficiency;  // (keys per query, measured / causal equivalent)
  if (sparse && keys_per_query > 0)
    for (const AttentionRate& r : attention)
      if (r.backend == backend && r.mask == mask && r.head_dim == causal.front()->head_dim) {
        const double keys = r.flops(false) / (4.0 * double(r.heads) * double(r.head_dim)) / double(r.tokens);
        efficiency.push_back({keys, (backward ? r.bwd_tflops : r.fwd_tflops) / causal_rate(keys)});
      }
  if (efficiency.empty()) {  // not sparse, or no rows of its kind (the presets): by FLOPs per head
    const RateMask kind = sparse ? RateMask::kCausal : mask;
    return flops / (rate_at(rate_rows(attention, backend, kind, head_dim), flops / double(std::max<int64_t>(1, heads)),
                            backward) * 1e12);
  }
  // Rows of (nearly) the same keys per query, a window's at every length, are averaged.
  std::sort(efficiency.begin(), efficiency.end());
  std::vector<std::pair<double, double>> merged;
  std::vector<int> counts;
  for (const auto& [keys, f] : efficiency)
    if (!merged.empty() && keys <= 1.1 * merged.back().first / counts.back()) {
      merged.back().first += keys, merged.back().second += f, ++counts.back();
    } else {
      merged.push_back({keys, f}), counts.push_back(1);
    }
  for (size_t i = 0; i < merged.size(); ++i) merged[i].first /= counts[i], merged[i].second /= counts[i];
  const double factor = interpolate_log(merged, keys_per_query, [](const auto& p) { return p.first; },
                                        [](const auto& p) { return p.second; });
  return flops / (causal_rate(keys_per_query) * factor * 1e12);
}

std::vector<std::string> cluster_preset_names() { return {"h100x2", "h100x4", "h200x2", "h200x4", "generic:N"}; }

StatusOr<Cluster> cluster_preset(const std::string& name) {
  // Memory as the device reports it free of the driver's share; HBM copies at 80% of the datasheet.
  for (int gpus : {2, 4}) {
    if (name == "h100x" + std::to_string(gpus)) return nvlink_node(name, gpus, int64_t(79.1 * kGiB), 3350 * 0.8);
    if (name == "h200x" + std::to_string(gpus)) return nvlink_node(name, gpus, int64_t(139.8 * kGiB), 4800 * 0.8);
  }
  if (name.rfind("generic:", 0) == 0) {
    const std::string n = name.substr(8);
    char* end = nullptr;
    const long gpus = std::strtol(n.c_str(), &end, 10);
    SP_CHECK_ARG(!n.empty() && *end == 0 && gpus >= 1 && gpus <= (1 << 20),
                 "generic:N needs a GPU count, got '" + n + "'");
    Cluster c = nvlink_node(name, int(std::min<long>(gpus, 8)), int64_t(79.1 * kGiB), 3350 * 0.8);
    SP_CHECK_ARG(gpus <= 8 || gpus % 8 == 0, "generic:N fills nodes of 8: N must be at most 8 or a multiple of 8");
    c.nodes = int(gpus <= 8 ? 1 : gpus / 8);
    c.inter = network_50gbps();
    c.sources.push_back("inter-node: 50 GB/s per GPU, 10 us a message (the issue's generic cluster)");
    return c;
  }
  return SP_STATUS(StatusCode::kInvalidArgument,
                   "unknown cluster preset '" + name + "' (h100x2, h100x4, h200x2, h200x4, generic:N, or a JSON file)");
}

StatusOr<Cluster> load_cluster(const std::string& name_or_path) {
  std::ifstream in(name_or_path);
  if (!in) return cluster_preset(name_or_path);
  std::stringstream text;
  text << in.rdbuf();
  return cluster_from_json(text.str());
}

#ifdef SEQPAR_HAVE_JSON
namespace {

nlohmann::json link_json(const LinkSpec& l) {
  nlohmann::json points = nlohmann::json::array();
  for (const auto& p : l.bandwidth) points.push_back({{"bytes", p.bytes}, {"gbps", p.gbps}});
  return {{"latency_us", l.latency_s * 1e6}, {"port_pairs", l.port_pairs}, {"bandwidth", points}};
}

LinkSpec link_from(const nlohmann::json& j) {
  LinkSpec l;
  l.latency_s = j.value("latency_us", 10.0) * 1e-6;
  l.port_pairs = j.value("port_pairs", 1.0);
  for (const auto& p : j.at("bandwidth")) {
    l.bandwidth.push_back({p.at("bytes").get<double>(), p.at("gbps").get<double>()});
    if (!(l.bandwidth.back().bytes > 0 && l.bandwidth.back().gbps > 0))
      throw std::invalid_argument("a link's bandwidth points need bytes and gbps above 0");
  }
  std::sort(l.bandwidth.begin(), l.bandwidth.end(), [](auto& a, auto& b) { return a.bytes < b.bytes; });
  return l;
}

}  // namespace

std::string cluster_to_json(const Cluster& c) {
  nlohmann::json rates = nlohmann::json::array();
  for (const AttentionRate& r : c.attention) {
    nlohmann::json row = {{"backend", r.backend}, {"head_dim", r.head_dim}, {"heads", r.heads}, {"tokens", r.tokens},
                          {"mask", rate_mask_name(r.mask)}, {"fwd_tflops", r.fwd_tflops},
                          {"bwd_tflops", r.bwd_tflops}, {"source", r.source}};
    if (r.visible > 0) row["visible"] = r.visible;  // window and documents rows
    rates.push_back(std::move(row));
  }
  const nlohmann::json j = {{"name", c.name}, {"gpus_per_node", c.gpus_per_node}, {"nodes", c.nodes},
                            {"links", {{"intra", link_json(c.intra)}, {"inter", link_json(c.inter)}}},
                            {"attention", rates}, {"backend", c.backend}, {"launch_us", c.launch_s * 1e6},
                            {"post_us", c.post_s * 1e6}, {"wait_us", c.wait_s * 1e6}, {"hbm_gbps", c.hbm_gbps},
                            {"gemm_tflops", c.gemm_tflops}, {"memory_bytes", c.memory_bytes},
                            {"workspace_bytes_per_element", c.workspace_bytes_per_element},
                            {"call_workspace_bytes_per_query_element", c.call_workspace_bytes_per_query_element},
                            {"shard_step_factor", {{"fwd", c.shard_step_fwd}, {"bwd", c.shard_step_bwd}}},
                            {"sources", c.sources}};
  return j.dump(2);
}

StatusOr<Cluster> cluster_from_json(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    Cluster c;
    c.name = j.value("name", std::string("custom"));
    c.gpus_per_node = j.at("gpus_per_node").get<int>();
    c.nodes = j.value("nodes", 1);
    c.intra = link_from(j.at("links").at("intra"));
    c.inter = j.at("links").contains("inter") ? link_from(j.at("links").at("inter")) : network_50gbps();
    for (const auto& r : j.at("attention")) {
      const std::string mask = r.value("mask", std::string("causal"));
      const std::optional<RateMask> kind = rate_mask_from(mask);
      SP_CHECK_ARG(kind.has_value(), "attention rate mask '" + mask + "': expected full, causal, window or documents");
      c.attention.push_back({r.value("backend", std::string("cudnn")), r.value("head_dim", int64_t(128)),
                             r.value("heads", int64_t(32)), r.at("tokens").get<int64_t>(), *kind,
                             r.at("fwd_tflops").get<double>(), r.at("bwd_tflops").get<double>(),
                             r.value("source", std::string()), r.value("visible", 0.0)});
      const AttentionRate& added = c.attention.back();
      const bool sparse = added.mask == RateMask::kWindow || added.mask == RateMask::kDocuments;
      SP_CHECK_ARG(added.tokens >= 1 && added.heads >= 1 && added.head_dim >= 1 && added.fwd_tflops > 0 &&
                       added.bwd_tflops > 0 && (sparse ? added.visible > 0 && added.visible <= 1 : added.visible == 0),
                   "attention rate at " + std::to_string(added.tokens) + " tokens: tokens, heads and head_dim must "
                   "be positive, the rates above 0, and a window or documents row needs its visible share in (0, 1] "
                   "(full and causal rows take none)");
    }
    c.backend = j.value("backend", std::string("cudnn"));
    c.launch_s = j.value("launch_us", 10.0) * 1e-6;
    c.post_s = j.value("post_us", 5.0) * 1e-6;
    c.wait_s = j.value("wait_us", 10.0) * 1e-6;
    c.hbm_gbps = j.value("hbm_gbps", 3000.0);
    c.gemm_tflops = j.value("gemm_tflops", 700.0);
    c.memory_bytes = j.value("memory_bytes", int64_t(80) << 30);
    c.workspace_bytes_per_element = j.value("workspace_bytes_per_element", 4.0);
    c.call_workspace_bytes_per_query_element = j.value("call_workspace_bytes_per_query_element", 0.0);
    if (j.contains("shard_step_factor")) {
      const nlohmann::json& f = j.at("shard_step_factor");
      c.shard_step_fwd = f.value("fwd", 1.0), c.shard_step_bwd = f.value("bwd", 1.0);
      SP_CHECK_ARG(c.shard_step_fwd > 0 && c.shard_step_bwd > 0, "shard_step_factor's fwd and bwd must be above 0");
    }
    if (j.contains("sources")) c.sources = j.at("sources").get<std::vector<std::string>>();
    SP_CHECK_ARG(c.gpus_per_node >= 1 && c.nodes >= 1, "a cluster needs at least one GPU a node and one node");
    SP_CHECK_ARG(!c.intra.bandwidth.empty(), "the intra-node link needs a bandwidth table");
    return c;
  } catch (const nlohmann::json::exception& e) {
    return SP_STATUS(StatusCode::kInvalidArgument, std::string("cluster description: ") + e.what());
  } catch (const std::invalid_argument& e) {  // link_from's checks
    return SP_STATUS(StatusCode::kInvalidArgument, std::string("cluster description: ") + e.what());
  }
}

#else
// Built without nlohmann-json: presets only.
std::string cluster_to_json(const Cluster& c) { return "{\"name\": \"" + c.name + "\"}"; }
StatusOr<Cluster> cluster_from_json(const std::string&) {
  return SP_STATUS(StatusCode::kUnsupported, "cluster files need nlohmann-json at build time; use a preset");
}
#endif

}  // namespace seqpar::planner
