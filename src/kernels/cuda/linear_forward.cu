// Causal linear attention with per-head decay on the GPU, forward: span-local states, the scan
// over spans (which also gives state_out), then the output sweep (see linear_sweep.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda_check.hpp"
#include "kernels/cuda/linear_host.hpp"
#include "kernels/cuda/linear_sweep_impl.cuh"

namespace seqpar {

namespace {

using cuda::LinearCudaDims;
using cuda::Operand;

template <class Elem>
Status forward(const LinearCudaDims& d, const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& state_in, const LinearAttentionParams& params, const TensorView& o,
               const TensorView& state_out, const LinearCudaOptions& options) {
  const cuda::LinearPlan plan = cuda::plan_linear(d, options);
  DeviceBuffer local;
  void* ws = nullptr;
  SP_RETURN_IF_ERROR(cuda::reserve_workspace(options, &local, plan.state_bytes(d), &ws));
  float* states = static_cast<float*>(ws);
  const Operand Q{q, 1}, K{k, d.group()}, V{v, d.group()};
  // 1. Each span's own state: sum_r lambda^(L-1-r) k_r v_r^T over its tokens.
  cuda::LinearSweepParams p = cuda::sweep_params(d, plan, params, K, K, V);
  p.states = states;
  cuda::launch_sweep_width<Elem, false, false, float>(p, int(d.batch), options.stream);
  SP_CUDA_CHECK(cudaGetLastError());
  // 2. The state entering each span, and the one leaving the last.
  SP_RETURN_IF_ERROR(cuda::scan_spans(d, plan, params, states, state_in, state_out, false, options.stream));
  // 3. Outputs from the entering states ([d_k, d_v] as stored: T = S).
  if (o.data) {
    p = cuda::sweep_params(d, plan, params, Q, K, V);
    p.t0 = states;
    p.t0_ld_b = d.dv, p.t0_ld_c = 1;
    p.out = o.data;
    p.out_batch = o.strides[0], p.out_row = o.strides[1], p.out_head = o.strides[2];
    cuda::launch_sweep_width<Elem, false, true, Elem>(p, int(d.batch), options.stream);
    SP_CUDA_CHECK(cudaGetLastError());
  }
  return Status::Ok();
}

}  // namespace

Status linear_attention_forward_cuda(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& state_in, const LinearAttentionParams& params,
                                     const TensorView& o, const TensorView& state_out,
                                     const LinearCudaOptions& options) {
  LinearCudaDims d;
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda(q, k, v, params, &d));
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_state("state_in", state_in, d));
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_state("state_out", state_out, d));
  if (o.data) SP_RETURN_IF_ERROR(cuda::check_linear_cuda_rows("o", o, d, d.heads, d.dv));
  const auto stream = static_cast<cudaStream_t>(options.stream);
  if (d.seq == 0) {  // no tokens: the state passes through
    const size_t bytes = size_t(d.batch * d.heads * d.dk * d.dv) * sizeof(float);
    if (state_out.data && state_in.data)
      SP_CUDA_CHECK(cudaMemcpyAsync(state_out.data, state_in.data, bytes, cudaMemcpyDeviceToDevice, stream));
    else if (state_out.data)
      SP_CUDA_CHECK(cudaMemsetAsync(state_out.data, 0, bytes, stream));
    return Status::Ok();
  }
  if (d.dtype == DType::kBF16) return forward<__nv_bfloat16>(d, q, k, v, state_in, params, o, state_out, options);
  return forward<__half>(d, q, k, v, state_in, params, o, state_out, options);
}

}  // namespace seqpar
