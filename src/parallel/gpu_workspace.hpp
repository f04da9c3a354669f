// GpuWorkspace's insides (src/parallel/gpu_executor.hpp), shared by the workspace's own
// calls (gpu_workspace.cpp) and the GPU executor: the trace's marks, and the event that orders
// a call on one stream after the last call on another.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "core/cuda_check.hpp"
#include "seqpar/gpu.hpp"
#include "parallel/gpu_executor.hpp"

namespace seqpar {

struct GpuWorkspace::Impl {
  bool tracing = false;
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  // The end of the last call's work, on its stream: a call on another stream waits for it (the
  // blocks a forward kept for the backward were written there).
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
