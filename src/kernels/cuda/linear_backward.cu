// Causal linear attention with per-head decay on the GPU, backward: the states entering each
// span (forward scan), the dStates leaving each span (reverse scan, which also gives
// dstate_in), then one sweep each for dq (in time order), dv and dk (against it), and the GQA
// group sums (linear_common.cu lists the steps). This unit holds the reverse sweep kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda_check.hpp"
#include "kernels/cuda/linear_host.hpp"
#include "kernels/cuda/linear_sweep_impl.cuh"

namespace seqpar {

namespace cuda {

namespace {
template <class Elem>
void reverse_sweep(const LinearSweepParams& p, bool output, bool out_fp32, bool pipelined, int batch, void* stream) {
  if (!output)
    launch_sweep_width<Elem, true, false, float>(p, pipelined, batch, stream);
  else if (out_fp32)
    launch_sweep_width<Elem, true, true, float>(p, pipelined, batch, stream);
  else
    launch_sweep_width<Elem, true, true, Elem>(p, pipelined, batch, stream);
}
}  // namespace

void launch_reverse_sweep(const LinearSweepParams& p, bool elem_is_bf16, bool output, bool out_fp32,
                          bool pipelined, int batch, void* stream) {
  if (elem_is_bf16)
    reverse_sweep<__nv_bfloat16>(p, output, out_fp32, pipelined, batch, stream);
  else
    reverse_sweep<__half>(p, output, out_fp32, pipelined, batch, stream);
}

}  // namespace cuda

Status linear_attention_backward_cuda(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& state_in, const TensorView& dout,
                                      const TensorView& dstate_out,
                                      const LinearAttentionParams& params, const TensorView& dq,
                                      const TensorView& dk, const TensorView& dv,
                                      const TensorView& dstate_in, const LinearCudaOptions& options) {
  cuda::LinearCudaDims d;
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda(q, k, v, params, &d));
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_state("state_in", state_in, d));
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_state("dstate_out", dstate_out, d));
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_state("dstate_in", dstate_in, d));
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_rows("dout", dout, d, d.heads, d.dv));
  if (dq.data || dk.data || dv.data) {
    SP_RETURN_IF_ERROR(cuda::check_linear_cuda_rows("dq", dq, d, d.heads, d.dk));
    SP_RETURN_IF_ERROR(cuda::check_linear_cuda_rows("dk", dk, d, d.kv_heads, d.dk));
    SP_RETURN_IF_ERROR(cuda::check_linear_cuda_rows("dv", dv, d, d.kv_heads, d.dv));
  } else {
    SP_CHECK_ARG(dstate_in.data != nullptr, "dq, dk, dv and dstate_in are all empty: nothing to compute");
  }
  const cuda::LinearPlan plan = cuda::plan_linear(d, options.chunks_per_span);
  DeviceBuffer local;
  float* ws = nullptr;
  SP_RETURN_IF_ERROR(cuda::reserve_workspace(options, &local, cuda::linear_backward_workspace(d, plan), &ws));
  return cuda::run_linear_steps(cuda::linear_backward_steps(d, plan, params, q, k, v, state_in, dout, dstate_out,
                                                            dq, dk, dv, dstate_in, ws),
                                d, options.stream, options.pipelined);
}

}  // namespace seqpar
