// CUDA devices and streams for the binding (cuda_streams.hpp).
#include "cuda_streams.hpp"

#ifdef SEQPAR_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <string>

#include "seqpar/gpu.hpp"

namespace seqpar::py {

#ifdef SEQPAR_HAVE_CUDA
namespace {
Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kInternal, std::string(what) + " failed: " + cudaGetErrorString(e));
}
}  // namespace

DeviceGuard::DeviceGuard(int device) {
  status_ = cuda_status(cudaGetDevice(&previous_), "cudaGetDevice");
  if (status_.ok() && previous_ != device) status_ = cuda_status(cudaSetDevice(device), "cudaSetDevice");
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
}

StatusOr<void*> create_stream() {
  cudaStream_t s = nullptr;
  SP_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
  return static_cast<void*>(s);
}

void destroy_stream(void* stream) {
  if (!stream) return;
  (void)forget_stream_arenas(stream);  // its arena's memory goes back to CUDA
  (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

Status stream_wait(void* waiter, void* waited) {
  if (waiter == waited) return Status::Ok();
  cudaEvent_t e = nullptr;
  SP_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
  Status s = cuda_status(cudaEventRecord(e, static_cast<cudaStream_t>(waited)), "cudaEventRecord");
  if (s.ok()) s = cuda_status(cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), e, 0), "cudaStreamWaitEvent");
  (void)cudaEventDestroy(e);  // released once the wait is done
  return s;
}

#else

namespace {
Status no_cuda() {
  return Status(StatusCode::kUnsupported,
                "this seqpar module was built without CUDA; build it with -C cmake.define.SEQPAR_WITH_CUDA=ON on a "
                "machine with the CUDA toolkit");
}
}  // namespace

DeviceGuard::DeviceGuard(int) : status_(no_cuda()) {}
DeviceGuard::~DeviceGuard() = default;
StatusOr<void*> create_stream() { return no_cuda(); }
void destroy_stream(void*) {}
Status stream_wait(void*, void*) { return no_cuda(); }

#endif

}  // namespace seqpar::py
