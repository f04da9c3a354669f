// Linear attention on one device: the two oracle forms agree and match finite differences; the
// chunked CPU kernels match the oracle over decays, GQA, d_k != d_v, chunk lengths and both
// dtypes; the state-term pieces add up to the whole; bad arguments are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "linear_test_util.hpp"

namespace seqpar {
namespace {

using testing::expect_close;
using testing::LinearInputs;
using testing::LinearProblem;
using testing::make_linear_inputs;

const TensorView kNone{};

StatusOr<LinearReferenceResult> oracle(const LinearInputs& in, const LinearProblem& p,
                                       LinearOracleForm form, bool with_states = true) {
  return linear_attention_reference(in.q.view(), in.k.view(), in.v.view(),
                                    with_states ? in.state_in.view() : kNone, in.dout.view(),
                                    with_states ? in.dstate_out.view() : kNone, p.params(), form);
}

// The chunked kernels' forward and backward, in the inputs' dtype.
LinearReferenceResult run_chunked(const LinearInputs& in, const LinearProblem& p, bool with_states = true) {
  const DType t = in.q.view().dtype;
  LinearReferenceResult r{HostTensor(t, {p.batch, p.seq, p.heads, p.dv}), HostTensor(t, {p.batch, p.heads, p.dk, p.dv}),
                          HostTensor(t, {p.batch, p.seq, p.heads, p.dk}), HostTensor(t, {p.batch, p.seq, p.kv_heads, p.dk}),
                          HostTensor(t, {p.batch, p.seq, p.kv_heads, p.dv}), HostTensor(t, {p.batch, p.heads, p.dk, p.dv})};
  const TensorView s_in = with_states ? in.state_in.view() : kNone;
  const TensorView ds_out = with_states ? in.dstate_out.view() : kNone;
  EXPECT_TRUE(linear_attention_forward(in.q.view(), in.k.view(), in.v.view(), s_in, p.params(), r.o.view(),
                                       r.state_out.view()).ok());
  EXPECT_TRUE(linear_attention_backward(in.q.view(), in.k.view(), in.v.view(), s_in, in.dout.view(), ds_out,
                                        p.params(), r.dq.view(), r.dk.view(), r.dv.view(), r.dstate_in.view()).ok());
  return r;
}

void expect_all_close(const LinearReferenceResult& got, const LinearReferenceResult& want, double rel) {
  expect_close("o", got.o, want.o, rel);
  expect_close("state_out", got.state_out, want.state_out, rel);
  expect_close("dq", got.dq, want.dq, rel);
  expect_close("dk", got.dk, want.dk, rel);
  expect_close("dv", got.dv, want.dv, rel);
  expect_close("dstate_in", got.dstate_in, want.dstate_in, rel);
}

std::vector<LinearProblem> oracle_problems() {
  return {
      {1, 37, 2, 2, 8, 8, {1.0}, 1.0, 64},                 // plain linear attention
      {2, 45, 2, 2, 6, 4, {0.9}, 1.0, 64},                 // decay, d_k != d_v
      {1, 50, 4, 2, 5, 7, {0.5, 0.8, 0.95, 1.0}, 0.3, 64},  // per-head decays, GQA, a scale
      {1, 33, 3, 1, 4, 6, {0.7, 0.99, 0.85}, 1.0, 64},      // MQA
  };
}

TEST(LinearOracle, QuadraticAndRecurrentFormsAgree) {
  for (const LinearProblem& p : oracle_problems()) {
    const LinearInputs in = make_linear_inputs(p, DType::kF64, 11);
    auto quad = oracle(in, p, LinearOracleForm::kQuadratic);
    auto rec = oracle(in, p, LinearOracleForm::kRecurrent);
    ASSERT_TRUE(quad.ok() && rec.ok()) << quad.status().to_string() << rec.status().to_string();
    SCOPED_TRACE("S=" + std::to_string(p.seq) + " H=" + std::to_string(p.heads));
    expect_all_close(quad.value(), rec.value(), 1e-12);
  }
}

// L = sum dO . O + sum dS_out . S_out; its central differences against every gradient.
TEST(LinearOracle, GradientsMatchFiniteDifferences) {
  const LinearProblem p{1, 7, 2, 1, 3, 2, {0.8, 0.95}, 0.7, 64};
  LinearInputs in = make_linear_inputs(p, DType::kF64, 5);
  for (LinearOracleForm form : {LinearOracleForm::kQuadratic, LinearOracleForm::kRecurrent}) {
    auto grads = oracle(in, p, form);
    ASSERT_TRUE(grads.ok());
    auto loss = [&] {
      auto r = oracle(in, p, LinearOracleForm::kQuadratic);
      double l = 0;
      for (int64_t i = 0; i < r->o.numel(); ++i) l += r->o.data<double>()[i] * in.dout.data<double>()[i];
      for (int64_t i = 0; i < r->state_out.numel(); ++i)
        l += r->state_out.data<double>()[i] * in.dstate_out.data<double>()[i];
      return l;
    };
    const std::pair<HostTensor*, const HostTensor*> wrt[] = {
        {&in.q, &grads->dq}, {&in.k, &grads->dk}, {&in.v, &grads->dv}, {&in.state_in, &grads->dstate_in}};
    const double eps = 1e-6;
    for (const auto& [x, g] : wrt)
      for (int64_t i = 0; i < x->numel(); ++i) {
        double& xi = x->data<double>()[i];
        const double saved = xi;
        xi = saved + eps;
        const double up = loss();
        xi = saved - eps;
        const double down = loss();
        xi = saved;
        EXPECT_NEAR((up - down) / (2 * eps), g->data<double>()[i], 1e-8) << "element " << i;
      }
  }
}

TEST(LinearKernel, Fp64MatchesTheOracleOverChunkLengths) {
  for (LinearProblem p : oracle_problems()) {
    p.seq = 101;  // not a multiple of any chunk below
    const LinearInputs in = make_linear_inputs(p, DType::kF64, 21);
    auto want = oracle(in, p, LinearOracleForm::kRecurrent);
    ASSERT_TRUE(want.ok());
    for (int64_t chunk : {1, 5, 40, 48, 64, 1000}) {
      p.chunk = chunk;
      SCOPED_TRACE("H=" + std::to_string(p.heads) + " chunk=" + std::to_string(chunk));
      expect_all_close(run_chunked(in, p), want.value(), 1e-12);
    }
  }
}

TEST(LinearKernel, ZeroStatesWhenAbsent) {
  LinearProblem p{2, 70, 4, 2, 8, 6, {0.9, 0.6, 1.0, 0.75}, 1.0, 48};
  const LinearInputs in = make_linear_inputs(p, DType::kF64, 31);
  auto want = oracle(in, p, LinearOracleForm::kQuadratic, false);
  ASSERT_TRUE(want.ok());
  expect_all_close(run_chunked(in, p, false), want.value(), 1e-12);
}

TEST(LinearKernel, Fp32MatchesTheOracle) {
  for (LinearProblem p : oracle_problems()) {
    p.seq = 150, p.chunk = 40;
    const LinearInputs in64 = make_linear_inputs(p, DType::kF64, 41);
    const LinearInputs in32{testing::cast(in64.q, DType::kF32), testing::cast(in64.k, DType::kF32),
                            testing::cast(in64.v, DType::kF32), testing::cast(in64.dout, DType::kF32),
                            testing::cast(in64.state_in, DType::kF32), testing::cast(in64.dstate_out, DType::kF32)};
    auto want = oracle(in32, p, LinearOracleForm::kRecurrent);  // the fp32 inputs, in fp64
    ASSERT_TRUE(want.ok());
    expect_all_close(run_chunked(in32, p), want.value(), 1e-5);
  }
}

// Far decays stay finite: lambda^255 is 1e-510 (0 in fp64) while lambda^-255 would overflow.
TEST(LinearKernel, StrongDecayOverLongChunksStaysFinite) {
  LinearProblem p{1, 300, 2, 2, 4, 4, {0.01, 0.5}, 1.0, 256};
  const LinearInputs in = make_linear_inputs(p, DType::kF64, 51);
  auto want = oracle(in, p, LinearOracleForm::kRecurrent);
  ASSERT_TRUE(want.ok());
  const LinearReferenceResult got = run_chunked(in, p);
  for (const HostTensor* t : {&got.o, &got.dq, &got.dk, &got.dv, &got.state_out, &got.dstate_in})
    for (int64_t i = 0; i < t->numel(); ++i) ASSERT_TRUE(std::isfinite(t->data<double>()[i]));
  expect_all_close(got, want.value(), 1e-12);
}

// The pieces LASP splits a pass into: a forward with no o gives the tokens' own state (from a
// zero state), a backward with no dq, dk, dv their own dState (from a zero dState), both equal to
// what the full passes from zero write; combine(S_in, own, n) is then the outgoing state (dState).
TEST(LinearKernel, OwnStatesAndTheCombineMakeThePassesStates) {
  LinearProblem p{2, 57, 4, 2, 6, 5, {0.9, 0.6, 1.0, 0.75}, 0.5, 40};
  const LinearInputs in = make_linear_inputs(p, DType::kF64, 61);
  const LinearReferenceResult whole = run_chunked(in, p);
  const LinearAttentionParams params = p.params();
  HostTensor own(DType::kF64, {p.batch, p.heads, p.dk, p.dv}), own_grad(DType::kF64, {p.batch, p.heads, p.dk, p.dv});
  ASSERT_TRUE(linear_attention_forward(in.q.view(), in.k.view(), in.v.view(), kNone, params, kNone, own.view()).ok());
  ASSERT_TRUE(linear_attention_backward(in.q.view(), in.k.view(), in.v.view(), kNone, in.dout.view(), kNone, params,
                                        kNone, kNone, kNone, own_grad.view()).ok());
  // From zero, the full passes' states are the own ones, bit for bit.
  LinearReferenceResult from_zero = whole;
  ASSERT_TRUE(linear_attention_forward(in.q.view(), in.k.view(), in.v.view(), kNone, params, from_zero.o.view(),
                                       from_zero.state_out.view()).ok());
  ASSERT_TRUE(linear_attention_backward(in.q.view(), in.k.view(), in.v.view(), kNone, in.dout.view(), kNone, params,
                                        from_zero.dq.view(), from_zero.dk.view(), from_zero.dv.view(),
                                        from_zero.dstate_in.view()).ok());
  EXPECT_EQ(testing::max_abs_diff(own, from_zero.state_out), 0.0);
  EXPECT_EQ(testing::max_abs_diff(own_grad, from_zero.dstate_in), 0.0);
  HostTensor carried(DType::kF64, {p.batch, p.heads, p.dk, p.dv}), carried_grad(DType::kF64, {p.batch, p.heads, p.dk, p.dv});
  ASSERT_TRUE(linear_state_combine(in.state_in.view(), own.view(), p.seq, params, carried.view()).ok());
  ASSERT_TRUE(linear_state_combine(in.dstate_out.view(), own_grad.view(), p.seq, params, carried_grad.view()).ok());
  expect_close("state_out", carried, whole.state_out, 1e-12);
  expect_close("dstate_in", carried_grad, whole.dstate_in, 1e-12);
  // In place, as the all-gather's prefix calls it.
  ASSERT_TRUE(linear_state_combine(in.state_in.view(), own.view(), p.seq, params, own.view()).ok());
  EXPECT_EQ(testing::max_abs_diff(own, carried), 0.0);
  // A backward with nothing to write is refused.
  EXPECT_EQ(linear_attention_backward(in.q.view(), in.k.view(), in.v.view(), kNone, in.dout.view(), kNone, params,
                                      kNone, kNone, kNone, kNone).code(),
            StatusCode::kInvalidArgument);
}

TEST(LinearKernel, RefusesBadArguments) {
  LinearProblem p{1, 16, 4, 2, 4, 4, {0.9}, 1.0, 8};
  const LinearInputs in = make_linear_inputs(p, DType::kF64, 71);
  HostTensor o(DType::kF64, {1, 16, 4, 4});
  auto forward = [&](const LinearAttentionParams& params, const TensorView& q, const TensorView& k) {
    return linear_attention_forward(q, k, in.v.view(), kNone, params, o.view(), kNone);
  };
  for (const std::vector<double>& decay :
       std::vector<std::vector<double>>{{0.0}, {1.5}, {-0.3}, {std::nan("")}, {0.9, 0.8}}) {
    LinearAttentionParams params = p.params();
    params.decay = decay;
    const Status s = forward(params, in.q.view(), in.k.view());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << decay[0];
  }
  LinearAttentionParams zero_chunk = p.params();
  zero_chunk.chunk = 0;
  EXPECT_EQ(forward(zero_chunk, in.q.view(), in.k.view()).code(), StatusCode::kInvalidArgument);
  const HostTensor k3 = testing::random_tensor(DType::kF64, {1, 16, 3, 4}, 1);  // 4 heads over 3
  EXPECT_EQ(forward(p.params(), in.q.view(), k3.view()).code(), StatusCode::kInvalidArgument);
  const HostTensor q16 = testing::cast(in.q, DType::kBF16), k16 = testing::cast(in.k, DType::kBF16);
  const HostTensor v16 = testing::cast(in.v, DType::kBF16), o16(DType::kBF16, {1, 16, 4, 4});
  EXPECT_EQ(linear_attention_forward(q16.view(), k16.view(), v16.view(), kNone, p.params(), o16.view(), kNone).code(),
            StatusCode::kUnsupported);
  HostTensor wrong_state(DType::kF32, {1, 4, 4, 4});
  EXPECT_EQ(linear_attention_forward(in.q.view(), in.k.view(), in.v.view(), wrong_state.view(), p.params(),
                                     o.view(), kNone).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace seqpar
