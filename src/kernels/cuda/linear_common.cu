// Host side shared by the linear-attention CUDA passes: input checks, the span length, the
// sweep parameters of one operand triple, and the two small kernels (the span scan and the
// GQA group sum of dk, dv).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/cuda_check.hpp"
#include "kernels/cuda/linear_host.hpp"

namespace seqpar {
namespace cuda {

namespace {

Status check_tensor(const char* name, const TensorView& t, DType dtype, int64_t d0, int64_t d1,
                    int64_t d2, int64_t d3, bool contiguous) {
  bool ok = t.device.kind == DeviceKind::kCuda && t.dtype == dtype && t.ndim == 4 && t.strides[3] == 1;
  const int64_t want[4] = {d0, d1, d2, d3};
  for (int i = 0; ok && i < 4; ++i) ok = t.shape[i] == want[i];
  ok = ok && (!contiguous || t.is_contiguous());
  SP_CHECK_ARG(ok, std::string(name) + " must be a device tensor [" + std::to_string(d0) + ", " +
                       std::to_string(d1) + ", " + std::to_string(d2) + ", " + std::to_string(d3) +
                       "] " + dtype_name(dtype) + (contiguous ? ", contiguous" : " with a contiguous last dim") +
                       "; got " + t.shape_string() + (t.device.kind == DeviceKind::kCuda ? "" : " in host memory"));
  if (!contiguous) {  // cp.async moves 16-byte pieces of each row
    bool aligned = reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
    for (int i = 0; i < 3; ++i) aligned = aligned && t.strides[i] % 8 == 0;
    SP_CHECK_ARG(aligned, std::string(name) +
                              " needs 16-byte aligned rows (pointer and strides multiples of 8 elements)");
  } else {
    SP_CHECK_ARG(reinterpret_cast<uintptr_t>(t.data) % 16 == 0, std::string(name) + " must be 16-byte aligned");
  }
  return Status::Ok();
}

}  // namespace

Status check_linear_cuda(const TensorView& q, const TensorView& k, const TensorView& v,
                         const LinearAttentionParams& params, LinearCudaDims* d) {
  SP_CHECK_ARG(q.ndim == 4 && k.ndim == 4 && v.ndim == 4,
               "q, k, v must be [B, S, H, D]; got q " + q.shape_string() + ", k " + k.shape_string() +
                   ", v " + v.shape_string());
  SP_CHECK_SUPPORTED(q.dtype == DType::kBF16 || q.dtype == DType::kF16,
                     std::string("the CUDA linear-attention kernels take bf16 or fp16, not ") + dtype_name(q.dtype));
  *d = {q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3], q.dtype};
  SP_CHECK_ARG(d->kv_heads >= 1 && d->heads % d->kv_heads == 0,
               "query heads (" + std::to_string(d->heads) + ") must be divisible by K/V heads (" +
                   std::to_string(d->kv_heads) + ")");
  SP_CHECK_SUPPORTED((d->dk == 64 || d->dk == 128) && (d->dv == 64 || d->dv == 128),
                     "the CUDA linear-attention kernels take d_k and d_v in {64, 128}, not " +
                         std::to_string(d->dk) + " and " + std::to_string(d->dv));
  SP_CHECK_SUPPORTED(d->heads <= kLinearMaxHeads, "the CUDA linear-attention kernels take at most " +
                                                      std::to_string(kLinearMaxHeads) + " query heads");
  SP_CHECK_SUPPORTED(d->batch * d->heads <= 65535 && d->seq < (int64_t(1) << 40),
                     "batch * heads must stay below 65536");
  SP_RETURN_IF_ERROR(validate_linear_params(params, d->heads));
  // The kernels carry the scale and log2(1 / lambda) in fp32.
  SP_CHECK_ARG(std::abs(params.scale) <= 1e30, "the scale must be at most 1e30 in magnitude");
  SP_RETURN_IF_ERROR(check_tensor("q", q, d->dtype, d->batch, d->seq, d->heads, d->dk, false));
  SP_RETURN_IF_ERROR(check_tensor("k", k, d->dtype, d->batch, d->seq, d->kv_heads, d->dk, false));
  return check_tensor("v", v, d->dtype, d->batch, d->seq, d->kv_heads, d->dv, false);
}

Status check_linear_cuda_state(const char* name, const TensorView& t, const LinearCudaDims& d) {
  if (t.data == nullptr) return Status::Ok();
  return check_tensor(name, t, DType::kF32, d.batch, d.heads, d.dk, d.dv, true);
}

Status check_linear_cuda_rows(const char* name, const TensorView& t, const LinearCudaDims& d,
                              int64_t heads, int64_t dim) {
  return check_tensor(name, t, d.dtype, d.batch, d.seq, heads, dim, false);
}

LinearPlan plan_linear(const LinearCudaDims& d, const LinearCudaOptions& options) {
  LinearPlan plan;
  plan.chunks = (d.seq + kLinearChunk - 1) / kLinearChunk;
  int64_t cps = options.chunks_per_span;
  if (cps <= 0) {
    // About 1024 spans over all (batch, head) pairs fill 132 SMs several times over; spans of
    // at least 4 chunks keep the scan and the state workspace small.
    const int64_t pairs = std::max<int64_t>(1, d.batch * d.heads);
    cps = std::max<int64_t>(4, (plan.chunks * pairs + 1023) / 1024);
  }
  plan.chunks_per_span = std::max<int64_t>(1, std::min(cps, std::max<int64_t>(plan.chunks, 1)));
  plan.spans = (plan.chunks + plan.chunks_per_span - 1) / plan.chunks_per_span;
  plan.state_elems = d.dk * d.dv;
  return plan;
}

Status reserve_workspace(const LinearCudaOptions& options, DeviceBuffer* local, size_t bytes, void** data) {
  DeviceBuffer* ws = options.workspace ? options.workspace : local;
  SP_RETURN_IF_ERROR(ws->reserve(std::max<size_t>(bytes, 256)));
  *data = ws->data();
  return Status::Ok();
}

void fill_decays(const LinearAttentionParams& params, int64_t heads, float* log2_inv_decay) {
  for (int64_t h = 0; h < heads; ++h)
    log2_inv_decay[h] = static_cast<float>(std::log2(1.0 / head_decay(params, h)));
}

LinearSweepParams sweep_params(const LinearCudaDims& d, const LinearPlan& plan,
                               const LinearAttentionParams& params, Operand a, Operand b, Operand c) {
  LinearSweepParams p{};
  p.a = a.t.data, p.b = b.t.data, p.c = c.t.data;
  p.a_batch = a.t.strides[0], p.a_row = a.t.strides[1], p.a_head = a.t.strides[2];
  p.b_batch = b.t.strides[0], p.b_row = b.t.strides[1], p.b_head = b.t.strides[2];
  p.c_batch = c.t.strides[0], p.c_row = c.t.strides[1], p.c_head = c.t.strides[2];
  p.a_head_div = int(a.head_div), p.b_head_div = int(b.head_div), p.c_head_div = int(c.head_div);
  p.b_width = int(b.t.shape[3]), p.c_width = int(c.t.shape[3]);
  p.seq = d.seq;
  p.heads = int(d.heads);
  p.chunks_per_span = int(plan.chunks_per_span);
  p.num_spans = int(plan.spans);
  p.scale = static_cast<float>(params.scale);
  fill_decays(params, d.heads, p.log2_inv_decay);
  return p;
}

// ---- the span scan -------------------------------------------------------------------------

namespace {

// One thread per state element of one (batch, head): out_p = carry; carry = lambda^L_p carry +
// local_p over the spans in time order (or reversed), in place.
__global__ void linear_scan_kernel(const __grid_constant__ LinearScanParams p) {
  const int64_t bh = blockIdx.y, e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= p.elems) return;
  const float l2 = p.log2_inv_decay[bh % p.heads];
  float carry = p.init ? p.init[bh * p.elems + e] : 0.f;
  float* s = p.states + bh * p.num_spans * p.elems + e;
#pragma unroll 4
  for (int i = 0; i < p.num_spans; ++i) {
    const int64_t span = p.reverse ? p.num_spans - 1 - i : i;
    const int64_t length = min(p.seq, (span + 1) * p.span_tokens) - span * p.span_tokens;
    const float local = s[span * p.elems];
    s[span * p.elems] = carry;
    carry = exp2f(-l2 * float(length)) * carry + local;
  }
  if (p.final_state) p.final_state[bh * p.elems + e] = carry;
}

template <class Elem>
__global__ void linear_group_sum_kernel(const __grid_constant__ LinearGroupSumParams p) {
  const int group = p.heads / p.kv_heads;
  const int64_t total = p.batch * p.seq * p.kv_heads * p.dim;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int d = int(idx % p.dim);
    const int g = int((idx / p.dim) % p.kv_heads);
    const int64_t s = (idx / (int64_t(p.dim) * p.kv_heads)) % p.seq, b = idx / (int64_t(p.dim) * p.kv_heads * p.seq);
    const float* src = p.src + ((b * p.seq + s) * p.heads + int64_t(g) * group) * p.dim + d;
    float sum = 0.f;
    for (int j = 0; j < group; ++j) sum += src[int64_t(j) * p.dim];
    static_cast<Elem*>(p.dst)[b * p.dst_batch + s * p.dst_row + g * p.dst_head + d] = Elem(sum);
  }
}

}  // namespace

