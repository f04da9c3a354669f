// CPU kernel benchmark: GFLOP/s of the fast attention kernel, forward and backward, on 1 and 2
// threads, against this machine's fp32 FMA peak per core (measured with an FMA-bound loop,
// and computed from the vector width and clock). Prints a table; --json adds JSON lines.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "seqpar/attention.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Highest fp32 FMA throughput one thread reaches: 12 independent vector accumulators.
double measured_fma_peak_gflops() {
  typedef float v16 __attribute__((vector_size(64)));
  v16 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = v16{} + 1.0f + i * 1e-3f;
  const v16 a = v16{} + 0.999999f, b = v16{} + 1e-7f;
  const long iters = 20'000'000;
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    for (long it = 0; it < iters; ++it)
      for (int i = 0; i < 12; ++i) acc[i] = acc[i] * a + b;
    const double s = seconds_since(t0);
    best = std::max(best, 2.0 * 16 * 12 * iters / s / 1e9);
  }
  float sink = 0;
  for (auto& x : acc) sink += x[0];
  if (sink == 12345.f) std::puts("");  // keep the loop alive
  return best;
}

// Vector lanes x 2 FMA pipes x 2 flops x nominal clock, from /proc/cpuinfo.
double computed_fma_peak_gflops(std::string* isa) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, flags;
  double mhz = 0;
  while (std::getline(cpuinfo, line)) {
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = line;
    if (mhz == 0 && line.rfind("cpu MHz", 0) == 0) mhz = std::stod(line.substr(line.find(':') + 1));
  }
  int lanes = 4;
  *isa = "sse";
  if (flags.find(" avx512f") != std::string::npos) lanes = 16, *isa = "avx512";
  else if (flags.find(" avx2") != std::string::npos) lanes = 8, *isa = "avx2";
  return lanes * 2.0 * 2.0 * mhz / 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Benchmark the fast CPU attention kernel (fp32) against the FMA peak"};
  int64_t seq = 4096, head_dim = 64, heads = 4;
  std::vector<int> threads{1, 2};
  int iters = 3;
  bool causal = false, json = false;
  app.add_option("--seq", seq, "sequence length")->check(CLI::PositiveNumber);
  app.add_option("--head-dim", head_dim, "head dimension")->check(CLI::PositiveNumber);
  app.add_option("--heads", heads, "heads")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "thread counts to run")->delimiter(',');
  app.add_option("--iters", iters, "timed iterations (median reported)")->check(CLI::PositiveNumber);
  app.add_flag("--causal", causal, "causal mask (FLOPs counted at half)");
  app.add_flag("--json", json, "also print one JSON object per measurement");
  CLI11_PARSE(app, argc, argv);

  using seqpar::DType;
  using seqpar::HostTensor;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  auto rand_tensor = [&](std::initializer_list<int64_t> shape) {
    HostTensor t(DType::kF32, shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
    return t;
  };
  HostTensor q = rand_tensor({1, seq, heads, head_dim}), k = rand_tensor({1, seq, heads, head_dim});
  HostTensor v = rand_tensor({1, seq, heads, head_dim}), dout = rand_tensor({1, seq, heads, head_dim});
  HostTensor o(DType::kF32, {1, seq, heads, head_dim}), lse(DType::kF32, {1, heads, seq});
  HostTensor delta(DType::kF32, {1, heads, seq});
  HostTensor dq(DType::kF32, {1, seq, heads, head_dim}), dk = dq, dv = dq;
  seqpar::AttentionParams params;
  if (causal) params.mask = seqpar::MaskSpec::causal();

  std::string isa;
  const double computed_peak = computed_fma_peak_gflops(&isa);
  const double measured_peak = measured_fma_peak_gflops();
  const double fwd_flops = 4.0 * seq * seq * heads * head_dim * (causal ? 0.5 : 1.0);
  const double bwd_flops = 2.5 * fwd_flops;
  std::printf("fp32 FMA peak per core: measured %.1f GFLOP/s, computed %.1f GFLOP/s (%s, 2 FMA "
              "pipes, nominal clock)\n",
              measured_peak, computed_peak, isa.c_str());
  std::printf("S=%ld H=%ld D=%ld %s, fp32; FLOPs 4*S^2*H*D%s, backward 2.5x\n", long(seq),
              long(heads), long(head_dim), causal ? "causal" : "full", causal ? "/2" : "");
  std::printf("%-8s %-9s %10s %10s %12s %14s\n", "threads", "pass", "ms", "GFLOP/s",
              "%meas.peak", "%comp.peak");
  for (int t : threads) {
    omp_set_num_threads(t);
    for (const char* pass : {"forward", "backward"}) {
      const bool fwd = std::string(pass) == "forward";
      std::vector<double> times;
      for (int it = 0; it < iters + 1; ++it) {  // first run is the warm-up
        const auto t0 = Clock::now();
        seqpar::Status s;
        if (fwd) {
          s = seqpar::cpu_attention_forward(q.view(), k.view(), v.view(), params, o.view(),
                                            lse.view(), false);
        } else {
          s = seqpar::cpu_attention_delta(o.view(), dout.view(), delta.view());
          if (s.ok())
            s = seqpar::cpu_attention_backward(q.view(), k.view(), v.view(), dout.view(),
                                               lse.view(), delta.view(), params, dq.view(),
                                               dk.view(), dv.view());
        }
        if (!s.ok()) {
          std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
          return 1;
        }
        if (it > 0) times.push_back(seconds_since(t0));
      }
      std::sort(times.begin(), times.end());
      const double sec = times[times.size() / 2];
      const double gflops = (fwd ? fwd_flops : bwd_flops) / sec / 1e9;
      const double per_core = gflops / t;
      std::printf("%-8d %-9s %10.1f %10.1f %11.1f%% %13.1f%%\n", t, pass, sec * 1e3, gflops,
                  100 * per_core / measured_peak, 100 * per_core / computed_peak);
      if (json) {
        nlohmann::json j{{"bench", "cpu_kernel"}, {"pass", pass}, {"threads", t},
                         {"seq", seq}, {"heads", heads}, {"head_dim", head_dim},
                         {"causal", causal}, {"median_s", sec}, {"gflops", gflops},
                         {"measured_peak_gflops_per_core", measured_peak},
                         {"computed_peak_gflops_per_core", computed_peak},
                         {"pct_of_measured_peak_per_core", 100 * per_core / measured_peak},
                         {"pct_of_computed_peak_per_core", 100 * per_core / computed_peak}};
        std::printf("%s\n", j.dump().c_str());
      }
    }
  }
  return 0;
}
