// The GPU executor's per-rank workspace (src/parallel/gpu_executor.hpp): the trace of the
// milestones the calls passed on their stream. The blocks are stream buffers (gpu.hpp).
#include "parallel/gpu_workspace.hpp"

namespace seqpar {

GpuWorkspace::GpuWorkspace(bool trace) : impl_(std::make_unique<Impl>()) { impl_->tracing = trace; }
GpuWorkspace::~GpuWorkspace() = default;

StatusOr<std::vector<std::pair<std::string, double>>> GpuWorkspace::take_trace() {
  Impl& I = *impl_;
  std::vector<std::pair<std::string, double>> out;
  if (I.marks.empty()) return out;
  SP_CUDA_CHECK(cudaEventSynchronize(I.marks.back().second));
  for (const auto& [label, e] : I.marks) {
    float ms = 0;
    SP_CUDA_CHECK(cudaEventElapsedTime(&ms, I.marks.front().second, e));
    out.emplace_back(label, ms);
  }
  I.drop_marks();
  return out;
}

}  // namespace seqpar
