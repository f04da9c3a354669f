// The linear-attention backends this build has (kernels/linear_backend.hpp): the CPU one always,
// the CUDA one where CUDA is built (its file is left out otherwise).
#include "kernels/linear_backend.hpp"

namespace seqpar {

#ifndef SEQPAR_HAVE_CUDA
std::unique_ptr<LinearBackend> make_cuda_linear_backend() { return nullptr; }
#endif

StatusOr<std::unique_ptr<LinearBackend>> make_linear_backend(DeviceKind device) {
  if (device == DeviceKind::kCpu) return make_cpu_linear_backend();
  std::unique_ptr<LinearBackend> cuda = make_cuda_linear_backend();
  SP_CHECK_SUPPORTED(cuda != nullptr, "linear attention on CUDA tensors: seqpar was built without CUDA");
  return cuda;
}

}  // namespace seqpar
