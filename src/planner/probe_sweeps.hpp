// The measurements of `seqpar probe` that are the same on every device: the attention sweep
// (a backend over lengths and masks, forward and backward) and the link sweep (pairwise
// exchanges at each size, an all-to-all, the host time to post and wait for a batch). Each
// device half hands them its memory and its clock (ProbeMemory).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "planner/probe.hpp"
#include "seqpar/backend.hpp"
#include "seqpar/comm.hpp"
#include "seqpar/distributed_attention.hpp"
#include "seqpar/layout.hpp"
#include "seqpar/schedule.hpp"

namespace seqpar::planner {

// Where the attention sweep's tensors live and how its calls are timed.
class ProbeMemory {
 public:
  virtual ~ProbeMemory() = default;
  // A contiguous tensor of uniform values in [-1, 1) (inputs alike on every device: see
  // CONVENTIONS.md, benchmarks), held until release().
  virtual StatusOr<TensorView> random(DType dtype, const std::vector<int64_t>& shape) = 0;
  virtual void release() = 0;
  // Median seconds of call() over `repeats` runs after one untimed run (plans built, caches warm);
  // device work is timed on the stream the calls are queued on.
  virtual StatusOr<double> median_seconds(const std::function<Status()>& call, int repeats) = 0;
  virtual void* stream() const { return nullptr; }
  // Device memory call() takes at its peak beyond what is held before it (the call's own
  // workspace), once it is done; -1 where the device does not count its memory (the host).
  virtual StatusOr<int64_t> workspace_bytes(const std::function<Status()>& /*call*/) { return int64_t(-1); }
};

// What the attention sweep measured: a rate per length and mask, and the memory a call takes
// beyond its inputs and outputs (call_workspace_bytes_per_query_element).
struct AttentionSweep {
  std::vector<AttentionRate> rows;
  // Cluster::call_workspace_bytes_per_query_element as the longest measured causal call shows
  // it: the larger of the forward's and the backward's own workspace over S H D (query) elements.
  // -1: not measured.
  double call_workspace_bytes_per_query_element = -1;
  int64_t workspace_tokens = 0;  // the length it was measured at
};

// Rates of `backend` on inputs of dtype `input` (accumulators and row stats fp32), B = 1, the
// options' heads and head dim, for each mask and length: one AttentionRate each (a length or mask
// the backend refuses is logged and left out), and the workspace where `memory` counts
// it. `source` goes into each row.
StatusOr<AttentionSweep> sweep_attention(const AttentionBackend& backend, DType input,
                                                     ProbeMemory& memory, const ProbeOptions& options,
                                                     const std::string& source, const ProbeLog& log);

// What the link sweep measured, as rank 0 saw it.
struct LinkSweep {
  std::vector<LinkSample> pair;
  double all_to_all_bytes_per_peer = 0, all_to_all_seconds = 0;  // 0: fewer than three ranks
  double post_s = 0, wait_s = 0;  // host seconds to post a tiny batch, and to wait for it
};

// Collective: every rank of `comm` calls it with buffers (host or device, as the communicator
// moves them) of at least the largest message size each. Ranks pair up (0-1, 2-3, ...; an odd
// last rank idles) and exchange each size, all pairs at once as in a ring step. Rank 0's result
// is returned; on the other ranks it is empty.
StatusOr<LinkSweep> sweep_links(Communicator& comm, void* send, void* recv, const ProbeOptions& options,
                                const ProbeLog& log);

// A rank's q, k, v, o, lse, dout, dq, dk, dv for n tokens (B = 1, the options' heads and head
// dim): uniform values in `input` (lse fp32), held by `memory` until its release().
StatusOr<ShardTensors> random_shard_tensors(ProbeMemory& memory, DType input, int64_t n, const ProbeOptions& options);

// One rank's distributed attention on its device, for sweep_schedules (each device half makes one).
class ProbeRankPasses {
 public:
  virtual ~ProbeRankPasses() = default;
  // Plans `algorithm` (named, one head group) over `layout`, causal, B = 1 and the options' heads
  // and head dim, on random inputs of this rank.
  virtual Status prepare(Communicator& comm, const std::string& algorithm, const Layout& layout,
                         const ProbeOptions& options) = 0;
  // Runs the prepared pass; its device work is done when it returns.
  virtual Status run(Communicator& comm, Pass pass) = 0;
  virtual const AttentionPlan& plan() const = 0;  // the prepared one
  virtual void release() = 0;
};

// Collective: ring-return over options.schedule_tokens tokens a rank (one untimed run, then
// options.repeats), each pass between barriers. Rank 0's samples are returned; the others' empty.
StatusOr<std::vector<ScheduleSample>> sweep_schedules(Communicator& comm, ProbeRankPasses& passes,
                                                      const ProbeOptions& options, const ProbeLog& log);

// Seconds of `fn` on the host clock.
double host_seconds(const std::function<void()>& fn);
// The median of a non-empty list.
double median(std::vector<double> values);

}  // namespace seqpar::planner
