// The backends this build has, and the choice of a GPU backend for a problem: cuDNN where it
// takes the problem, else our own CUDA kernels (any mask, any positions). The Hopper kernels are
// made by name only (make_hopper_backend): no default picks them.
#include "seqpar/backend.hpp"

#ifdef SEQPAR_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif
#ifdef SEQPAR_HAVE_HOPPER
#include "kernels/hopper/hopper_backend.hpp"
#endif

namespace seqpar {

std::unique_ptr<AttentionBackend> make_cuda_backend() {
#ifdef SEQPAR_HAVE_CUDA
  return std::make_unique<cuda::CudaKernelBackend>();
#else
  return nullptr;
#endif
}

std::unique_ptr<AttentionBackend> make_cudnn_backend(int64_t max_call_rows, bool deterministic) {
#ifdef SEQPAR_HAVE_CUDNN
  return cuda::make_cudnn_backend(max_call_rows, deterministic);
#else
  (void)max_call_rows, (void)deterministic;
  return nullptr;
#endif
}

std::unique_ptr<AttentionBackend> make_hopper_backend() {
#ifdef SEQPAR_HAVE_HOPPER
  return hopper::make_backend();
#else
  return nullptr;
#endif
}

std::unique_ptr<AttentionBackend> make_gpu_backend(const TensorView& q, const AttentionParams& params,
                                                   bool prefer_cudnn, int64_t max_call_rows) {
  if (prefer_cudnn) {
    std::unique_ptr<AttentionBackend> cudnn = make_cudnn_backend(max_call_rows);
    if (cudnn && cudnn->supports(q, params).empty()) return cudnn;
  }
  return make_cuda_backend();
}

std::vector<const AttentionBackend*> all_backends() {
  std::vector<const AttentionBackend*> all{&cpu_kernel_backend(), &cpu_oracle_backend()};
  static const std::unique_ptr<AttentionBackend> own = make_cuda_backend(), cudnn = make_cudnn_backend(),
                                                 hopper = make_hopper_backend();
  for (const auto* gpu : {own.get(), cudnn.get(), hopper.get()})
    if (gpu) all.push_back(gpu);
  return all;
}

}  // namespace seqpar
