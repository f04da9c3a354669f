// Benchmark of the fused LM head + cross-entropy on one GPU (src/model/lm_head_loss.cu) called as
// the trainer calls it (layer_pass.hpp): the loss with its gradient in one pass, scale = 1 /
// counted rows, dx (fp32) written and dw (fp32) added, here zeroed inside the timed call as
// Liger's zeros_like is; and the loss alone (an evaluation's forward). Each chunk size is timed
// with fp32 logits (the trainer's) and, with --logits, bf16 logits as Liger keeps them.
// The peer is bench/liger_flce_peer.py. Inputs: x = sqrt(3) u (std 1, like an RMSNorm output),
// w = 0.02 sqrt(3) u (std 0.02, Llama's init), u uniform in [-1, 1) from a splitmix hash of
// (seed, index) rounded once to bf16, targets = hash mod vocab. `--dump DIR` writes these bits
// and fp32 samples of dx and dw for the peer, so both sides run (and check) the same data.
// Prints one JSON line per chunk size on stdout, a readable line on stderr.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "model/layers_cuda.hpp"
#include "seqpar/gpu.hpp"

namespace {

using seqpar::DeviceBuffer;
using seqpar::Status;
namespace cu = seqpar::model::cuda;

__device__ uint64_t splitmix(uint64_t seed, uint64_t i) {  // bench_util.cuh's hash
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z;
}

// x[i] = bf16(scale * u), u uniform in [-1, 1) from the top 24 bits of the hash (round to nearest
// even).
__global__ void fill_scaled_bf16(uint16_t* x, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float u = float((splitmix(seed, i) >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
    const uint32_t bits = __float_as_uint(scale * u);
    x[i] = uint16_t((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
  }
}

__global__ void fill_targets(int32_t* t, size_t n, uint64_t seed, int64_t vocab) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    t[i] = int32_t(splitmix(seed, i) % uint64_t(vocab));
}

// *sum += sum of v[i]^2 (fp64 atomics: a checksum, not bitwise reproducible).
__global__ void sum_squares(const float* v, size_t n, double* sum) {
  double s = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    s += double(v[i]) * v[i];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) atomicAdd(sum, s);
}

double l2_norm(const float* v, size_t n, DeviceBuffer& scratch) {
  cudaMemset(scratch.data(), 0, sizeof(double));
  sum_squares<<<1024, 256>>>(v, n, static_cast<double*>(scratch.data()));
  double s = 0;
  cudaMemcpy(&s, scratch.data(), sizeof(double), cudaMemcpyDeviceToHost);
  return std::sqrt(s);
}

// Writes rows 0, stride, 2 stride, ... of a device array of `rows` rows of `row_bytes` to path.
bool dump(const std::string& path, const void* device, size_t rows, size_t row_bytes,
          size_t stride = 1) {
  const size_t kept = (rows + stride - 1) / stride;
  std::vector<char> host(kept * row_bytes);
  if (cudaMemcpy2D(host.data(), row_bytes, device, row_bytes * stride, row_bytes, kept,
                   cudaMemcpyDeviceToHost) != cudaSuccess)
    return false;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(host.data(), 1, host.size(), f) == host.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Benchmark seqpar's fused LM head + cross-entropy (CUDA, bf16 inputs)"};
  int64_t tokens = 32768, hidden = 4096, vocab = 128256, stride = 64;
  std::vector<int64_t> chunks{1024};  // the trainer's default --lm-head-chunk
  int iters = 10, warmup = 3;
  uint64_t seed = 1;
  std::string dump_dir;
  std::vector<std::string> logit_kinds{"f32"};
  app.add_option("--tokens", tokens, "rows (tokens)")->check(CLI::PositiveNumber);
  app.add_option("--hidden", hidden, "hidden size")->check(CLI::PositiveNumber);
  app.add_option("--vocab", vocab, "vocabulary size")->check(CLI::PositiveNumber);
  app.add_option("--chunks", chunks, "rows of logits made at once (0: all); each value is timed")
      ->delimiter(',');
  app.add_option("--logits", logit_kinds, "scratch logits, each timed: f32 (the trainer's), bf16")
      ->delimiter(',')
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--iters", iters, "timed iterations (median)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed iterations first");
  app.add_option("--seed", seed, "input seed (x: seed, w: seed + 1, targets: seed + 2)");
  app.add_option("--dump", dump_dir,
                 "write x, w, targets, meta.json and dx/dw row samples (first chunk) here");
  app.add_option("--sample-stride", stride, "dumped samples: every stride-th row of dx and of dw")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (seqpar::cuda_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  const size_t nx = size_t(tokens * hidden), nw = size_t(vocab * hidden);
  DeviceBuffer x, w, targets, scratch;
  if (!x.reserve(nx * 2).ok() || !w.reserve(nw * 2).ok() ||
      !targets.reserve(size_t(tokens) * 4).ok() || !scratch.reserve(sizeof(double)).ok()) {
    std::printf(
        "%s\n",
        nlohmann::json{{"kind", "seqpar_lm_head"}, {"error", "OOM for the inputs"}}.dump().c_str());
    return 1;
  }
  fill_scaled_bf16<<<1024, 256>>>(static_cast<uint16_t*>(x.data()), nx, seed, std::sqrt(3.0f));
  fill_scaled_bf16<<<1024, 256>>>(static_cast<uint16_t*>(w.data()), nw, seed + 1,
                                  0.02f * std::sqrt(3.0f));
  fill_targets<<<256, 256>>>(static_cast<int32_t*>(targets.data()), size_t(tokens), seed + 2,
                             vocab);
  cudaDeviceSynchronize();
  const auto* xp = static_cast<const uint16_t*>(x.data());
  const auto* wp = static_cast<const uint16_t*>(w.data());
  const auto* tp = static_cast<const int32_t*>(targets.data());
  const int64_t counted = tokens;  // every target counted (none negative)
  const double scale = 1.0 / double(counted);
  int failures = 0;
  for (size_t c = 0; c < chunks.size() * logit_kinds.size(); ++c) {
    const std::string& kind_name = logit_kinds[c % logit_kinds.size()];
    const cu::Logits kind = kind_name == "bf16" ? cu::Logits::kBf16 : cu::Logits::kF32;
    const int64_t chunk =
        chunks[c / logit_kinds.size()] > 0 ? chunks[c / logit_kinds.size()] : tokens;  // 0: all rows at once, as the trainer reads it
    // Extra memory: what this call allocates beyond the inputs (outputs included), by our
    // allocator's counters (the head's scratch is a DeviceBuffer) and by cudaMemGetInfo (adds
    // cuBLAS's workspace and lazily loaded modules, on the first chunk only).
    const int64_t base_tracked = seqpar::device_memory_stats(0).current;
    const int64_t base_free = seqpar::cuda_free_memory();
    seqpar::reset_device_memory_peak(0);
    DeviceBuffer row_loss, dx, dw;
    bool ok = row_loss.reserve(size_t(tokens) * 4).ok() && dx.reserve(nx * 4).ok() && dw.reserve(nw * 4).ok();
    auto* lossp = static_cast<float*>(row_loss.data());
    auto* dxp = static_cast<float*>(dx.data());
    auto* dwp = static_cast<float*>(dw.data());
    auto fwd = [&] {
      return cu::lm_head_loss(xp, wp, tp, tokens, hidden, vocab, chunk, lossp, 0.0, nullptr, nullptr,
                              nullptr, kind);
    };
    auto fwd_bwd = [&]() -> Status {
      if (cudaMemsetAsync(dwp, 0, nw * 4) != cudaSuccess)
        return SP_STATUS(seqpar::StatusCode::kInternal, "memset");
      return cu::lm_head_loss(xp, wp, tp, tokens, hidden, vocab, chunk, lossp, scale, dxp, dwp,
                              nullptr, kind);
    };
    nlohmann::json j{{"kind", "seqpar_lm_head"},
                     {"tokens", tokens},
                     {"hidden", hidden},
                     {"vocab", vocab},
                     {"chunk", chunk},
                     {"logits", kind_name}};
    const Status first =
        ok ? fwd_bwd() : SP_STATUS(seqpar::StatusCode::kInternal, "OOM for the outputs");
    ok = ok && first.ok() && cudaDeviceSynchronize() == cudaSuccess;
    if (!ok) {
      j["error"] =
          first.ok() ? std::string(cudaGetErrorString(cudaGetLastError())) : first.to_string();
      std::printf("%s\n", j.dump().c_str());
      ++failures;
      continue;
    }
    j["peak_extra_bytes"] = seqpar::device_memory_stats(0).peak - base_tracked;
    j["peak_extra_bytes_meminfo"] = base_free - seqpar::cuda_free_memory();
    j["grad_bytes"] = int64_t((nx + nw) * 4);  // dx and dw (fp32) are part of the extra
    std::vector<float> losses(static_cast<size_t>(tokens), 0.0f);
    cudaMemcpy(losses.data(), lossp, losses.size() * 4, cudaMemcpyDeviceToHost);
    double loss = 0;
    for (float l : losses) loss += l;  // row order, as model_pass_cuda.cpp's loss_sum
    j["loss"] = loss * scale;
    j["dx_l2"] = l2_norm(dxp, nx, scratch);
    j["dw_l2"] = l2_norm(dwp, nw, scratch);
    if (c == 0 && !dump_dir.empty()) {  // the peer's data and the samples it checks against
      std::filesystem::create_directories(dump_dir);
      const std::string d = dump_dir + "/";
      const bool dumped =
          dump(d + "x.bin", xp, size_t(tokens), size_t(hidden) * 2) &&
          dump(d + "w.bin", wp, size_t(vocab), size_t(hidden) * 2) &&
          dump(d + "targets.bin", tp, 1, size_t(tokens) * 4) &&
          dump(d + "dx_sample.bin", dxp, size_t(tokens), size_t(hidden) * 4, size_t(stride)) &&
          dump(d + "dw_sample.bin", dwp, size_t(vocab), size_t(hidden) * 4, size_t(stride));
      nlohmann::json meta{{"tokens", tokens},
                          {"hidden", hidden},
                          {"vocab", vocab},
                          {"seed", seed},
                          {"sample_stride", stride},
                          {"chunk", chunk},
                          {"loss", j["loss"]},
                          {"x", "bf16 [tokens, hidden]"},
                          {"w", "bf16 [vocab, hidden]"},
                          {"targets", "int32 [tokens]"},
                          {"dx_sample", "fp32 dx[::stride]"},
                          {"dw_sample", "fp32 dw[::stride]"}};
      FILE* f = std::fopen((d + "meta.json").c_str(), "w");
      const bool meta_ok =
          f && std::fprintf(f, "%s\n", meta.dump().c_str()) > 0 && std::fclose(f) == 0;
      j["dumped"] = dumped && meta_ok ? dump_dir : "failed";
    }
    const double t_fb = seqpar::bench::event_median_ms(fwd_bwd, warmup, iters, &ok);
    const double t_f = seqpar::bench::event_median_ms(fwd, warmup, iters, &ok);
    const double matmul_flops =
        2.0 * double(tokens) * double(hidden) * double(vocab);  // one of the 3 products
    j["ms_fwd_bwd"] = t_fb;
    j["ms_fwd"] = t_f;
    j["tflops_fwd_bwd"] =
        3 * matmul_flops / t_fb / 1e9;  // the 3 products: logits, dx, dw
    j["ok"] = ok;
    if (!ok) ++failures;
    std::printf("%s\n", j.dump().c_str());
    std::fprintf(
        stderr,
        "chunk %6ld  %4s logits  fwd+bwd %8.2f ms  fwd %8.2f ms  %6.1f TFLOP/s  extra %.2f GiB  loss %.6f\n",
        long(chunk), kind_name.c_str(), t_fb, t_f, 3 * matmul_flops / t_fb / 1e9,
        double(j["peak_extra_bytes"].get<int64_t>()) / (1 << 30), j["loss"].get<double>());
    std::fflush(stdout);
  }
  return failures ? 1 : 0;
}
