// Test helpers: random tensors and error measures.
#include "test_util.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <random>

namespace seqpar::testing {

HostTensor random_tensor(DType dtype, const std::vector<int64_t>& shape, uint64_t seed) {
  HostTensor f64(DType::kF64, shape);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  for (int64_t i = 0; i < f64.numel(); ++i) f64.data<double>()[i] = dist(rng);
  return cast(f64, dtype);
}

HostTensor cast(const HostTensor& t, DType dtype) {
  std::vector<int64_t> shape(t.view().shape.begin(), t.view().shape.begin() + t.view().ndim);
  HostTensor out(dtype, shape);
  convert(t.view().data, t.view().dtype, out.view().data, dtype, t.numel());
  return out;
}

double max_abs_diff(const HostTensor& a, const HostTensor& b) {
  if (a.numel() != b.numel()) return std::numeric_limits<double>::infinity();
  const HostTensor x = cast(a, DType::kF64), y = cast(b, DType::kF64);
  double worst = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double u = x.data<double>()[i], v = y.data<double>()[i];
    if (u == v) continue;  // covers -inf == -inf
    const double d = std::abs(u - v);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, d);
  }
  return worst;
}

double max_abs(const HostTensor& t) {
  const HostTensor x = cast(t, DType::kF64);
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i)
    if (std::isfinite(x.data<double>()[i])) m = std::max(m, std::abs(x.data<double>()[i]));
  return m;
}

TempFile::TempFile(const std::string& stem, const std::string& text)
    : path(std::filesystem::temp_directory_path() /
           (stem + "_" + std::to_string(getpid()) + ".txt")) {
  std::ofstream(path) << text;
}

TempFile::~TempFile() {
  std::error_code ignored;
  std::filesystem::remove(path, ignored);
}

}  // namespace seqpar::testing

// ---- the plain low-precision baseline ----------------------------------------------------
#include <sstream>

#include "kernels/cpu/attention_common.hpp"

namespace seqpar::testing {

namespace {
double round_to(double x, DType t) {
  const float f = static_cast<float>(x);
  return t == DType::kBF16 ? bf16_to_float(float_to_bf16(f)) : fp16_to_float(float_to_fp16(f));
}
}  // namespace

ReferenceResult plain_lowp_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                                     const HostTensor* dout, const AttentionParams& params,
                                     DType t, const std::vector<int64_t>& query_rows) {
  const HostTensor Q = cast(q, DType::kF64), K = cast(k, DType::kF64), V = cast(v, DType::kF64);
  const int64_t B = q.view().shape[0], Sq = q.view().shape[1], H = q.view().shape[2],
                D = q.view().shape[3], Sk = k.view().shape[1], Hkv = k.view().shape[2], G = H / Hkv;
  const double scale = params.scale != 0 ? params.scale : 1.0 / std::sqrt(double(D));
  const cpu::MaskEvaluator mask(params, Sq, Sk);
  auto at = [](const HostTensor& x, int64_t b, int64_t s, int64_t h, int64_t d) {
    const auto& vw = x.view();
    return x.data<double>()[b * vw.strides[0] + s * vw.strides[1] + h * vw.strides[2] + d];
  };
  ReferenceResult r{HostTensor(DType::kF64, {B, Sq, H, D}), HostTensor(DType::kF64, {B, H, Sq}),
                    HostTensor(DType::kF64, {B, Sq, H, D}), HostTensor(DType::kF64, {B, Sk, Hkv, D}),
                    HostTensor(DType::kF64, {B, Sk, Hkv, D})};
  std::vector<float> dk_acc(B * Sk * Hkv * D, 0.f), dv_acc(B * Sk * Hkv * D, 0.f);
  const HostTensor dO = dout ? cast(*dout, DType::kF64) : HostTensor();
  std::vector<int64_t> all_rows;
  if (query_rows.empty())
    for (int64_t i = 0; i < Sq; ++i) all_rows.push_back(i);
  const std::vector<int64_t>& chosen = query_rows.empty() ? all_rows : query_rows;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / G;
      for (int64_t i : chosen) {
        std::vector<float> s(Sk, -INFINITY), p(Sk, 0.f);
        float m = -INFINITY;
        for (int64_t j = 0; j < Sk; ++j) {
          if (!mask.allowed(i, j)) continue;
          float acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += float(at(Q, b, i, h, d)) * float(at(K, b, j, g, d));
          s[j] = float(round_to(acc * scale, t));
          m = std::max(m, s[j]);
        }
        double* lse = &r.lse.data<double>()[(b * H + h) * Sq + i];
        if (m == -INFINITY) {
          *lse = -INFINITY;
          continue;
        }
        float l = 0;
        for (int64_t j = 0; j < Sk; ++j) l += (s[j] == -INFINITY) ? 0.f : std::exp(s[j] - m);
        *lse = m + std::log(l);
        for (int64_t j = 0; j < Sk; ++j)
          p[j] = s[j] == -INFINITY ? 0.f : float(round_to(std::exp(s[j] - m) / l, t));
        std::vector<float> o(D, 0.f);
        for (int64_t j = 0; j < Sk; ++j)
          if (p[j] != 0.f)
            for (int64_t d = 0; d < D; ++d) o[d] += p[j] * float(at(V, b, j, g, d));
        for (int64_t d = 0; d < D; ++d)
          r.o.data<double>()[((b * Sq + i) * H + h) * D + d] = round_to(o[d], t);
        if (!dout) continue;
        float delta = 0;
        for (int64_t d = 0; d < D; ++d)
          delta += float(at(dO, b, i, h, d)) * float(r.o.data<double>()[((b * Sq + i) * H + h) * D + d]);
        std::vector<float> dq(D, 0.f);
        for (int64_t j = 0; j < Sk; ++j) {
          if (p[j] == 0.f && s[j] == -INFINITY) continue;
          float dp = 0;
          for (int64_t d = 0; d < D; ++d) dp += float(at(dO, b, i, h, d)) * float(at(V, b, j, g, d));
          dp = float(round_to(dp, t));
          const float ds = float(round_to(p[j] * (dp - delta), t));
          for (int64_t d = 0; d < D; ++d) {
            dq[d] += ds * float(at(K, b, j, g, d));
            dk_acc[((b * Sk + j) * Hkv + g) * D + d] += ds * float(at(Q, b, i, h, d));
            dv_acc[((b * Sk + j) * Hkv + g) * D + d] += p[j] * float(at(dO, b, i, h, d));
          }
        }
        for (int64_t d = 0; d < D; ++d)
          r.dq.data<double>()[((b * Sq + i) * H + h) * D + d] = round_to(dq[d] * scale, t);
      }
    }
  for (size_t e = 0; e < dk_acc.size(); ++e) {
    r.dk.data<double>()[e] = round_to(dk_acc[e] * scale, t);
    r.dv.data<double>()[e] = round_to(dv_acc[e], t);
  }
  return r;
}

