// GpuWorkspace's insides (include/seqpar/gpu_executor.hpp), shared by the workspace's own
// calls (gpu_workspace.cpp) and the GPU executor that draws its blocks from the pool.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_check.hpp"
#include "seqpar/gpu.hpp"
#include "seqpar/gpu_executor.hpp"

namespace seqpar {

struct GpuWorkspace::Impl {
  // Free device buffers by size: blocks of one kind share one size (the longest shard's), so
  // after the first group every block finds a buffer.
  std::multimap<size_t, DeviceBuffer> pool;
  int64_t pooled = 0;
  bool tracing = false;
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  // The end of the last call's work, on its stream: released buffers may still be in use
  // there, so a call on another stream waits for it before reusing them.
  cudaEvent_t done = nullptr;
  cudaStream_t done_on = nullptr;

  ~Impl() {
    drop_marks();
    if (done && !device_abandoned()) (void)cudaEventDestroy(done);
  }
  Status begin(cudaStream_t s) {
    if (done && done_on != s) SP_CUDA_CHECK(cudaStreamWaitEvent(s, done, 0));
    return Status::Ok();
  }
  Status end(cudaStream_t s) {
    if (!done) SP_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    SP_CUDA_CHECK(cudaEventRecord(done, s));
    done_on = s;
    return Status::Ok();
  }
  StatusOr<DeviceBuffer> take(size_t bytes) {
    auto it = pool.lower_bound(bytes);
    if (it != pool.end()) {
      DeviceBuffer b = std::move(it->second);
      pool.erase(it);
      return b;
    }
    SP_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::allocate(bytes));
    pooled += int64_t(b.bytes());
    return b;
  }
  void give(DeviceBuffer b) {
    if (b.data()) pool.emplace(b.bytes(), std::move(b));
  }
  Status mark(cudaStream_t s, std::string label) {
    if (!tracing) return Status::Ok();
    cudaEvent_t e;
    SP_CUDA_CHECK(cudaEventCreate(&e));
    marks.emplace_back(std::move(label), e);
    SP_CUDA_CHECK(cudaEventRecord(e, s));
    return Status::Ok();
  }
  void drop_marks() {
    for (auto& m : marks) (void)cudaEventDestroy(m.second);
    marks.clear();
  }
};

}  // namespace seqpar
