// The device-independent sweeps of `seqpar probe` (probe_sweeps.hpp): attention rates through the
// backend interface, and pairwise and all-to-all link times through the Communicator.
#include "planner/probe_sweeps.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace seqpar::planner {
namespace {

std::string format(const char* fmt, double a, double b = 0) {
  char line[128];
  std::snprintf(line, sizeof line, fmt, a, b);
  return line;
}

// Repetitions of a timed exchange: enough that a small message's time is not the barrier's skew
// between the two ranks, few enough that the largest stays quick.
int exchanges_per_timing(int64_t bytes) {
  return int(std::clamp<int64_t>((int64_t(64) << 20) / std::max<int64_t>(bytes, 1), 2, 50));
}

}  // namespace

double host_seconds(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

StatusOr<AttentionSweep> sweep_attention(const AttentionBackend& backend, DType input,
                                                     ProbeMemory& memory, const ProbeOptions& o,
                                                     const std::string& source, const ProbeLog& log) {
  const int64_t H = o.heads, Hkv = o.kv_heads, D = o.head_dim;
  const bool takes_delta = backend.caps().takes_delta;
  void* stream = memory.stream();
  AttentionSweep sweep;
  std::vector<AttentionRate>& rows = sweep.rows;
  for (const std::string& mask_text : o.masks) {
    for (const int64_t S : o.tokens) {
      const std::string what = std::string("attention ") + backend.name() + " " + mask_text + " " + std::to_string(S);
      AttentionParams params;
      SP_ASSIGN_OR_RETURN(params.mask, parse_mask(mask_text, S));
      const RateMask kind = rate_mask_of(params.mask);
      const bool causal = kind == RateMask::kCausal;
      memory.release();  // the previous length's tensors
      SP_ASSIGN_OR_RETURN(const TensorView q, memory.random(input, {1, S, H, D}));
      const std::string why_not = backend.supports(q, params);
      if (!why_not.empty()) {
        log("probe: " + what + ": refused (" + why_not + "), left out");
        continue;
      }
      SP_ASSIGN_OR_RETURN(const TensorView k, memory.random(input, {1, S, Hkv, D}));
      SP_ASSIGN_OR_RETURN(const TensorView v, memory.random(input, {1, S, Hkv, D}));
      SP_ASSIGN_OR_RETURN(const TensorView dout, memory.random(input, {1, S, H, D}));
      SP_ASSIGN_OR_RETURN(const TensorView out, memory.random(DType::kF32, {1, S, H, D}));
      SP_ASSIGN_OR_RETURN(const TensorView lse, memory.random(DType::kF32, {1, H, S}));
      // D = rowsum(dO * O), or O itself for a backend that computes D (cuDNN): its values do not
      // change the time, so it is drawn like the inputs rather than computed.
      SP_ASSIGN_OR_RETURN(const TensorView delta, takes_delta ? memory.random(DType::kF32, {1, H, S})
                                                              : memory.random(input, {1, S, H, D}));
      SP_ASSIGN_OR_RETURN(const TensorView dq, memory.random(DType::kF32, {1, S, H, D}));
      SP_ASSIGN_OR_RETURN(const TensorView dk, memory.random(DType::kF32, {1, S, Hkv, D}));
      SP_ASSIGN_OR_RETURN(const TensorView dv, memory.random(DType::kF32, {1, S, Hkv, D}));

      log("probe: " + what + " forward ...");
      const auto forward = [&] {
        return backend.forward(q, k, v, params, out, lse, FreshOutputs{true, false, false}, stream);
      };
      // The backward reads the forward's LSE (finite rows), as a schedule's does.
      const auto backward = [&] {
        return backend.backward(q, k, v, dout, lse, delta, params, dq, dk, dv, FreshOutputs{false, true, true}, stream);
      };
      SP_ASSIGN_OR_RETURN(const double fwd_s, memory.median_seconds(forward, o.repeats));
      log("probe: " + what + " backward ...");
      SP_ASSIGN_OR_RETURN(const double bwd_s, memory.median_seconds(backward, o.repeats));
      // Memory: the causal calls of the longest length measured (the last of the ascending list).
      if (causal && S >= sweep.workspace_tokens) {
        SP_ASSIGN_OR_RETURN(const int64_t fwd_extra, memory.workspace_bytes(forward));
        SP_ASSIGN_OR_RETURN(const int64_t bwd_extra, memory.workspace_bytes(backward));
        if (fwd_extra >= 0 && bwd_extra >= 0) {
          const double query_elements = double(S) * double(H) * double(D);
          sweep.call_workspace_bytes_per_query_element = double(std::max(fwd_extra, bwd_extra)) / query_elements;
          sweep.workspace_tokens = S;
          log("probe: " + what + format(": workspace %.4g MiB forward, ", double(fwd_extra) / (1 << 20)) +
              format("%.4g MiB backward: %.3g bytes a query element", double(bwd_extra) / (1 << 20),
                     sweep.call_workspace_bytes_per_query_element));
        }
      }
      AttentionRate rate;
      rate.backend = backend.name();
      rate.head_dim = D, rate.heads = H, rate.tokens = S, rate.mask = kind;
      if (kind == RateMask::kWindow || kind == RateMask::kDocuments)
        rate.visible = params.mask.visible_pairs(S) / (double(S) * double(S));
      rate.fwd_tflops = rate.flops(false) / fwd_s / 1e12;
      rate.bwd_tflops = rate.flops(true) / bwd_s / 1e12;
      rate.source = source;
      log("probe: " + what + format(": forward %.4g ms, %.4g TFLOP/s", fwd_s * 1e3, rate.fwd_tflops) +
          format("; backward %.4g ms, %.4g TFLOP/s", bwd_s * 1e3, rate.bwd_tflops));
      rows.push_back(rate);
    }
  }
  memory.release();
  SP_CHECK_SUPPORTED(!rows.empty(), std::string("backend ") + backend.name() + " refused every probe shape (H = " +
                                        std::to_string(H) + ", H_kv = " + std::to_string(Hkv) +
                                        ", D = " + std::to_string(D) + ")");
  return sweep;
}

StatusOr<LinkSweep> sweep_links(Communicator& comm, void* send, void* recv, const ProbeOptions& o,
                                const ProbeLog& log) {
  const int P = comm.size(), rank = comm.rank();
  const int partner = (rank ^ 1) < P ? (rank ^ 1) : -1;  // an odd last rank idles
  const auto exchange = [&](size_t bytes) -> Status {
    if (partner < 0) return Status::Ok();
    const SendSpec s{partner, send, bytes};
    const RecvSpec r{partner, recv, bytes};
    return comm.exchange({&s, 1}, {&r, 1});
  };
  // Times `step` (run `iters` times back to back after a barrier) `repeats` times: the median
  // seconds of one step.
  const auto time_steps = [&](int iters, const std::function<Status()>& step) -> StatusOr<double> {
    SP_RETURN_IF_ERROR(step());  // warm-up: connections and buffers registered
    std::vector<double> times;
    for (int i = 0; i < o.repeats; ++i) {
      SP_RETURN_IF_ERROR(comm.barrier());
      Status status = Status::Ok();
      const double t = host_seconds([&] {
        for (int k = 0; k < iters && status.ok(); ++k) status = step();
      });
      SP_RETURN_IF_ERROR(status);
      times.push_back(t / iters);
    }
    return median(times);
  };

  LinkSweep out;
  for (const int64_t bytes : o.message_bytes) {
    if (rank == 0) log("probe: link pairs of " + std::to_string(P) + " ranks, " + std::to_string(bytes) + " bytes ...");
    SP_ASSIGN_OR_RETURN(const double t, time_steps(exchanges_per_timing(bytes), [&] { return exchange(size_t(bytes)); }));
    if (rank == 0) {
      out.pair.push_back({double(bytes), t});
      log("probe: link " + std::to_string(bytes) + " bytes" +
          format(": %.4g us, %.4g GB/s per direction", t * 1e6, double(bytes) / t / 1e9));
    }
  }

  // All-to-all: each rank sends the largest message in P blocks. Two ranks make one pair, so
  // it says nothing new there.
  if (P >= 3) {
    const int64_t largest = *std::max_element(o.message_bytes.begin(), o.message_bytes.end());
    const size_t per_peer = size_t(std::max<int64_t>(1, largest / P));
    if (rank == 0) log("probe: all-to-all of " + std::to_string(P) + " ranks, " + std::to_string(per_peer) + " bytes a peer ...");
    SP_ASSIGN_OR_RETURN(const double t, time_steps(exchanges_per_timing(int64_t(per_peer) * (P - 1)),
                                                  [&] { return comm.all_to_all(send, recv, per_peer); }));
    if (rank == 0) {
      out.all_to_all_bytes_per_peer = double(per_peer), out.all_to_all_seconds = t;
      log("probe: all-to-all" + format(": %.4g us, %.4g GB/s out of each rank", t * 1e6,
                                       double(per_peer) * (P - 1) / t / 1e9));
    }
  }

  // Host time to post a batch of one small send and receive, and to wait for it.
  const size_t tiny = size_t(std::min<int64_t>(256, *std::min_element(o.message_bytes.begin(), o.message_bytes.end())));
  std::vector<double> post_times, wait_times;
  SP_RETURN_IF_ERROR(comm.barrier());
  if (partner >= 0) {
    const SendSpec s{partner, send, tiny};
    const RecvSpec r{partner, recv, tiny};
    for (int i = 0; i < 50; ++i) {
      std::unique_ptr<PendingExchange> pending;
      Status status = Status::Ok();
      post_times.push_back(host_seconds([&] {
        auto started = comm.start_exchange({&s, 1}, {&r, 1});
        if (started.ok()) pending = std::move(started.value());
        else status = started.status();
      }));
      SP_RETURN_IF_ERROR(status);
      wait_times.push_back(host_seconds([&] { status = pending->wait(); }));
      SP_RETURN_IF_ERROR(status);
    }
  }
  SP_RETURN_IF_ERROR(comm.barrier());
  if (rank == 0) {
    out.post_s = median(post_times), out.wait_s = median(wait_times);
    log("probe: post" + format(" %.4g us, wait %.4g us a batch", out.post_s * 1e6, out.wait_s * 1e6));
  }
  return out;
}

StatusOr<ShardTensors> random_shard_tensors(ProbeMemory& memory, DType input, int64_t n, const ProbeOptions& o) {
  const int64_t H = o.heads, Hkv = o.kv_heads, D = o.head_dim;
  ShardTensors t;
  for (TensorView* x : {&t.q, &t.o, &t.dout, &t.dq}) {
    SP_ASSIGN_OR_RETURN(*x, memory.random(input, {1, n, H, D}));
  }
  for (TensorView* x : {&t.k, &t.v, &t.dk, &t.dv}) {
    SP_ASSIGN_OR_RETURN(*x, memory.random(input, {1, n, Hkv, D}));
  }
  SP_ASSIGN_OR_RETURN(t.lse, memory.random(DType::kF32, {1, H, n}));
  return t;
}

StatusOr<std::vector<ScheduleSample>> sweep_schedules(Communicator& comm, ProbeRankPasses& passes,
                                                      const ProbeOptions& o, const ProbeLog& log) {
  const int P = comm.size();
  const int64_t seq = o.schedule_tokens * P;
  const std::string algorithm = "ring-return";  // the ring family's step, among its exchanges
  if (comm.rank() == 0)
    log("probe: " + algorithm + " over " + std::to_string(P) + " ranks, " + std::to_string(seq) + " tokens ...");
  SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(LayoutKind::kZigzag, seq, P));
  SP_RETURN_IF_ERROR(passes.prepare(comm, algorithm, layout, o));
  std::vector<double> fwd, bwd;
  for (int i = 0; i <= o.repeats; ++i) {  // the first untimed: plans built, buffers placed
    double seconds[2] = {0, 0};
    for (const Pass pass : {Pass::kForward, Pass::kBackward}) {
      SP_RETURN_IF_ERROR(comm.barrier());
      Status status = Status::Ok();
      seconds[int(pass)] = host_seconds([&] {
        status = passes.run(comm, pass);
        if (status.ok()) status = comm.barrier();  // the slowest rank's end
      });
      SP_RETURN_IF_ERROR(status);
    }
    if (i > 0) fwd.push_back(seconds[0]), bwd.push_back(seconds[1]);
  }
  const BlockBytes wire = passes.plan().block_bytes;
  passes.release();
  std::vector<ScheduleSample> out;
  if (comm.rank() == 0) {
    out.push_back({algorithm, seq, median(fwd), median(bwd), wire});
    log("probe: " + algorithm + format(": forward %.4g ms, backward %.4g ms", out.back().fwd_s * 1e3,
                                       out.back().bwd_s * 1e3));
  }
  return out;
}

}  // namespace seqpar::planner
