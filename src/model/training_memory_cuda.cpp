// The CUDA half of training_memory.hpp: one GPU's memory, taken from the stream arenas of the
// trainer's own stream (gpu.hpp's StreamBuffer: the one allocator of the engine's scratch, the
// executor's blocks and the trainer's activations), every call queued on that stream; the
// compute copy of the weights is bf16. The kernels are the model's CUDA halves (adamw.cu,
// linear.cu).
#include <cuda_runtime.h>

#include "core/cuda_check.hpp"
#include "model/layers_cuda.hpp"
#include "model/training_memory.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar::model {
namespace {

class StreamArray final : public Buffer {
 public:
  StreamArray(StreamBuffer b, void* stream) : b_(std::move(b)), stream_(stream) {}
  ~StreamArray() override {
    if (!device_abandoned()) b_.release(stream_);
  }
  void* data() const override { return b_.data(); }

 private:
  StreamBuffer b_;
  void* stream_;
};

class CudaTrainingMemory final : public TrainingMemory {
 public:
  CudaTrainingMemory(int device, cudaStream_t s) : device_(device), s_(s) {}
  ~CudaTrainingMemory() override {
    if (!device_abandoned()) (void)forget_stream_arenas(s_), (void)cudaStreamDestroy(s_);
  }
  DeviceKind device() const override { return DeviceKind::kCuda; }
  void* stream() const override { return s_; }
  DType compute_dtype() const override { return DType::kBF16; }
  StatusOr<std::unique_ptr<Buffer>> allocate(size_t bytes) override {
    SP_ASSIGN_OR_RETURN(StreamBuffer b, StreamBuffer::allocate(std::max<size_t>(bytes, 1), s_));
    return std::unique_ptr<Buffer>(std::make_unique<StreamArray>(std::move(b), s_));
  }
  Status zero(void* p, size_t bytes) override {
    if (bytes) SP_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s_));
    return Status::Ok();
  }
  Status copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) SP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s_));
    return Status::Ok();
  }
  Status copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                   size_t height) override {
    if (width && height)
      SP_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDeviceToDevice, s_));
    return Status::Ok();
  }
  Status to_host(void* host, const void* src, size_t bytes) override {
    if (bytes) SP_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, s_));
    return synchronize();
  }
  Status from_host(void* dst, const void* host, size_t bytes) override {
    if (bytes) SP_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, s_));
    return synchronize();
  }
  Status to_compute(const float* src, void* dst, int64_t n) override {
    return cuda::to_bf16(src, static_cast<cuda::bf16_t*>(dst), n, s_);
  }
  Status add(float* dst, const float* src, int64_t n) override { return cuda::add(dst, src, n, s_); }
  StatusOr<double> sum_of_squares(const float* x, int64_t n) override {
    SP_ASSIGN_OR_RETURN(StreamBuffer sum, StreamBuffer::allocate(sizeof(double), s_));
    SP_CUDA_CHECK(cudaMemsetAsync(sum.data(), 0, sizeof(double), s_));
    SP_RETURN_IF_ERROR(cuda::sum_of_squares(x, n, static_cast<double*>(sum.data()), s_));
    double host = 0;
    SP_RETURN_IF_ERROR(to_host(&host, sum.data(), sizeof(double)));
    sum.release(s_);
    return host;
  }
  Status adamw(const AdamWStep& a, double decay, float* params, void* compute, const float* grads, float* m, float* v,
               int64_t n) override {
    return cuda::adamw_update(params, static_cast<cuda::bf16_t*>(compute), grads, m, v, n, a.lr, a.beta1, a.beta2,
                              a.eps, decay, a.clip, a.c1, a.c2, s_);
  }
  Status synchronize() override { return stream_synchronize(s_); }
  StatusOr<std::unique_ptr<TrainingMemory>> make_lane() override {
    cudaStream_t s = nullptr;
    SP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return std::unique_ptr<TrainingMemory>(std::make_unique<CudaTrainingMemory>(device_, s));
  }
  Status wait_for(const TrainingMemory& other) override {
    // An event of its own each time: the wait takes the event's state when queued, so it may go
    // at once (destroying a recorded event that a stream waits on is allowed).
    cudaEvent_t e = nullptr;
    SP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    const cudaError_t rec = cudaEventRecord(e, static_cast<cudaStream_t>(other.stream()));
    const cudaError_t wait = rec == cudaSuccess ? cudaStreamWaitEvent(s_, e, 0) : rec;
    (void)cudaEventDestroy(e);
    SP_CUDA_CHECK(wait);
    return Status::Ok();
  }
  int64_t peak_bytes() const override { return device_memory_stats(device_).peak; }

 private:
  int device_;
  cudaStream_t s_;
};

}  // namespace

StatusOr<std::unique_ptr<TrainingMemory>> make_cuda_training_memory() {
  SP_CHECK_SUPPORTED(cuda_device_count() > 0, "GPU training needs a CUDA GPU; none is visible");
  int device = 0;
  SP_CUDA_CHECK(cudaGetDevice(&device));
  reset_device_memory_peak(device);
  cudaStream_t s = nullptr;
  SP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return std::unique_ptr<TrainingMemory>(std::make_unique<CudaTrainingMemory>(device, s));
}

}  // namespace seqpar::model
