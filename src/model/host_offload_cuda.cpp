// The CUDA half of host_offload.hpp: pinned host slots, each taken at its first use (so the
// slots add up to the layers' kept bytes) and reused by later steps, pinned as pin_host_bytes
// says, and a copy stream that
// starts each copy after an event on the memory's stream (the source written, the destination
// taken) and records a layer's event after it, which the memory's stream waits for before it
// gives a source back or reads a destination. Copies on one stream run in order, so a slot's
// copy back in a backward ends before the next step's forward overwrites it.
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "core/cuda_check.hpp"
#include "model/host_offload.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar::model {

// cudaHostAlloc pinned the 1M-token run's 48 GB a rank at about 1.3 GB/s (146 s of a first
// step on 4 H100s): the kernel faults, zeroes and locks 4 KiB pages one at a time. Here the
// mapping asks for transparent huge pages (2 MiB faults, where the host allows them), several
// threads fault its pages in at once, and CUDA registers the pages, already present, for DMA.
// Where any of that fails, cudaHostAlloc as before.
StatusOr<PinnedHostBytes> pin_host_bytes(size_t bytes, int threads) {
  PinnedHostBytes p;
  p.bytes = bytes;
  if (bytes == 0) return p;
  void* at = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (at != MAP_FAILED) {
    (void)madvise(at, bytes, MADV_HUGEPAGE);  // advice: refused where THP is off, and then 4 KiB pages
    const size_t page = 4096, pages = (bytes + page - 1) / page;
    const int n = std::max(1, std::min<int>(threads, int(std::min<size_t>(pages, 64))));
    std::vector<std::thread> touch;
    for (int t = 0; t < n; ++t)
      touch.emplace_back([=] {
        for (size_t i = pages * t / n; i < pages * (t + 1) / n; ++i) static_cast<volatile char*>(at)[i * page] = 0;
      });
    for (std::thread& t : touch) t.join();
    if (cudaHostRegister(at, bytes, cudaHostRegisterDefault) == cudaSuccess) {
      p.data = at, p.mapped = true;
      return p;
    }
    (void)cudaGetLastError();
    munmap(at, bytes);
  }
  SP_CUDA_CHECK(cudaHostAlloc(&p.data, bytes, cudaHostAllocDefault));
  return p;
}

void unpin_host_bytes(PinnedHostBytes& p) {
  if (!p.data) return;
  if (p.mapped) {
    (void)cudaHostUnregister(p.data);
    munmap(p.data, p.bytes);
  } else {
    (void)cudaFreeHost(p.data);
  }
  p = {};
}

namespace {

// Threads to fault a slot's pages in with: a share of the host's cores (a node's ranks pin at once).
int touch_threads() { return int(std::clamp(std::thread::hardware_concurrency() / 4u, 1u, 16u)); }

class PinnedCopies final : public HostOffload {
 public:
  PinnedCopies(cudaStream_t compute, cudaStream_t copy, cudaEvent_t ready)
      : compute_(compute), copy_(copy), ready_(ready) {}
  ~PinnedCopies() override {
    if (device_abandoned()) return;
    (void)cudaStreamSynchronize(copy_);
    for (auto& [key, slot] : slots_) unpin_host_bytes(slot.host);
    for (auto& [layer, done] : done_) (void)cudaEventDestroy(done);
    (void)cudaEventDestroy(ready_), (void)cudaStreamDestroy(copy_);
  }

  Status to_host(int64_t layer, int index, const void* src, size_t bytes) override {
    Slot& slot = slots_[{layer, index}];
    if (slot.capacity < bytes) {  // the first step (or a longer shard): the slot's earlier copies end first
      SP_CUDA_CHECK(cudaStreamSynchronize(copy_));
      unpin_host_bytes(slot.host);
      slot.capacity = 0;
      SP_ASSIGN_OR_RETURN(slot.host, pin_host_bytes(bytes, touch_threads()));
      slot.capacity = bytes;
    }
    slot.bytes = bytes;
    SP_RETURN_IF_ERROR(after_compute());
    if (bytes) SP_CUDA_CHECK(cudaMemcpyAsync(slot.host.data, src, bytes, cudaMemcpyDeviceToHost, copy_));
    return record(layer);
  }
  Status from_host(int64_t layer, int index, void* dst, size_t bytes) override {
    const auto it = slots_.find({layer, index});
    SP_CHECK_ARG(it != slots_.end() && it->second.bytes == bytes,
                 "internal: a checkpoint brought back that was not offloaded with that size");
    SP_RETURN_IF_ERROR(after_compute());
    if (bytes) SP_CUDA_CHECK(cudaMemcpyAsync(dst, it->second.host.data, bytes, cudaMemcpyHostToDevice, copy_));
    return record(layer);
  }
  Status wait(int64_t layer) override {
    const auto it = done_.find(layer);
    if (it != done_.end()) SP_CUDA_CHECK(cudaStreamWaitEvent(compute_, it->second, 0));
    return Status::Ok();
  }
  Status wait_all() override {
    SP_CUDA_CHECK(cudaEventRecord(ready_, copy_));
    SP_CUDA_CHECK(cudaStreamWaitEvent(compute_, ready_, 0));
    return Status::Ok();
  }
  int64_t host_bytes() const override {
    int64_t n = 0;
    for (const auto& [key, slot] : slots_) n += int64_t(slot.capacity);
    return n;
  }

 private:
  struct Slot {
    PinnedHostBytes host;
    size_t capacity = 0, bytes = 0;
  };
  // The copy stream's next copy starts after the work queued so far on the compute stream.
  Status after_compute() {
    SP_CUDA_CHECK(cudaEventRecord(ready_, compute_));
    SP_CUDA_CHECK(cudaStreamWaitEvent(copy_, ready_, 0));
    return Status::Ok();
  }
  // The layer's event marks the copy stream after its copies queued so far.
  Status record(int64_t layer) {
    cudaEvent_t& done = done_[layer];
    if (!done) SP_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    SP_CUDA_CHECK(cudaEventRecord(done, copy_));
    return Status::Ok();
  }

  cudaStream_t compute_, copy_;
  cudaEvent_t ready_;
  std::map<std::pair<int64_t, int>, Slot> slots_;  // (layer, index of the kept array)
  std::map<int64_t, cudaEvent_t> done_;            // a layer's copies
};

}  // namespace

StatusOr<std::unique_ptr<HostOffload>> make_cuda_host_offload(TrainingMemory& memory) {
  SP_CHECK_ARG(memory.device() == DeviceKind::kCuda, "internal: pinned offload needs device training memory");
  cudaStream_t copy = nullptr;
  cudaEvent_t ready = nullptr;
  SP_CUDA_CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
  if (const cudaError_t e = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming); e != cudaSuccess) {
    (void)cudaStreamDestroy(copy);
    SP_CUDA_CHECK(e);
  }
  return std::unique_ptr<HostOffload>(
      std::make_unique<PinnedCopies>(static_cast<cudaStream_t>(memory.stream()), copy, ready));
}

}  // namespace seqpar::model
