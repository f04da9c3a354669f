// Multi-GPU benchmark of the distributed algorithms: one process, a thread per GPU, NCCL between
// them. For each total length S: bf16 forward + backward (causal by default; --mask, --kv-heads,
// --layout, and ulysses-ring's --ulysses / --ring-algo as `seqpar attn` takes them; the bytes
// each rank sent) with each algorithm asked for
// (ring, burst, distflash, ..., auto) through the single algorithm API and the GPU executor; median time, TFLOP/s per GPU, peak extra device memory per GPU (every byte our
// buffers hold beyond q, k, v and dO: outputs, LSE, workspace) and our single-GPU cuDNN
// kernel's throughput at S / P tokens, the mean over the GPUs (the scaling reference). One
// JSON line per run; the PyTorch peer is bench/torch_cp_peer.py and bench/compare_multi_gpu.py
// joins the two. A configuration an algorithm refuses (a layout, mask or size it does not take)
// gets a line with "error" and the run goes on with the next one; a failure while running (CUDA,
// NCCL) stops it. --rounds R interleaves the algorithms R times per length and reports each one's
// median round ("round_ms" holds them all). With a document mask the line lists "doc_lengths",
// which bench/torch_sdpa_docs_peer.py reads to time PyTorch SDPA per document on one GPU.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cudnn/cudnn_attention.hpp"
#include "seqpar/gpu.hpp"
#include "parallel/gpu_executor.hpp"
#include "seqpar/nccl_comm.hpp"
#include "bench_util.cuh"

namespace seqpar {
namespace {

struct Options {
  std::vector<int64_t> seqs{16384, 65536, 131072, 262144, 524288, 1048576, 2097152};
  std::vector<std::string> algos{"ring", "burst", "auto"};
  int gpus = 0;
  int64_t heads = 32, head_dim = 128;
  int64_t kv_heads = 0;            // 0: heads (no GQA)
  std::string mask = "causal";     // MaskSpec text, as seqpar attn's --mask
  std::string layout = "zigzag";
  int ulysses = 0;                 // ulysses-ring's degree (0: the planner's)
  std::string ring_algo = "ring";  // ulysses-ring's ring dimension
  bool keep_forward_state = false;
  int64_t single_max = 262144;  // single-GPU reference up to this many tokens per GPU
  int64_t big_from = 1048576;   // from here: only big_algos, one run each without warm-up
  std::vector<std::string> big_algos{"auto"};
  std::vector<int> head_groups{0};  // 0: the executor's choice; several: a sweep
  int64_t probe_tokens = 0;         // > 0: run the communication probes at this many tokens first
  bool trace = false;               // print each rank's step milestones of the last iteration
  int rounds = 1;                   // > 1: the algorithms interleaved, each reported by its median round
};

// A device tensor, filled with uniform random bf16 (seed != 0) or zeros, on stream s.
StatusOr<DeviceTensor> device_tensor(DType t, std::vector<int64_t> shape, uint64_t seed, cudaStream_t s) {
  DeviceTensor out;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  SP_ASSIGN_OR_RETURN(out.buffer, DeviceBuffer::allocate(n * dtype_size(t)));
  int device = 0;
  cudaGetDevice(&device);
  out.view = TensorView::contiguous(out.buffer.data(), t, shape, Device{DeviceKind::kCuda, device});
  if (seed && t == DType::kBF16)
    bench::fill_uniform_bf16<<<1024, 256, 0, s>>>(static_cast<uint16_t*>(out.buffer.data()), size_t(n), seed);
  else if (cudaMemsetAsync(out.buffer.data(), 0, n * dtype_size(t), s) != cudaSuccess)
    return SP_STATUS(StatusCode::kInternal, "memset failed");
  return std::move(out);
}

double causal_flops(int64_t S, int64_t H, int64_t D, bool backward) {
  return 4.0 * double(S) * double(S) * H * D * 0.5 * (backward ? 3.5 : 1.0);
}

// FLOPs of the pairs the mask leaves visible (the causal count for the causal mask).
double mask_flops(const MaskSpec& mask, int64_t S, int64_t H, int64_t D, bool backward) {
  return 4.0 * mask.visible_pairs(S) * H * D * (backward ? 3.5 : 1.0);
}


// One GPU's causal attention problem at S tokens: random inputs, zeroed outputs, and its cuDNN
// fwd+bwd (the scaling reference and the overlap probe's compute).
struct SingleGpuAttention {
  DeviceTensor q, k, v, dout, o, dq, dk, dv, lse;

