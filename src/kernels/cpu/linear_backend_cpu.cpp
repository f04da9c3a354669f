// The CPU row of the linear-attention backend table (kernels/linear_backend.hpp): the chunked
// fp32/fp64 kernels of linear_attention_cpu.cpp, states in the inputs' dtype in host memory.
// Everything completes before returning, so the stream is ignored.
#include <cstring>
#include <vector>

#include "kernels/cpu/linear_common.hpp"
#include "kernels/linear_backend.hpp"

namespace seqpar {
namespace {

class CpuLinearBackend final : public LinearBackend {
 public:
  CpuLinearBackend() : LinearBackend("cpu", DeviceKind::kCpu) {}
  DType state_dtype(DType input) const override { return input; }

  std::string supports(const TensorView& q, const TensorView& k, const TensorView& v,
                       const LinearAttentionParams& params) const override {
    for (const TensorView* t : {&q, &k, &v})
      if (t->device.kind != DeviceKind::kCpu) return "the CPU linear-attention kernels take host tensors";
    if (q.dtype != DType::kF32 && q.dtype != DType::kF64)
      return std::string("the CPU linear-attention kernels compute in fp32 or fp64, not ") + dtype_name(q.dtype);
    cpu::LinearDims dims;
    const Status s = cpu::validate_linear_qkv(q, k, v, params, &dims);  // shapes, strides, decays
    return s.ok() ? std::string() : s.message();
  }

  Status reserve(const TensorView&, const TensorView&, const TensorView&, size_t state_bytes,
                 void** states) override {
    // Doubles, so that every state of an fp64 or fp32 problem is aligned.
    const size_t words = (state_bytes + sizeof(double) - 1) / sizeof(double);
    if (memory_.size() < words) memory_.assign(words, 0.0);
    *states = memory_.data();
    return Status::Ok();
  }

  Status forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& state_in,
                 const LinearAttentionParams& params, const TensorView& o, const TensorView& state_out,
                 void*) override {
    return linear_attention_forward(q, k, v, state_in, params, o, state_out);
  }

  Status backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& state_in,
                  const TensorView& dout, const TensorView& dstate_out, const LinearAttentionParams& params,
                  const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dstate_in,
                  void*) override {
    return linear_attention_backward(q, k, v, state_in, dout, dstate_out, params, dq, dk, dv, dstate_in);
  }

  Status combine(const TensorView& carried, const TensorView& local, int64_t length,
                 const LinearAttentionParams& params, const TensorView& out, void*) override {
    return linear_state_combine(carried, local, length, params, out);
  }

  StatusOr<LinearScratch> scratch(size_t bytes, void*) override {
    LinearScratch s;
    s.host.reset(new double[(bytes + sizeof(double) - 1) / sizeof(double)]);  // not zeroed: written before read
    s.data = reinterpret_cast<char*>(s.host.get());
    return s;
  }

  Status zero(const TensorView& state, void*) override {
    SP_CHECK_ARG(state.is_contiguous(), "a state must be contiguous");
    std::memset(state.data, 0, size_t(state.numel()) * dtype_size(state.dtype));
    return Status::Ok();
  }

  Status copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t height,
                   void*) override {
    for (size_t r = 0; r < height; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, width);
    return Status::Ok();
  }

  Status synchronize(void*) override { return Status::Ok(); }

 private:
  std::vector<double> memory_;
};

}  // namespace

std::unique_ptr<LinearBackend> make_cpu_linear_backend() { return std::make_unique<CpuLinearBackend>(); }

}  // namespace seqpar
