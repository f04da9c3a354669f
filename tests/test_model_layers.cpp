// Each CPU layer of the training engine (src/model/layers.hpp) against its fp64 version: the
// fp64 backward against central finite differences of the fp64 forward (a scalar loss
// sum(y * r) with random r), and the fp32 forward and backward against the fp64 ones. The fused
// LM head + cross-entropy also against the plain computation over the whole logits. The
// TransNormerLLM-style token mixer (linear_attention_layer.hpp) likewise, plus its decay edges.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "model/layers.hpp"
#include "model/linear_attention_layer.hpp"

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
  double loss_sum = 0, loss_sum_trained = 0;
  int64_t counted = 0, counted_trained = 0;
  lm_head_loss(x.data(), w.data(), targets.data(), rows, dim, vocab, chunk, &loss_sum, &counted);
  EXPECT_EQ(counted, 9);
  EXPECT_NEAR(loss_sum * scale, plain_loss(), 1e-12);
  std::vector<double> dx(x.size()), dw(w.size(), 0.0);
  lm_head_loss(x.data(), w.data(), targets.data(), rows, dim, vocab, chunk, &loss_sum_trained, &counted_trained, scale,
               dx.data(), dw.data());
  EXPECT_EQ(loss_sum_trained, loss_sum);  // the gradient does not change the loss it comes with
  EXPECT_EQ(counted_trained, counted);
  expect_matches_finite_differences("dx", x, dx, plain_loss);
  expect_matches_finite_differences("dw", w, dw, plain_loss);
}

// ---- the TransNormerLLM-style token mixer ----------------------------------------------------

// One mixer problem in fp64: shape, decays, input and weights (tests perturb them in place).
struct MixerProblem {
  LinearMixerShape shape;
  LinearAttentionParams params;
  std::vector<double> x, wq, wk, wv, wg, wo;
};

// 2 sequences of 23 tokens, hidden 16, 2 heads of 8; chunk 8 so the kernel's inter-chunk state
// path runs (23 = 8 + 8 + 7).
MixerProblem mixer_problem(MixerGate gate, std::vector<double> decay) {
  MixerProblem p;
  p.shape.batch = 2, p.shape.seq = 23, p.shape.hidden = 16, p.shape.heads = 2, p.shape.head_dim = 8;
  p.shape.gate = gate;
  p.params.decay = std::move(decay);
  p.params.chunk = 8;
  const size_t rows = size_t(p.shape.rows()), hid = size_t(p.shape.hidden), width = size_t(p.shape.width());
  p.x = random_vec(rows * hid, 41);
  p.wq = random_vec(width * hid, 42, 0.5), p.wk = random_vec(width * hid, 43, 0.5);
  p.wv = random_vec(width * hid, 44, 0.5), p.wg = random_vec(width * hid, 45, 0.5);
  p.wo = random_vec(hid * width, 46, 0.5);
  return p;
}

template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

template <class T>
struct MixerRun {
  std::vector<T> y, dx, dwq, dwk, dwv, dwg, dwo;
  std::vector<T> q, k, v, o;  // the attention's inputs and output, for the decay edges
};

