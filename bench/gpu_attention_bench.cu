// GPU local attention benchmark: TFLOP/s of our backends (cuDNN today) for forward and
// forward+backward at B = 1, H heads, head dim D, bf16, causal and full masks, timed like
// the PyTorch peer (bench/torch_sdpa_peer.py): median of CUDA-event-timed iterations after
// warm-up. Prints a table and, with --json, one JSON object per measurement.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "kernels/cudnn/cudnn_attention.hpp"
#include "kernels/cuda/flash_cuda.hpp"
#include "seqpar/gpu.hpp"
#include "bench_util.cuh"

namespace {


}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Benchmark seqpar's GPU attention backends (bf16)"};
  std::vector<int64_t> seqs{8192, 32768, 131072};
  std::vector<std::string> masks{"causal", "full"};
  std::vector<std::string> backends{"cudnn", "flash"};
  int64_t heads = 32, head_dim = 128;
  bool json = false;
  app.add_option("--seqs", seqs, "sequence lengths")->delimiter(',');
  app.add_option("--masks", masks, "causal and/or full")->delimiter(',');
  app.add_option("--backends", backends, "cudnn and/or flash (ours)")->delimiter(',');
  app.add_option("--heads", heads, "heads")->check(CLI::PositiveNumber);
  app.add_option("--head-dim", head_dim, "head dimension")->check(CLI::PositiveNumber);
  app.add_flag("--json", json, "print one JSON object per measurement");
  CLI11_PARSE(app, argc, argv);
  if (seqpar::cuda_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  using seqpar::DType;
  std::printf("%-8s %-7s %8s %10s %10s %14s %12s\n", "backend", "mask", "seq", "fwd ms", "fwd TF/s",
              "fwd+bwd ms", "f+b TF/s");
  int failures = 0;
  for (int64_t S : seqs) {
    const std::vector<int64_t> shape{1, S, heads, head_dim};
    auto q = seqpar::device_zeros(DType::kBF16, shape), k = seqpar::device_zeros(DType::kBF16, shape);
    auto v = seqpar::device_zeros(DType::kBF16, shape), o = seqpar::device_zeros(DType::kBF16, shape);
    auto dout = seqpar::device_zeros(DType::kBF16, shape), dq = seqpar::device_zeros(DType::kBF16, shape);
    auto dk = seqpar::device_zeros(DType::kBF16, shape), dv = seqpar::device_zeros(DType::kBF16, shape);
    auto lse = seqpar::device_zeros(DType::kF32, {1, heads, S});
    auto o_acc = seqpar::device_zeros(DType::kF32, shape);
    auto delta = seqpar::device_zeros(DType::kF32, {1, heads, S});
    auto g_dq = seqpar::device_zeros(DType::kF32, shape), g_dk = seqpar::device_zeros(DType::kF32, shape);
    auto g_dv = seqpar::device_zeros(DType::kF32, shape);
    if (!(o_acc.ok() && delta.ok() && g_dq.ok() && g_dk.ok() && g_dv.ok())) return 1;
    if (!(q.ok() && k.ok() && v.ok() && o.ok() && dout.ok() && dq.ok() && dk.ok() && dv.ok() && lse.ok())) {
      std::fprintf(stderr, "out of device memory at S=%ld\n", long(S));
      return 1;
    }
    const size_t n = size_t(S) * heads * head_dim;
    int seed = 1;
    for (auto* t : {&q, &k, &v, &dout})
      seqpar::bench::fill_uniform_bf16<<<1024, 256>>>(static_cast<uint16_t*>(t->value().view.data), n, seed++);
    for (const std::string& backend : backends)
    for (const std::string& mask_name : masks) {
      seqpar::AttentionParams params;
      params.mask = mask_name == "causal" ? seqpar::MaskSpec::causal() : seqpar::MaskSpec::none();
      const bool ours = backend == "flash";
      auto fwd = [&] {
        if (ours)
          return seqpar::flash_attention_forward(q->view, k->view, v->view, params, {}, o_acc->view,
                                                 lse->view, false, o->view);
        return seqpar::cudnn_attention_forward(q->view, k->view, v->view, params, o->view, lse->view);
      };
      auto fwd_bwd = [&] {
        seqpar::Status s = fwd();
        if (!s.ok()) return s;
        if (ours) {  // D from the output, then the backward adding into zeroed fp32 grads
          const seqpar::Status d = seqpar::flash_attention_delta(o->view, dout->view, delta->view);
          if (!d.ok()) return d;
          for (auto* g : {&g_dq, &g_dk, &g_dv})
            if (cudaMemsetAsync(g->value().view.data, 0, n * sizeof(float)) != cudaSuccess)
              return seqpar::Status(seqpar::StatusCode::kInternal, "cudaMemsetAsync failed");
          return seqpar::flash_attention_backward(q->view, k->view, v->view, dout->view, lse->view,
                                                  delta->view, params, {}, g_dq->view, g_dk->view,
                                                  g_dv->view);
        }
        return seqpar::cudnn_attention_backward(q->view, k->view, v->view, o->view, dout->view,
                                                lse->view, params, dq->view, dk->view, dv->view);
      };
      const int iters = S > 65536 ? 3 : 10, warmup = 2;
      bool ok = true;
      const double tf = seqpar::bench::event_median_ms(fwd, warmup, iters, &ok) / 1e3;
      const double tfb = seqpar::bench::event_median_ms(fwd_bwd, warmup, iters, &ok) / 1e3;
      if (!ok) ++failures;
      const double flops = 4.0 * S * double(S) * heads * head_dim * (mask_name == "causal" ? 0.5 : 1.0);
      std::printf("%-8s %-7s %8ld %10.2f %10.1f %14.2f %12.1f\n", backend.c_str(), mask_name.c_str(), long(S),
                  tf * 1e3, flops / tf / 1e12, tfb * 1e3, tfb > 0 ? 3.5 * flops / tfb / 1e12 : 0.0);
      if (json) {
        nlohmann::json j{{"kind", "seqpar_kernel"}, {"backend", backend}, {"seq", S},
                         {"heads", heads}, {"dim", head_dim}, {"causal", mask_name == "causal"},
                         {"fwd_ms", tf * 1e3}, {"fwd_tflops", flops / tf / 1e12}, {"ok", ok}};
        if (tfb > 0) {
          j["fwdbwd_ms"] = tfb * 1e3;
          j["fwdbwd_tflops"] = 3.5 * flops / tfb / 1e12;
          j["bwd_tflops"] = 2.5 * flops / (tfb - tf) / 1e12;
        }
        std::printf("%s\n", j.dump().c_str());
      }
      std::fflush(stdout);
    }
  }
  return failures ? 1 : 0;
}