  static StatusOr<SingleGpuAttention> create(int64_t S, int64_t H, int64_t D, cudaStream_t s) {
    SingleGpuAttention a;
    int seed = 11;
    for (DeviceTensor* t : {&a.q, &a.k, &a.v, &a.dout}) {
      SP_ASSIGN_OR_RETURN(*t, device_tensor(DType::kBF16, {1, S, H, D}, seed++, s));
    }
    for (DeviceTensor* t : {&a.o, &a.dq, &a.dk, &a.dv}) {
      SP_ASSIGN_OR_RETURN(*t, device_tensor(DType::kBF16, {1, S, H, D}, 0, s));
    }
    SP_ASSIGN_OR_RETURN(a.lse, device_tensor(DType::kF32, {1, H, S}, 0, s));
    return std::move(a);
  }

  Status fwd_bwd(cudaStream_t s) const {
    AttentionParams p;
    p.mask = MaskSpec::causal();
    SP_RETURN_IF_ERROR(cudnn_attention_forward(q.view, k.view, v.view, p, o.view, lse.view, s));
    return cudnn_attention_backward(q.view, k.view, v.view, o.view, dout.view, lse.view, p, dq.view,
                                    dk.view, dv.view, s);
  }
};

// Our single-GPU cuDNN kernel, causal fwd+bwd TFLOP/s at S tokens (the scaling reference).
StatusOr<double> single_gpu_tflops(int64_t S, int64_t H, int64_t D, cudaStream_t s) {
  SP_ASSIGN_OR_RETURN(const SingleGpuAttention a, SingleGpuAttention::create(S, H, D, s));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  // A warm-up and 3 runs; past 256K tokens (a run of 15 s and more) one run, whose graph
  // build is well under 1% of it.
  const int warm = S > 262144 ? 0 : 1, runs = S > 262144 ? 1 : 3;
  std::vector<double> ms;
  for (int it = 0; it < warm + runs; ++it) {
    cudaEventRecord(e0, s);
    SP_RETURN_IF_ERROR(a.fwd_bwd(s));
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (it >= warm) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return causal_flops(S, H, D, true) / (bench::median(ms) * 1e-3) / 1e12;
}

// Diagnostics for the small sizes: the ring exchange's bandwidth per direction, and how much a
// concurrent exchange slows a cuDNN causal fwd+bwd at `tokens` tokens (32 heads) on each GPU.
Status probe(Communicator& comm, const Options& opt, int64_t tokens, cudaStream_t s) {
  const int P = comm.size(), me = comm.rank();
  cudaStream_t side;
  cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  const auto elapsed = [&](cudaStream_t on, auto&& work) -> StatusOr<double> {
    std::vector<double> ms;
    for (int it = 0; it < 6; ++it) {
      SP_RETURN_IF_ERROR(comm.barrier());
      cudaEventRecord(a, on);
      SP_RETURN_IF_ERROR(work());
      cudaEventRecord(b, on);
      SP_RETURN_IF_ERROR(comm.synchronize(on));
      float t = 0;
      cudaEventElapsedTime(&t, a, b);
      if (it > 0) ms.push_back(t);
    }
    return bench::median(ms);
  };
  const int64_t max_bytes = 256ll << 20;
  SP_ASSIGN_OR_RETURN(DeviceBuffer send, DeviceBuffer::allocate(max_bytes));
  SP_ASSIGN_OR_RETURN(DeviceBuffer recv, DeviceBuffer::allocate(max_bytes));
  const auto exchange = [&](int64_t bytes, cudaStream_t on) -> Status {
    const SendSpec sp{(me + 1) % P, send.data(), size_t(bytes)};
    const RecvSpec rp{(me + P - 1) % P, recv.data(), size_t(bytes)};
    auto pending = comm.start_exchange({&sp, 1}, {&rp, 1}, StreamOrder::on(on));
    if (!pending.ok()) return pending.status();
    return pending.value() ? pending.value()->wait_on_stream(on) : Status::Ok();
  };
  for (int64_t mib : {32, 64, 128, 256}) {
    SP_ASSIGN_OR_RETURN(double ms, elapsed(s, [&] { return exchange(mib << 20, s); }));
    if (me == 0)
      std::printf("{\"kind\":\"seqpar_comm_probe\",\"gpus\":%d,\"mib\":%lld,\"ms\":%.4f,\"GBps_per_direction\":%.1f}\n",
                  P, (long long)mib, ms, double(mib << 20) / (ms * 1e-3) / 1e9);
  }
  const int64_t H = opt.heads, D = opt.head_dim, S = tokens;
  SP_ASSIGN_OR_RETURN(const SingleGpuAttention single, SingleGpuAttention::create(S, H, D, s));
  const auto attention = [&] { return single.fwd_bwd(s); };
  SP_ASSIGN_OR_RETURN(double alone, elapsed(s, attention));
  const int64_t bytes = 2 * S * H * D * 2;  // a K/V shard
  SP_ASSIGN_OR_RETURN(double with_comm, elapsed(s, [&]() -> Status {
    SP_RETURN_IF_ERROR(exchange(std::min(bytes, max_bytes), side));
    return attention();
  }));
  if (me == 0)
    std::printf("{\"kind\":\"seqpar_overlap_probe\",\"tokens\":%lld,\"cudnn_fwdbwd_ms\":%.4f,\"with_exchange_ms\":%.4f,\"exchange_mib\":%lld}\n",
                (long long)S, alone, with_comm, (long long)(std::min(bytes, max_bytes) >> 20));
  std::fflush(stdout);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return comm.synchronize(side);
}

// One (S, algo) configuration on this rank, set up but not yet run: everything that may refuse
// it (mask, layout, backend, plan), and no collective on the way.
struct Prepared {
  AttentionParams params;
  std::optional<Layout> layout;
  int64_t n = 0;  // this rank's tokens
  DeviceTensor q, k, v, dout;
  std::unique_ptr<AttentionBackend> backend;
  std::optional<AttentionPlan> plan;  // points at *backend
};

StatusOr<std::unique_ptr<Prepared>> prepare(Communicator& comm, const Options& opt, int64_t S,
                                            const std::string& algo, int head_groups, cudaStream_t s) {
  const int P = comm.size(), me = comm.rank();
  const int64_t H = opt.heads, Hkv = opt.kv_heads > 0 ? opt.kv_heads : opt.heads, D = opt.head_dim;
  auto p = std::make_unique<Prepared>();
  SP_ASSIGN_OR_RETURN(p->params.mask, parse_mask(opt.mask, S));
  SP_ASSIGN_OR_RETURN(const LayoutKind kind, parse_layout(opt.layout));
  // The documents layout balances the mask's documents (the others ignore them).
  SP_ASSIGN_OR_RETURN(Layout layout, Layout::create(kind, S, P, p->params.mask.doc_offsets));
  p->layout.emplace(std::move(layout));
  p->n = p->layout->local_len(me);
  const int64_t n = p->n;
  SP_ASSIGN_OR_RETURN(p->q, device_tensor(DType::kBF16, {1, n, H, D}, 1 + me, s));
  SP_ASSIGN_OR_RETURN(p->k, device_tensor(DType::kBF16, {1, n, Hkv, D}, 101 + me, s));
  SP_ASSIGN_OR_RETURN(p->v, device_tensor(DType::kBF16, {1, n, Hkv, D}, 201 + me, s));
  SP_ASSIGN_OR_RETURN(p->dout, device_tensor(DType::kBF16, {1, n, H, D}, 301 + me, s));
  p->backend = make_gpu_backend(p->q.view, p->params);
  SP_CHECK_SUPPORTED(p->backend != nullptr, "no GPU backend takes this problem");
  PlanOptions plan_options{algo, {}};
  plan_options.head_groups = head_groups;
  plan_options.ulysses = opt.ulysses;
  plan_options.ring_algorithm = opt.ring_algo;
  plan_options.keep_forward_state = opt.keep_forward_state;
  SP_ASSIGN_OR_RETURN(AttentionPlan plan, plan_attention(plan_options, *p->layout, p->params,
                                                         block_bytes_for(p->q.view, p->k.view, *p->backend), me,
                                                         *p->backend));
  p->plan.emplace(std::move(plan));
  return std::move(p);  // nvcc's front end does not move implicitly into StatusOr
}

// A refusal: the configuration is not one the algorithm (or a backend, a layout, the mask
// parser) takes. Anything else (CUDA, NCCL, memory) is a failure.
bool is_refusal(const Status& st) {
  return st.code() == StatusCode::kUnsupported || st.code() == StatusCode::kInvalidArgument;
}

// One (S, algo) run on this rank; fills `line` on rank 0. When any rank's setup refuses the
// configuration, every rank returns Ok with *refusal set (on rank 0 to the message), having run
// nothing: the ranks agree on it by one all-reduce before the first timed collective, so they
// stay in step. A failure in setup on any rank fails every rank; one while running stays fatal.
Status run_one(Communicator& comm, const Options& opt, int64_t S, const std::string& algo,
               int head_groups, bool trace, cudaStream_t s, nlohmann::ordered_json* line, std::string* refusal) {
  const int P = comm.size(), me = comm.rank();
  const int64_t H = opt.heads, Hkv = opt.kv_heads > 0 ? opt.kv_heads : opt.heads, D = opt.head_dim;
  StatusOr<std::unique_ptr<Prepared>> prepared = prepare(comm, opt, S, algo, head_groups, s);
  {
    // {worst verdict: 0 ready, 1 refused, 2 failed; P - the lowest rank that did not get ready}
    const bool ready = prepared.ok();
    double verdict[2] = {ready ? 0.0 : is_refusal(prepared.status()) ? 1.0 : 2.0, ready ? 0.0 : double(P - me)};
    SP_RETURN_IF_ERROR(comm.all_reduce(verdict, 2, DType::kF64, ReduceOp::kMax));
    const int first = P - int(verdict[1]);
    if (!ready && me != 0)
      std::fprintf(stderr, "bench_gpu_ring: rank %d, %s at %lld: %s\n", me, algo.c_str(), (long long)S,
                   prepared.status().to_string().c_str());
    if (verdict[0] >= 2) {
      if (!ready) return prepared.status();
      return SP_STATUS(StatusCode::kInternal, "rank " + std::to_string(first) + " failed setting up " + algo +
                                                  " (its error is on stderr)");
    }
    if (verdict[0] >= 1) {
      *refusal = me == 0 && !ready ? prepared.status().message()
                                   : "refused on rank " + std::to_string(first) + " (its message is on stderr)";
      return Status::Ok();
    }
  }
  Prepared& p = *prepared.value();
  const AttentionParams& params = p.params;
  const AttentionPlan& plan = *p.plan;
  const AttentionBackend* backend = p.backend.get();
  const int64_t n = p.n;
  int device = 0;
  cudaGetDevice(&device);
  cudaStreamSynchronize(s);
  SP_RETURN_IF_ERROR(cudnn_release_workspace());  // counted in this configuration's peak
  const int64_t base = device_memory_stats(device).current;
  reset_device_memory_peak(device);
  {
    SP_ASSIGN_OR_RETURN(DeviceTensor o, device_tensor(DType::kBF16, {1, n, H, D}, 0, s));
    SP_ASSIGN_OR_RETURN(DeviceTensor lse, device_tensor(DType::kF32, {1, H, n}, 0, s));
    SP_ASSIGN_OR_RETURN(DeviceTensor dq, device_tensor(DType::kBF16, {1, n, H, D}, 0, s));
    SP_ASSIGN_OR_RETURN(DeviceTensor dk, device_tensor(DType::kBF16, {1, n, Hkv, D}, 0, s));
    SP_ASSIGN_OR_RETURN(DeviceTensor dv, device_tensor(DType::kBF16, {1, n, Hkv, D}, 0, s));
    GpuWorkspace ws(trace);
    ForwardState kept;  // what a keep_forward_state plan keeps between the passes
    const ShardTensors st{p.q.view, p.k.view, p.v.view, o.view, lse.view, p.dout.view, dq.view, dk.view, dv.view};
    const bool big = S >= opt.big_from;
    const int iters = big ? 1 : S <= 65536 ? 10 : 3, warm = big ? 0 : 1;
    cudaEvent_t e0, e1, e2;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventCreate(&e2);
    std::vector<double> fwd_ms, total_ms;
    for (int it = 0; it < warm + iters; ++it) {
      SP_RETURN_IF_ERROR(comm.barrier());
      cudaEventRecord(e0, s);
      comm.reset_counters();
      SP_RETURN_IF_ERROR(run_forward_gpu(comm, plan, st, ws, s, nullptr, &kept));
      cudaEventRecord(e1, s);
      SP_RETURN_IF_ERROR(run_backward_gpu(comm, plan, st, ws, s, nullptr, &kept));
      cudaEventRecord(e2, s);
      SP_RETURN_IF_ERROR(comm.synchronize(s));
      float f = 0, t = 0;
      cudaEventElapsedTime(&f, e0, e1);
      cudaEventElapsedTime(&t, e0, e2);
      if (it >= warm) fwd_ms.push_back(f), total_ms.push_back(t);
      if (trace) {
        SP_ASSIGN_OR_RETURN(const auto marks, ws.take_trace());
        if (it + 1 == warm + iters) {
          nlohmann::ordered_json marks_line = {{"kind", "seqpar_trace"}, {"algo", algo}, {"seq", S},
                                               {"rank", me}, {"marks", marks}};
          std::printf("%s\n", marks_line.dump().c_str());
          std::fflush(stdout);
        }
      }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaEventDestroy(e2);
    double stats[5] = {bench::median(fwd_ms), bench::median(total_ms),
                       double(device_memory_stats(device).peak - base) / double(1ll << 30),
                       double(comm.counters().sent(Phase::kForward)), double(comm.counters().sent(Phase::kBackward))};
    SP_RETURN_IF_ERROR(comm.all_reduce(stats, 5, DType::kF64, ReduceOp::kMax));
    (*line)["kind"] = "seqpar_ring";
    (*line)["algo"] = algo;
    (*line)["ran"] = plan.algorithm->name;
    (*line)["backend"] = backend->name();
    // Which backend ran rank 0's calls ("auto" hands each to one), per forward + backward.
    nlohmann::ordered_json calls = nlohmann::ordered_json::object();
    for (const auto& [what, count] : backend->calls_by_backend()) calls[what] = count / (warm + iters);
    (*line)["backend_calls_per_iter_rank0"] = calls;
    (*line)["gpus"] = P;
    (*line)["seq"] = S;
    (*line)["tokens_per_gpu"] = S / P;
    (*line)["heads"] = H;
    (*line)["kv_heads"] = Hkv;
    (*line)["head_dim"] = D;
    (*line)["mask"] = params.mask.describe();
    if (params.mask.has_documents()) {  // in order, as the peer (bench/torch_sdpa_docs_peer.py) reads them
      std::vector<int64_t> lengths;
      const std::vector<int64_t>& off = params.mask.doc_offsets;
      for (size_t d = 0; d + 1 < off.size(); ++d)
        if (std::min(off[d + 1], S) > off[d]) lengths.push_back(std::min(off[d + 1], S) - off[d]);
      (*line)["doc_lengths"] = lengths;
    }
    (*line)["layout"] = opt.layout;
    (*line)["keep_forward_state"] = opt.keep_forward_state;
    (*line)["head_groups"] = plan.head_groups;
    // ulysses-ring's grid as it ran (`seqpar plan --ulysses --ring-algo` prices it): the degree
    // --ulysses 0 resolved to, and the ring dimension.
    if (std::string(plan.algorithm->name) == "ulysses-ring") {
      (*line)["ulysses"] = plan.schedule.head_parts;
      (*line)["ring_algo"] = plan.request.ring_algorithm;
    }
    (*line)["iters"] = iters;
    (*line)["fwd_ms"] = stats[0];
    (*line)["fwdbwd_ms"] = stats[1];
    (*line)["fwd_tflops_per_gpu"] = mask_flops(params.mask, S, H, D, false) / (stats[0] * 1e-3) / 1e12 / P;
    (*line)["fwdbwd_tflops_per_gpu"] = mask_flops(params.mask, S, H, D, true) / (stats[1] * 1e-3) / 1e12 / P;
    (*line)["peak_extra_GiB"] = stats[2];
    (*line)["sent_bytes_per_rank_max"] = {{"forward", int64_t(stats[3])}, {"backward", int64_t(stats[4])}};
  }
  return Status::Ok();
}

Status bench_rank(Communicator& comm, const Options& opt) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (opt.probe_tokens > 0) SP_RETURN_IF_ERROR(probe(comm, opt, opt.probe_tokens, s));
  for (int64_t S : opt.seqs) {
    // The reference is measured on every GPU at once (the ring runs at its slowest GPU's pace,
    // and GPUs of one machine differ by a few percent); the fraction is against their mean.
    const int64_t per_gpu = S / comm.size();
    std::vector<double> singles(comm.size(), 0.0);
    if (per_gpu <= opt.single_max) {
      auto t = single_gpu_tflops(per_gpu, opt.heads, opt.head_dim, s);
      singles[comm.rank()] = t.ok() ? t.value() : 0;
    }
    SP_RETURN_IF_ERROR(comm.all_reduce(singles.data(), singles.size(), DType::kF64, ReduceOp::kSum));
    const bool every_gpu = std::all_of(singles.begin(), singles.end(), [](double t) { return t > 0; });
    const double single = every_gpu ? std::accumulate(singles.begin(), singles.end(), 0.0) / singles.size() : 0;
    // The (algo, head groups) runs of this S, interleaved over the rounds: algo1, algo2, ...,
    // algo1, algo2, ... (each run has its own warm-up), so drift over the call hits each alike.
    struct Candidate {
      std::string algo;
      int groups = 0;
      bool refused = false;
      std::vector<double> fwd_ms, total_ms;  // per round
      double peak_GiB = 0;
    };
    std::vector<Candidate> candidates;
    for (const std::string& algo : opt.algos)
      for (int groups : opt.head_groups) {
        if (S >= opt.big_from && std::find(opt.big_algos.begin(), opt.big_algos.end(), algo) == opt.big_algos.end())
          continue;
        if (groups > opt.heads || (groups > 0 && opt.heads % groups != 0)) continue;
        Candidate c;
        c.algo = algo;
        c.groups = groups;
        candidates.push_back(std::move(c));
      }
    for (int round = 0; round < opt.rounds; ++round)
      for (Candidate& c : candidates) {
        if (c.refused) continue;
        const bool last = round + 1 == opt.rounds;
        nlohmann::ordered_json line;
        std::string refusal;
        const Status st = run_one(comm, opt, S, c.algo, c.groups, opt.trace && last, s, &line, &refusal);
        c.refused = st.ok() && !refusal.empty();  // the same on every rank
        if (comm.rank() != 0) {
          SP_RETURN_IF_ERROR(st);
          continue;
        }
        if (!st.ok() || c.refused) {
          line = {{"kind", "seqpar_ring"}, {"algo", c.algo}, {"gpus", comm.size()}, {"seq", S},
                  {"tokens_per_gpu", per_gpu}};
          if (c.groups > 0) line["head_groups"] = c.groups;
          if (opt.rounds > 1) line["round"] = round;
          line["error"] = (st.ok() ? refusal : st.message()).substr(0, 300);
          std::printf("%s\n", line.dump().c_str());
          std::fflush(stdout);
          if (!st.ok()) return st;  // a failed collective run leaves the ranks out of step: stop here
          continue;                 // a refusal ends this algorithm only
        }
        c.fwd_ms.push_back(line["fwd_ms"].get<double>());
        c.total_ms.push_back(line["fwdbwd_ms"].get<double>());
        c.peak_GiB = std::max(c.peak_GiB, line["peak_extra_GiB"].get<double>());
        if (!last) continue;
        if (opt.rounds > 1) {  // the median over the rounds of each round's median
          const double fwd = bench::median(c.fwd_ms), total = bench::median(c.total_ms);
          line["rounds"] = opt.rounds;
          line["fwd_tflops_per_gpu"] = line["fwd_tflops_per_gpu"].get<double>() * line["fwd_ms"].get<double>() / fwd;
          line["fwdbwd_tflops_per_gpu"] =
              line["fwdbwd_tflops_per_gpu"].get<double>() * line["fwdbwd_ms"].get<double>() / total;
          line["fwd_ms"] = fwd;
          line["fwdbwd_ms"] = total;
          line["round_ms"] = c.total_ms;
          line["round_fwd_ms"] = c.fwd_ms;
          line["peak_extra_GiB"] = c.peak_GiB;
        }
        if (single > 0) {
          line["single_gpu_tflops"] = single;
          line["single_gpu_tflops_each"] = singles;
          line["fraction_of_single_gpu"] = line["fwdbwd_tflops_per_gpu"].get<double>() / single;
        }
        std::printf("%s\n", line.dump().c_str());
        std::fflush(stdout);
      }
  }
  (void)forget_stream_arenas(s);
  cudaStreamDestroy(s);
  return Status::Ok();
}

}  // namespace
}  // namespace seqpar

int main(int argc, char** argv) {
  using namespace seqpar;
  CLI::App app{"Multi-GPU distributed attention benchmark (bf16, B = 1; causal and zigzag by default); JSON lines"};
  Options opt;
  app.add_option("--seqs", opt.seqs, "total sequence lengths")->delimiter(',')->capture_default_str();
  app.add_option("--algos", opt.algos, "algorithms (algorithm.hpp names) or auto")->delimiter(',')->capture_default_str();
  app.add_option("--gpus", opt.gpus, "GPUs (default: all visible)");
  app.add_option("--heads", opt.heads, "heads")->capture_default_str();
  app.add_option("--kv-heads", opt.kv_heads, "K/V heads (0: as many as heads)")->capture_default_str();
  app.add_option("--mask", opt.mask, "mask, as seqpar attn --mask (causal, full, window:L,R, docs:N, docs-lognormal:M[,SIGMA[,SEED]], ...)")
      ->capture_default_str();
  app.add_option("--layout", opt.layout, "contiguous, zigzag, striped or documents")->capture_default_str();
  app.add_option("--ulysses", opt.ulysses, "ulysses-ring: the Ulysses degree (0: the planner's)")->capture_default_str();
  app.add_option("--ring-algo", opt.ring_algo, "ulysses-ring: the ring-family algorithm across groups")
      ->capture_default_str();
  app.add_flag("--keep-forward-state", opt.keep_forward_state,
               "keep forward blocks for the backward (ulysses, ulysses-ring, attention2d)");
  app.add_option("--head-dim", opt.head_dim, "head dim")->capture_default_str();
  app.add_option("--single-max", opt.single_max, "single-GPU reference up to this many tokens per GPU")
      ->capture_default_str();
  app.add_option("--head-groups", opt.head_groups, "head groups to try (0: automatic)")
      ->delimiter(',')->capture_default_str();
  app.add_option("--big-from", opt.big_from, "from this S on: only --big-algos, one run each, no warm-up")
      ->capture_default_str();
  app.add_option("--big-algos", opt.big_algos, "the algorithms run from --big-from on (of --algos)")
      ->delimiter(',')->capture_default_str();
  app.add_option("--probe", opt.probe_tokens,
                 "first measure the exchange bandwidth and a cuDNN fwd+bwd at this many tokens alone "
                 "and beside an exchange");
  app.add_option("--rounds", opt.rounds,
                 "run the algorithms this many times in turn per length (algo1, algo2, ..., algo1, ...), each "
                 "with its warm-up, and report each one's median round (per-round fwd+bwd ms in round_ms; "
                 "of an even count the slower middle round); a refused configuration prints its error once")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--trace", opt.trace, "print each rank's step milestones (ms on its stream) of the "
                                     "last timed iteration");
  CLI11_PARSE(app, argc, argv);
  const int gpus = opt.gpus > 0 ? opt.gpus : cuda_device_count();
  if (gpus < 1) {
    std::fprintf(stderr, "bench_gpu_ring: no CUDA GPU\n");
    return 2;
  }
  const Status s = run_nccl_local_ranks(gpus, [&](Communicator& comm) { return bench_rank(comm, opt); });
  if (!s.ok()) {
    std::fprintf(stderr, "bench_gpu_ring: %s\n", s.to_string().c_str());
    return 1;
  }
  return 0;
}
