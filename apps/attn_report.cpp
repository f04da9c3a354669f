// `seqpar attn`'s table and JSON (attn_report.hpp).
#include "attn_report.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

namespace seqpar::app {
namespace {

void print_check_line(const Job& job, const CheckResult& c) {
  const bool low_precision = job.dtype == DType::kBF16 || job.dtype == DType::kF16;
  const auto& e = c.errors;
  if (c.mode == "none") {
    std::printf("check: skipped (--check %s)\n", job.opt.check.c_str());
  } else if (c.mode == "single") {
    if (c.single_error.empty())
      std::printf("vs the single-GPU result, every row: |error| / |reference| (Frobenius) O %.2e  dQ %.2e  dK %.2e  "
                  "dV %.2e (tolerance %.0e); max |error| LSE %.2e (tolerance %.0e)\n",
                  e["o"].get<double>(), e["dq"].get<double>(), e["dk"].get<double>(), e["dv"].get<double>(),
                  c.tolerance, e["lse"].get<double>(), kSingleLseTolerance);
    else
      std::printf("no single-GPU result (%s): the oracle rows alone check the ranks\n", c.single_error.c_str());
    for (const auto& [who, err] : c.oracle_errors.items())
      std::printf("max |error| / max |reference| vs fp64 oracle on %ld query rows, %s: O %.2e  LSE %.2e  dQ %.2e\n",
                  long(c.oracle_rows), who.c_str(), err["o"].get<double>(), err["lse"].get<double>(),
                  err["dq"].get<double>());
    for (size_t i = 0; i < std::min<size_t>(c.disagreeing.size(), 12); ++i) {
      const auto& d = c.disagreeing[i];
      std::printf("  disagrees: %s rows [%ld, %ld) heads [%ld, %ld): %.2e\n", d["tensor"].get<std::string>().c_str(),
                  long(d["rows"][0]), long(d["rows"][1]), long(d["heads"][0]), long(d["heads"][1]),
                  d["relative_err"].get<double>());
    }
    const auto passes_oracle = [&](const char* who) {
      if (!c.oracle_errors.contains(who)) return false;
      for (const auto& [name, err] : c.oracle_errors[who].items())
        if (!(err.get<double>() <= c.tolerance)) return false;
      return true;
    };
    if (!c.disagreeing.empty() && passes_oracle("ranks") != passes_oracle("single"))
      std::printf("the oracle rows side with the %s result\n", passes_oracle("ranks") ? "ranks'" : "single-GPU");
    std::printf("check (the ranks within both tolerances): %s\n", c.ok ? "PASS" : "FAIL");
  } else if (c.mode == "rows") {
    std::printf("max |error|%s vs fp64 oracle (%ld sampled query rows): O %.2e  LSE %.2e  dQ %.2e  (tolerance %.0e): "
                "%s\n",
                low_precision ? " / max |reference|" : "", long(c.rows_checked), e["o"].get<double>(),
                e["lse"].get<double>(), e["dq"].get<double>(), c.tolerance, c.ok ? "PASS" : "FAIL");
  } else {
    std::printf("max |error|%s vs fp64 oracle (%s): O %.2e  LSE %.2e  dQ %.2e  dK %.2e  dV %.2e  (tolerance %.0e): %s\n",
                low_precision ? " / max |reference|" : "", c.mode.c_str(), e["o"].get<double>(), e["lse"].get<double>(),
                e["dq"].get<double>(), e["dk"].get<double>(), e["dv"].get<double>(), c.tolerance,
                c.ok ? "PASS" : "FAIL");
  }
}

}  // namespace

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) b /= 1024, ++u;
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.2f %s", b, units[u]);
  return buf;
}

