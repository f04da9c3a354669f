// The backends this build has, and the choice of a GPU backend for a problem: the one
// SEQPAR_ATTN_BACKEND names; else "auto" (backend_choice.cpp: per call the fastest of cuDNN, our
// Hopper kernels and our CUDA kernels) on sm_90 devices; else cuDNN where it takes the problem,
// else our own CUDA kernels (any mask but block patterns, any positions).
#include "seqpar/backend.hpp"

#include <cstdlib>

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

StatusOr<std::string> forced_gpu_backend() {
  const char* env = std::getenv("SEQPAR_ATTN_BACKEND");
  const std::string name = env ? env : "";
  SP_CHECK_ARG(name.empty() || name == "cudnn" || name == "hopper" || name == "cuda" || name == "auto",
               "SEQPAR_ATTN_BACKEND=" + name + " names no GPU backend (cudnn, hopper, cuda or auto)");
  return name;
}

std::unique_ptr<AttentionBackend> make_gpu_backend_named(const std::string& name, int device, int64_t max_call_rows) {
  if (name == "cudnn") return make_cudnn_backend(max_call_rows);
  if (name == "hopper") return make_hopper_backend();
  if (name == "cuda") return make_cuda_backend();
  if (name == "auto") return make_auto_backend(device, max_call_rows);
  return nullptr;
}

std::unique_ptr<AttentionBackend> make_gpu_backend(const TensorView& q, const AttentionParams& params,
                                                   bool prefer_cudnn, int64_t max_call_rows) {
  StatusOr<std::string> forced = forced_gpu_backend();
  if (!forced.ok()) return nullptr;
  if (!forced.value().empty() && forced.value() != "auto")
    return make_gpu_backend_named(forced.value(), q.device.index, max_call_rows);
  if (prefer_cudnn || !forced.value().empty()) {  // forced "auto": the same choice
    std::unique_ptr<AttentionBackend> chosen =
        make_auto_backend(q.device.index, max_call_rows, q.ndim > 3 && auto_backward_from_o(q.shape[3]));
    if (chosen && chosen->supports(q, params).empty()) return chosen;
    std::unique_ptr<AttentionBackend> cudnn = make_cudnn_backend(max_call_rows);
    if (cudnn && cudnn->supports(q, params).empty()) return cudnn;
  }
  return make_cuda_backend();
}

std::vector<const AttentionBackend*> all_backends() {
  std::vector<const AttentionBackend*> all{&cpu_kernel_backend(), &cpu_oracle_backend()};
  static const std::unique_ptr<AttentionBackend> own = make_cuda_backend(), cudnn = make_cudnn_backend(),
                                                 hopper = make_hopper_backend(), chosen = make_auto_backend(0),
                                                 chosen_from_o = make_auto_backend(0, 0, true);
  for (const auto* gpu : {own.get(), cudnn.get(), hopper.get(), chosen.get(), chosen_from_o.get()})
    if (gpu) all.push_back(gpu);
  return all;
}

}  // namespace seqpar
