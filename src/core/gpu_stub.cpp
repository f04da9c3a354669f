// GPU entry points for builds without CUDA: no devices, and clear refusals.
#ifndef SEQPAR_HAVE_CUDA
#include <cstring>

#include "seqpar/gpu.hpp"

namespace seqpar {

namespace {
Status no_cuda() {
  return SP_STATUS(StatusCode::kUnsupported, "seqpar was built without CUDA (no nvcc found)");
}
}  // namespace

int cuda_device_count() { return 0; }
int64_t cuda_free_memory() { return 0; }
Status stream_synchronize(void*) { return Status::Ok(); }
Status copy_bytes(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
  return Status::Ok();
}
Status copy_bytes_on_stream(void* dst, const void* src, size_t bytes, void*) {
  std::memcpy(dst, src, bytes);
  return Status::Ok();
}
bool is_device_pointer(const void*) { return false; }
void abandon_device() {}
bool device_abandoned() { return false; }
DeviceMemoryStats device_memory_stats(int) { return {}; }
void reset_device_memory_peak(int) {}
void DeviceBuffer::release() {}
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&&) noexcept = default;
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept = default;
StatusOr<DeviceBuffer> DeviceBuffer::allocate(size_t) { return no_cuda(); }
Status DeviceBuffer::reserve(size_t) { return no_cuda(); }
StreamBuffer::~StreamBuffer() = default;
StreamBuffer::StreamBuffer(StreamBuffer&&) noexcept = default;
StreamBuffer& StreamBuffer::operator=(StreamBuffer&&) noexcept = default;
StatusOr<StreamBuffer> StreamBuffer::allocate(size_t, void*) { return no_cuda(); }
void StreamBuffer::release(void*) {}
Status trim_stream_arenas() { return Status::Ok(); }
Status forget_stream_arenas(void*) { return Status::Ok(); }
StatusOr<DeviceTensor> to_device(const HostTensor&) { return no_cuda(); }
StatusOr<DeviceTensor> device_zeros(DType, const std::vector<int64_t>&) { return no_cuda(); }
StatusOr<HostTensor> to_host(const TensorView&) { return no_cuda(); }

}  // namespace seqpar
#endif
