// GPU support shared by the CUDA backends: whether a device is present, owning device
// buffers, and host<->device copies. Streams are passed as `void*` (a cudaStream_t) so that
// headers stay free of CUDA includes; nullptr is the default stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "seqpar/status.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar {

// Number of usable CUDA devices (0 when built without CUDA or when none is present).
int cuda_device_count();
// Bytes free on the current CUDA device now (0 without CUDA or a device).
int64_t cuda_free_memory();

// Blocks until the work queued on `stream` is done (no-op without CUDA).
Status stream_synchronize(void* stream);
// Copies bytes between any two of host and device memory (plain memcpy without CUDA).
Status copy_bytes(void* dst, const void* src, size_t bytes);
// Queues the same copy on `stream` and returns at once (plain memcpy without CUDA).
Status copy_bytes_on_stream(void* dst, const void* src, size_t bytes, void* stream);
// Whether `p` points into device memory.
bool is_device_pointer(const void* p);

// After a communicator abort that could not stop its kernels: DeviceBuffers stop freeing
// (cudaFree would wait for those kernels forever); the process is expected to exit. The Python
// package also calls it at interpreter exit, once its ranks are destroyed: what other threads
// still hold is then left to the process's end, as CUDA's and cuDNN's teardown may run first.
void abandon_device();
bool device_abandoned();

// Bytes held on one device by DeviceBuffers and by the stream arenas (their segments, handed
// out or not), now and at most since the last reset (so a benchmark can report the peak
// workspace of an algorithm).
struct DeviceMemoryStats {
  int64_t current = 0;
  int64_t peak = 0;
};
DeviceMemoryStats device_memory_stats(int device);
void reset_device_memory_peak(int device);

// Device memory in stream order (src/core/cuda_stream_arena.cpp): taken for work queued on
// `stream` and given back once the work that uses it is queued, so that the next block taken on
// that stream reuses it at once; blocks that never live at the same time so share memory, where
// buffers kept per use would each hold their largest. Another stream may use a block after an
// event recorded on `stream` after the allocation. A block given back on another stream than
// it was taken on is reused once the work queued there so far is done. The memory comes from an
// arena per device and stream, best fit, kept for reuse (counted in device_memory_stats) until
// trim_stream_arenas(), or forget_stream_arenas() as the stream ends. Mapped with CUDA's virtual
// memory calls: peers with peer access may read and write it (NCCL); cudaIpc* cannot share it.
class StreamBuffer {
 public:
  StreamBuffer() = default;
  ~StreamBuffer();  // given back on the stream it was taken on, if not given back before
  StreamBuffer(StreamBuffer&& other) noexcept;
  StreamBuffer& operator=(StreamBuffer&& other) noexcept;
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;

  static StatusOr<StreamBuffer> allocate(size_t bytes, void* stream);
  // Gives the memory back after the work queued on `stream` so far.
  void release(void* stream);
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  void* stream_ = nullptr;
  unsigned long long stream_id_ = 0;  // its arena's key: CUDA never reuses a stream's id
  int device_ = 0;
};
// Waits for the current device's queued work, then returns to CUDA the arenas' memory on it
// that holds no block, so a measurement starts from the memory it takes itself. For quiet
// points: no other thread may queue work on the device meanwhile.
Status trim_stream_arenas();
// Before cudaStreamDestroy(stream): waits for the stream, returns its arena's free memory to
// CUDA, and drops the arena once its last block comes back (blocks may outlive the stream).
Status forget_stream_arenas(void* stream);

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
  // Grows (never shrinks) to at least `bytes`; contents are not kept. The outgrown block is
  // freed with the buffer (no device-wide sync in the middle of a schedule).
  Status reserve(size_t bytes);
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void release();

  void* data_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
  std::vector<std::pair<void*, size_t>> retired_;  // outgrown blocks, freed with the buffer
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
