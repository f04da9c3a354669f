// Block memory on a CUDA device (block_memory.hpp): stream buffers from the stream's arena
// (gpu.hpp), given back in stream order, so blocks that never live at once share memory with
// each other and with the backends' part buffers and cuDNN's workspace; copies, fills and sums
// by our small kernels (flash_cuda.hpp); the pass ordered after the last one on another stream
// and traced through the rank's GpuWorkspace. Also the GPU entry points of the one executor
// (src/parallel/gpu_executor.hpp).
#include <cuda_runtime.h>

#include "parallel/block_memory.hpp"
#include "parallel/executor.hpp"
#include "parallel/gpu_workspace.hpp"
#include "kernels/cuda/flash_cuda.hpp"
#include "seqpar/gpu.hpp"
#include "parallel/gpu_executor.hpp"

namespace seqpar::parallel {
namespace {

class CudaBlock final : public MemoryBlock {
 public:
  explicit CudaBlock(StreamBuffer buffer) : buffer_(std::move(buffer)) {}
  void* data() const override { return buffer_.data(); }
  void release(void* stream) { buffer_.release(stream); }

 private:
  StreamBuffer buffer_;  // dropped unreleased: given back on the stream it was taken on
};

}  // namespace

class CudaBlockMemory final : public BlockMemory {
 public:
  CudaBlockMemory(GpuWorkspace& ws, void* stream) : ws_(ws.impl()), s_(static_cast<cudaStream_t>(stream)) {}
  DeviceKind device() const override { return DeviceKind::kCuda; }
  void* stream() const override { return s_; }

  StatusOr<std::unique_ptr<MemoryBlock>> allocate(size_t bytes) override {
    SP_ASSIGN_OR_RETURN(StreamBuffer buffer, StreamBuffer::allocate(bytes, s_));
    return std::unique_ptr<MemoryBlock>(std::make_unique<CudaBlock>(std::move(buffer)));
  }
  void release(std::unique_ptr<MemoryBlock> block) override {
    if (block) static_cast<CudaBlock&>(*block).release(s_);
  }

  // A same-dtype copy through the row-copying kernel (16-byte units, no per-element index
  // arithmetic), a cast through flash_cast.
  Status copy(const TensorView& src, const TensorView& dst) override {
    const std::pair<TensorView, TensorView> pair{src, dst};
    return flash_copy_many({&pair, 1}, s_);
  }
  Status copy_many(std::span<const std::pair<TensorView, TensorView>> pairs) override {
    return flash_copy_many(pairs, s_);
  }
  Status fill(const TensorView& dst, float value) override { return flash_fill(dst, value, s_); }
  Status add(const TensorView& src, const TensorView& dst) override { return flash_accumulate(src, dst, s_); }

  Status settle() override { return stream_synchronize(s_); }
  Status begin() override { return ws_.begin(s_); }
  Status end() override { return ws_.end(s_); }
  bool tracing() const override { return ws_.tracing; }
  Status mark(const std::string& label) override { return ws_.mark(s_, label); }

 private:
  GpuWorkspace::Impl& ws_;
  cudaStream_t s_;
};

}  // namespace seqpar::parallel

namespace seqpar {

Status run_forward_gpu(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, GpuWorkspace& ws,
                       void* stream, PassStats* stats, ForwardState* state) {
  parallel::CudaBlockMemory memory(ws, stream);
  return parallel::run_pass(comm, plan, t, Pass::kForward, memory, stats, state);
}

Status run_backward_gpu(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, GpuWorkspace& ws,
                        void* stream, PassStats* stats, ForwardState* state) {
  parallel::CudaBlockMemory memory(ws, stream);
  return parallel::run_pass(comm, plan, t, Pass::kBackward, memory, stats, state);
}

}  // namespace seqpar
