// `seqpar probe`: measures this machine and makes a cluster description of it (cluster.hpp) that
// `seqpar plan --cluster FILE` reads. This header holds what both device halves share: the
// options, the raw measurements, the fits that turn them into a Cluster, and the entry point.
// The device halves are probe_cpu.cpp (CPU backend, thread ranks) and probe_cuda.cu (GPU
// backends, a rank per GPU over NCCL); the sweeps both run are in probe_sweeps.hpp.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "planner/cluster.hpp"
#include "seqpar/status.hpp"

namespace seqpar::planner {

// Zero or empty fields take the device's defaults (probe_defaults); `quick` picks tiny ones.
struct ProbeOptions {
  std::string device = "cpu";              // "cpu" (thread ranks) or "cuda" (a rank per GPU)
  int ranks = 0;                           // ranks whose links are measured: threads (cpu), GPUs (cuda)
  std::vector<std::string> backends;       // attention backends to time; empty: the device's default
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  std::vector<int64_t> tokens;             // lengths of the square attention calls timed
  // Masks the calls are timed under (parse_mask's syntax), each at every length; its kind
  // (rate_mask_of) names its rows. Must hold "causal" (the workspace and the fallback rows).
  std::vector<std::string> masks;
  std::vector<int64_t> message_bytes;      // sizes of the pairwise messages timed
  int64_t gemm_size = 0;                   // M = N = K of the GEMM timed
  int64_t copy_bytes = 0;                  // bytes of the memory copy timed
  int repeats = 0;                         // timed repetitions of each figure (the median is kept)
  // Tokens a rank of the ring-return pass timed over all ranks (causal, zigzag), whose time
  // against the planner's prediction from the other figures fits the shard-step factors
  // (Cluster::shard_step_fwd, _bwd); below 0: not timed (the factors stay 1).
  int64_t schedule_tokens = 0;
  bool quick = false;                      // tiny sizes: a smoke test of every step, not figures
};

// The options with every unset field filled for the device (and `quick`), checked: an error
// names the option that is wrong.
StatusOr<ProbeOptions> probe_defaults(ProbeOptions options);

// A progress line ("probe: attention cudnn causal 32768 ..."), written as each step starts and ends.
using ProbeLog = std::function<void(const std::string&)>;

// One message size between a pair of ranks: seconds per exchange, each rank sending `bytes` to
// its partner and receiving as many back at once (median over the repetitions).
struct LinkSample {
  double bytes = 0, seconds = 0;
};

// One distributed pass timed on every rank: the algorithm over `seq` tokens (causal, zigzag,
// B = 1, the options' heads and head dim, one head group), wall seconds from a barrier to the
// barrier after it, median over the repetitions.
struct ScheduleSample {
  std::string algorithm;
  int64_t seq = 0;
  double fwd_s = 0, bwd_s = 0;
  BlockBytes wire;  // how its blocks travelled (the plan's), so the prediction moves the same bytes
};

struct ProbeMeasurements {
  std::string device_name;                 // "NVIDIA H100 80GB HBM3", or the CPU's model name
  std::string comm_name;                   // the communicator the links were measured over
  int ranks = 1;                           // ranks (GPUs) of the node measured
  std::string backend;                     // the backend whose rates price the computes
  std::vector<AttentionRate> attention;
  std::vector<LinkSample> pair;            // empty: links not measured (one rank)
  double all_to_all_bytes_per_peer = 0;    // one all-to-all's bytes to each peer; 0: not measured
  double all_to_all_seconds = 0;
  double launch_s = 0, post_s = 0, wait_s = 0;
  double gemm_tflops = 0, hbm_gbps = 0;
  int64_t memory_bytes = 0;
  double call_workspace_bytes_per_query_element = -1;  // AttentionSweep's, of `backend`; -1: not measured
  int64_t workspace_tokens = 0;                        // the length it was measured at
  std::vector<ScheduleSample> schedules;   // empty: none timed (one rank, or schedule_tokens < 0)
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // the shape the schedules ran at
  bool quick = false;                      // --quick sizes: the schedule is timed, not fitted
  std::vector<std::string> notes;          // what was not measured, and what stands in for it
};

// The device halves: probe_cpu.cpp and probe_cuda.cu (probe_cuda_stub.cpp without CUDA).
StatusOr<ProbeMeasurements> measure_cpu(const ProbeOptions& options, const ProbeLog& log);
StatusOr<ProbeMeasurements> measure_cuda(const ProbeOptions& options, const ProbeLog& log);

// A link class from pairwise samples: latency from a straight-line fit of the smallest messages
// (time = latency + bytes / bandwidth), and a bandwidth point per size such that
// LinkSpec::seconds gives back the measured time. Needs at least one sample.
LinkSpec fit_link(std::span<const LinkSample> samples);
// All-to-all bandwidth out of a rank's port over one pair's at the same message size, within
// [1, peers] (LinkSpec::port_pairs).
double fit_port_pairs(const LinkSpec& pair_link, double bytes_per_peer, double seconds, int ranks);

// The cluster description of one node of `m.ranks` devices; `date` goes into its sources.
Cluster cluster_from_probe(const ProbeMeasurements& m, const std::string& date);

// probe_defaults, the device's measure_*, cluster_from_probe with today's UTC date.
StatusOr<Cluster> probe_cluster(const ProbeOptions& options, const ProbeLog& log);

}  // namespace seqpar::planner
