// Device buffers and host<->device copies (CUDA builds only; gpu_stub.cpp covers the rest).
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda_check.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) (void)cudaFree(data_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) (void)cudaFree(data_);
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

StatusOr<DeviceBuffer> DeviceBuffer::allocate(size_t bytes) {
  DeviceBuffer b;
  SP_RETURN_IF_ERROR(b.reserve(bytes));
  return b;
}

Status DeviceBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_) return Status::Ok();
  if (data_) SP_CUDA_CHECK(cudaFree(data_));
  data_ = nullptr;
  bytes_ = 0;
  SP_CUDA_CHECK(cudaMalloc(&data_, bytes));
  bytes_ = bytes;
  return Status::Ok();
}

StatusOr<DeviceTensor> device_zeros(DType dtype, const std::vector<int64_t>& shape) {
  HostTensor like(dtype, shape);
  DeviceTensor t;
  SP_ASSIGN_OR_RETURN(t.buffer, DeviceBuffer::allocate(std::max<size_t>(like.bytes(), 1)));
  SP_CUDA_CHECK(cudaMemset(t.buffer.data(), 0, like.bytes()));
  t.view = like.view();
  t.view.data = t.buffer.data();
  t.view.device = Device{DeviceKind::kCuda, 0};
  SP_CUDA_CHECK(cudaGetDevice(&t.view.device.index));
  return t;
}

StatusOr<DeviceTensor> to_device(const HostTensor& host) {
  std::vector<int64_t> shape(host.view().shape.begin(), host.view().shape.begin() + host.view().ndim);
  SP_ASSIGN_OR_RETURN(DeviceTensor t, device_zeros(host.view().dtype, shape));
  SP_CUDA_CHECK(cudaMemcpy(t.buffer.data(), host.view().data, host.bytes(), cudaMemcpyHostToDevice));
  return t;
}

StatusOr<HostTensor> to_host(const TensorView& device_view) {
  SP_CHECK_ARG(device_view.is_contiguous(), "to_host needs a contiguous view");
  HostTensor h(device_view.dtype, std::vector<int64_t>(device_view.shape.begin(),
                                                       device_view.shape.begin() + device_view.ndim));
  SP_CUDA_CHECK(cudaMemcpy(h.view().data, device_view.data, h.bytes(), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace seqpar
