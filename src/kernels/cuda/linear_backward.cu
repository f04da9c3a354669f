// Causal linear attention with per-head decay on the GPU, backward: the states entering each
// span (forward scan) and the dStates leaving each span (reverse scan, which also gives
// dstate_in), then one sweep each for dq (in time order), dv and dk (against it).
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
Status backward(const LinearCudaDims& d, const TensorView& q, const TensorView& k, const TensorView& v,
                const TensorView& state_in, const TensorView& dout, const TensorView& dstate_out,
                const LinearAttentionParams& params, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const TensorView& dstate_in, const LinearCudaOptions& options) {
  const cuda::LinearPlan plan = cuda::plan_linear(d, options);
  const size_t state_bytes = plan.state_bytes(d);
  // Under GQA every query head writes its own fp32 dk, dv rows, summed per group at the end.
  const bool grouped = d.group() > 1;
  const size_t scratch_elems = grouped ? size_t(d.batch * d.seq * d.heads * (d.dk + d.dv)) : 0;
  DeviceBuffer local;
  void* ws = nullptr;
  SP_RETURN_IF_ERROR(cuda::reserve_workspace(options, &local, 2 * state_bytes + scratch_elems * sizeof(float), &ws));
  float* fwd_states = static_cast<float*>(ws);
  float* bwd_states = fwd_states + state_bytes / sizeof(float);
  float* dk_rows = bwd_states + state_bytes / sizeof(float);
  float* dv_rows = dk_rows + size_t(d.batch * d.seq * d.heads * d.dk);
  const Operand Q{q, 1}, K{k, d.group()}, V{v, d.group()}, dO{dout, 1};
  void* stream = options.stream;
  const int batch = int(d.batch);

  // States S entering each span (T = S, [d_k, d_v]).
  cuda::LinearSweepParams p = cuda::sweep_params(d, plan, params, K, K, V);
  p.states = fwd_states;
  cuda::launch_sweep_width<Elem, false, false, float>(p, batch, stream);
  SP_CUDA_CHECK(cudaGetLastError());
  SP_RETURN_IF_ERROR(cuda::scan_spans(d, plan, params, fwd_states, state_in, {}, false, stream));
  // dStates G leaving each span: G_prev = lambda^L G + scale sum_t lambda^(t+1) q_t dO_t^T.
  p = cuda::sweep_params(d, plan, params, Q, Q, dO);
  p.states = bwd_states;
  cuda::launch_sweep_width<Elem, true, false, float>(p, batch, stream);
  SP_CUDA_CHECK(cudaGetLastError());
  SP_RETURN_IF_ERROR(cuda::scan_spans(d, plan, params, bwd_states, dstate_out, dstate_in, true, stream));

  // dq_i = sum_{j<=i} scale lambda^(i-j) (dO_i . v_j) k_j + scale lambda^(i+1) S dO_i: T = S^T.
  p = cuda::sweep_params(d, plan, params, dO, V, K);
  p.t0 = fwd_states;
  p.t0_ld_b = 1, p.t0_ld_c = d.dv;
  p.out = dq.data;
  p.out_batch = dq.strides[0], p.out_row = dq.strides[1], p.out_head = dq.strides[2];
  cuda::launch_sweep_width<Elem, false, true, Elem>(p, batch, stream);
  SP_CUDA_CHECK(cudaGetLastError());

  // dv_j = sum_{i>=j} scale lambda^(i-j) (q_i . k_j) dO_i + lambda^(m-1-j) G^T k_j: T = G;
  // dk_j = sum_{i>=j} scale lambda^(i-j) (dO_i . v_j) q_i + lambda^(m-1-j) G v_j: T = G^T.
  const auto dkdv = [&](Operand a, Operand b, Operand c, const TensorView& out, float* rows, int64_t ld_b,
                        int64_t ld_c, int64_t dim) {
    cuda::LinearSweepParams s = cuda::sweep_params(d, plan, params, a, b, c);
    s.t0 = bwd_states;
    s.t0_ld_b = ld_b, s.t0_ld_c = ld_c;
    if (grouped) {
      s.out = rows;
      s.out_batch = d.seq * d.heads * dim, s.out_row = d.heads * dim, s.out_head = dim;
      cuda::launch_sweep_width<Elem, true, true, float>(s, batch, stream);
      cuda::LinearGroupSumParams g{rows, out.data, out.strides[0], out.strides[1], out.strides[2],
                                   d.batch, d.seq, int(d.heads), int(d.kv_heads), int(dim)};
      cuda::launch_linear_group_sum<Elem>(g, stream);
    } else {
      s.out = out.data;
      s.out_batch = out.strides[0], s.out_row = out.strides[1], s.out_head = out.strides[2];
      cuda::launch_sweep_width<Elem, true, true, Elem>(s, batch, stream);
    }
  };
  dkdv(K, Q, dO, dv, dv_rows, d.dv, 1, d.dv);
  dkdv(V, dO, Q, dk, dk_rows, 1, d.dv, d.dk);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace

Status linear_attention_backward_cuda(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& state_in, const TensorView& dout,
                                      const TensorView& dstate_out,
                                      const LinearAttentionParams& params, const TensorView& dq,
                                      const TensorView& dk, const TensorView& dv,
                                      const TensorView& dstate_in, const LinearCudaOptions& options) {
  LinearCudaDims d;
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda(q, k, v, params, &d));
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_state("state_in", state_in, d));
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_state("dstate_out", dstate_out, d));
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_state("dstate_in", dstate_in, d));
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_rows("dout", dout, d, d.heads, d.dv));
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_rows("dq", dq, d, d.heads, d.dk));
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_rows("dk", dk, d, d.kv_heads, d.dk));
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_rows("dv", dv, d, d.kv_heads, d.dv));
  if (d.seq == 0) {  // no tokens: the dState passes through
    const size_t bytes = size_t(d.batch * d.heads * d.dk * d.dv) * sizeof(float);
    const auto stream = static_cast<cudaStream_t>(options.stream);
    if (dstate_in.data && dstate_out.data)
      SP_CUDA_CHECK(cudaMemcpyAsync(dstate_in.data, dstate_out.data, bytes, cudaMemcpyDeviceToDevice, stream));
    else if (dstate_in.data)
      SP_CUDA_CHECK(cudaMemsetAsync(dstate_in.data, 0, bytes, stream));
    return Status::Ok();
  }
  if (d.dtype == DType::kBF16)
    return backward<__nv_bfloat16>(d, q, k, v, state_in, dout, dstate_out, params, dq, dk, dv, dstate_in, options);
  return backward<__half>(d, q, k, v, state_in, dout, dstate_out, params, dq, dk, dv, dstate_in, options);
}

}  // namespace seqpar
