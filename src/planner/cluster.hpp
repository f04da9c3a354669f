// A cluster description for the planner: how many GPUs, how they are linked, how fast each
// link and each local attention call runs, and what a device holds. Read from JSON (written by
// hand, or from the presets below that cite the measurements they come from), and written back.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "seqpar/mask.hpp"
#include "seqpar/schedule.hpp"
#include "seqpar/status.hpp"

namespace seqpar::planner {

// One link class (NVLink inside a node, the network between nodes): per GPU and direction,
// the bandwidth reached at each message size, and the latency of one message.
struct LinkSpec {
  struct Point {
    double bytes = 0, gbps = 0;  // message size, GB/s (1e9 bytes/s) per direction
  };
  std::vector<Point> bandwidth;  // increasing sizes; interpolated in log size, clamped outside
  double latency_s = 10e-6;
  // Transfers to different peers a rank's port carries at once at full speed (its bandwidth
  // over one pair's): 1 for a network port, about 2 for an H100's NVSwitch port.
  double port_pairs = 1.0;
  double gbps_at(double bytes) const;
  double seconds(double bytes) const { return bytes <= 0 ? 0 : latency_s + bytes / (gbps_at(bytes) * 1e9); }
};

// The kind of call a rate was measured on. A sliding window's or documents' call runs well below
// the causal rate for the same visible pairs (tiles at the band's or documents' edges do full
// work for few pairs; a backend without tile lists cuts the call into many small ones), so those
// two have rates of their own; a partly visible call under any other mask is priced as causal.
enum class RateMask { kFull, kCausal, kWindow, kDocuments };
const char* rate_mask_name(RateMask mask);                            // "full", "causal", "window", "documents"
std::optional<RateMask> rate_mask_from(const std::string& name);      // the inverse; nullopt for other text
RateMask rate_mask_of(const MaskSpec& mask);                          // documents, a bounded window, full, else causal

// Local attention throughput of one backend at one head dim, mask kind and length (a square
// call of `tokens` queries and keys, `heads` heads): the planner prices a call of any shape by
// its FLOPs, interpolating between the entries of the same backend, head dim and mask kind.
struct AttentionRate {
  std::string backend = "cudnn";
  int64_t head_dim = 128, heads = 32, tokens = 0;
  RateMask mask = RateMask::kCausal;
  double fwd_tflops = 0, bwd_tflops = 0;  // FLOPs of the visible pairs only
  std::string source;       // the measurement it comes from (file:line)
  // The visible fraction of the tokens^2 pairs; 0: the mask's own (full 1, causal 1/2). Window
  // and documents rows carry the one their measured call had.
  double visible = 0;
  double flops(bool backward) const;  // of that call, as counted
};

struct Cluster {
  std::string name;
  int gpus_per_node = 1, nodes = 1;
  LinkSpec intra, inter;              // NVLink inside a node; the network between nodes
  std::vector<AttentionRate> attention;
  std::string backend = "cudnn";      // which entries of `attention` price the computes
  double launch_s = 10e-6;            // per local kernel call (host launch, small-call tail)
  double post_s = 5e-6;               // per batch of sends and receives posted
  double wait_s = 10e-6;              // per batch waited for (host synchronisation)
  double hbm_gbps = 3000;             // device memory copies and merges (read + write counted)
  double gemm_tflops = 700;           // dense bf16 GEMM rate (training steps)
  int64_t memory_bytes = 80LL << 30;  // per device
  // The backend's own workspace beyond the schedule's blocks, in bytes per token of the rank's
  // shard and per (query head + 2 K/V heads) x head dim: fp32 gradients of the whole shard, as
  // fitted on the 2- and 4-GPU runs of 2026-11-27 (docs/PLANNER.md), whatever the head groups.
  // The executor has held no such copies since the own query pack's fix (b7052a6): a probed
  // cluster, which measures the calls' workspace below, sets it to 0.
  double workspace_bytes_per_element = 4.0;
  // The backend calls' own workspace at its peak, in bytes per token of the rank's shard and per
  // query head x head dim of a call (the Hopper backward's fp32 dQ accumulator: 4 (D + 2) / D; a
  // call computes one head group's heads), as `seqpar probe` measures it on the longest call; 0
  // where not measured.
  double call_workspace_bytes_per_query_element = 0.0;
  // Time of a schedule's shard-pair compute step (keys of fewer than all ranks' shards, run among
  // the schedule's exchanges: ring, Burst, DistFlashAttn, Attention2D steps) over what `attention`
  // predicts for the same call alone, forward and backward. The probe's rows are single calls on
  // an idle GPU: on 4 x H200 the ring family's passes ran 5-13% forward and 0-9% backward over
  // them, Ulysses' whole-sequence calls 1-7% and 1-2% (docs/PLANNER.md "Shard steps"). Fitted
  // per cluster from measured runs by docs/planner/fit_shard_steps.py; 1 where not fitted (the
  // presets' rates come from such steps' traces already). Fitted on dense masks; it stretches
  // window steps too, not documents steps (cost_model.cpp's predict_on says why).
  double shard_step_fwd = 1.0, shard_step_bwd = 1.0;
  std::vector<std::string> sources;   // where the figures come from

  int gpus() const { return gpus_per_node * nodes; }
  Topology topology() const { return {nodes > 1 ? gpus_per_node : 0}; }
  const LinkSpec& link(LinkClass c) const { return c == LinkClass::kIntra ? intra : inter; }
  // Seconds of a local attention call of `flops` FLOPs (counted as AttentionRate counts them)
  // over `heads` heads, of mask kind `mask`, head dim `head_dim`. Entries are matched by FLOPs
  // per head: heads are independent work of the same tile shapes, so a head group's call of
  // fewer heads runs at the rate of its tokens, not of its smaller total. A window or documents
  // call whose queries see `keys_per_query` keys on average runs as causal calls of twice that
  // length (short documents run at short calls' rate whatever their total), scaled by what that
  // kind's rows measured against the same; without keys_per_query or rows of its kind, it is
  // priced by its FLOPs at the causal rows.
  double attention_seconds(double flops, int64_t heads, RateMask mask, int64_t head_dim, bool backward,
                           double keys_per_query = 0) const;
};

// Presets: "h100x2", "h100x4", "h200x2", "h200x4" (one node, NVLink between every pair), and
// "generic:N" (N GPUs, 8 a node, NVLink inside, 50 GB/s per GPU between nodes).
StatusOr<Cluster> cluster_preset(const std::string& name);
std::vector<std::string> cluster_preset_names();
// A preset name or a JSON file path.
StatusOr<Cluster> load_cluster(const std::string& name_or_path);
StatusOr<Cluster> cluster_from_json(const std::string& json_text);
std::string cluster_to_json(const Cluster& cluster);

}  // namespace seqpar::planner
