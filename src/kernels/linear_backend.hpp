// The linear-attention backend table LASP runs through (src/parallel/lasp.cpp), one per device:
// the few operations both devices' kernels fill, so that one pass order serves both. The math,
// shapes and state conventions are those of seqpar/linear_attention.hpp; states and dStates are
// [B, H, d_k, d_v] contiguous in state_dtype(), on the backend's device.
//   forward   o and state_out from q, k, v and the entering state (empty o: the state alone,
//             the cheap half a rank computes before its neighbour's state is known);
//   backward  dq, dk, dv and dstate_in from the kept state_in and the arriving dstate_out (dq,
//             dk, dv all empty: dstate_in alone, the backward's cheap half);
//   combine   out = lambda_h^length carried + local (out may alias either): a state carried
//             across `length` tokens plus what they add;
//   zero      a state of zeros;
//   copy_rows rows of bytes between strided places (ulysses's all-to-all buffers: a head part's
//             rows cut out of [B, S, H, D] and put back);
//   scratch   memory one pass takes and gives back (ulysses's all-to-all buffers).
// Every call is ordered on `stream` (a cudaStream_t; CPU backends ignore it and return done).
// An instance keeps memory (the states LASP asks for, its kernels' workspace): one per rank and
// layer, used from one thread. Scratch is not the instance's: a rank runs its layers' passes one
// at a time, so each pass's scratch reuses the memory the last pass gave back.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "seqpar/gpu.hpp"
#include "seqpar/linear_attention.hpp"
#include "seqpar/status.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar {

// A pass's scratch, given back when it goes: device memory is a block of the stream's arena
// (StreamBuffer: given back after the work queued on the stream, and taken again by the next pass
// on that stream, so every layer's passes share one block's memory); host memory is the pass's own.
struct LinearScratch {
  StreamBuffer device;
  std::unique_ptr<double[]> host;  // doubles, so that every fp64 or fp32 view into it is aligned
  char* data = nullptr;
};

class LinearBackend {
 public:
  LinearBackend(const char* name, DeviceKind device) : name_(name), device_(device) {}
  virtual ~LinearBackend() = default;
  const char* name() const { return name_; }
  // Where its tensors and states live; a device backend needs a communicator that moves device
  // buffers, and its exchanges ordered after the kernels on the stream.
  DeviceKind device() const { return device_; }
  // The dtype of states for inputs of `input` dtype (CPU: the inputs'; CUDA: fp32).
  virtual DType state_dtype(DType input) const = 0;
  // Empty when it runs q [B, S, H, d_k], k [B, S, H_kv, d_k], v [B, S, H_kv, d_v] with these
  // params (dtype, device, head dims, decays); else the reason it refuses them.
  virtual std::string supports(const TensorView& q, const TensorView& k, const TensorView& v,
                               const LinearAttentionParams& params) const = 0;
  // Memory for `state_bytes` of states and the kernels' workspace for problems like q, k, v,
  // kept by the backend (grown, never shrunk; contents not kept when it grows): *states is its
  // start. Called before any pass, so that no pass allocates mid-schedule.
  [[nodiscard]] virtual Status reserve(const TensorView& q, const TensorView& k, const TensorView& v,
                                       size_t state_bytes, void** states) = 0;

  [[nodiscard]] virtual Status forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const TensorView& state_in, const LinearAttentionParams& params,
                                       const TensorView& o, const TensorView& state_out, void* stream) = 0;
  [[nodiscard]] virtual Status backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                        const TensorView& state_in, const TensorView& dout,
                                        const TensorView& dstate_out, const LinearAttentionParams& params,
                                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                        const TensorView& dstate_in, void* stream) = 0;
  [[nodiscard]] virtual Status combine(const TensorView& carried, const TensorView& local, int64_t length,
                                       const LinearAttentionParams& params, const TensorView& out,
                                       void* stream) = 0;
  [[nodiscard]] virtual Status zero(const TensorView& state, void* stream) = 0;
  // `height` rows of `width` bytes from src (rows `src_pitch` bytes apart) to dst (`dst_pitch`),
  // both in the backend's memory.
  [[nodiscard]] virtual Status copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                                         size_t height, void* stream) = 0;
  // `bytes` of scratch on the backend's device for work queued on `stream`; its contents do not
  // outlive the pass that took it.
  [[nodiscard]] virtual StatusOr<LinearScratch> scratch(size_t bytes, void* stream) = 0;
  // Blocks the host until the work queued on `stream` is done (before a host-driven
  // communicator reads device memory).
  [[nodiscard]] virtual Status synchronize(void* stream) = 0;

 private:
  const char* name_;
  DeviceKind device_;
};

// The chunked CPU kernels (fp32, fp64; states in the inputs' dtype).
std::unique_ptr<LinearBackend> make_cpu_linear_backend();
// Our CUDA kernels (bf16, fp16 on the current device; fp32 states); nullptr without CUDA.
std::unique_ptr<LinearBackend> make_cuda_linear_backend();
// The backend for tensors on `device`; refused with the reason where this build has none.
StatusOr<std::unique_ptr<LinearBackend>> make_linear_backend(DeviceKind device);

}  // namespace seqpar
