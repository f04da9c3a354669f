// Host side shared by the linear-attention CUDA passes: input checks, the span length, the
// steps of a forward and a backward call (which sweep reads which operand, with which state
// layout), their launcher, and the two small kernels (the span scan, the GQA group sum).
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
                    int64_t d2, int64_t d3, bool contiguous, bool on_device) {
  bool ok = (t.device.kind == DeviceKind::kCuda) == on_device && t.dtype == dtype && t.ndim == 4 && t.strides[3] == 1;
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
                         const LinearAttentionParams& params, LinearCudaDims* d, bool on_device) {
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
  SP_RETURN_IF_ERROR(check_tensor("q", q, d->dtype, d->batch, d->seq, d->heads, d->dk, false, on_device));
  SP_RETURN_IF_ERROR(check_tensor("k", k, d->dtype, d->batch, d->seq, d->kv_heads, d->dk, false, on_device));
  return check_tensor("v", v, d->dtype, d->batch, d->seq, d->kv_heads, d->dv, false, on_device);
}

Status check_linear_cuda_state(const char* name, const TensorView& t, const LinearCudaDims& d, bool on_device) {
  if (t.data == nullptr) return Status::Ok();
  return check_tensor(name, t, DType::kF32, d.batch, d.heads, d.dk, d.dv, true, on_device);
}

Status check_linear_cuda_rows(const char* name, const TensorView& t, const LinearCudaDims& d, int64_t heads,
                              int64_t dim, bool on_device) {
  return check_tensor(name, t, d.dtype, d.batch, d.seq, heads, dim, false, on_device);
}

LinearPlan plan_linear(const LinearCudaDims& d, int64_t chunks_per_span) {
  LinearPlan plan;
  plan.chunks = (d.seq + kLinearChunk - 1) / kLinearChunk;
  int64_t cps = chunks_per_span;
  if (cps <= 0) {
    // Each span pays for a d x d state of its own (a sweep to make it, a scan step, a start from
    // it), so spans are made as long as the GPU allows: about one span per SM over all (batch,
    // head) pairs, between 4 and 64 chunks. Measured on one H200 (B = 1, H = 16, d = 128,
    // docs/RESULTS.md): fwd+bwd at 32K took 2.93 ms with 8-chunk spans and 2.04 ms with 64; at
    // 512K, 64-chunk spans were within 1.5% of 128.
    const int64_t pairs = std::max<int64_t>(1, d.batch * d.heads);
    cps = std::clamp<int64_t>(plan.chunks * pairs / 132, 4, 64);
  }
  plan.chunks_per_span = std::max<int64_t>(1, std::min(cps, std::max<int64_t>(plan.chunks, 1)));
  plan.spans = (plan.chunks + plan.chunks_per_span - 1) / plan.chunks_per_span;
  plan.state_elems = d.dk * d.dv;
  return plan;
}

Status reserve_workspace(const LinearCudaOptions& options, DeviceBuffer* local, size_t floats, float** data) {
  DeviceBuffer* ws = options.workspace ? options.workspace : local;
  SP_RETURN_IF_ERROR(ws->reserve(std::max<size_t>(floats * sizeof(float), 256)));
  *data = static_cast<float*>(ws->data());
  return Status::Ok();
}

void fill_decays(const LinearAttentionParams& params, int64_t heads, float* log2_inv_decay) {
  for (int64_t h = 0; h < heads; ++h)
    log2_inv_decay[h] = static_cast<float>(std::log2(1.0 / head_decay(params, h)));
}

// ---- the steps of one call ------------------------------------------------------------------

