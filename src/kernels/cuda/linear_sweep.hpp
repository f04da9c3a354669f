// The parameters of the one chunk-sweep kernel behind every linear-attention pass (forward, dq,
// dk, dv and both state passes), of the span scan and the GQA group sum. Every pass has one form:
//
//   out_i = sum_{j in chunk, causal} scale lambda^|i-j| (a_i . b_j) c_j  +  w_i (a_i T)
//   T     <- lambda^m T + sum_r b_r (u_r c_r)^T                       (after each chunk)
//
// swept over the chunks of one span in time order (kReverse = false: j <= i, w_i = scale
// lambda^(i+1), u_r = lambda^(m-1-r)) or against it (kReverse = true: j >= i, w_i =
// lambda^(m-1-i), u_r = scale lambda^(r+1)); T is [width(b), 64] (one 64-column slice of c).
//   forward  a=q  b=k  c=v   T=S         dq  a=dO b=v  c=k  T=S^T   (time order)
//   dv       a=k  b=q  c=dO  T=dS        dk  a=v  b=dO c=q  T=dS^T  (reverse)
// Without an output (kOutput = false) the sweep starts from zero and stores the span's T:
// the span-local states that the scan chains.
//
// Rounding (bf16/fp16 operands of the mma): the decayed scores, T when it multiplies a, and
// u_r c_r; everything accumulates in fp32. tests/linear_lowp.hpp rounds the same quantities.
#pragma once

#include <cstdint>

#include <vector>

namespace seqpar::cuda {

constexpr int kLinearChunk = 64;      // tokens per chunk
constexpr int kLinearSlice = 64;      // columns of c (and T) per CTA
constexpr int kLinearThreads = 128;   // 4 warps, 16 rows of a chunk each
constexpr int kLinearMaxHeads = 256;  // per-head decays travel inside the parameter struct

struct LinearSweepParams {
  // Operands: element pointers at (batch 0, row 0, head 0) and strides in elements; the head
  // of an operand is the query head h divided by its head_div (1, or the GQA group).
  const void *a, *b, *c;
  int64_t a_batch, a_row, a_head, b_batch, b_row, b_head, c_batch, c_row, c_head;
  int a_head_div, b_head_div, c_head_div;
  int b_width, c_width;  // d of b (= d of a) and of c
  // Output rows of query head h (fp32 or the input dtype, by template).
  void* out;
  int64_t out_batch, out_row, out_head;
  // Span states, fp32 [B * H, spans, b_width, c_width] (kOutput = false writes them; the
  // output sweep reads its start from t0 with strides t0_ld_b along b's dim and t0_ld_c along
  // c's, so a transposed state is a stride swap).
  float* states;
  const float* t0;
  int64_t t0_ld_b, t0_ld_c;
  int64_t seq;
  int heads, chunks_per_span, num_spans;
  float scale;
  float log2_inv_decay[kLinearMaxHeads];  // log2(1 / lambda_h) >= 0
};

struct LinearScanParams {
  float* states;        // [B * H, spans, elems]: span-local in, entering (or leaving) state out
  const float* init;    // [B * H, elems] or nullptr (zero): state_in, or dstate_out in reverse
  float* final_state;   // [B * H, elems] or nullptr: state_out, or dstate_in in reverse
  int64_t elems, seq, span_tokens;
  int heads, num_spans;
  bool reverse;
  float log2_inv_decay[kLinearMaxHeads];
};

// Sum of the per-query-head fp32 gradient rows over each GQA group, cast to dst's dtype.
struct LinearGroupSumParams {
  const float* src;  // [B, S, H, d] contiguous
  void* dst;         // [B, S, H_kv, d]
  int64_t dst_batch, dst_row, dst_head;
  int64_t batch, seq;
  int heads, kv_heads, dim;
};

// One pass of a forward or backward call, as data: what the GPU launches and what
// tests/linear_emulator.hpp replays on the host.
struct LinearStep {
  enum class Kind { kSweep, kScan, kGroupSum };
  Kind kind = Kind::kSweep;
  bool reverse = false;   // sweep against time
  bool output = false;    // an output sweep (else span-local states)
  bool out_fp32 = false;  // output rows in fp32 (per-query-head dk, dv under GQA)
  LinearSweepParams sweep{};
  LinearScanParams scan{};
  LinearGroupSumParams group_sum{};
};

// Launchers, by translation unit: the time-order sweeps in linear_forward.cu, the reverse ones
// in linear_backward.cu (elem_is_bf16: bf16, else fp16; pipelined: two tile stages).
void launch_forward_sweep(const LinearSweepParams& p, bool elem_is_bf16, bool output, bool pipelined, int batch,
                          void* stream);
void launch_reverse_sweep(const LinearSweepParams& p, bool elem_is_bf16, bool output, bool out_fp32,
                          bool pipelined, int batch, void* stream);

}  // namespace seqpar::cuda
