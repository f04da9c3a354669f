// Causal linear attention with per-head decay on the GPU, forward: span-local states, the scan
// over spans (which also gives state_out), then the output sweep (linear_common.cu lists the
// steps). This unit holds the time-order sweep kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda_check.hpp"
#include "kernels/cuda/linear_host.hpp"
#include "kernels/cuda/linear_sweep_impl.cuh"

namespace seqpar {

namespace cuda {

namespace {
template <class Elem>
void forward_sweep(const LinearSweepParams& p, bool output, bool pipelined, int batch, void* stream) {
  if (output)
    launch_sweep_width<Elem, false, true, Elem>(p, pipelined, batch, stream);
  else
    launch_sweep_width<Elem, false, false, float>(p, pipelined, batch, stream);
}
}  // namespace

void launch_forward_sweep(const LinearSweepParams& p, bool elem_is_bf16, bool output, bool pipelined, int batch,
                          void* stream) {
  if (elem_is_bf16)
    forward_sweep<__nv_bfloat16>(p, output, pipelined, batch, stream);
  else
    forward_sweep<__half>(p, output, pipelined, batch, stream);
}

}  // namespace cuda

Status linear_attention_forward_cuda(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& state_in, const LinearAttentionParams& params,
                                     const TensorView& o, const TensorView& state_out,
                                     const LinearCudaOptions& options) {
  cuda::LinearCudaDims d;
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda(q, k, v, params, &d));
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_state("state_in", state_in, d));
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_state("state_out", state_out, d));
  if (o.data) SP_RETURN_IF_ERROR(cuda::check_linear_cuda_rows("o", o, d, d.heads, d.dv));
  const cuda::LinearPlan plan = cuda::plan_linear(d, options.chunks_per_span);
  DeviceBuffer local;
  float* ws = nullptr;
  SP_RETURN_IF_ERROR(cuda::reserve_workspace(options, &local, cuda::linear_forward_workspace(d, plan), &ws));
  return cuda::run_linear_steps(cuda::linear_forward_steps(d, plan, params, q, k, v, state_in, o, state_out, ws),
                                d, options.stream, options.pipelined);
}

}  // namespace seqpar