double max_abs_diff_rows(const HostTensor& a, const HostTensor& b, int seq_dim,
                         const std::vector<int64_t>& rows) {
  if (a.view().ndim != b.view().ndim ||
      !std::equal(a.view().shape.begin(), a.view().shape.begin() + a.view().ndim, b.view().shape.begin()))
    return std::numeric_limits<double>::infinity();
  const HostTensor x = cast(a, DType::kF64), y = cast(b, DType::kF64);
  const TensorView& v = x.view();
  std::vector<char> chosen(v.shape[seq_dim], rows.empty() ? 1 : 0);
  for (int64_t r : rows) chosen[r] = 1;
  double worst = 0;
  for (int64_t e = 0; e < x.numel(); ++e) {
    if (!chosen[(e / v.strides[seq_dim]) % v.shape[seq_dim]]) continue;
    const double u = x.data<double>()[e], w = y.data<double>()[e];
    if (u == w) continue;
    const double d = std::abs(u - w);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, d);
  }
  return worst;
}

HostTensor take_rows(const HostTensor& t, int seq_dim, const std::vector<int64_t>& rows) {
  const HostTensor x = cast(t, DType::kF64);
  const TensorView& v = x.view();
  std::vector<int64_t> shape(v.shape.begin(), v.shape.begin() + v.ndim);
  shape[seq_dim] = static_cast<int64_t>(rows.size());
  HostTensor out(DType::kF64, shape);
  // Contiguous input: an element is (outer, row, inner) around seq_dim.
  const int64_t inner = v.strides[seq_dim], n = v.shape[seq_dim], outer = x.numel() / (n * inner);
  const int64_t R = static_cast<int64_t>(rows.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t r = 0; r < R; ++r)
      std::copy_n(x.data<double>() + (o * n + rows[r]) * inner, inner, out.data<double>() + (o * R + r) * inner);
  return out;
}

std::string check_lowp_rule(const char* what, const HostTensor& ours, const HostTensor& plain,
                            const HostTensor& oracle, DType rounding) {
  return check_lowp_rule_rows(what, ours, plain, oracle, rounding, 0, {});
}

std::string check_lowp_rule_rows(const char* what, const HostTensor& ours, const HostTensor& plain,
                                 const HostTensor& oracle, DType rounding, int seq_dim,
                                 const std::vector<int64_t>& rows) {
  const double err = max_abs_diff_rows(ours, oracle, seq_dim, rows);
  const double plain_err = max_abs_diff_rows(plain, oracle, seq_dim, rows);
  const HostTensor rounded = cast(cast(oracle, rounding), DType::kF64);
  const double floor = max_abs_diff_rows(rounded, oracle, seq_dim, rows);
  const double bound = 2 * plain_err + floor;
  if (err <= bound) return {};
  std::ostringstream out;
  out << what << ": error " << err << " > 2 x plain " << plain_err << " + rounding " << floor;
  return out.str();
}

}  // namespace seqpar::testing
