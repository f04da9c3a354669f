// A rank's attention session: what a caller of distributed attention keeps between calls, so
// that the tool, the model, the benchmarks and the Python binding run attention the same way.
// It holds the rank's communicator (not owned, it must outlive the session), picks the local
// backend for the tensors' device (the blocked CPU kernels on the host; on a GPU the one
// SEQPAR_ATTN_BACKEND names, else on sm_90 "auto", which hands each call to the fastest of cuDNN,
// our Hopper kernels and our own, else cuDNN where it takes the problem, else our own kernels,
// which take every mask but block patterns), plans each
// problem once and caches the plan by the whole problem (layout, mask with its documents and
// block pattern, dims, dtypes, scale, backend), and runs the forward and backward through the one
// executor on the tensors' device.
//
// Shapes as in distributed_attention.hpp (rank r's shard, S_r = layout.local_len(r)):
//   q, o, dout, dq: [B, S_r, H, D]   k, v, dk, dv: [B, S_r, H_kv, D]   lse: [B, H, S_r]
// Host tensors: fp32 or fp64 (lse in q's dtype). Device tensors: bf16 or fp16 on the current
// CUDA device (lse fp32); the work is queued on PassOptions::stream. A session's GPU state
// lives on the first device it computes on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "seqpar/distributed_attention.hpp"

namespace seqpar {

struct SessionOptions {
  PlanOptions plan;            // algorithm and planner options, for every problem
  bool prefer_cudnn = true;    // GPU: the fastest backend that takes the problem ("auto" on sm_90,
                               // else cuDNN), else our kernels (false: our kernels)
  int64_t max_call_rows = 0;   // GPU: no cuDNN call spans more rows (0: no bound)
  // GPU: backward passes give the same bits every run (training that resumes bit for bit):
  // cuDNN's deterministic algorithm, whose workspace grows as S_q x S_k per call (bound it with
  // max_call_rows); problems cuDNN does not take are refused (our kernels sum dQ with atomics).
  bool deterministic = false;
  bool trace = false;          // GPU: record the passes' milestones (take_trace)
  size_t max_plans = 64;       // beyond this many problems the plan cache starts over
};

struct PassOptions {
  void* stream = nullptr;          // GPU: the CUDA stream the pass is queued on
  ForwardState* state = nullptr;   // required where the plan keeps forward blocks
  PassStats* stats = nullptr;
};

class Session {
 public:
  explicit Session(Communicator& comm, SessionOptions options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // This rank's plan of the problem (layout, params with their mask) on tensors like q and k:
  // made on the first call, then the cached one. Valid until the cache starts over
  // (SessionOptions::max_plans problems later) or the session ends.
  StatusOr<const AttentionPlan*> plan(const Layout& layout, const AttentionParams& params, const TensorView& q,
                                      const TensorView& k);
  // Plans (or reuses the plan) and runs the forward (writes t.o, t.lse) or the backward (writes
  // t.dq, t.dk, t.dv) of this rank's shard, on the tensors' device.
  Status forward(const Layout& layout, const AttentionParams& params, const ShardTensors& t,
                 const PassOptions& pass = {});
  Status backward(const Layout& layout, const AttentionParams& params, const ShardTensors& t,
                  const PassOptions& pass = {});
  // From now on, plans take `plan`'s algorithm and grid (Ulysses degree, ring algorithm) in place
  // of the session's auto: a caller whose layout changes with every batch (a trainer on the
  // documents layout) chooses once, not once per batch, since the planner prices every candidate
  // on the whole layout (0.6-1.9 s at 256K-1M tokens on 2 cores). Head groups are still chosen per
  // problem (the shards' sizes change with the layout). Plans made before keep their own.
  void keep_choice(const AttentionPlan& plan);
  // Runs one pass of a plan this session made.
  Status run(const AttentionPlan& plan, Pass pass, const ShardTensors& t, const PassOptions& options = {});

  Communicator& comm() const;
  // GPU, with SessionOptions::trace: the milestones the passes since the last call passed, as
  // (label, ms after the first) (src/parallel/gpu_executor.hpp's GpuWorkspace::take_trace).
  StatusOr<std::vector<std::pair<std::string, double>>> take_trace();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace seqpar
