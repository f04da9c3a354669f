// Multi-GPU LASP benchmark (seqpar/lasp.hpp on device tensors): one process, a thread per GPU, NCCL between
// them. For each total length N and algorithm (lasp: the state chain; lasp2: the all-gather of
// state contributions), each GPU holds N / P contiguous tokens and runs forward + backward with
// our CUDA linear kernels; bench_gpu_linear's shapes (B = 1, H = 16, d = 128, per-head decay,
// scale 1/sqrt(d)) and inputs (uniform in [-1, 1)). Median of CUDA-event-timed iterations,
// each started after a barrier, the slowest rank's; the bytes each rank sent; the peak device
// memory beyond q, k, v, dO and the outputs (the states, the kernels' workspace). --gpus 1 gives the one-GPU figures in the same way. A length that
// does not fit prints "error": "OOM" and ends the sweep (the longest that fits is the line
// before). One JSON line per run.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "seqpar/gpu.hpp"
#include "seqpar/lasp.hpp"
#include "seqpar/nccl_comm.hpp"

namespace seqpar {
namespace {

struct Options {
  std::vector<int64_t> seqs{1048576, 2097152, 4194304, 8388608};
  std::vector<std::string> algos{"lasp", "lasp2"};
  int gpus = 0;
  int64_t heads = 16, dim = 128;
  int iters = 3, warmup = 1;
};

// One (N, algorithm) run on this rank; *line filled on rank 0. *oom set where it did not fit.
Status run_one(Communicator& comm, const Options& opt, int64_t N, LaspAlgorithm algo, nlohmann::ordered_json* line,
               bool* oom) {
  const int P = comm.size(), me = comm.rank();
  SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(LayoutKind::kContiguous, N, P));
  const int64_t n = layout.local_len(me), H = opt.heads, d = opt.dim;
  LinearAttentionParams params;
  params.decay.clear();
  for (int64_t h = 0; h < H; ++h) params.decay.push_back(std::exp(-(8.0 / H) * double(h) / H - 0.01));
  params.scale = 1.0 / std::sqrt(double(d));
  int device = 0;
  cudaGetDevice(&device);
  const int64_t base = device_memory_stats(device).current;
  reset_device_memory_peak(device);
  std::vector<DeviceTensor> t;
  bool fits = true;
  for (int i = 0; i < 8 && fits; ++i) {  // q k v dO, then o dq dk dv
    auto a = device_zeros(DType::kBF16, {1, n, H, d});
    fits = a.ok();
    if (fits) t.push_back(std::move(a).value());
  }
  const int64_t tensors = device_memory_stats(device).current;  // the peak counts what comes after
  LaspContext ctx;  // its states, scratch and kernel workspace too, before any rank communicates
  // The shapes here are valid by construction, so a failure is memory.
  if (fits) fits = lasp_reserve(&ctx, t[0].view, t[1].view, t[2].view, params, P, algo).ok();
  (void)cudaGetLastError();
  double short_of_memory = fits ? 0 : 1;  // every rank must agree before any communicates
  SP_RETURN_IF_ERROR(comm.all_reduce(&short_of_memory, 1, DType::kF64, ReduceOp::kMax));
  if (short_of_memory > 0) {
    *oom = true;
    return Status::Ok();
  }
  for (int i = 0; i < 4; ++i)
    bench::fill_uniform_bf16<<<1024, 256>>>(static_cast<uint16_t*>(t[i].view.data), size_t(n * H * d), 1 + i + 10 * me);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  const auto fwd_bwd = [&]() -> Status {
    SP_RETURN_IF_ERROR(
        lasp_forward(comm, layout, params, algo, t[0].view, t[1].view, t[2].view, t[4].view, &ctx, nullptr));
    return lasp_backward(comm, layout, params, &ctx, t[0].view, t[1].view, t[2].view, t[3].view, t[5].view,
                         t[6].view, t[7].view, nullptr);
  };
  std::vector<double> ms;
  for (int it = 0; it < opt.warmup + opt.iters; ++it) {
    SP_RETURN_IF_ERROR(comm.barrier());
    comm.reset_counters();
    cudaEventRecord(e0, nullptr);
    const Status ran = fwd_bwd();
    cudaEventRecord(e1, nullptr);
    SP_RETURN_IF_ERROR(ran);
    SP_RETURN_IF_ERROR(comm.synchronize(nullptr));
    float f = 0;
    cudaEventElapsedTime(&f, e0, e1);
    if (it >= opt.warmup) ms.push_back(f);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  double stats[4] = {bench::median(ms), double(device_memory_stats(device).peak - tensors) / double(1ll << 30),
                     double(comm.counters().sent(Phase::kForward)), double(comm.counters().sent(Phase::kBackward))};
  SP_RETURN_IF_ERROR(comm.all_reduce(stats, 4, DType::kF64, ReduceOp::kMax));
  const double C = 64, fwd_flops = 2.0 * double(N) * H * (C * d / 2.0 + C * d / 2.0 + 2.0 * d * d);
  *line = {{"kind", "seqpar_lasp"},
           {"algo", lasp_algorithm_name(ctx.algorithm)},
           {"gpus", P},
           {"seq", N},
           {"tokens_per_gpu", N / P},
           {"heads", H},
           {"dim", d},
           {"iters", opt.iters},
           {"fwdbwd_ms", stats[0]},
           {"tokens_per_s", double(N) / stats[0] * 1e3},
           {"fwdbwd_tflops_per_gpu", 3 * fwd_flops / stats[0] / 1e9 / P},
           {"peak_extra_GiB", stats[1]},
           {"inputs_and_grads_GiB_per_gpu", double(tensors - base) / double(1ll << 30)},
           {"sent_bytes_per_rank_max", {{"forward", int64_t(stats[2])}, {"backward", int64_t(stats[3])}}}};
  return Status::Ok();
}

Status bench_rank(Communicator& comm, const Options& opt) {
  for (int64_t N : opt.seqs)
    for (const std::string& name : opt.algos) {
      SP_ASSIGN_OR_RETURN(const LaspAlgorithm algo, parse_lasp_algorithm(name));
      nlohmann::ordered_json line;
      bool oom = false;
      SP_RETURN_IF_ERROR(run_one(comm, opt, N, algo, &line, &oom));
      if (comm.rank() != 0) {
        if (oom) return Status::Ok();
        continue;
      }
      if (oom) line = {{"kind", "seqpar_lasp"}, {"algo", name}, {"gpus", comm.size()}, {"seq", N}, {"error", "OOM"}};
      std::printf("%s\n", line.dump().c_str());
      std::fflush(stdout);
      if (oom) return Status::Ok();  // longer ones fit no better
    }
  return Status::Ok();
}

}  // namespace
}  // namespace seqpar

