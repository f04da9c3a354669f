// The CUDA half of host_offload.hpp: pinned host slots, each taken at its first use (so the
// slots add up to the layers' kept bytes) and reused by later steps, and a copy stream that
// starts each copy after an event on the memory's stream (the source written, the destination
// taken) and records a layer's event after it, which the memory's stream waits for before it
// gives a source back or reads a destination. Copies on one stream run in order, so a slot's
// copy back in a backward ends before the next step's forward overwrites it.
#include <cuda_runtime.h>

#include <map>
#include <utility>

#include "core/cuda_check.hpp"
#include "model/host_offload.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar::model {
namespace {

class PinnedCopies final : public HostOffload {
 public:
  PinnedCopies(cudaStream_t compute, cudaStream_t copy, cudaEvent_t ready)
      : compute_(compute), copy_(copy), ready_(ready) {}
  ~PinnedCopies() override {
    if (device_abandoned()) return;
    (void)cudaStreamSynchronize(copy_);
    for (auto& [key, slot] : slots_) (void)cudaFreeHost(slot.host);
    for (auto& [layer, done] : done_) (void)cudaEventDestroy(done);
    (void)cudaEventDestroy(ready_), (void)cudaStreamDestroy(copy_);
  }

  Status to_host(int64_t layer, int index, const void* src, size_t bytes) override {
    Slot& slot = slots_[{layer, index}];
    if (slot.capacity < bytes) {  // the first step (or a longer shard): the slot's earlier copies end first
      SP_CUDA_CHECK(cudaStreamSynchronize(copy_));
      if (slot.host) SP_CUDA_CHECK(cudaFreeHost(slot.host));
      slot.host = nullptr, slot.capacity = 0;
      SP_CUDA_CHECK(cudaHostAlloc(&slot.host, bytes, cudaHostAllocDefault));
      slot.capacity = bytes;
    }
    slot.bytes = bytes;
    SP_RETURN_IF_ERROR(after_compute());
    if (bytes) SP_CUDA_CHECK(cudaMemcpyAsync(slot.host, src, bytes, cudaMemcpyDeviceToHost, copy_));
    return record(layer);
  }
  Status from_host(int64_t layer, int index, void* dst, size_t bytes) override {
    const auto it = slots_.find({layer, index});
    SP_CHECK_ARG(it != slots_.end() && it->second.bytes == bytes,
                 "internal: a checkpoint brought back that was not offloaded with that size");
    SP_RETURN_IF_ERROR(after_compute());
    if (bytes) SP_CUDA_CHECK(cudaMemcpyAsync(dst, it->second.host, bytes, cudaMemcpyHostToDevice, copy_));
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
    void* host = nullptr;
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
