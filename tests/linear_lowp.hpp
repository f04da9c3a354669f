// The baseline of the bf16 rule for linear attention: the chunked computation (chunks of 64)
// as a plain low-precision implementation does it. Inputs in bf16/fp16, every product
// accumulated in fp32, and every matrix that feeds a low-precision matmul rounded to the dtype:
// the decay-weighted scores, the state when it multiplies q (or dO, k, v), the decay-weighted
// rows added into a state, and every output. States and dStates stay fp32, as in LASP.
// CUDA-free, so the rule's own tests run on any machine.
#pragma once

#include <algorithm>
#include <vector>

#include "seqpar/dtype.hpp"
#include "seqpar/linear_attention.hpp"
#include "test_util.hpp"

namespace seqpar::testing {

// intra_decay_shift adds to every intra-chunk decay distance: a deliberately wrong kernel, to
// show that the rule notices a decay exponent off by one.
inline LinearReferenceResult plain_lowp_linear(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                                               const HostTensor* state_in, const HostTensor* dout,
                                               const HostTensor* dstate_out, const LinearAttentionParams& params,
                                               DType dtype, int intra_decay_shift = 0) {
  constexpr int64_t C = 64;
  const auto rnd = [dtype](float x) {
    return dtype == DType::kBF16 ? bf16_to_float(float_to_bf16(x)) : fp16_to_float(float_to_fp16(x));
  };
  const HostTensor Q = cast(q, DType::kF32), K = cast(k, DType::kF32), V = cast(v, DType::kF32);
  const TensorView& qv = q.view();
  const int64_t B = qv.shape[0], N = qv.shape[1], H = qv.shape[2], DK = qv.shape[3];
  const int64_t HKV = k.view().shape[2], DV = v.view().shape[3], G = H / HKV, E = DK * DV;
  const float scale = float(params.scale);
  const HostTensor dO = dout ? cast(*dout, DType::kF32) : HostTensor();
  const HostTensor S0 = state_in ? cast(*state_in, DType::kF32) : HostTensor();
  const HostTensor G0 = dstate_out ? cast(*dstate_out, DType::kF32) : HostTensor();
  auto row = [](const HostTensor& t, int64_t b, int64_t s, int64_t h) {
    const TensorView& w = t.view();
    return t.data<float>() + b * w.strides[0] + s * w.strides[1] + h * w.strides[2];
  };
  LinearReferenceResult r{HostTensor(DType::kF64, {B, N, H, DV}), HostTensor(DType::kF64, {B, H, DK, DV}),
                          HostTensor(DType::kF64, {B, N, H, DK}), HostTensor(DType::kF64, {B, N, HKV, DK}),
                          HostTensor(DType::kF64, {B, N, HKV, DV}), HostTensor(DType::kF64, {B, H, DK, DV})};
  std::vector<float> dk_acc(B * N * HKV * DK, 0.f), dv_acc(B * N * HKV * DV, 0.f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / G;
      std::vector<float> pw(2 * C + 2);
      for (int64_t t = 0; t < int64_t(pw.size()); ++t) pw[t] = float(decay_power(params, h, t));
      const auto dot = [](const float* x, const float* y, int64_t n) {
        float s = 0;
        for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
        return s;
      };
      // Forward, keeping the (rounded) state entering every chunk for dq.
      std::vector<float> S(E, 0.f);
      if (state_in) std::copy_n(S0.data<float>() + (b * H + h) * E, E, S.begin());
      std::vector<std::vector<float>> entering;
      for (int64_t c0 = 0; c0 < N; c0 += C) {
        const int64_t m = std::min(C, N - c0);
        std::vector<float> Sr(E);
        for (int64_t e = 0; e < E; ++e) Sr[e] = rnd(S[e]);
        for (int64_t i = 0; i < m; ++i) {
          const float* qi = row(Q, b, c0 + i, h);
          std::vector<float> o(DV, 0.f);
          for (int64_t x = 0; x < DK; ++x)
            for (int64_t y = 0; y < DV; ++y) o[y] += qi[x] * Sr[x * DV + y];
          for (int64_t y = 0; y < DV; ++y) o[y] *= scale * pw[i + 1];
          for (int64_t j = 0; j <= i; ++j) {
            const float p = rnd(scale * pw[i - j + intra_decay_shift] * dot(qi, row(K, b, c0 + j, g), DK));
            const float* vj = row(V, b, c0 + j, g);
            for (int64_t y = 0; y < DV; ++y) o[y] += p * vj[y];
          }
          for (int64_t y = 0; y < DV; ++y) r.o.data<double>()[((b * N + c0 + i) * H + h) * DV + y] = rnd(o[y]);
        }
        entering.push_back(Sr);
        for (float& x : S) x *= pw[m];
        for (int64_t j = 0; j < m; ++j) {
          const float *kj = row(K, b, c0 + j, g), *vj = row(V, b, c0 + j, g);
          for (int64_t y = 0; y < DV; ++y) {
            const float u = rnd(pw[m - 1 - j] * vj[y]);
            for (int64_t x = 0; x < DK; ++x) S[x * DV + y] += kj[x] * u;
          }
        }
      }
      for (int64_t e = 0; e < E; ++e) r.state_out.data<double>()[(b * H + h) * E + e] = S[e];
      if (!dout) continue;
      // Backward: dq in time order from the entering states, dk and dv against it from G.
      std::vector<float> Gs(E, 0.f);
      if (dstate_out) std::copy_n(G0.data<float>() + (b * H + h) * E, E, Gs.begin());
      for (int64_t c0 = ((N - 1) / C) * C; N > 0 && c0 >= 0; c0 -= C) {
        const int64_t m = std::min(C, N - c0);
        const std::vector<float>& Sr = entering[c0 / C];
        std::vector<float> Gr(E);
        for (int64_t e = 0; e < E; ++e) Gr[e] = rnd(Gs[e]);
        for (int64_t i = 0; i < m; ++i) {
          const float* doi = row(dO, b, c0 + i, h);
          std::vector<float> dq(DK, 0.f);
          for (int64_t x = 0; x < DK; ++x) dq[x] = scale * pw[i + 1] * dot(&Sr[x * DV], doi, DV);
          for (int64_t j = 0; j <= i; ++j) {
            const float* kj = row(K, b, c0 + j, g);
            const float ds = rnd(scale * pw[i - j + intra_decay_shift] * dot(doi, row(V, b, c0 + j, g), DV));
            for (int64_t x = 0; x < DK; ++x) dq[x] += ds * kj[x];
          }
          for (int64_t x = 0; x < DK; ++x) r.dq.data<double>()[((b * N + c0 + i) * H + h) * DK + x] = rnd(dq[x]);
        }
        for (int64_t j = 0; j < m; ++j) {
          const float *kj = row(K, b, c0 + j, g), *vj = row(V, b, c0 + j, g);
          float* dkj = &dk_acc[((b * N + c0 + j) * HKV + g) * DK];
          float* dvj = &dv_acc[((b * N + c0 + j) * HKV + g) * DV];
          std::vector<float> dkl(DK, 0.f), dvl(DV, 0.f);
          for (int64_t x = 0; x < DK; ++x) dkl[x] = pw[m - 1 - j] * dot(&Gr[x * DV], vj, DV);
          for (int64_t y = 0; y < DV; ++y) {
            float s = 0;
            for (int64_t x = 0; x < DK; ++x) s += kj[x] * Gr[x * DV + y];
            dvl[y] = pw[m - 1 - j] * s;
          }
          for (int64_t i = j; i < m; ++i) {
            const float *qi = row(Q, b, c0 + i, h), *doi = row(dO, b, c0 + i, h);
            const float p = rnd(scale * pw[i - j + intra_decay_shift] * dot(qi, kj, DK));
            const float ds = rnd(scale * pw[i - j + intra_decay_shift] * dot(doi, vj, DV));
            for (int64_t x = 0; x < DK; ++x) dkl[x] += ds * qi[x];
            for (int64_t y = 0; y < DV; ++y) dvl[y] += p * doi[y];
          }
          for (int64_t x = 0; x < DK; ++x) dkj[x] += dkl[x];
          for (int64_t y = 0; y < DV; ++y) dvj[y] += dvl[y];
        }
        for (float& x : Gs) x *= pw[m];
        for (int64_t i = 0; i < m; ++i) {
          const float *qi = row(Q, b, c0 + i, h), *doi = row(dO, b, c0 + i, h);
          for (int64_t y = 0; y < DV; ++y) {
            const float u = rnd(scale * pw[i + 1] * doi[y]);
            for (int64_t x = 0; x < DK; ++x) Gs[x * DV + y] += qi[x] * u;
          }
        }
      }
      for (int64_t e = 0; e < E; ++e) r.dstate_in.data<double>()[(b * H + h) * E + e] = Gs[e];
    }
  for (size_t e = 0; e < dk_acc.size(); ++e) r.dk.data<double>()[e] = rnd(dk_acc[e]);
  for (size_t e = 0; e < dv_acc.size(); ++e) r.dv.data<double>()[e] = rnd(dv_acc[e]);
  return r;
}

}  // namespace seqpar::testing
