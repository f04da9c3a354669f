// A host replay of the linear-attention CUDA steps (src/kernels/cuda/linear_host.hpp): the
// same LinearStep list the GPU launches, built over host tensors and run here in fp32 with
// the kernel's rounding points, one (span, batch * head, slice) at a time. It checks on any
// machine everything about the kernels but their fragment-level code: which operand each pass
// reads, the state layouts and transposes, the decay and scale weights, the span boundaries,
// the scans and the GQA sums.
#pragma once

#include <cmath>
#include <vector>

#include "kernels/cuda/linear_host.hpp"
#include "seqpar/dtype.hpp"

namespace seqpar::testing {

namespace emulator_detail {

inline float read(const void* base, int64_t idx, DType t) {
  const uint16_t raw = static_cast<const uint16_t*>(base)[idx];
  return t == DType::kBF16 ? bf16_to_float(bf16_t{raw}) : fp16_to_float(fp16_t{raw});
}
inline void write(void* base, int64_t idx, float x, DType t) {
  static_cast<uint16_t*>(base)[idx] = t == DType::kBF16 ? float_to_bf16(x).bits : float_to_fp16(x).bits;
}
inline float rnd(float x, DType t) {
  return t == DType::kBF16 ? bf16_to_float(float_to_bf16(x)) : fp16_to_float(float_to_fp16(x));
}

inline void sweep(const cuda::LinearStep& step, int64_t batch, DType t) {
  const cuda::LinearSweepParams& p = step.sweep;
  constexpr int C = cuda::kLinearChunk, W = cuda::kLinearSlice;
  const int BW = p.b_width;
  const int64_t chunks = (p.seq + C - 1) / C;
  for (int64_t bh = 0; bh < batch * p.heads; ++bh)
    for (int slice = 0; slice < p.c_width / W; ++slice)
      for (int span = 0; span < p.num_spans; ++span) {
        const int64_t b = bh / p.heads, h = bh % p.heads;
        std::vector<float> pw(C + 1);
        for (int i = 0; i <= C; ++i) pw[i] = std::exp2(-p.log2_inv_decay[h] * float(i));
        const int64_t a0 = b * p.a_batch + (h / p.a_head_div) * p.a_head;
        const int64_t b0 = b * p.b_batch + (h / p.b_head_div) * p.b_head;
        const int64_t c0 = b * p.c_batch + (h / p.c_head_div) * p.c_head + slice * W;
        const auto A = [&](int64_t r, int x) { return read(p.a, a0 + r * p.a_row + x, t); };
        const auto B = [&](int64_t r, int x) { return read(p.b, b0 + r * p.b_row + x, t); };
        const auto Cv = [&](int64_t r, int x) { return read(p.c, c0 + r * p.c_row + x, t); };
        const int64_t elems = int64_t(p.b_width) * p.c_width, at = (bh * p.num_spans + span) * elems;
        std::vector<float> T(size_t(BW) * W, 0.f);
        if (step.output)
          for (int x = 0; x < BW; ++x)
            for (int y = 0; y < W; ++y) T[x * W + y] = p.t0[at + x * p.t0_ld_b + (slice * W + y) * p.t0_ld_c];
        const int64_t first = int64_t(span) * p.chunks_per_span;
        const int64_t end = std::min(first + p.chunks_per_span, chunks);
        for (int64_t st = 0; st < end - first; ++st) {
          const int64_t chunk = step.reverse ? end - 1 - st : first + st, row0 = chunk * C;
          const int m = int(std::min<int64_t>(C, p.seq - row0));
          std::vector<float> Tr(T.size()), Cu(size_t(m) * W);
          for (size_t e = 0; e < T.size(); ++e) Tr[e] = rnd(T[e], t);
          for (int r = 0; r < m; ++r) {
            const float u = step.reverse ? p.scale * pw[r + 1] : pw[m - 1 - r];
            for (int y = 0; y < W; ++y) Cu[r * W + y] = rnd(u * Cv(row0 + r, y), t);
          }
          for (int i = 0; step.output && i < m; ++i) {
            std::vector<float> acc(W, 0.f);
            for (int x = 0; x < BW; ++x)
              for (int y = 0; y < W; ++y) acc[y] += A(row0 + i, x) * Tr[x * W + y];
            const float w = step.reverse ? pw[m - 1 - i] : p.scale * pw[i + 1];
            for (float& y : acc) y *= w;
            for (int j = step.reverse ? i : 0; j < (step.reverse ? m : i + 1); ++j) {
              float s = 0;
              for (int x = 0; x < BW; ++x) s += A(row0 + i, x) * B(row0 + j, x);
              const float pr = rnd(p.scale * pw[step.reverse ? j - i : i - j] * s, t);
              for (int y = 0; y < W; ++y) acc[y] += pr * Cv(row0 + j, y);
            }
            const int64_t o = b * p.out_batch + h * p.out_head + (row0 + i) * p.out_row + slice * W;
            for (int y = 0; y < W; ++y) {
              if (step.out_fp32)
                static_cast<float*>(p.out)[o + y] = acc[y];
              else
                write(p.out, o + y, acc[y], t);
            }
          }
          for (float& x : T) x *= pw[m];
          for (int r = 0; r < m; ++r)
            for (int x = 0; x < BW; ++x) {
              const float bx = B(row0 + r, x);
              for (int y = 0; y < W; ++y) T[x * W + y] += bx * Cu[r * W + y];
            }
        }
        if (!step.output)
          for (int x = 0; x < BW; ++x)
            for (int y = 0; y < W; ++y) p.states[at + int64_t(x) * p.c_width + slice * W + y] = T[x * W + y];
      }
}

inline void scan(const cuda::LinearScanParams& p, int64_t batch) {
  for (int64_t bh = 0; bh < batch * p.heads; ++bh)
    for (int64_t e = 0; e < p.elems; ++e) {
      float carry = p.init ? p.init[bh * p.elems + e] : 0.f;
      for (int i = 0; i < p.num_spans; ++i) {
        const int64_t span = p.reverse ? p.num_spans - 1 - i : i;
        const int64_t length = std::min(p.seq, (span + 1) * p.span_tokens) - span * p.span_tokens;
        float& slot = p.states[(bh * p.num_spans + span) * p.elems + e];
        const float local = slot;
        slot = carry;
        carry = std::exp2(-p.log2_inv_decay[bh % p.heads] * float(length)) * carry + local;
      }
      if (p.final_state) p.final_state[bh * p.elems + e] = carry;
    }
}

inline void group_sum(const cuda::LinearGroupSumParams& p, DType t) {
  const int group = p.heads / p.kv_heads;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < p.seq; ++s)
      for (int g = 0; g < p.kv_heads; ++g)
        for (int d = 0; d < p.dim; ++d) {
          float sum = 0;
          for (int j = 0; j < group; ++j) sum += p.src[((b * p.seq + s) * p.heads + g * group + j) * p.dim + d];
          write(p.dst, b * p.dst_batch + s * p.dst_row + g * p.dst_head + d, sum, t);
        }
}

}  // namespace emulator_detail

inline void emulate_linear_steps(const std::vector<cuda::LinearStep>& steps, const cuda::LinearCudaDims& d) {
  for (const cuda::LinearStep& step : steps) {
    switch (step.kind) {
      case cuda::LinearStep::Kind::kSweep: emulator_detail::sweep(step, d.batch, d.dtype); break;
      case cuda::LinearStep::Kind::kScan: emulator_detail::scan(step.scan, d.batch); break;
      case cuda::LinearStep::Kind::kGroupSum: emulator_detail::group_sum(step.group_sum, d.dtype); break;
    }
  }
}

}  // namespace seqpar::testing