void progress(const std::string& text) {
  static const auto start = std::chrono::steady_clock::now();
  std::fprintf(stderr, "[seqpar %7.1f s] %s\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), text.c_str());
}

bool print_report(const Job& job, const RankRun& run0, const std::vector<RankFigures>& ranks, const double times[2],
                  const CheckResult& check) {
  const AttnOptions& o = job.opt;
  const AttentionPlan& plan = *run0.plan;
  const int P = int(ranks.size());
  const Topology topology{o.ranks_per_node};
  const std::vector<RankSchedule> schedules = all_rank_schedules(*plan.algorithm, plan.request);
  nlohmann::ordered_json sent_fwd = nlohmann::json::array(), sent_bwd = nlohmann::json::array();
  nlohmann::ordered_json want_fwd = nlohmann::json::array(), want_bwd = nlohmann::json::array();
  nlohmann::ordered_json sent_inter = nlohmann::json::array(), want_inter = nlohmann::json::array();
  nlohmann::ordered_json computed = nlohmann::json::array(), work = nlohmann::json::array();
  nlohmann::ordered_json by_collective, by_link;  // walked, per rank: {name: {forward: [...], backward: [...]}}
  int64_t collective_max[kNumCollectives][2] = {};
  bool bytes_ok = true;
  int64_t sent_max[2] = {0, 0}, want_max[2] = {0, 0};
  for (int r = 0; r < P; ++r) {  // walked from each rank's steps
    const int parts = schedules[r].head_parts;
    const WalkedBytes f = walk_bytes(schedules[r].forward, r, plan.layout, plan.block_bytes, topology, parts);
    const WalkedBytes b = walk_bytes(schedules[r].backward, r, plan.layout, plan.block_bytes, topology, parts);
    for (int c = 0; c < kNumCollectives; ++c) {
      const char* name = collective_name(Collective(c));
      by_collective[name]["forward"].push_back(f.by_collective[c]);
      by_collective[name]["backward"].push_back(b.by_collective[c]);
      collective_max[c][0] = std::max(collective_max[c][0], f.by_collective[c]);
      collective_max[c][1] = std::max(collective_max[c][1], b.by_collective[c]);
    }
    for (int l = 0; l < kNumLinkClasses; ++l) {
      by_link[link_class_name(LinkClass(l))]["forward"].push_back(f.by_link[l]);
      by_link[link_class_name(LinkClass(l))]["backward"].push_back(b.by_link[l]);
    }
    work.push_back(compute_work(schedules[r].forward, plan.request, parts));
    const int64_t walked_inter = f.by_link[1] + b.by_link[1];
    sent_fwd.push_back(ranks[r].sent[0]), sent_bwd.push_back(ranks[r].sent[1]);
    want_fwd.push_back(f.total), want_bwd.push_back(b.total);
    sent_inter.push_back(ranks[r].inter), want_inter.push_back(walked_inter);
    computed.push_back(ranks[r].pairs);
    bytes_ok = bytes_ok && f.total == ranks[r].sent[0] && b.total == ranks[r].sent[1] && walked_inter == ranks[r].inter;
    sent_max[0] = std::max(sent_max[0], ranks[r].sent[0]), sent_max[1] = std::max(sent_max[1], ranks[r].sent[1]);
    want_max[0] = std::max(want_max[0], f.total), want_max[1] = std::max(want_max[1], b.total);
  }
  const double fwd_flops = 4.0 * o.batch * o.heads * o.head_dim * job.mask.visible_pairs(o.seq);
  const double bwd_flops = 2.5 * fwd_flops;

  std::printf("seqpar attn: %s (ran %s on the %s backend), %s layout, %s mask, %d ranks (%s, %d OpenMP thread%s per "
              "rank)\n",
              o.algo.c_str(), plan.algorithm->name, run0.backend.c_str(), o.layout.c_str(), job.mask.describe().c_str(),
              P, job.comm_backend.c_str(), job.threads_per_rank, job.threads_per_rank > 1 ? "s" : "");
  if (!plan.choice.empty()) std::printf("%s\n", plan.choice.c_str());
  if (!run0.backend_calls.empty()) {
    std::string calls;
    for (const auto& [what, n] : run0.backend_calls) calls += (calls.empty() ? "" : ", ") + what + " " + std::to_string(n);
    std::printf("rank 0's attention calls by backend: %s\n", calls.c_str());
  }
  std::printf("problem: B=%ld S=%ld H=%ld H_kv=%ld D=%ld %s%s\n", long(o.batch), long(o.seq), long(o.heads),
              long(job.kv_heads), long(o.head_dim), dtype_name(job.dtype),
              job.on_gpu ? (", " + std::to_string(plan.head_groups) + " head group(s)").c_str() : "");
  std::printf("%-10s %10s %12s %16s %16s %6s\n", "pass", "time (s)", "GFLOP/s", "sent/rank (max)", "expected (max)",
              "bytes");
  for (int pass = 0; pass < 2; ++pass)
    std::printf("%-10s %10.3f %12.2f %16s %16s %6s\n", pass ? "backward" : "forward", times[pass],
                (pass ? bwd_flops : fwd_flops) / times[pass] / 1e9, human_bytes(double(sent_max[pass])).c_str(),
                human_bytes(double(want_max[pass])).c_str(), bytes_ok ? "equal" : "DIFFER");
  for (int c = 0; c < kNumCollectives; ++c)
    if (collective_max[c][0] || collective_max[c][1])
      std::printf("  %-22s forward %12s  backward %12s  (walked, busiest rank)\n", collective_name(Collective(c)),
                  human_bytes(double(collective_max[c][0])).c_str(), human_bytes(double(collective_max[c][1])).c_str());
  std::string pairs, shares;
  for (int r = 0; r < P; ++r) {
    char w[32];
    std::snprintf(w, sizeof w, "%.3g", work[r].get<double>());
    pairs += (r ? " " : "") + std::to_string(ranks[r].pairs), shares += (r ? " " : "") + std::string(w);
  }
  std::printf("forward attention calls per rank: %s; work in shard pairs of all heads: %s (of %d)\n", pairs.c_str(),
              shares.c_str(), P);
  // The visible (query, key) pairs each rank's queries bring: what a layout balances (documents).
  const std::vector<double> visible = rank_visible_work(plan.layout, plan.params.mask);
  const double visible_mean = std::accumulate(visible.begin(), visible.end(), 0.0) / P;
  std::printf("visible pairs of each rank's queries: busiest %.4g, mean %.4g (busiest / mean %.3f)\n",
              *std::max_element(visible.begin(), visible.end()), visible_mean,
              *std::max_element(visible.begin(), visible.end()) / visible_mean);
  print_check_line(job, check);

  if (o.json) {
    nlohmann::ordered_json j;
    j["algo"] = o.algo;
    j["algorithm"] = plan.algorithm->name;
    j["backend"] = run0.backend;
    if (!run0.backend_calls.empty()) {
      nlohmann::ordered_json calls;
      for (const auto& [what, n] : run0.backend_calls) calls[what] = n;
      j["backend_calls_rank0"] = calls;
    }
    j["ranks_per_node"] = o.ranks_per_node;
    j["layout"] = o.layout;
    j["mask"] = job.mask.describe();
    j["ranks"] = P;
    j["comm"] = job.comm_backend;
    j["device"] = o.device;
    j["dtype"] = dtype_name(job.dtype);
    j["batch"] = o.batch;
    j["seq"] = o.seq;
    j["heads"] = o.heads;
    j["kv_heads"] = job.kv_heads;
    j["head_dim"] = o.head_dim;
    j["threads_per_rank"] = job.threads_per_rank;
    j["head_groups"] = plan.head_groups;
    j["fwd_s"] = times[0];
    j["bwd_s"] = times[1];
    j["fwd_gflops"] = fwd_flops / times[0] / 1e9;
    j["bwd_gflops"] = bwd_flops / times[1] / 1e9;
    j["check"] = check.mode;
    j["check_rows"] = check.rows_checked;
    if (check.mode == "single") {
      j["relative_err"] = check.errors;  // LSE: max |error|
      j["lse_tolerance"] = kSingleLseTolerance;
      j["oracle_query_rows"] = check.oracle_rows;
      j["oracle_err"] = check.oracle_errors;     // max |error| / max |reference| on those rows
      j["disagreeing_blocks"] = check.disagreeing;  // (tensor, rows, heads: K/V heads for dk, dv) past tolerance
      if (!check.single_error.empty()) j["single_error"] = check.single_error;
    } else {
      j["max_abs_err"] = check.errors;
    }
    j["tolerance"] = check.tolerance;
    j["check_passed"] = check.ok;
    j["bytes_sent_per_rank"] = {{"forward", sent_fwd}, {"backward", sent_bwd}};
    j["bytes_expected_per_rank"] = {{"forward", want_fwd}, {"backward", want_bwd}};
    j["inter_node_bytes_per_rank"] = {{"sent", sent_inter}, {"walked", want_inter}};
    j["walked_bytes_per_rank_by_collective"] = by_collective;
    j["walked_bytes_per_rank_by_link"] = by_link;
    j["bytes_match"] = bytes_ok;
    j["fwd_pairs_computed_per_rank"] = computed;
    j["fwd_work_per_rank"] = work;
    j["visible_pairs_per_rank"] = visible;
    std::printf("%s\n", j.dump().c_str());
  }
  std::fflush(stdout);
  return bytes_ok;
}

}  // namespace seqpar::app
