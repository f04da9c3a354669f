// The CUDA row of the linear-attention backend table (kernels/linear_backend.hpp): our kernels
// (kernels/cuda/linear_cuda.hpp; bf16/fp16 rows, fp32 states) on the current device, every call
// queued on the caller's stream. The states and the kernels' workspace are sized once by
// reserve, at the backward's size (the forward's is smaller), so no pass grows a buffer; a pass's
// scratch is a block of the stream's arena.
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda_check.hpp"
#include "kernels/cuda/linear_host.hpp"
#include "kernels/linear_backend.hpp"
#include "seqpar/gpu.hpp"
#include "kernels/cuda/linear_cuda.hpp"

namespace seqpar {
namespace {

class CudaLinearBackend final : public LinearBackend {
 public:
  CudaLinearBackend() : LinearBackend("cuda", DeviceKind::kCuda) {}
  DType state_dtype(DType) const override { return DType::kF32; }

  std::string supports(const TensorView& q, const TensorView& k, const TensorView& v,
                       const LinearAttentionParams& params) const override {
    cuda::LinearCudaDims d;
    const Status s = cuda::check_linear_cuda(q, k, v, params, &d);
    if (!s.ok()) return s.message();
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return "no current CUDA device";
    if (q.device.index != device)
      return "q is on GPU " + std::to_string(q.device.index) + " but the current device is " + std::to_string(device);
    return {};
  }

  Status reserve(const TensorView& q, const TensorView& k, const TensorView& v, size_t state_bytes,
                 void** states) override {
    cuda::LinearCudaDims d;
    SP_RETURN_IF_ERROR(cuda::check_linear_cuda(q, k, v, LinearAttentionParams{}, &d));
    SP_RETURN_IF_ERROR(states_.reserve(state_bytes));
    const cuda::LinearPlan plan = cuda::plan_linear(d, 0);
    const size_t floats = std::max(cuda::linear_forward_workspace(d, plan), cuda::linear_backward_workspace(d, plan));
    SP_RETURN_IF_ERROR(workspace_.reserve(std::max<size_t>(floats * sizeof(float), 256)));
    *states = states_.data();
    return Status::Ok();
  }

  Status forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& state_in,
                 const LinearAttentionParams& params, const TensorView& o, const TensorView& state_out,
                 void* stream) override {
    return linear_attention_forward_cuda(q, k, v, state_in, params, o, state_out, options(stream));
  }

  Status backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& state_in,
                  const TensorView& dout, const TensorView& dstate_out, const LinearAttentionParams& params,
                  const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dstate_in,
                  void* stream) override {
    return linear_attention_backward_cuda(q, k, v, state_in, dout, dstate_out, params, dq, dk, dv, dstate_in,
                                          options(stream));
  }

  Status combine(const TensorView& carried, const TensorView& local, int64_t length,
                 const LinearAttentionParams& params, const TensorView& out, void* stream) override {
    return linear_state_combine_cuda(carried, local, length, params, out, stream);
  }

  Status zero(const TensorView& state, void* stream) override {
    SP_CHECK_ARG(state.is_contiguous(), "a state must be contiguous");
    SP_CUDA_CHECK(cudaMemsetAsync(state.data, 0, size_t(state.numel()) * dtype_size(state.dtype),
                                  static_cast<cudaStream_t>(stream)));
    return Status::Ok();
  }

  Status copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t height,
                   void* stream) override {
    if (width == 0 || height == 0) return Status::Ok();
    SP_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDeviceToDevice,
                                    static_cast<cudaStream_t>(stream)));
    return Status::Ok();
  }

  StatusOr<LinearScratch> scratch(size_t bytes, void* stream) override {
    LinearScratch s;
    SP_ASSIGN_OR_RETURN(s.device, StreamBuffer::allocate(std::max<size_t>(bytes, 1), stream));
    s.data = static_cast<char*>(s.device.data());
    return s;
  }

  Status synchronize(void* stream) override {
    SP_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    return Status::Ok();
  }

 private:
  LinearCudaOptions options(void* stream) {
    LinearCudaOptions o;
    o.workspace = &workspace_;
    o.stream = stream;
    return o;
  }

  DeviceBuffer states_, workspace_;
};

}  // namespace

std::unique_ptr<LinearBackend> make_cuda_linear_backend() { return std::make_unique<CudaLinearBackend>(); }

}  // namespace seqpar