namespace {

// An operand of a sweep: a [B, S, heads, d] view and the divisor from the query head to its head.
struct Operand {
  TensorView t;
  int64_t head_div = 1;
};

// A span-local state sweep (output = false) of b and c into `states`, or an output sweep of
// (a, b, c) from the scanned `states` read with strides (ld_b, ld_c) into out's rows.
LinearStep sweep_step(const LinearCudaDims& d, const LinearPlan& plan, const LinearAttentionParams& params,
                      bool reverse, Operand a, Operand b, Operand c, float* states) {
  LinearStep step;
  step.kind = LinearStep::Kind::kSweep;
  step.reverse = reverse;
  LinearSweepParams& p = step.sweep;
  p.a = a.t.data, p.b = b.t.data, p.c = c.t.data;
  p.a_batch = a.t.strides[0], p.a_row = a.t.strides[1], p.a_head = a.t.strides[2];
  p.b_batch = b.t.strides[0], p.b_row = b.t.strides[1], p.b_head = b.t.strides[2];
  p.c_batch = c.t.strides[0], p.c_row = c.t.strides[1], p.c_head = c.t.strides[2];
  p.a_head_div = int(a.head_div), p.b_head_div = int(b.head_div), p.c_head_div = int(c.head_div);
  p.b_width = int(b.t.shape[3]), p.c_width = int(c.t.shape[3]);
  p.states = states;
  p.seq = d.seq;
  p.heads = int(d.heads);
  p.chunks_per_span = int(plan.chunks_per_span);
  p.num_spans = int(plan.spans);
  p.scale = static_cast<float>(params.scale);
  fill_decays(params, d.heads, p.log2_inv_decay);
  return step;
}

LinearStep output_step(LinearStep step, const float* states, int64_t ld_b, int64_t ld_c, void* out,
                       int64_t out_batch, int64_t out_row, int64_t out_head, bool out_fp32) {
  step.output = true;
  step.out_fp32 = out_fp32;
  LinearSweepParams& p = step.sweep;
  p.states = nullptr;
  p.t0 = states;
  p.t0_ld_b = ld_b, p.t0_ld_c = ld_c;
  p.out = out;
  p.out_batch = out_batch, p.out_row = out_row, p.out_head = out_head;
  return step;
}

LinearStep output_step(LinearStep step, const float* states, int64_t ld_b, int64_t ld_c, const TensorView& out) {
  return output_step(step, states, ld_b, ld_c, out.data, out.strides[0], out.strides[1], out.strides[2], false);
}

LinearStep scan_step(const LinearCudaDims& d, const LinearPlan& plan, const LinearAttentionParams& params,
                     float* states, const TensorView& init, const TensorView& final_state, bool reverse) {
  LinearStep step;
  step.kind = LinearStep::Kind::kScan;
  LinearScanParams& p = step.scan;
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
  return step;
}

}  // namespace

size_t linear_forward_workspace(const LinearCudaDims& d, const LinearPlan& plan) { return plan.state_floats(d); }

size_t linear_backward_workspace(const LinearCudaDims& d, const LinearPlan& plan) {
  // Both state sets; under GQA also fp32 dk, dv rows per query head, summed per group at the end.
  const size_t rows = d.group() > 1 ? size_t(d.batch * d.seq * d.heads * (d.dk + d.dv)) : 0;
  return 2 * plan.state_floats(d) + rows;
}

std::vector<LinearStep> linear_forward_steps(const LinearCudaDims& d, const LinearPlan& plan,
                                             const LinearAttentionParams& params, const TensorView& q,
                                             const TensorView& k, const TensorView& v, const TensorView& state_in,
                                             const TensorView& o, const TensorView& state_out, float* ws) {
  const Operand Q{q, 1}, K{k, d.group()}, V{v, d.group()};
  std::vector<LinearStep> steps;
  // Each span's own state sum_r lambda^(L-1-r) k_r v_r^T; the scan; the outputs (T = S).
  steps.push_back(sweep_step(d, plan, params, false, K, K, V, ws));
  steps.push_back(scan_step(d, plan, params, ws, state_in, state_out, false));
  if (o.data) steps.push_back(output_step(sweep_step(d, plan, params, false, Q, K, V, nullptr), ws, d.dv, 1, o));
  return steps;
}

