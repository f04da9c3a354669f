// Host-side pieces the linear-attention CUDA passes share (linear_common.cu defines them):
// problem dimensions and checks, the span plan, and the parameters of one sweep.
#pragma once

#include <cstdint>

#include "kernels/cuda/linear_sweep.cuh"
#include "seqpar/linear_cuda.hpp"

namespace seqpar::cuda {

struct LinearCudaDims {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, dk = 0, dv = 0;
  DType dtype = DType::kBF16;
  int64_t group() const { return heads / kv_heads; }
};

struct LinearPlan {
  int64_t chunks = 0, chunks_per_span = 1, spans = 0, state_elems = 0;
  // Bytes of one set of span states, fp32 [B * H, spans, d_k * d_v].
  size_t state_bytes(const LinearCudaDims& d) const {
    return size_t(d.batch * d.heads * spans * state_elems) * sizeof(float);
  }
};

// An operand of a sweep: a [B, S, heads, d] view and the divisor from the query head to its head.
struct Operand {
  TensorView t;
  int64_t head_div = 1;
};

// q, k, v on the device, bf16/fp16, d_k and d_v in {64, 128}; fills d.
Status check_linear_cuda(const TensorView& q, const TensorView& k, const TensorView& v,
                         const LinearAttentionParams& params, LinearCudaDims* d);
// A [B, H, d_k, d_v] contiguous fp32 device state; an empty view passes.
Status check_linear_cuda_state(const char* name, const TensorView& t, const LinearCudaDims& d);
// A [B, S, heads, dim] device tensor of the inputs' dtype (an output).
Status check_linear_cuda_rows(const char* name, const TensorView& t, const LinearCudaDims& d,
                              int64_t heads, int64_t dim);

LinearPlan plan_linear(const LinearCudaDims& d, const LinearCudaOptions& options);
// options.workspace (or `local`) grown to `bytes`; *data its start.
Status reserve_workspace(const LinearCudaOptions& options, DeviceBuffer* local, size_t bytes, void** data);
LinearSweepParams sweep_params(const LinearCudaDims& d, const LinearPlan& plan,
                               const LinearAttentionParams& params, Operand a, Operand b, Operand c);
// The span scan over `states` (see LinearScanParams); init and final_state may be empty views.
Status scan_spans(const LinearCudaDims& d, const LinearPlan& plan, const LinearAttentionParams& params,
                  float* states, const TensorView& init, const TensorView& final_state, bool reverse,
                  void* stream);

// launch_linear_sweep with the width of b (64 or 128) chosen at run time.
template <class Elem, bool kReverse, bool kOutput, class OutT>
void launch_sweep_width(const LinearSweepParams& p, int batch, void* stream) {
  if (p.b_width == 64)
    launch_linear_sweep<Elem, 64, kReverse, kOutput, OutT>(p, batch, stream);
  else
    launch_linear_sweep<Elem, 128, kReverse, kOutput, OutT>(p, batch, stream);
}

}  // namespace seqpar::cuda