int main(int argc, char** argv) {
  using namespace seqpar;
  CLI::App app{"Multi-GPU LASP benchmark: the state chain against the all-gather (bf16, B = 1); JSON lines"};
  Options opt;
  app.add_option("--seqs", opt.seqs, "total sequence lengths, in turn until one does not fit")
      ->delimiter(',')->capture_default_str();
  app.add_option("--algos", opt.algos, "lasp (chain), lasp2 (all-gather), ulysses (the LASP paper's baseline: heads over the ranks) or auto")->delimiter(',')->capture_default_str();
  app.add_option("--gpus", opt.gpus, "GPUs (default: all visible)");
  app.add_option("--heads", opt.heads, "heads")->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("--dim", opt.dim, "d_k = d_v: 64 or 128")->check(CLI::IsMember({64, 128}))->capture_default_str();
  app.add_option("--iters", opt.iters, "timed iterations (median)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--warmup", opt.warmup, "untimed iterations first")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const int visible = cuda_device_count();
  const int gpus = opt.gpus > 0 ? opt.gpus : visible;
  if (gpus < 1 || gpus > visible) {
    std::fprintf(stderr, "bench_gpu_lasp: error: %d GPUs asked, %d visible\n", gpus, visible);
    return 2;
  }
  nccl_exit_process_on_failure(true);
  const Status s = run_nccl_local_ranks(gpus, [&](Communicator& comm) { return bench_rank(comm, opt); });
  if (!s.ok()) {
    std::fprintf(stderr, "bench_gpu_lasp: error: %s\n", s.to_string().c_str());
    return 1;
  }
  return 0;
}