std::vector<LinearStep> linear_backward_steps(const LinearCudaDims& d, const LinearPlan& plan,
                                              const LinearAttentionParams& params, const TensorView& q,
                                              const TensorView& k, const TensorView& v, const TensorView& state_in,
                                              const TensorView& dout, const TensorView& dstate_out,
                                              const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                              const TensorView& dstate_in, float* ws) {
  const Operand Q{q, 1}, K{k, d.group()}, V{v, d.group()}, dO{dout, 1};
  float* fwd_states = ws;  // S entering each span, [d_k, d_v]
  float* bwd_states = ws + plan.state_floats(d);  // G leaving each span, [d_k, d_v]
  float* dk_rows = bwd_states + plan.state_floats(d);
  float* dv_rows = dk_rows + size_t(d.batch * d.seq * d.heads * d.dk);
  std::vector<LinearStep> steps;
  // G_prev = lambda^L G + scale sum_t lambda^(t+1) q_t dO_t^T, against time from dstate_out.
  const auto dstate_steps = [&] {
    steps.push_back(sweep_step(d, plan, params, true, Q, Q, dO, bwd_states));
    steps.push_back(scan_step(d, plan, params, bwd_states, dstate_out, dstate_in, true));
  };
  if (!dq.data && !dk.data && !dv.data) {  // dstate_in alone: no forward states needed
    dstate_steps();
    return steps;
  }
  steps.push_back(sweep_step(d, plan, params, false, K, K, V, fwd_states));
  steps.push_back(scan_step(d, plan, params, fwd_states, state_in, {}, false));
  dstate_steps();
  // dq_i = sum_{j<=i} scale lambda^(i-j) (dO_i . v_j) k_j + scale lambda^(i+1) S dO_i: T = S^T,
  // element (b = y, c = x) of S[x][y] at x d_v + y.
  steps.push_back(output_step(sweep_step(d, plan, params, false, dO, V, K, nullptr), fwd_states, 1, d.dv, dq));
  // dv_j = sum_{i>=j} scale lambda^(i-j) (q_i . k_j) dO_i + lambda^(m-1-j) G^T k_j: T = G;
  // dk_j = sum_{i>=j} scale lambda^(i-j) (dO_i . v_j) q_i + lambda^(m-1-j) G v_j: T = G^T.
  const LinearStep dv_sweep = sweep_step(d, plan, params, true, K, Q, dO, nullptr);
  const LinearStep dk_sweep = sweep_step(d, plan, params, true, V, dO, Q, nullptr);
  if (d.group() == 1) {
    steps.push_back(output_step(dv_sweep, bwd_states, d.dv, 1, dv));
    steps.push_back(output_step(dk_sweep, bwd_states, 1, d.dv, dk));
    return steps;
  }
  steps.push_back(output_step(dv_sweep, bwd_states, d.dv, 1, dv_rows, d.seq * d.heads * d.dv, d.heads * d.dv,
                              d.dv, true));
  steps.push_back(output_step(dk_sweep, bwd_states, 1, d.dv, dk_rows, d.seq * d.heads * d.dk, d.heads * d.dk,
                              d.dk, true));
  for (auto [rows, out, dim] : {std::tuple{dv_rows, &dv, d.dv}, {dk_rows, &dk, d.dk}}) {
    LinearStep sum;
    sum.kind = LinearStep::Kind::kGroupSum;
    sum.group_sum = {rows, out->data, out->strides[0], out->strides[1], out->strides[2],
                     d.batch, d.seq, int(d.heads), int(d.kv_heads), int(dim)};
    steps.push_back(sum);
  }
  return steps;
}

// ---- the small kernels and the launcher -------------------------------------------------------

namespace {

// One thread per state element of one (batch, head): out_p = carry; carry = lambda^L_p carry +
// local_p over the spans in time order (or reversed), in place; then the final carry.
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
    carry = exp2f(-l2 * float(length)) * carry + local;  // lambda^L as one exp2 of the distance
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

Status run_linear_steps(const std::vector<LinearStep>& steps, const LinearCudaDims& d, void* stream_ptr,
                        bool pipelined) {
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  const bool bf16 = d.dtype == DType::kBF16;
  const int batch = int(d.batch);
  for (const LinearStep& step : steps) {
    switch (step.kind) {
      case LinearStep::Kind::kSweep:
        if (step.sweep.num_spans == 0) continue;  // no tokens
        if (step.reverse)
          launch_reverse_sweep(step.sweep, bf16, step.output, step.out_fp32, pipelined, batch, stream_ptr);
        else
          launch_forward_sweep(step.sweep, bf16, step.output, pipelined, batch, stream_ptr);
        break;
      case LinearStep::Kind::kScan: {  // with no spans: the initial state passes through
        const LinearScanParams& p = step.scan;
        if (!p.final_state && p.num_spans == 0) continue;
        linear_scan_kernel<<<dim3(unsigned((p.elems + 255) / 256), unsigned(batch * p.heads)), 256, 0, stream>>>(p);
        break;
      }
      case LinearStep::Kind::kGroupSum: {
        const LinearGroupSumParams& p = step.group_sum;
        const int64_t total = p.batch * p.seq * p.kv_heads * p.dim;
        if (total == 0) continue;
        const unsigned blocks = unsigned(std::min<int64_t>((total + 255) / 256, 8192));
        if (bf16)
          linear_group_sum_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(p);
        else
          linear_group_sum_kernel<__half><<<blocks, 256, 0, stream>>>(p);
        break;
      }
    }
    SP_CUDA_CHECK(cudaGetLastError());
  }
  return Status::Ok();
}

}  // namespace cuda
}  // namespace seqpar
