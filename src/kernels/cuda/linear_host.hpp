// Host-side pieces the linear-attention CUDA passes share (linear_common.cu defines them):
// problem dimensions and checks, the span plan, and the passes of a call as a list of steps
// (built here, launched by run_linear_steps, replayed on the host by the tests' emulator).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cuda/linear_sweep.hpp"
#include "kernels/cuda/linear_cuda.hpp"

namespace seqpar::cuda {

struct LinearCudaDims {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, dk = 0, dv = 0;
  DType dtype = DType::kBF16;
  int64_t group() const { return heads / kv_heads; }
};

struct LinearPlan {
  int64_t chunks = 0, chunks_per_span = 1, spans = 0, state_elems = 0;
  // Elements of one set of span states, fp32 [B * H, spans, d_k * d_v].
  size_t state_floats(const LinearCudaDims& d) const { return size_t(d.batch * d.heads * spans * state_elems); }
};

// q, k, v on the device, bf16/fp16, d_k and d_v in {64, 128}; fills d. `on_device` false lets
// the host emulator take host tensors through the same checks.
Status check_linear_cuda(const TensorView& q, const TensorView& k, const TensorView& v,
                         const LinearAttentionParams& params, LinearCudaDims* d, bool on_device = true);
// A [B, H, d_k, d_v] contiguous fp32 state; an empty view passes.
Status check_linear_cuda_state(const char* name, const TensorView& t, const LinearCudaDims& d,
                               bool on_device = true);
// A [B, S, heads, dim] tensor of the inputs' dtype (an output).
Status check_linear_cuda_rows(const char* name, const TensorView& t, const LinearCudaDims& d, int64_t heads,
                              int64_t dim, bool on_device = true);

LinearPlan plan_linear(const LinearCudaDims& d, int64_t chunks_per_span);
// log2(1 / lambda_h) of each query head, as the kernels carry it (fp32).
void fill_decays(const LinearAttentionParams& params, int64_t heads, float* log2_inv_decay);

// fp32 workspace (elements) of each call, and its steps over a workspace at `ws`. Empty views
// (state_in, state_out, o, dstate_out, dstate_in) are zero or not written, as in the API.
size_t linear_forward_workspace(const LinearCudaDims& d, const LinearPlan& plan);
size_t linear_backward_workspace(const LinearCudaDims& d, const LinearPlan& plan);
std::vector<LinearStep> linear_forward_steps(const LinearCudaDims& d, const LinearPlan& plan,
                                             const LinearAttentionParams& params, const TensorView& q,
                                             const TensorView& k, const TensorView& v, const TensorView& state_in,
                                             const TensorView& o, const TensorView& state_out, float* ws);
std::vector<LinearStep> linear_backward_steps(const LinearCudaDims& d, const LinearPlan& plan,
                                              const LinearAttentionParams& params, const TensorView& q,
                                              const TensorView& k, const TensorView& v, const TensorView& state_in,
                                              const TensorView& dout, const TensorView& dstate_out,
                                              const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                              const TensorView& dstate_in, float* ws);

// Launches the steps in order on `stream` (pipelined: the sweeps with two tile stages).
Status run_linear_steps(const std::vector<LinearStep>& steps, const LinearCudaDims& d, void* stream,
                        bool pipelined = false);

// options.workspace (or `local`) grown to `floats` fp32 elements; *data its start.
Status reserve_workspace(const LinearCudaOptions& options, DeviceBuffer* local, size_t floats, float** data);

}  // namespace seqpar::cuda
