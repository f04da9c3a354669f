// `seqpar probe` (probe_command.hpp): options, the probe, the JSON out and a short table on stderr.
#include "probe_command.hpp"

#include <cstdio>
#include <fstream>
#include <iostream>

#include "seqpar/gpu.hpp"
#include "seqpar/nccl_comm.hpp"

namespace seqpar::app {
namespace {

int usage_error(const std::string& message) {
  std::fprintf(stderr, "seqpar probe: error: %s\n", message.c_str());
  return 2;
}

void print_summary(const planner::Cluster& c) {
  std::fprintf(stderr, "\n%s: %d rank(s)\n", c.name.c_str(), c.gpus());
  std::fprintf(stderr, "%-8s %5s %6s %9s %9s %12s %12s\n", "backend", "D", "heads", "tokens", "mask", "fwd TFLOP/s",
               "bwd TFLOP/s");
  for (const planner::AttentionRate& r : c.attention)
    std::fprintf(stderr, "%-8s %5lld %6lld %9lld %9s %12.4g %12.4g\n", r.backend.c_str(), (long long)r.head_dim,
                 (long long)r.heads, (long long)r.tokens, planner::rate_mask_name(r.mask), r.fwd_tflops, r.bwd_tflops);
  std::fprintf(stderr, "link: latency %.3g us, port_pairs %.2f;", c.intra.latency_s * 1e6, c.intra.port_pairs);
  for (const planner::LinkSpec::Point& p : c.intra.bandwidth)
    std::fprintf(stderr, " %.0f B: %.4g GB/s;", p.bytes, p.gbps);
  std::fprintf(stderr, "\nlaunch %.3g us, post %.3g us, wait %.3g us, GEMM %.4g TFLOP/s, memory copy %.4g GB/s, "
                       "memory %.1f GiB\n",
               c.launch_s * 1e6, c.post_s * 1e6, c.wait_s * 1e6, c.gemm_tflops, c.hbm_gbps,
               double(c.memory_bytes) / double(1LL << 30));
  for (const std::string& s : c.sources) std::fprintf(stderr, "source: %s\n", s.c_str());
}

}  // namespace

int run_probe(ProbeCliOptions o) {
  planner::ProbeOptions& p = o.probe;
  if (p.device.empty()) p.device = cuda_device_count() > 0 ? "cuda" : "cpu";
  if (o.gpus < 0 || o.ranks < 0) return usage_error("--gpus and --ranks take a positive count");
  if (o.gpus != 0 && p.device != "cuda") return usage_error("--gpus is for --device cuda; CPU thread ranks take --ranks");
  if (o.ranks != 0 && p.device != "cpu") return usage_error("--ranks is for --device cpu; GPUs take --gpus");
  p.ranks = p.device == "cuda" ? o.gpus : o.ranks;
  // Open the output first: a bad path should not cost a whole probe.
  std::ofstream file;
  if (!o.out.empty()) {
    file.open(o.out);
    if (!file) return usage_error("cannot write --out " + o.out);
  }
  // A failed GPU rank ends the tool rather than leaving the others waiting (as `seqpar attn`).
  if (p.device == "cuda") nccl_exit_process_on_failure(true);
  const planner::ProbeLog log = [](const std::string& line) {
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  };
  StatusOr<planner::Cluster> cluster = planner::probe_cluster(p, log);
  if (!cluster.ok()) {
    std::fprintf(stderr, "seqpar probe: %s\n", cluster.status().message().c_str());
    return cluster.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  const std::string json = planner::cluster_to_json(cluster.value()) + "\n";
  if (o.out.empty()) {
    std::cout << json << std::flush;
  } else {
    file << json;
    file.close();
    if (!file) {
      std::fprintf(stderr, "seqpar probe: writing %s failed\n", o.out.c_str());
      return 1;
    }
  }
  print_summary(cluster.value());
  return 0;
}

void add_probe_command(CLI::App& app, ProbeCliOptions& o, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "probe", "measure this machine (attention rates, links, overheads, GEMM, memory) and write a cluster "
               "description for `seqpar plan --cluster FILE`");
  o.probe.device.clear();
  cmd->add_option("--device", o.probe.device, "cpu (the CPU backend, thread ranks) or cuda (default where a GPU is visible)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--gpus", o.gpus, "cuda: GPUs whose links are measured, a thread each over NCCL (default: every "
                                    "visible GPU); attention is timed on GPU 0");
  cmd->add_option("--ranks", o.ranks, "cpu: thread ranks whose links are measured (default 2)");
  cmd->add_option("--backends", o.probe.backends,
                  "attention backends to time, the first pricing the computes (cuda: cudnn, hopper, cuda, auto; cpu: "
                  "cpu, oracle); default: the one a session picks")
      ->delimiter(',');
  cmd->add_option("--heads", o.probe.heads, "query heads of the attention calls (default: cuda 32, cpu 4)");
  cmd->add_option("--kv-heads", o.probe.kv_heads, "K/V heads (default: cuda 8, cpu 2)");
  cmd->add_option("--head-dim", o.probe.head_dim, "head dim (default: cuda 128, cpu 64)");
  cmd->add_option("--tokens", o.probe.tokens,
                  "lengths of the square attention calls (default: cuda 8192,32768,131072; cpu 256,512,1024)")
      ->delimiter(',');
  cmd->add_option("--masks", o.probe.masks,
                  "masks the attention calls are timed under, separated by ';', causal among them (default: "
                  "'causal;full;window:4096,0;docs:16' on cuda; a window of a quarter of the shortest call and docs:4 "
                  "on cpu)")
      ->delimiter(';');
  cmd->add_option("--message-bytes", o.probe.message_bytes,
                  "pairwise message sizes (default: cuda 8 KiB to 256 MiB, cpu 1 KiB to 4 MiB, x8 apart)")
      ->delimiter(',');
  cmd->add_option("--gemm-size", o.probe.gemm_size, "M = N = K of the GEMM (default: cuda 8192, cpu 512)");
  cmd->add_option("--copy-bytes", o.probe.copy_bytes, "bytes of the memory copy (default: cuda 1 GiB, cpu 64 MiB)");
  cmd->add_option("--schedule-tokens", o.probe.schedule_tokens,
                  "tokens a rank of the ring-return pass timed over all ranks, which fits the shard-step factors "
                  "(a ring step among its exchanges against the single calls' rates); below 0: not timed "
                  "(default: cuda 65536, cpu 256)");
  cmd->add_option("--repeats", o.probe.repeats, "timed runs of each figure, the median kept (default: cuda 5, cpu 3)");
  cmd->add_flag("--quick", o.probe.quick, "tiny sizes for every unset option: checks each step runs, not a measurement");
  cmd->add_option("--out", o.out, "write the cluster JSON here (default: stdout)");
  cmd->callback([&o, exit_code] { *exit_code = run_probe(o); });
}

}  // namespace seqpar::app
