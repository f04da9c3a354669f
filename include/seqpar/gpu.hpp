// GPU support shared by the CUDA backends: whether a device is present, owning device
// buffers, and host<->device copies. Streams are passed as `void*` (a cudaStream_t) so that
// headers stay free of CUDA includes; nullptr is the default stream.
#pragma once

#include <cstddef>
#include <cstdint>

#include "seqpar/status.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar {

// Number of usable CUDA devices (0 when built without CUDA or when none is present).
int cuda_device_count();

// Device memory owned by this object (cudaMalloc / cudaFree on the current device).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  static StatusOr<DeviceBuffer> allocate(size_t bytes);
  // Grows (never shrinks) to at least `bytes`; contents are not kept.
  Status reserve(size_t bytes);
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A device copy of a host tensor, with a contiguous view of it.
struct DeviceTensor {
  DeviceBuffer buffer;
  TensorView view;
};
StatusOr<DeviceTensor> to_device(const HostTensor& host);
StatusOr<DeviceTensor> device_zeros(DType dtype, const std::vector<int64_t>& shape);
// Copies a contiguous device view back into a new host tensor (synchronous).
StatusOr<HostTensor> to_host(const TensorView& device_view);

}  // namespace seqpar
