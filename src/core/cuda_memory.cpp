// Device buffers and host<->device copies (CUDA builds only; gpu_stub.cpp covers the rest).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>

#include "core/cuda_check.hpp"
#include "core/cuda_memory.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar {

namespace {
constexpr int kMaxTrackedDevices = 64;
struct MemoryCounters {
  std::atomic<int64_t> current{0}, peak{0};
};
std::array<MemoryCounters, kMaxTrackedDevices> g_memory;
std::atomic<bool> g_abandoned{false};
}  // namespace

void track_device_bytes(int device, int64_t delta) {
  if (device < 0 || device >= kMaxTrackedDevices) return;
  MemoryCounters& m = g_memory[device];
  const int64_t now = m.current.fetch_add(delta) + delta;
  int64_t peak = m.peak.load();
  while (now > peak && !m.peak.compare_exchange_weak(peak, now)) {
  }
}

void abandon_device() { g_abandoned = true; }
bool device_abandoned() { return g_abandoned.load(); }

DeviceMemoryStats device_memory_stats(int device) {
  if (device < 0 || device >= kMaxTrackedDevices) return {};
  return {g_memory[device].current.load(), g_memory[device].peak.load()};
}
void reset_device_memory_peak(int device) {
  if (device >= 0 && device < kMaxTrackedDevices)
    g_memory[device].peak.store(g_memory[device].current.load());
}

Status stream_synchronize(void* stream) {
  SP_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  return Status::Ok();
}

namespace {
// The device holding `p`, or -1 for host memory.
int device_of(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ? attr.device : -1;
}
}  // namespace

bool is_device_pointer(const void* p) { return device_of(p) >= 0; }

Status copy_bytes(void* dst, const void* src, size_t bytes) {
  const int dst_device = device_of(dst), src_device = device_of(src);
  if (dst_device < 0 && src_device < 0) {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  // A plain cudaMemcpy between device buffers may return before the copy lands: copy on a
  // stream of our own, on the device that holds the data, and wait for it.
  int caller_device = 0;
  SP_CUDA_CHECK(cudaGetDevice(&caller_device));
  SP_CUDA_CHECK(cudaSetDevice(dst_device >= 0 ? dst_device : src_device));
  cudaStream_t stream;
  cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    (void)cudaStreamDestroy(stream);
  }
  SP_CUDA_CHECK(cudaSetDevice(caller_device));  // the caller's current device is unchanged
  SP_CUDA_CHECK(err);
  return Status::Ok();
}

Status copy_bytes_on_stream(void* dst, const void* src, size_t bytes, void* stream) {
  SP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
  return Status::Ok();
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

int64_t cuda_free_memory() {
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return int64_t(free_bytes);
}

void DeviceBuffer::release() {
  if (data_) retired_.push_back({data_, bytes_});
  for (const auto& [ptr, bytes] : retired_) {
    if (!device_abandoned()) (void)cudaFree(ptr);
    track_device_bytes(device_, -static_cast<int64_t>(bytes));
  }
  retired_.clear();
  data_ = nullptr;
  bytes_ = 0;
}
DeviceBuffer::~DeviceBuffer() { release(); }
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(other.data_), bytes_(other.bytes_), device_(other.device_),
      retired_(std::move(other.retired_)) {
  other.data_ = nullptr;
  other.bytes_ = 0;
  other.retired_.clear();
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    bytes_ = other.bytes_;
    device_ = other.device_;
    retired_ = std::move(other.retired_);
    other.data_ = nullptr;
    other.bytes_ = 0;
    other.retired_.clear();
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
  // The old block is freed with the buffer, not now: cudaFree waits for the whole device, and
  // a buffer may grow while a transfer is in flight (or stuck on a dead peer).
  if (data_) retired_.push_back({data_, bytes_});
  data_ = nullptr;
  bytes_ = 0;
  SP_CUDA_CHECK(cudaGetDevice(&device_));
  SP_CUDA_CHECK(cudaMalloc(&data_, bytes));
  bytes_ = bytes;
  track_device_bytes(device_, static_cast<int64_t>(bytes));
  return Status::Ok();
}

StatusOr<DeviceTensor> device_zeros(DType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  DeviceTensor t;
  SP_ASSIGN_OR_RETURN(t.buffer, DeviceBuffer::allocate(std::max<size_t>(bytes, 1)));
  SP_CUDA_CHECK(cudaMemset(t.buffer.data(), 0, bytes));
  Device device{DeviceKind::kCuda, 0};
  SP_CUDA_CHECK(cudaGetDevice(&device.index));
  t.view = TensorView::contiguous(t.buffer.data(), dtype, shape, device);
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