// The mixer's forward (and with dy its backward) of p in precision T, the sequences split
// contiguously over `ranks` thread ranks (LASP between them): rows gathered back into *run,
// weight gradients summed over ranks in rank order (what a data-parallel all-reduce would add).
template <class T>
Status run_mixer(const MixerProblem& p, const std::vector<double>* dy, MixerRun<T>* run, int ranks = 1,
                 LaspAlgorithm algorithm = LaspAlgorithm::kChain) {
  const LinearMixerShape& s = p.shape;  // s.seq: the whole sequence here
  const int64_t B = s.batch, S = s.seq, hid = s.hidden, width = s.width();
  const DType dtype = sizeof(T) == sizeof(double) ? DType::kF64 : DType::kF32;
  SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(LayoutKind::kContiguous, S, ranks));
  auto x = cast<T>(p.x), dyt = dy ? cast<T>(*dy) : std::vector<T>();
  const auto wq = cast<T>(p.wq), wk = cast<T>(p.wk), wv = cast<T>(p.wv), wg = cast<T>(p.wg), wo = cast<T>(p.wo);
  const LinearMixerSlots<const T*> w{wq.data(), wk.data(), wv.data(), wg.data(), wo.data()};
  const size_t all_acts = size_t(B * S * width);
  run->y.assign(size_t(B * S * hid), T(0)), run->dx.assign(dy ? x.size() : 0, T(0));
  run->q.assign(all_acts, T(0)), run->k.assign(all_acts, T(0)), run->v.assign(all_acts, T(0)), run->o.assign(all_acts, T(0));
  std::vector<MixerRun<T>> grads(static_cast<size_t>(ranks));  // each rank's weight gradients
  SP_RETURN_IF_ERROR(run_local_ranks(ranks, [&](Communicator& comm) -> Status {
    const int me = comm.rank();
    LinearMixerShape local = s;
    local.seq = layout.local_len(me);
    const size_t rows = size_t(local.rows()), act = rows * size_t(width);
    const auto whole = [&](std::vector<T>& a, int64_t dim) { return TensorView::contiguous(a.data(), dtype, {B, S, dim}); };
    const auto mine = [&](std::vector<T>& a, int64_t dim) {
      return TensorView::contiguous(a.data(), dtype, {B, local.seq, dim});
    };
    std::vector<T> x_mine(rows * size_t(hid)), y_mine(rows * size_t(hid)), q_in(act), k_in(act), q(act), k(act), v(act),
        g(act), o(act), normed(act), rstd(rows);
    SP_RETURN_IF_ERROR(layout.shard(whole(x, hid), 1, me, mine(x_mine, hid)));
    const LinearMixerActs<T> acts{q_in.data(), k_in.data(), q.data(),      k.data(),   v.data(),
                                  g.data(),    o.data(),    normed.data(), rstd.data()};
    LaspContext ctx;
    SP_RETURN_IF_ERROR(linear_mixer_forward<T>(comm, layout, algorithm, p.params, local, w, x_mine.data(), acts,
                                               y_mine.data(), &ctx));
    SP_RETURN_IF_ERROR(layout.unshard(mine(y_mine, hid), 1, me, whole(run->y, hid)));
    for (auto [from, to] : {std::pair{&q, &run->q}, {&k, &run->k}, {&v, &run->v}, {&o, &run->o}})
      SP_RETURN_IF_ERROR(layout.unshard(mine(*from, width), 1, me, whole(*to, width)));
    if (!dy) return Status::Ok();
    std::vector<T> dy_mine(rows * size_t(hid)), dx_mine(rows * size_t(hid));
    SP_RETURN_IF_ERROR(layout.shard(whole(dyt, hid), 1, me, mine(dy_mine, hid)));
    MixerRun<T>& g_me = grads[size_t(me)];
    g_me.dwq.assign(wq.size(), T(0)), g_me.dwk.assign(wk.size(), T(0)), g_me.dwv.assign(wv.size(), T(0));
    g_me.dwg.assign(wg.size(), T(0)), g_me.dwo.assign(wo.size(), T(0));
    const LinearMixerSlots<T*> dw{g_me.dwq.data(), g_me.dwk.data(), g_me.dwv.data(), g_me.dwg.data(), g_me.dwo.data()};
    SP_RETURN_IF_ERROR(linear_mixer_backward<T>(comm, layout, p.params, local, w, x_mine.data(), acts, dy_mine.data(),
                                                dx_mine.data(), dw, &ctx));
    return layout.unshard(mine(dx_mine, hid), 1, me, whole(run->dx, hid));
  }));
  if (!dy) return Status::Ok();
  run->dwq = grads[0].dwq, run->dwk = grads[0].dwk, run->dwv = grads[0].dwv, run->dwg = grads[0].dwg, run->dwo = grads[0].dwo;
  for (size_t r = 1; r < grads.size(); ++r)
    for (auto [sum, part] : {std::pair{&run->dwq, &grads[r].dwq}, {&run->dwk, &grads[r].dwk}, {&run->dwv, &grads[r].dwv},
                             {&run->dwg, &grads[r].dwg}, {&run->dwo, &grads[r].dwo}})
      for (size_t i = 0; i < sum->size(); ++i) (*sum)[i] += (*part)[i];
  return Status::Ok();
}

// Every weight's and the input's gradient of sum(y * r) against central differences, in fp64.
void expect_mixer_gradients_match_finite_differences(MixerProblem p) {
  const auto r = random_vec(size_t(p.shape.rows() * p.shape.hidden), 47);
  MixerRun<double> analytic;
  ASSERT_TRUE(run_mixer<double>(p, &r, &analytic).ok());
  const auto loss = [&] {
    MixerRun<double> again;
    EXPECT_TRUE(run_mixer<double>(p, nullptr, &again).ok());
    return dot(again.y, r);
  };
  const std::tuple<const char*, std::vector<double>*, const std::vector<double>*> checked[] = {
      {"dx", &p.x, &analytic.dx},    {"dwq", &p.wq, &analytic.dwq}, {"dwk", &p.wk, &analytic.dwk},
      {"dwv", &p.wv, &analytic.dwv}, {"dwg", &p.wg, &analytic.dwg}, {"dwo", &p.wo, &analytic.dwo}};
  for (const auto& [name, param, gradient] : checked) expect_matches_finite_differences(name, *param, *gradient, loss);
}

