// Each CPU layer of the training engine (src/model/layers.hpp) against its fp64 version: the
// fp64 backward against central finite differences of the fp64 forward (a scalar loss
// sum(y * r) with random r), and the fp32 forward and backward against the fp64 ones. The fused
// LM head + cross-entropy also against the plain computation over the whole logits.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "model/layers.hpp"

namespace seqpar::model {
namespace {

std::vector<double> random_vec(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = scale * u(rng);
  return v;
}
std::vector<float> to_f32(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// max |a - b| / max(max |b|, tiny)
double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < b.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i])), scale = std::max(scale, std::abs(b[i]));
  return worst / scale;
}

// Checks analytic d/dx of f (a scalar function of x) at a few elements against central
// differences: |analytic - numeric| <= 1e-6 * max(1, |numeric|).
void expect_matches_finite_differences(const char* what, std::vector<double>& x, const std::vector<double>& analytic,
                                       const std::function<double()>& f) {
  const double h = 1e-5;
  for (size_t i = 0; i < x.size(); i += std::max<size_t>(1, x.size() / 23)) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = f();
    x[i] = keep - h;
    const double down = f();
    x[i] = keep;
    const double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(analytic[i], numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << what << "[" << i << "]";
  }
}

TEST(ModelLayers, Linear) {
  const int64_t rows = 7, in = 12, out = 5;
  auto x = random_vec(size_t(rows * in), 1), w = random_vec(size_t(out * in), 2), r = random_vec(size_t(rows * out), 3);
  const auto loss = [&] {
    std::vector<double> y(size_t(rows * out));
    linear_forward(x.data(), w.data(), y.data(), rows, in, out);
    return dot(y, r);
  };
  std::vector<double> dx(x.size()), dw(w.size(), 0.0);
  linear_backward(x.data(), w.data(), r.data(), dx.data(), dw.data(), rows, in, out, false);
  expect_matches_finite_differences("dx", x, dx, loss);
  expect_matches_finite_differences("dw", w, dw, loss);
  // fp32 against fp64.
  std::vector<double> y(size_t(rows * out));
  linear_forward(x.data(), w.data(), y.data(), rows, in, out);
  auto xf = to_f32(x), wf = to_f32(w), rf = to_f32(r);
  std::vector<float> yf(y.size()), dxf(x.size()), dwf(w.size(), 0.0f);
  linear_forward(xf.data(), wf.data(), yf.data(), rows, in, out);
  linear_backward(xf.data(), wf.data(), rf.data(), dxf.data(), dwf.data(), rows, in, out, false);
  EXPECT_LT(rel_err(yf, y), 1e-6);
  EXPECT_LT(rel_err(dxf, dx), 1e-6);
  EXPECT_LT(rel_err(dwf, dw), 1e-6);
}

TEST(ModelLayers, EmbeddingWithRepeatedTokens) {
  const int64_t rows = 9, dim = 6, vocab = 5;
  const std::vector<int32_t> tokens{0, 3, 3, 1, 4, 0, 3, 2, 2};
  auto table = random_vec(size_t(vocab * dim), 4), r = random_vec(size_t(rows * dim), 5);
  const auto loss = [&] {
    std::vector<double> y(size_t(rows * dim));
    embedding_forward(tokens.data(), table.data(), y.data(), rows, dim);
    return dot(y, r);
  };
  std::vector<double> dtable(table.size(), 0.0);
  embedding_backward(tokens.data(), r.data(), dtable.data(), rows, dim);
  expect_matches_finite_differences("dtable", table, dtable, loss);
}

TEST(ModelLayers, RmsNorm) {
  const int64_t rows = 6, dim = 16;
  auto x = random_vec(size_t(rows * dim), 6, 3.0), w = random_vec(size_t(dim), 7), r = random_vec(size_t(rows * dim), 8);
  std::vector<double> rstd(static_cast<size_t>(rows));
  const auto loss = [&] {
    std::vector<double> y(size_t(rows * dim));
    rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, dim, 1e-5);
    return dot(y, r);
  };
  loss();
  std::vector<double> dx(x.size(), 0.0), dw(w.size(), 0.0);
  rmsnorm_backward(x.data(), w.data(), rstd.data(), r.data(), dx.data(), dw.data(), rows, dim);
  expect_matches_finite_differences("dx", x, dx, loss);
  expect_matches_finite_differences("dw", w, dw, loss);
  auto xf = to_f32(x), wf = to_f32(w), rf = to_f32(r);
  std::vector<float> yf(x.size()), rstdf(static_cast<size_t>(rows)), dxf(x.size(), 0.0f), dwf(w.size(), 0.0f);
  rmsnorm_forward(xf.data(), wf.data(), yf.data(), rstdf.data(), rows, dim, 1e-5);
  rmsnorm_backward(xf.data(), wf.data(), rstdf.data(), rf.data(), dxf.data(), dwf.data(), rows, dim);
  EXPECT_LT(rel_err(dxf, dx), 1e-5);
  EXPECT_LT(rel_err(dwf, dw), 1e-5);
}

