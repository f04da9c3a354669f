// --offload-checkpoints: the arrays a checkpointing policy keeps from a layer's forward to its
// backward wait in host memory meanwhile (DeepSpeed ALST's idea), so a GPU's memory holds about
// two layers' checkpoints instead of every layer's. The layer pass (layer_pass.hpp) says what goes
// and when; this says how: on a GPU, pinned host slots (taken once, reused every step) and a copy
// stream of its own ordered by events against the memory's stream (host_offload_cuda.cpp); on the
// host, plain copies (host_offload.cpp), the same calls so that the CPU tests run the pass's path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "model/training_memory.hpp"
#include "seqpar/status.hpp"

namespace seqpar::model {

class HostOffload {
 public:
  virtual ~HostOffload() = default;
  // Queues the copy of `bytes` at `src` (the memory's) into the host slot (layer, index), after
  // the work queued so far on the memory's stream. `src` must stay until `wait(layer)`.
  [[nodiscard]] virtual Status to_host(int64_t layer, int index, const void* src, size_t bytes) = 0;
  // Queues the copy of the slot's `bytes` (those of its last to_host) into `dst` (the memory's,
  // taken before this call), after the work queued so far on the memory's stream.
  [[nodiscard]] virtual Status from_host(int64_t layer, int index, void* dst, size_t bytes) = 0;
  // The memory's stream waits for the layer's copies queued so far: after this a to_host's source
  // may be given back (in stream order) and a from_host's destination read.
  [[nodiscard]] virtual Status wait(int64_t layer) = 0;
  // The memory's stream waits for every copy queued so far (before arrays are dropped on a
  // failed pass).
  [[nodiscard]] virtual Status wait_all() = 0;
  // Host bytes held in the slots.
  virtual int64_t host_bytes() const = 0;
};

// Pinned host memory (the CUDA half; host_offload_cuda.cpp says how it is pinned and why):
// `threads` fault its pages in at once. Given back by unpin_host_bytes.
struct PinnedHostBytes {
  void* data = nullptr;
  size_t bytes = 0;
  bool mapped = false;  // an mmap registered with CUDA, else cudaHostAlloc's
};
StatusOr<PinnedHostBytes> pin_host_bytes(size_t bytes, int threads);
void unpin_host_bytes(PinnedHostBytes& p);

// For `memory`'s device: plain host copies, or pinned slots and a copy stream on its GPU.
StatusOr<std::unique_ptr<HostOffload>> make_host_offload(TrainingMemory& memory);
// The CUDA half (refused without CUDA).
StatusOr<std::unique_ptr<HostOffload>> make_cuda_host_offload(TrainingMemory& memory);

}  // namespace seqpar::model
