// Where the executor's blocks live and how bytes move between them, apart from what the
// schedule does with them (ggml keeps buffers apart from backends the same way). Two
// implementations: host memory (host_block_memory.cpp) and CUDA stream buffers on one stream
// (gpu_block_memory.cpp). Every call is ordered on the memory's stream: host calls are done
// when they return; device calls are queued.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "seqpar/status.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar::parallel {

// One allocation of a BlockMemory. Dropped without release(), it is given back on the stream
// it was taken on.
class MemoryBlock {
 public:
  virtual ~MemoryBlock() = default;
  virtual void* data() const = 0;
};

class BlockMemory {
 public:
  virtual ~BlockMemory() = default;
  virtual DeviceKind device() const = 0;
  // The CUDA stream of device memory (nullptr for the host, or the legacy default stream).
  virtual void* stream() const = 0;

  // `bytes` of uninitialised memory, 256-byte aligned.
  virtual StatusOr<std::unique_ptr<MemoryBlock>> allocate(size_t bytes) = 0;
  // Gives a block back once the work queued so far on this memory's stream is done with it.
  virtual void release(std::unique_ptr<MemoryBlock> block) = 0;

  // dst = src, cast to dst's dtype (views of one shape, up to 4 dims, contiguous last dim).
  [[nodiscard]] virtual Status copy(const TensorView& src, const TensorView& dst) = 0;
  // dst = src for each pair; no destination overlaps another pair's source or destination.
  // A device does them in one launch (a span step copies hundreds of pieces, and a launch each
  // made it launch-bound); the host one by one.
  [[nodiscard]] virtual Status copy_many(std::span<const std::pair<TensorView, TensorView>> pairs) {
    for (const auto& [src, dst] : pairs) SP_RETURN_IF_ERROR(copy(src, dst));
    return Status::Ok();
  }
  // Every element of dst set to value.
  [[nodiscard]] virtual Status fill(const TensorView& dst, float value) = 0;
  // dst += src (dst in the accumulators' dtype, src in it or the inputs').
  [[nodiscard]] virtual Status add(const TensorView& src, const TensorView& dst) = 0;

  // Before a host-driven communicator moves these buffers: the queued work is done.
  [[nodiscard]] virtual Status settle() = 0;
  // A pass begins (ordered after the last pass on another stream) and ends; with tracing,
  // mark records a milestone on the stream.
  [[nodiscard]] virtual Status begin() = 0;
  [[nodiscard]] virtual Status end() = 0;
  virtual bool tracing() const = 0;
  [[nodiscard]] virtual Status mark(const std::string& label) = 0;
};

std::unique_ptr<BlockMemory> make_host_block_memory();

}  // namespace seqpar::parallel