void launch_linear_scan(const LinearScanParams& p, int batch, void* stream) {
  const dim3 grid(unsigned((p.elems + 255) / 256), unsigned(batch * p.heads));
  linear_scan_kernel<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(p);
}

template <class Elem>
void launch_linear_group_sum(const LinearGroupSumParams& p, void* stream) {
  const int64_t total = p.batch * p.seq * p.kv_heads * p.dim;
  const unsigned blocks = unsigned(std::min<int64_t>((total + 255) / 256, 8192));
  linear_group_sum_kernel<Elem><<<std::max(blocks, 1u), 256, 0, static_cast<cudaStream_t>(stream)>>>(p);
}
template void launch_linear_group_sum<__nv_bfloat16>(const LinearGroupSumParams&, void*);
template void launch_linear_group_sum<__half>(const LinearGroupSumParams&, void*);

Status scan_spans(const LinearCudaDims& d, const LinearPlan& plan, const LinearAttentionParams& params,
                  float* states, const TensorView& init, const TensorView& final_state, bool reverse,
                  void* stream) {
  LinearScanParams p{};
  p.states = states;
  p.init = static_cast<const float*>(init.data);
  p.final_state = static_cast<float*>(final_state.data);
  p.elems = plan.state_elems;
  p.seq = d.seq;
  p.span_tokens = plan.chunks_per_span * kLinearChunk;
  p.heads = int(d.heads);
  p.num_spans = int(plan.spans);
  p.reverse = reverse;
  fill_decays(params, d.heads, p.log2_inv_decay);
  launch_linear_scan(p, int(d.batch), stream);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace cuda
}  // namespace seqpar