// RoPE at global positions: the rotation is orthogonal (inverse undoes it), its backward is the
// inverse rotation, and a shard rotated at its global positions equals those rows of the whole.
TEST(ModelLayers, RopeAtGlobalPositions) {
  const int64_t B = 2, S = 10, H = 3, D = 8;
  auto x = random_vec(size_t(B * S * H * D), 9), r = random_vec(x.size(), 10);
  std::vector<int64_t> pos(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) pos[size_t(s)] = 1000003 * s + 17;  // large positions: angles in double
  const auto loss = [&] {
    std::vector<double> y = x;
    rope_apply(y.data(), pos.data(), B, S, H, D, 10000.0, false);
    return dot(y, r);
  };
  std::vector<double> dx = r;
  rope_apply(dx.data(), pos.data(), B, S, H, D, 10000.0, true);
  expect_matches_finite_differences("dx", x, dx, loss);
  std::vector<double> back = x;
  rope_apply(back.data(), pos.data(), B, S, H, D, 10000.0, false);
  rope_apply(back.data(), pos.data(), B, S, H, D, 10000.0, true);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-12);
  // Position 0 leaves a row as it is; position p turns pair 0 by exactly p radians.
  std::vector<double> one{1, 0, 0, 0, 0, 0, 0, 0};
  const int64_t p = 3;
  rope_apply(one.data(), &p, 1, 1, 1, D, 10000.0, false);
  EXPECT_NEAR(one[0], std::cos(3.0), 1e-15);
  EXPECT_NEAR(one[4], std::sin(3.0), 1e-15);
}

TEST(ModelLayers, SwiGlu) {
  const int64_t n = 40;
  auto g = random_vec(size_t(n), 11, 4.0), u = random_vec(size_t(n), 12), r = random_vec(size_t(n), 13);
  const auto loss = [&] {
    std::vector<double> a(static_cast<size_t>(n));
    swiglu_forward(g.data(), u.data(), a.data(), n);
    return dot(a, r);
  };
  std::vector<double> dg(static_cast<size_t>(n)), du(static_cast<size_t>(n));
  swiglu_backward(g.data(), u.data(), r.data(), dg.data(), du.data(), n);
  expect_matches_finite_differences("dg", g, dg, loss);
  expect_matches_finite_differences("du", u, du, loss);
}

// The fused head: chunks smaller than the rows, ignored targets; loss and gradients equal the
// plain computation over the whole logits.
TEST(ModelLayers, FusedLmHeadLossMatchesPlainLogits) {
  const int64_t rows = 11, dim = 8, vocab = 13, chunk = 4;
  auto x = random_vec(size_t(rows * dim), 14, 2.0), w = random_vec(size_t(vocab * dim), 15);
  const std::vector<int32_t> targets{3, -1, 0, 12, 5, 5, -1, 7, 1, 2, 9};
  const double scale = 1.0 / 9.0;
  const auto plain_loss = [&] {
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[size_t(r)] < 0) continue;
      std::vector<double> logit(static_cast<size_t>(vocab));
      for (int64_t v = 0; v < vocab; ++v)
        for (int64_t d = 0; d < dim; ++d) logit[size_t(v)] += x[size_t(r * dim + d)] * w[size_t(v * dim + d)];
      double m = -INFINITY, z = 0;
      for (double l : logit) m = std::max(m, l);
      for (double l : logit) z += std::exp(l - m);
      sum += m + std::log(z) - logit[size_t(targets[size_t(r)])];
    }
    return sum * scale;
  };
  std::vector<double> lse(static_cast<size_t>(rows));
  double loss_sum = 0;
  int64_t counted = 0;
  lm_head_loss_forward(x.data(), w.data(), targets.data(), rows, dim, vocab, chunk, lse.data(), &loss_sum, &counted);
  EXPECT_EQ(counted, 9);
  EXPECT_NEAR(loss_sum * scale, plain_loss(), 1e-12);
  std::vector<double> dx(x.size()), dw(w.size(), 0.0);
  lm_head_loss_backward(x.data(), w.data(), targets.data(), lse.data(), rows, dim, vocab, chunk, scale, dx.data(),
                        dw.data());
  expect_matches_finite_differences("dx", x, dx, plain_loss);
  expect_matches_finite_differences("dw", w, dw, plain_loss);
}

}  // namespace
}  // namespace seqpar::model
