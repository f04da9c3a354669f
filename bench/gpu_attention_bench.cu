// GPU local attention benchmark through the backend interface (include/seqpar/backend.hpp): the
// TFLOP/s of any GPU backend by name (cudnn, cuda, hopper, auto), forward alone and forward +
// backward, at B = 1, H heads over H_kv K/V heads, head dim D, bf16, causal and full masks, uniform
// [-1, 1) q, k, v and dO. What a schedule runs on one shard pair, so the figures are the library's,
// not a lab's: the forward writes fresh (O, LSE); the backward gets D = rowsum(dO * O) from the
// backend's own delta step (timed with it) where its caps take D, else O; gradients are fresh, in
// bf16 where the backend writes parts, else fp32. Timed like the PyTorch peer
// (bench/torch_sdpa_peer.py; compare with bench/compare_kernels.py): median of CUDA-event-timed
// iterations after warm-up. Prints a table and, with --json, one JSON object per measurement.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "seqpar/backend.hpp"
#include "seqpar/gpu.hpp"
#include "bench_util.cuh"

namespace {
using seqpar::DType;

// One problem's device tensors; the gradients and O in the backend's output dtype.
struct Buffers {
  seqpar::DeviceTensor q, k, v, dout, o, lse, delta, dq, dk, dv;
};

// Fills *b; false where the device runs out of memory.
bool make_buffers(int64_t S, int64_t H, int64_t Hkv, int64_t D, DType out, Buffers* b) {
  const std::vector<int64_t> qs{1, S, H, D}, ks{1, S, Hkv, D}, stat{1, H, S};
  auto alloc = [](DType t, const std::vector<int64_t>& shape, seqpar::DeviceTensor* to) {
    auto x = seqpar::device_zeros(t, shape);
    if (!x.ok()) return false;
    *to = std::move(x).value();
    return true;
  };
  if (!(alloc(DType::kBF16, qs, &b->q) && alloc(DType::kBF16, ks, &b->k) && alloc(DType::kBF16, ks, &b->v) &&
        alloc(DType::kBF16, qs, &b->dout) && alloc(out, qs, &b->o) && alloc(DType::kF32, stat, &b->lse) &&
        alloc(DType::kF32, stat, &b->delta) && alloc(out, qs, &b->dq) && alloc(out, ks, &b->dk) &&
        alloc(out, ks, &b->dv)))
    return false;
  int seed = 1;
  for (auto* t : {&b->q, &b->k, &b->v, &b->dout})
    seqpar::bench::fill_uniform_bf16<<<1024, 256>>>(static_cast<uint16_t*>(t->view.data), size_t(t->view.numel()), seed++);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Benchmark seqpar's GPU attention backends through the backend interface (bf16)"};
  std::vector<int64_t> seqs{8192, 32768, 131072};
  std::vector<std::string> masks{"causal", "full"};
  std::vector<std::string> backends{"hopper", "cudnn"};
  int64_t heads = 32, kv_heads = 0, head_dim = 128;
  bool json = false;
  app.add_option("--seqs", seqs, "sequence lengths")->delimiter(',');
  app.add_option("--masks", masks, "causal and/or full")->delimiter(',');
  app.add_option("--backends", backends, "backend names: hopper, cudnn, cuda, auto")->delimiter(',');
  app.add_option("--heads", heads, "query heads")->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", kv_heads, "K/V heads (default: --heads)")->check(CLI::NonNegativeNumber);
  app.add_option("--head-dim", head_dim, "head dimension")->check(CLI::PositiveNumber);
  app.add_flag("--json", json, "print one JSON object per measurement");
  CLI11_PARSE(app, argc, argv);
  if (kv_heads == 0) kv_heads = heads;
  if (heads % kv_heads != 0) {
    std::fprintf(stderr, "--heads %ld is not a multiple of --kv-heads %ld\n", long(heads), long(kv_heads));
    return 2;
  }
  for (const std::string& m : masks)
    if (m != "causal" && m != "full") {
      std::fprintf(stderr, "--masks takes causal and full, not '%s'\n", m.c_str());
      return 2;
    }
  if (seqpar::cuda_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  std::printf("%-8s %-7s %8s %6s %10s %10s %14s %12s\n", "backend", "mask", "seq", "H:Hkv", "fwd ms", "fwd TF/s",
              "fwd+bwd ms", "f+b TF/s");
  int failures = 0;
  for (std::string name : backends) {
    if (name == "flash") name = "cuda";  // the name our CUDA kernels had here before
    const std::unique_ptr<seqpar::AttentionBackend> be = seqpar::make_gpu_backend_named(name);
    if (!be) {
      std::fprintf(stderr, "no backend '%s' in this build or on this GPU\n", name.c_str());
      if (app.count("--backends") > 0) ++failures;  // named by the user; the defaults may be absent
      continue;
    }
    const seqpar::BackendCaps caps = be->caps();
    const DType out = caps.writes_parts ? DType::kBF16 : DType::kF32;
    for (int64_t S : seqs) {
      Buffers b;
      if (!make_buffers(S, heads, kv_heads, head_dim, out, &b)) {
        std::fprintf(stderr, "out of device memory at S=%ld\n", long(S));
        return 1;
      }
      for (const std::string& mask_name : masks) {
        seqpar::AttentionParams params;
        params.mask = mask_name == "causal" ? seqpar::MaskSpec::causal() : seqpar::MaskSpec::none();
        const std::string why_not = be->supports(b.q.view, params);
        if (!why_not.empty()) {
          std::fprintf(stderr, "%s refuses %s S=%ld: %s\n", name.c_str(), mask_name.c_str(), long(S), why_not.c_str());
          continue;
        }
        auto fwd = [&] {
          return be->forward(b.q.view, b.k.view, b.v.view, params, b.o.view, b.lse.view, {true, false, false},
                             nullptr);
        };
        auto fwd_bwd = [&] {
          const seqpar::Status f = fwd();
          if (!f.ok()) return f;
          if (caps.takes_delta) {
            const seqpar::Status d = be->delta(b.o.view, b.dout.view, b.delta.view, nullptr);
            if (!d.ok()) return d;
          }
          return be->backward(b.q.view, b.k.view, b.v.view, b.dout.view, b.lse.view,
                              caps.takes_delta ? b.delta.view : b.o.view, params, b.dq.view, b.dk.view, b.dv.view,
                              {false, true, true}, nullptr);
        };
        const int iters = S > 65536 ? 3 : 10, warmup = 2;
        bool ok = true;
        const double tf = seqpar::bench::event_median_ms(fwd, warmup, iters, &ok) / 1e3;
        const double tfb = seqpar::bench::event_median_ms(fwd_bwd, warmup, iters, &ok) / 1e3;
        if (!ok) ++failures;
        const double flops = 4.0 * S * double(S) * heads * head_dim * (mask_name == "causal" ? 0.5 : 1.0);
        std::printf("%-8s %-7s %8ld %3ld:%-3ld %10.2f %10.1f %14.2f %12.1f\n", name.c_str(), mask_name.c_str(),
                    long(S), long(heads), long(kv_heads), tf * 1e3, flops / tf / 1e12, tfb * 1e3,
                    tfb > 0 ? 3.5 * flops / tfb / 1e12 : 0.0);
        if (json) {
          nlohmann::json j{{"kind", "seqpar_kernel"}, {"backend", name},    {"seq", S},
                           {"heads", heads},          {"kv_heads", kv_heads}, {"dim", head_dim},
                           {"causal", mask_name == "causal"}, {"fwd_ms", tf * 1e3}, {"fwd_tflops", flops / tf / 1e12},
                           {"ok", ok}};
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
  }
  return failures ? 1 : 0;
}