// The output, input gradient and weight gradients of `got` against `want`: max-error relative
// to each array's largest |value|, below tol.
template <class T>
void expect_mixer_runs_close(const MixerRun<T>& got, const MixerRun<double>& want, double tol, const std::string& what) {
  const std::pair<const std::vector<T>*, const std::vector<double>*> arrays[] = {
      {&got.y, &want.y},     {&got.dx, &want.dx},   {&got.dwq, &want.dwq}, {&got.dwk, &want.dwk},
      {&got.dwv, &want.dwv}, {&got.dwg, &want.dwg}, {&got.dwo, &want.dwo}};
  const char* names[] = {"y", "dx", "dwq", "dwk", "dwv", "dwg", "dwo"};
  for (size_t a = 0; a < std::size(arrays); ++a) {
    const auto& [mine, exact] = arrays[a];
    ASSERT_EQ(mine->size(), exact->size()) << what << " " << names[a];
    double worst = 0, scale = 1e-30;
    for (size_t i = 0; i < exact->size(); ++i)
      worst = std::max(worst, std::abs(double((*mine)[i]) - (*exact)[i])), scale = std::max(scale, std::abs((*exact)[i]));
    EXPECT_LT(worst / scale, tol) << what << " " << names[a];
  }
}

TEST(ModelLayers, LinearMixerGradientsMatchFiniteDifferences) {
  expect_mixer_gradients_match_finite_differences(mixer_problem(MixerGate::kIdentity, {0.9, 0.6}));
  expect_mixer_gradients_match_finite_differences(mixer_problem(MixerGate::kSilu, {0.9, 0.6}));
}

// lambda = 1 (head 0: no decay, every earlier token counts fully) next to lambda = 1e-30 (head 1:
// all but the token itself decayed away): the attention output against the two sums written out
// from the layer's own q, k, v, and the gradients still against finite differences. lambda = 0
// itself is outside the operator's contract (0, 1], and the layer refuses it.
TEST(ModelLayers, LinearMixerDecayEdges) {
  MixerProblem p = mixer_problem(MixerGate::kIdentity, {1.0, 1e-30});
  MixerRun<double> run;
  ASSERT_TRUE(run_mixer<double>(p, nullptr, &run).ok());
  const int64_t S = p.shape.seq, H = p.shape.heads, D = p.shape.head_dim;
  const auto at = [&](int64_t b, int64_t t, int64_t h) { return size_t(((b * S + t) * H + h) * D); };
  double worst = 0, scale = 0;
  for (int64_t b = 0; b < p.shape.batch; ++b)
    for (int64_t i = 0; i < S; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t e = 0; e < D; ++e) {
          double expected = 0;
          for (int64_t j = h == 0 ? 0 : i; j <= i; ++j) {
            double qk = 0;
            for (int64_t d = 0; d < D; ++d) qk += run.q[at(b, i, h) + size_t(d)] * run.k[at(b, j, h) + size_t(d)];
            expected += qk * run.v[at(b, j, h) + size_t(e)];
          }
          worst = std::max(worst, std::abs(run.o[at(b, i, h) + size_t(e)] - expected));
          scale = std::max(scale, std::abs(expected));
        }
  EXPECT_LT(worst, 1e-12 * scale);
  expect_mixer_gradients_match_finite_differences(p);

  p.params.decay = {1.0, 0.0};
  EXPECT_FALSE(run_mixer<double>(p, nullptr, &run).ok());
}

// The fp32 layer against the fp64 one on the same inputs: output, input and weight gradients.
TEST(ModelLayers, LinearMixerFp32MatchesFp64) {
  for (MixerGate gate : {MixerGate::kIdentity, MixerGate::kSilu}) {
    const MixerProblem p = mixer_problem(gate, {0.9, 0.6});
    const auto r = random_vec(size_t(p.shape.rows() * p.shape.hidden), 48);
    MixerRun<double> exact;
    MixerRun<float> single;
    ASSERT_TRUE(run_mixer<double>(p, &r, &exact).ok());
    ASSERT_TRUE(run_mixer<float>(p, &r, &single).ok());
    expect_mixer_runs_close(single, exact, 1e-5, gate == MixerGate::kSilu ? "silu gate" : "identity gate");
  }
}

// LASP inside the layer: the sequences split over 2 and 3 ranks (23 rows: uneven shards), by
// the chain and by the all-gather, give the one-rank layer's output, input gradient and summed
// weight gradients to fp64 round-off.
TEST(ModelLayers, LinearMixerOverRanksMatchesOneRank) {
  const MixerProblem p = mixer_problem(MixerGate::kSilu, {0.9, 0.6});
  const auto r = random_vec(size_t(p.shape.rows() * p.shape.hidden), 49);
  MixerRun<double> one;
  ASSERT_TRUE(run_mixer<double>(p, &r, &one).ok());
  for (int ranks : {2, 3})
    for (LaspAlgorithm algorithm : {LaspAlgorithm::kChain, LaspAlgorithm::kAllGather}) {
      MixerRun<double> split;
      ASSERT_TRUE(run_mixer<double>(p, &r, &split, ranks, algorithm).ok());
      const std::string what = std::to_string(ranks) + " ranks, " + lasp_algorithm_name(algorithm);
      expect_mixer_runs_close(split, one, 1e-12, what);
    }
}

}  // namespace
}  // namespace seqpar::model
