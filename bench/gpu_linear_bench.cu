// GPU linear-attention benchmark: our chunked CUDA kernels (kernels/cuda/linear_cuda.hpp), forward
// and forward+backward, at the peer's shapes (B = 1, H = 16, d = 128, per-head decay
// lambda_h = exp(-(8/H) h/H - 0.01), scale 1/sqrt(d)); inputs q, k, v, dO uniform in [-1, 1)
// like bench/fla_linear_peer.py; both kernel variants (one tile stage, pipelined). Median of
// CUDA-event-timed iterations after warm-up, after a check of the first length against the CPU
// fp32 kernel. One JSON line per measurement; a line
// with "error": "OOM" ends the sweep when the tensors no longer fit.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "seqpar/gpu.hpp"
#include "kernels/cuda/linear_cuda.hpp"

namespace {

using seqpar::DType;
using seqpar::Status;


// max |gpu - cpu| / max |cpu| of o for the given inputs (CPU fp32 chunked kernel as the check).
double check_against_cpu(const seqpar::TensorView& q, const seqpar::TensorView& k, const seqpar::TensorView& v,
                         const seqpar::TensorView& o, const seqpar::LinearAttentionParams& params) {
  auto to_f32 = [](const seqpar::TensorView& t) {
    seqpar::HostTensor h = seqpar::to_host(t).value();
    seqpar::HostTensor f(DType::kF32, {t.shape[0], t.shape[1], t.shape[2], t.shape[3]});
    seqpar::convert(h.view().data, h.view().dtype, f.view().data, DType::kF32, h.numel());
    return f;
  };
  const seqpar::HostTensor hq = to_f32(q), hk = to_f32(k), hv = to_f32(v), ho = to_f32(o);
  seqpar::HostTensor ref(DType::kF32, {q.shape[0], q.shape[1], q.shape[2], v.shape[3]});
  if (!seqpar::linear_attention_forward(hq.view(), hk.view(), hv.view(), {}, params, ref.view(), {}).ok()) return INFINITY;
  double err = 0, size = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    err = std::max(err, double(std::abs(ref.data<float>()[i] - ho.data<float>()[i])));
    size = std::max(size, double(std::abs(ref.data<float>()[i])));
  }
  return err / std::max(size, 1e-30);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Benchmark seqpar's CUDA linear-attention kernels (bf16)"};
  std::vector<int64_t> seqs{8192, 32768, 131072, 524288, 1048576, 2097152, 4194304, 8388608};
  int64_t heads = 16, dim = 128;
  int iters = 3, warmup = 1;
  bool json = false;
  std::vector<std::string> variants{"one_stage", "pipelined"};
  app.add_option("--seqs", seqs, "sequence lengths")->delimiter(',');
  app.add_option("--variants", variants, "kernel variants: one_stage (one tile stage), pipelined (two)")
      ->delimiter(',')
      ->check(CLI::IsMember({"one_stage", "pipelined"}));
  std::vector<int64_t> spans{0};
  app.add_option("--chunks-per-span", spans, "chunks a span sweeps (0: the kernel's own choice); each value is timed")
      ->delimiter(',');
  app.add_option("--heads", heads, "heads (query = K/V)")->check(CLI::Range(1, 256));
  app.add_option("--dim", dim, "d_k = d_v: 64 or 128")->check(CLI::IsMember({64, 128}));
  app.add_option("--iters", iters, "timed iterations (median)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed iterations first");
  app.add_flag("--json", json, "print one JSON object per measurement");
  CLI11_PARSE(app, argc, argv);
  if (seqpar::cuda_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  seqpar::LinearAttentionParams params;
  params.decay.clear();
  for (int64_t h = 0; h < heads; ++h) params.decay.push_back(std::exp(-(8.0 / heads) * double(h) / heads - 0.01));
  params.scale = 1.0 / std::sqrt(double(dim));
  seqpar::DeviceBuffer workspace;
  seqpar::LinearCudaOptions options;
  options.workspace = &workspace;
  std::printf("%-10s %10s %10s %10s %10s %12s %10s %10s\n", "variant", "seq", "fwd ms", "fwd TF/s", "fwd GB/s", "fwd+bwd ms",
              "f+b TF/s", "f+b GB/s");
  int failures = 0;
  bool checked = false;
  const int64_t C = 64;
  for (const int64_t N : seqs) {
    const std::vector<int64_t> shape{1, N, heads, dim};
    // Model FLOPs per (token, head): causal half of the chunk's scores and score-value products,
    // the state product and the state update; the backward counted as twice the forward.
    const double fwd_flops = 2.0 * N * heads * (C * dim / 2.0 + C * dim / 2.0 + 2.0 * dim * dim);
    const double row_bytes = double(N) * heads * dim * 2;  // one bf16 [1, N, H, d] tensor
    auto alloc = [&](DType t, const std::vector<int64_t>& s) -> std::optional<seqpar::DeviceTensor> {
      auto d = seqpar::device_zeros(t, s);
      if (!d.ok()) return std::nullopt;
      return std::move(d.value());
    };
    auto oom = [&] {
      nlohmann::json j{{"kind", "seqpar_linear"}, {"seq", N}, {"heads", heads}, {"dim", dim}, {"error", "OOM"}};
      std::printf("%s\n", j.dump().c_str());
    };
    auto q = alloc(DType::kBF16, shape), k = alloc(DType::kBF16, shape), v = alloc(DType::kBF16, shape);
    auto o = alloc(DType::kBF16, shape), state = alloc(DType::kF32, {1, heads, dim, dim});
    if (!(q && k && v && o && state)) {
      oom();
      break;
    }
    int seed = 1;
    for (auto* t : {&q, &k, &v})
      seqpar::bench::fill_uniform_bf16<<<1024, 256>>>(static_cast<uint16_t*>((*t)->view.data), size_t(row_bytes / 2), seed++);
    // dO and the gradients only when they fit beside the forward's tensors.
    auto dout = alloc(DType::kBF16, shape), dq = alloc(DType::kBF16, shape), dk = alloc(DType::kBF16, shape),
         dv = alloc(DType::kBF16, shape);
    const bool backward_fits = dout && dq && dk && dv;
    (void)cudaGetLastError();  // a failed allocation above is reported here, not by the next launch
    if (backward_fits)
      seqpar::bench::fill_uniform_bf16<<<1024, 256>>>(static_cast<uint16_t*>(dout->view.data), size_t(row_bytes / 2), seed++);
    for (const std::string& kernel : variants)
    for (const int64_t cps : spans) {
      options.pipelined = kernel == "pipelined";
      options.chunks_per_span = cps;
      const std::string variant = cps > 0 ? kernel + "_cps" + std::to_string(cps) : kernel;
      auto fwd = [&] {
        return seqpar::linear_attention_forward_cuda(q->view, k->view, v->view, {}, params, o->view, state->view,
                                                     options);
      };
      bool ok = true;
      if (!checked && N <= 32768) {  // correctness before timing, once per variant
        ok = fwd().ok() && seqpar::stream_synchronize(nullptr).ok();
        const double rel = check_against_cpu(q->view, k->view, v->view, o->view, params);
        ok = ok && rel < 2e-2;
        nlohmann::json j{{"kind", "seqpar_linear_check"}, {"variant", variant}, {"seq", N},
                         {"max_rel_error_vs_cpu_fp32", rel}, {"ok", ok}};
        std::printf("%s\n", j.dump().c_str());
      }
      const double tf = seqpar::bench::event_median_ms(fwd, warmup, iters, &ok);
      nlohmann::json j{{"kind", "seqpar_linear"}, {"variant", variant}, {"seq", N}, {"heads", heads}, {"dim", dim},
                       {"fwd_ms", tf}, {"fwd_tflops", fwd_flops / tf / 1e9},
                       {"fwd_GBps", 4 * row_bytes / tf / 1e6}, {"tokens_per_s_fwd", N / tf * 1e3}};
      double tfb = 0;
      if (backward_fits) {
        auto fwd_bwd = [&] {
          const Status s = fwd();
          if (!s.ok()) return s;
          return seqpar::linear_attention_backward_cuda(q->view, k->view, v->view, {}, dout->view, {}, params,
                                                        dq->view, dk->view, dv->view, {}, options);
        };
        tfb = seqpar::bench::event_median_ms(fwd_bwd, warmup, iters, &ok);
        j["fwdbwd_ms"] = tfb;
        j["fwdbwd_tflops"] = 3 * fwd_flops / tfb / 1e9;
        j["fwdbwd_GBps"] = 11 * row_bytes / tfb / 1e6;  // fwd: q k v o; bwd: q k v dO dq dk dv
        j["tokens_per_s_fwdbwd"] = N / tfb * 1e3;
      } else {
        j["fwdbwd_error"] = "OOM";
      }
      j["ok"] = ok;
      j["workspace_MiB"] = double(workspace.bytes()) / (1 << 20);
      if (!ok) ++failures;
      std::printf("%-10s %10ld %10.3f %10.1f %10.0f %12.3f %10.1f %10.0f\n", variant.c_str(), long(N), tf,
                  fwd_flops / tf / 1e9, 4 * row_bytes / tf / 1e6, tfb, tfb > 0 ? 3 * fwd_flops / tfb / 1e9 : 0.0,
                  tfb > 0 ? 11 * row_bytes / tfb / 1e6 : 0.0);
      if (json) std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
    checked = checked || N <= 32768;
    if (!backward_fits) break;  // the lines above say fwdbwd_error: OOM; longer ones fit no better
  }
  return failures ? 1 : 0;
}
