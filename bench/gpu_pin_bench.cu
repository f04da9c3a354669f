// Pinned host memory for offloaded checkpoints (--offload-checkpoints): how fast each way pins
// it, and whether copies into it run at full speed. `cuda-host-alloc` is cudaHostAlloc (the
// offload's first way); `mmap-register` is pin_host_bytes (model/host_offload.hpp: transparent
// huge pages asked, pages faulted in by threads, then cudaHostRegister). Slots of --slot-mib
// each up to --gib, pinned one after the other as a first training step pins them; then a
// device-to-host and a host-to-device copy of one slot. One JSON line per way. Run several at
// once (one per GPU) to see a node's ranks pinning side by side.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/host_offload.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// GB/s of one copy of `bytes` between device memory and host slot `host`, either way.
double copy_gbps(void* host, void* device, size_t bytes, bool to_host) {
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  cudaEventRecord(a);
  if (to_host) cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost);
  else cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice);
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a), cudaEventDestroy(b);
  return bytes / (ms * 1e-3) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"seconds and GB/s of pinning offload slots, cudaHostAlloc against mmap + cudaHostRegister"};
  double gib = 16;
  int slot_mib = 1024, threads = 16;
  std::vector<std::string> ways{"cuda-host-alloc", "mmap-register"};
  app.add_option("--gib", gib, "host memory to pin, in GiB")->check(CLI::PositiveNumber);
  app.add_option("--slot-mib", slot_mib, "one slot, in MiB")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "threads faulting pages in (mmap-register)")->check(CLI::PositiveNumber);
  app.add_option("--ways", ways, "cuda-host-alloc, mmap-register")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  const size_t slot = size_t(slot_mib) << 20;
  const int slots = std::max(1, int(gib * 1024 / slot_mib));
  void* device = nullptr;
  if (cudaMalloc(&device, slot) != cudaSuccess) return std::fprintf(stderr, "no device memory for one slot\n"), 1;
  for (const std::string& way : ways) {
    if (way != "cuda-host-alloc" && way != "mmap-register")
      return std::fprintf(stderr, "unknown way %s\n", way.c_str()), 2;
    std::vector<seqpar::model::PinnedHostBytes> pinned(slots);
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& p : pinned) {
      if (way == "cuda-host-alloc") {
        p.bytes = slot;
        if (cudaHostAlloc(&p.data, slot, cudaHostAllocDefault) != cudaSuccess)
          return std::fprintf(stderr, "cudaHostAlloc failed\n"), 3;
      } else {
        auto got = seqpar::model::pin_host_bytes(slot, threads);
        if (!got.ok()) return std::fprintf(stderr, "%s\n", got.status().to_string().c_str()), 3;
        p = got.value();
      }
    }
    const double pin_s = seconds_since(t0);
    (void)copy_gbps(pinned[0].data, device, slot, true);  // the first touch of the path
    const double d2h = copy_gbps(pinned[0].data, device, slot, true), h2d = copy_gbps(pinned[0].data, device, slot, false);
    const bool mapped = pinned[0].mapped;
    const auto t1 = std::chrono::steady_clock::now();
    for (auto& p : pinned) seqpar::model::unpin_host_bytes(p);
    const double free_s = seconds_since(t1);
    const double bytes = double(slot) * slots;
    nlohmann::json line{{"kind", "seqpar_pin"}, {"way", way}, {"mapped", mapped}, {"slots", slots},
                        {"slot_bytes", slot}, {"pin_s", pin_s}, {"pin_gbps", bytes / pin_s / 1e9},
                        {"free_s", free_s}, {"d2h_gbps", d2h}, {"h2d_gbps", h2d}, {"threads", threads}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
  }
  cudaFree(device);
  return 0;
}
