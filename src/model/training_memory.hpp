// Where the trainer's flat arrays live (parameters, their compute copy, gradients, AdamW's
// moments, ZeRO's gather and scatter buffers) and the few operations a step needs on them, so
// that one step loop (trainer.cpp) serves both devices: host memory (training_memory_host.cpp)
// or one GPU's memory, every call queued on the trainer's stream (training_memory_cuda.cpp).
// The collectives over these arrays are written once below: on the device where the
// communicator moves device buffers, through host memory where it does not (MPI).
#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <memory>

#include "model/layers.hpp"
#include "seqpar/comm.hpp"
#include "seqpar/status.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar::model {

// One allocation, given back when dropped (on the device: after the work queued so far).
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() const = 0;
};

// A typed array of a TrainingMemory.
template <class T>
struct Array {
  std::unique_ptr<Buffer> buffer;
  int64_t n = 0;
  T* p() const { return buffer ? static_cast<T*>(buffer->data()) : nullptr; }
};

class TrainingMemory {
 public:
  virtual ~TrainingMemory() = default;
  virtual DeviceKind device() const = 0;
  // The CUDA stream every call is queued on (nullptr on the host).
  virtual void* stream() const = 0;
  // The dtype the model pass reads weights in: f32 on the host (the master weights themselves,
  // no copy), bf16 on a GPU (a copy refreshed after every update).
  virtual DType compute_dtype() const = 0;

  // `bytes` of uninitialised memory.
  virtual StatusOr<std::unique_ptr<Buffer>> allocate(size_t bytes) = 0;
  [[nodiscard]] virtual Status zero(void* p, size_t bytes) = 0;
  [[nodiscard]] virtual Status copy(void* dst, const void* src, size_t bytes) = 0;  // both in this memory
  // `height` rows of `width` bytes from src (rows `src_pitch` bytes apart) to dst (`dst_pitch`).
  [[nodiscard]] virtual Status copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                                         size_t height) = 0;
  // Between this memory and the host; both complete before returning.
  [[nodiscard]] virtual Status to_host(void* host, const void* src, size_t bytes) = 0;
  [[nodiscard]] virtual Status from_host(void* dst, const void* host, size_t bytes) = 0;
  // dst (compute dtype) = src (f32), n elements.
  [[nodiscard]] virtual Status to_compute(const float* src, void* dst, int64_t n) = 0;
  // dst += src, n f32 elements.
  [[nodiscard]] virtual Status add(float* dst, const float* src, int64_t n) = 0;
  // The sum of x^2 over n elements in a fixed order (the same bits every run); completes.
  virtual StatusOr<double> sum_of_squares(const float* x, int64_t n) = 0;
  // AdamW on n elements with weight decay `decay`: params, m, v updated from grads * step.clip;
  // the compute copy of the updated params refreshed where given (may be null).
  [[nodiscard]] virtual Status adamw(const AdamWStep& step, double decay, float* params, void* compute,
                                     const float* grads, float* m, float* v, int64_t n) = 0;
  // The queued work is done.
  [[nodiscard]] virtual Status synchronize() = 0;
  // A second memory of the same device whose calls queue on a stream of its own (on the host:
  // another host memory, every call done when it returns): ZeRO-3's gathers and gradient sums run
  // there under the pass's compute. Its allocations come from that stream's arenas, so a buffer
  // one side allocates is used by the other only after wait_for, and given back by its own side
  // after that side waited for the other's last use.
  virtual StatusOr<std::unique_ptr<TrainingMemory>> make_lane() = 0;
  // Work queued here from now on runs after the work queued on `other` so far (no host wait).
  [[nodiscard]] virtual Status wait_for(const TrainingMemory& other) = 0;
  // The peak of the device memory taken since the trainer began (0 on the host).
  virtual int64_t peak_bytes() const = 0;

  template <class T>
  StatusOr<Array<T>> make(int64_t n) {
    Array<T> a;
    a.n = n;
    SP_ASSIGN_OR_RETURN(a.buffer, allocate(size_t(std::max<int64_t>(n, 1)) * sizeof(T)));
    return a;
  }
  template <class T>
  StatusOr<Array<T>> make_zeroed(int64_t n) {
    SP_ASSIGN_OR_RETURN(Array<T> a, make<T>(n));
    SP_RETURN_IF_ERROR(zero(a.p(), size_t(n) * sizeof(T)));
    return a;
  }
};

std::unique_ptr<TrainingMemory> make_host_training_memory();
// On the current GPU, on a stream of its own. Refused without CUDA.
StatusOr<std::unique_ptr<TrainingMemory>> make_cuda_training_memory();

// The communicator's collectives over arrays of `memory` (trainer.cpp's gradient reductions and
// ZeRO's gathers), ordered on its stream.
[[nodiscard]] Status all_reduce(Communicator& comm, TrainingMemory& memory, float* data, int64_t n);
// send [P * n] -> recv [n], summed.
[[nodiscard]] Status reduce_scatter(Communicator& comm, TrainingMemory& memory, const float* send, float* recv, int64_t n);
// send [bytes] from each rank -> recv [P * bytes] in rank order.
[[nodiscard]] Status all_gather(Communicator& comm, TrainingMemory& memory, const void* send, void* recv, size_t bytes);

}  // namespace seqpar::model
