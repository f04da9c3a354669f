// GPU local attention against the CPU fp64 oracle with the bf16 rule (CONVENTIONS.md): the
// cuDNN backend over masks, GQA ratios, head dims 64/128 and odd lengths, bf16 and fp16.
// Skipped when no GPU is present (CI); run on the GPU machine.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cudnn/cudnn_attention.hpp"
#include "kernels/cuda/flash_cuda.hpp"
#include "seqpar/gpu.hpp"
#include "test_util.hpp"

namespace seqpar {
namespace {

using testing::cast;

#define SKIP_WITHOUT_GPU()                                              \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device here"

struct Case {
  int64_t seq_q, seq_k, heads, kv_heads, head_dim;
  std::string mask;
  MaskAlign align;
  DType dtype;
};

std::string name(const Case& c) {
  std::string mask = c.mask;  // test names allow only letters, digits and '_'
  for (char& ch : mask)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return "Sq" + std::to_string(c.seq_q) + "_Sk" + std::to_string(c.seq_k) + "_H" +
         std::to_string(c.heads) + "_Hkv" + std::to_string(c.kv_heads) + "_D" +
         std::to_string(c.head_dim) + "_" + mask + (c.align == MaskAlign::kBottomRight ? "_br_" : "_tl_") +
         dtype_name(c.dtype);
}

class CudnnVsOracle : public ::testing::TestWithParam<Case> {};

TEST_P(CudnnVsOracle, MeetsTheLowPrecisionRule) {
  SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  SCOPED_TRACE(name(c));
  const HostTensor q = testing::random_tensor(c.dtype, {1, c.seq_q, c.heads, c.head_dim}, 11);
  const HostTensor k = testing::random_tensor(c.dtype, {1, c.seq_k, c.kv_heads, c.head_dim}, 12);
  const HostTensor v = testing::random_tensor(c.dtype, {1, c.seq_k, c.kv_heads, c.head_dim}, 13);
  const HostTensor dout = testing::random_tensor(c.dtype, {1, c.seq_q, c.heads, c.head_dim}, 14);
  AttentionParams params;
  params.mask = parse_mask(c.mask, std::max(c.seq_q, c.seq_k)).value();
  params.mask.align = c.align;

  auto dq_ = to_device(q), dk_ = to_device(k), dv_ = to_device(v), ddo = to_device(dout);
  ASSERT_TRUE(dq_.ok() && dk_.ok() && dv_.ok() && ddo.ok());
  auto o = device_zeros(c.dtype, {1, c.seq_q, c.heads, c.head_dim});
  auto lse = device_zeros(DType::kF32, {1, c.heads, c.seq_q});
  auto gq = device_zeros(c.dtype, {1, c.seq_q, c.heads, c.head_dim});
  auto gk = device_zeros(c.dtype, {1, c.seq_k, c.kv_heads, c.head_dim});
  auto gv = device_zeros(c.dtype, {1, c.seq_k, c.kv_heads, c.head_dim});
  Status s = cudnn_attention_forward(dq_->view, dk_->view, dv_->view, params, o->view, lse->view);
  ASSERT_TRUE(s.ok()) << s.to_string();
  s = cudnn_attention_backward(dq_->view, dk_->view, dv_->view, o->view, ddo->view, lse->view,
                               params, gq->view, gk->view, gv->view);
  ASSERT_TRUE(s.ok()) << s.to_string();

  auto oracle = reference_attention(q.view(), k.view(), v.view(), dout.view(), params);
  ASSERT_TRUE(oracle.ok());
  const ReferenceResult plain = testing::plain_lowp_attention(q, k, v, &dout, params, c.dtype);
  const std::pair<const char*, std::pair<const TensorView*, std::pair<const HostTensor*, const HostTensor*>>>
      outputs[] = {{"O", {&o->view, {&plain.o, &oracle->o}}},
                   {"dQ", {&gq->view, {&plain.dq, &oracle->dq}}},
                   {"dK", {&gk->view, {&plain.dk, &oracle->dk}}},
                   {"dV", {&gv->view, {&plain.dv, &oracle->dv}}}};
  for (const auto& [what, views] : outputs) {
    auto ours = to_host(*views.first);
    ASSERT_TRUE(ours.ok());
    const std::string why = testing::check_lowp_rule(what, cast(ours.value(), DType::kF64),
                                                     *views.second.first, *views.second.second, c.dtype);
    EXPECT_TRUE(why.empty()) << why;
  }
  auto ours_lse = to_host(lse->view);
  ASSERT_TRUE(ours_lse.ok());
  const std::string why = testing::check_lowp_rule("LSE", cast(ours_lse.value(), DType::kF64),
                                                   plain.lse, oracle->lse, DType::kF32);
  EXPECT_TRUE(why.empty()) << why;
}

std::vector<Case> cudnn_cases() {
  std::vector<Case> cases;
  for (DType t : {DType::kBF16, DType::kF16})
    for (int64_t d : {64, 128})
      for (auto [h, hkv] : {std::pair{8, 8}, std::pair{8, 2}, std::pair{8, 1}})
        for (const char* mask : {"full", "causal", "window:100,0", "window:50,20"})
          cases.push_back({1000, 1000, h, hkv, d, mask, MaskAlign::kTopLeft, t});
  // Longer, and cross lengths with the bottom-right (KV-cache) alignment.
  cases.push_back({4096, 4096, 4, 1, 128, "causal", MaskAlign::kTopLeft, DType::kBF16});
  cases.push_back({300, 1100, 4, 2, 128, "causal", MaskAlign::kBottomRight, DType::kBF16});
  cases.push_back({300, 1100, 4, 2, 64, "window:200,0", MaskAlign::kBottomRight, DType::kBF16});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudnnVsOracle, ::testing::ValuesIn(cudnn_cases()),
                         [](const auto& info) { return name(info.param); });

TEST(Cudnn, RefusesWhatItCannotDo) {
  SKIP_WITHOUT_GPU();
  const HostTensor q = testing::random_tensor(DType::kBF16, {1, 64, 2, 64}, 1);
  auto d = to_device(q);
  ASSERT_TRUE(d.ok());
  auto lse = device_zeros(DType::kF32, {1, 2, 64});
  AttentionParams docs;
  docs.mask = MaskSpec::documents({0, 30, 64});
  Status s = cudnn_attention_forward(d->view, d->view, d->view, docs, d->view, lse->view);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("document"), std::string::npos) << s.message();
  AttentionParams left_only;
  left_only.mask = MaskSpec::window(10, -1);
  s = cudnn_attention_forward(d->view, d->view, d->view, left_only, d->view, lse->view);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  // Host memory is refused, not dereferenced.
  s = cudnn_attention_forward(q.view(), q.view(), q.view(), {}, q.view(), lse->view);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
}

// ---- our flash forward ---------------------------------------------------------------------

struct FlashCase {
  int64_t seq_q, seq_k, heads, kv_heads, head_dim;
  std::string mask;
  PositionRun q_run, k_run;
  DType dtype;
  bool split_keys;  // run as two calls, the second continuing from the first
  double scale = 0.0;  // 0: 1/sqrt(D)
};

std::string flash_name(const FlashCase& c) {
  std::string mask = c.mask;
  for (char& ch : mask)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return "Sq" + std::to_string(c.seq_q) + "_Sk" + std::to_string(c.seq_k) + "_H" +
         std::to_string(c.heads) + "_" + std::to_string(c.kv_heads) + "_D" +
         std::to_string(c.head_dim) + "_" + mask + "_q" + std::to_string(c.q_run.offset) + "x" +
         std::to_string(c.q_run.stride) + "_k" + std::to_string(c.k_run.offset) + "x" +
         std::to_string(c.k_run.stride) + "_" + dtype_name(c.dtype) + (c.split_keys ? "_split" : "") +
         (c.scale < 0 ? "_negative_scale" : c.scale > 0 ? "_scale" : "");
}

TensorView key_rows(const TensorView& t, int64_t from, int64_t n) {
  TensorView v = t;
  v.data = static_cast<char*>(v.data) + from * v.strides[1] * dtype_size(v.dtype);
  v.shape[1] = n;
  return v;
}

// Inputs of a flash case on the host, its mask, and the same problem with explicit positions
// for the oracle (which takes per-row positions where our kernels take runs).
struct FlashSetup {
  HostTensor q, k, v, dout;
  AttentionParams params, host_params;
  std::vector<int64_t> qp, kp;
  FlashSetup(const FlashCase& c, uint64_t seed)
      : q(testing::random_tensor(c.dtype, {1, c.seq_q, c.heads, c.head_dim}, seed)),
        k(testing::random_tensor(c.dtype, {1, c.seq_k, c.kv_heads, c.head_dim}, seed + 1)),
        v(testing::random_tensor(c.dtype, {1, c.seq_k, c.kv_heads, c.head_dim}, seed + 2)),
        dout(testing::random_tensor(c.dtype, {1, c.seq_q, c.heads, c.head_dim}, seed + 3)),
        qp(c.seq_q), kp(c.seq_k) {
    const int64_t total = std::max(c.q_run.offset + c.q_run.stride * c.seq_q,
                                   c.k_run.offset + c.k_run.stride * c.seq_k);
    params.mask = parse_mask(c.mask, total).value();
    params.scale = c.scale;
    for (int64_t i = 0; i < c.seq_q; ++i) qp[i] = c.q_run.offset + c.q_run.stride * i;
    for (int64_t j = 0; j < c.seq_k; ++j) kp[j] = c.k_run.offset + c.k_run.stride * j;
    host_params = params;
    host_params.q_positions = qp.data();
    host_params.k_positions = kp.data();
  }
};

class FlashForwardVsOracle : public ::testing::TestWithParam<FlashCase> {};

TEST_P(FlashForwardVsOracle, MeetsTheLowPrecisionRule) {
  SKIP_WITHOUT_GPU();
  const FlashCase c = GetParam();
  const FlashSetup setup(c, 21);
  const HostTensor &q = setup.q, &k = setup.k, &v = setup.v;
  const AttentionParams &params = setup.params, &host_params = setup.host_params;

  auto gq = to_device(q), gk = to_device(k), gv = to_device(v);
  auto o_acc = device_zeros(DType::kF32, {1, c.seq_q, c.heads, c.head_dim});
  auto lse = device_zeros(DType::kF32, {1, c.heads, c.seq_q});
  auto o_out = device_zeros(c.dtype, {1, c.seq_q, c.heads, c.head_dim});
  ASSERT_TRUE(gq.ok() && gk.ok() && gv.ok() && o_acc.ok() && lse.ok() && o_out.ok());
  if (c.split_keys) {
    const int64_t half = c.seq_k / 2 + 3;
    FlashPositions first{c.q_run, c.k_run}, second{c.q_run, {c.k_run.offset + c.k_run.stride * half, c.k_run.stride}};
    Status s = flash_attention_forward(gq->view, key_rows(gk->view, 0, half), key_rows(gv->view, 0, half),
                                       params, first, o_acc->view, lse->view, false, TensorView{});
    ASSERT_TRUE(s.ok()) << s.to_string();
    s = flash_attention_forward(gq->view, key_rows(gk->view, half, c.seq_k - half),
                                key_rows(gv->view, half, c.seq_k - half), params, second, o_acc->view,
                                lse->view, true, o_out->view);
    ASSERT_TRUE(s.ok()) << s.to_string();
  } else {
    const Status s = flash_attention_forward(gq->view, gk->view, gv->view, params, {c.q_run, c.k_run},
                                             o_acc->view, lse->view, false, o_out->view);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  auto oracle = reference_attention(q.view(), k.view(), v.view(), TensorView{}, host_params);
  ASSERT_TRUE(oracle.ok());
  const ReferenceResult plain = testing::plain_lowp_attention(q, k, v, nullptr, host_params, c.dtype);
  auto ours_o = to_host(o_out->view), ours_lse = to_host(lse->view), ours_acc = to_host(o_acc->view);
  ASSERT_TRUE(ours_o.ok() && ours_lse.ok() && ours_acc.ok());
  std::string why = testing::check_lowp_rule("O", cast(ours_o.value(), DType::kF64), plain.o, oracle->o, c.dtype);
  EXPECT_TRUE(why.empty()) << why;
  why = testing::check_lowp_rule("LSE", cast(ours_lse.value(), DType::kF64), plain.lse, oracle->lse, DType::kF32);
  EXPECT_TRUE(why.empty()) << why;
  // The fp32 accumulator is at least as close to the oracle as the rounded output.
  why = testing::check_lowp_rule("O fp32", cast(ours_acc.value(), DType::kF64), plain.o, oracle->o, c.dtype);
  EXPECT_TRUE(why.empty()) << why;
  // Rows that see no key: O = 0 and LSE = -inf exactly.
  for (int64_t h = 0; h < c.heads; ++h)
    for (int64_t i = 0; i < c.seq_q; ++i)
      if (oracle->lse.data<double>()[h * c.seq_q + i] == -INFINITY) {
        ASSERT_EQ(ours_lse->data<float>()[h * c.seq_q + i], -INFINITY) << "row " << i;
        for (int64_t d = 0; d < c.head_dim; ++d)
          ASSERT_EQ(ours_acc->data<float>()[(i * c.heads + h) * c.head_dim + d], 0.f);
      }
}

std::vector<FlashCase> flash_cases() {
  std::vector<FlashCase> cases;
  const PositionRun from0{0, 1};
  for (DType t : {DType::kBF16, DType::kF16})
    for (int64_t d : {64, 128})
      for (auto [h, hkv] : {std::pair{4, 4}, std::pair{4, 1}})
        for (const char* mask : {"full", "causal", "window:70,10", "docs:5"})
          cases.push_back({333, 333, h, hkv, d, mask, from0, from0, t, false});
  // Continuation from a running result, and a query run after the keys (a later ring step).
  cases.push_back({200, 300, 4, 2, 128, "causal", {150, 1}, from0, DType::kBF16, true});
  cases.push_back({256, 256, 2, 2, 64, "full", from0, from0, DType::kBF16, true});
  // Striped shards: rank 1 of 4 against rank 3 of 4, and zigzag-like runs.
  cases.push_back({250, 250, 4, 2, 128, "causal", {1, 4}, {3, 4}, DType::kBF16, false});
  cases.push_back({250, 250, 4, 2, 128, "window:40,0", {2, 4}, {0, 4}, DType::kBF16, true});
  // Rows that see nothing: queries before every key under causal.
  cases.push_back({100, 120, 2, 1, 64, "causal", {0, 1}, {50, 1}, DType::kBF16, false});
  cases.push_back({4096, 4096, 2, 1, 128, "causal", from0, from0, DType::kBF16, false});
  cases.push_back({500, 500, 8, 1, 128, "causal", from0, from0, DType::kBF16, false});  // GQA 8:1
  cases.push_back({500, 500, 8, 1, 64, "window:30,30", from0, from0, DType::kF16, true});
  // A negative scale: the largest scaled score is the smallest raw one.
  cases.push_back({300, 300, 4, 2, 128, "causal", from0, from0, DType::kBF16, true, -0.09});
  cases.push_back({200, 200, 2, 2, 64, "window:40,10", from0, from0, DType::kF16, false, -0.125});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, FlashForwardVsOracle, ::testing::ValuesIn(flash_cases()),
                         [](const auto& info) { return flash_name(info.param); });

// ---- our flash backward --------------------------------------------------------------------

TensorView rows_of(const TensorView& t, int64_t from, int64_t n) { return key_rows(t, from, n); }

class FlashBackwardVsOracle : public ::testing::TestWithParam<FlashCase> {};

TEST_P(FlashBackwardVsOracle, MeetsTheLowPrecisionRule) {
  SKIP_WITHOUT_GPU();
  const FlashCase c = GetParam();
  const FlashSetup setup(c, 41);
  const HostTensor &q = setup.q, &k = setup.k, &v = setup.v, &dout = setup.dout;
  const AttentionParams &params = setup.params, &host_params = setup.host_params;

  auto gq = to_device(q), gk = to_device(k), gv = to_device(v), gdo = to_device(dout);
  auto o_acc = device_zeros(DType::kF32, {1, c.seq_q, c.heads, c.head_dim});
  auto lse = device_zeros(DType::kF32, {1, c.heads, c.seq_q});
  auto delta = device_zeros(DType::kF32, {1, c.heads, c.seq_q});
  auto dq = device_zeros(DType::kF32, {1, c.seq_q, c.heads, c.head_dim});
  auto dk = device_zeros(DType::kF32, {1, c.seq_k, c.kv_heads, c.head_dim});
  auto dv = device_zeros(DType::kF32, {1, c.seq_k, c.kv_heads, c.head_dim});
  ASSERT_TRUE(gq.ok() && gk.ok() && gv.ok() && gdo.ok() && o_acc.ok() && lse.ok() && delta.ok() &&
              dq.ok() && dk.ok() && dv.ok());
  const FlashPositions runs{c.q_run, c.k_run};
  Status s = flash_attention_forward(gq->view, gk->view, gv->view, params, runs, o_acc->view,
                                     lse->view, false, TensorView{});
  ASSERT_TRUE(s.ok()) << s.to_string();
  // D from the fp32 output, as the distributed schedules have it.
  auto dout_f32 = to_device(cast(dout, DType::kF32));
  ASSERT_TRUE(flash_attention_delta(o_acc->view, dout_f32->view, delta->view).ok());
  if (c.split_keys) {  // two key ranges, each adding into the same dQ
    const int64_t half = c.seq_k / 2 + 5;
    const FlashPositions second{c.q_run, {c.k_run.offset + c.k_run.stride * half, c.k_run.stride}};
    for (auto [from, n, pos] : {std::tuple{int64_t(0), half, runs}, std::tuple{half, c.seq_k - half, second}}) {
      s = flash_attention_backward(gq->view, rows_of(gk->view, from, n), rows_of(gv->view, from, n),
                                   gdo->view, lse->view, delta->view, params, pos, dq->view,
                                   rows_of(dk->view, from, n), rows_of(dv->view, from, n));
      ASSERT_TRUE(s.ok()) << s.to_string();
    }
  } else {
    s = flash_attention_backward(gq->view, gk->view, gv->view, gdo->view, lse->view, delta->view,
                                 params, runs, dq->view, dk->view, dv->view);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  auto oracle = reference_attention(q.view(), k.view(), v.view(), dout.view(), host_params);
  ASSERT_TRUE(oracle.ok());
  const ReferenceResult plain = testing::plain_lowp_attention(q, k, v, &dout, host_params, c.dtype);
  const std::pair<const char*, std::pair<const TensorView*, std::pair<const HostTensor*, const HostTensor*>>>
      grads[] = {{"dQ", {&dq->view, {&plain.dq, &oracle->dq}}},
                 {"dK", {&dk->view, {&plain.dk, &oracle->dk}}},
                 {"dV", {&dv->view, {&plain.dv, &oracle->dv}}}};
  for (const auto& [what, views] : grads) {
    auto ours = to_host(*views.first);
    ASSERT_TRUE(ours.ok());
    const std::string why = testing::check_lowp_rule(what, cast(ours.value(), DType::kF64),
                                                     *views.second.first, *views.second.second, c.dtype);
    EXPECT_TRUE(why.empty()) << why;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, FlashBackwardVsOracle, ::testing::ValuesIn(flash_cases()),
                         [](const auto& info) { return flash_name(info.param); });

TEST(FlashSmallKernels, DeltaAndMergeMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const HostTensor o = testing::random_tensor(DType::kF32, {2, 37, 3, 64}, 31);
  const HostTensor dout = testing::random_tensor(DType::kF32, {2, 37, 3, 64}, 32);
  HostTensor want(DType::kF32, {2, 3, 37});
  ASSERT_TRUE(cpu_attention_delta(o.view(), dout.view(), want.view()).ok());
  auto go = to_device(o), gd = to_device(dout);
  auto delta = device_zeros(DType::kF32, {2, 3, 37});
  ASSERT_TRUE(flash_attention_delta(go->view, gd->view, delta->view).ok());
  EXPECT_LE(testing::max_abs_diff(to_host(delta->view).value(), want), 1e-4);

  // Merge with -inf rows on either side.
  HostTensor lse1 = testing::random_tensor(DType::kF32, {2, 3, 37}, 33);
  HostTensor lse2 = testing::random_tensor(DType::kF32, {2, 3, 37}, 34);
  lse1.data<float>()[0] = -INFINITY;
  lse2.data<float>()[1] = -INFINITY;
  lse1.data<float>()[2] = lse2.data<float>()[2] = -INFINITY;
  HostTensor o1 = o, o2 = dout;
  for (int d = 0; d < 64; ++d) o1.data<float>()[2 * 64 * 3 + d] = 0.f;  // row s=2, h=0 empty on both
  auto g1 = to_device(o1), g2 = to_device(o2), gl1 = to_device(lse1), gl2 = to_device(lse2);
  // Into separate bf16 outputs first (the inputs stay as they were), then in place.
  auto o_out = device_zeros(DType::kBF16, {2, 37, 3, 64});
  auto lse_out = device_zeros(DType::kF32, {2, 3, 37});
  ASSERT_TRUE(flash_merge_partials_into(g1->view, gl1->view, g2->view, gl2->view, o_out->view, lse_out->view).ok());
  EXPECT_EQ(testing::max_abs_diff(to_host(g1->view).value(), o1), 0.0);
  ASSERT_TRUE(flash_merge_partials(g1->view, gl1->view, g2->view, gl2->view).ok());
  ASSERT_TRUE(merge_attention_partials(o1.view(), lse1.view(), o2.view(), lse2.view()).ok());
  EXPECT_LE(testing::max_abs_diff(to_host(g1->view).value(), o1), 1e-5);
  EXPECT_LE(testing::max_abs_diff(to_host(gl1->view).value(), lse1), 1e-5);
  EXPECT_EQ(testing::max_abs_diff(cast(to_host(o_out->view).value(), DType::kF32), cast(cast(to_host(g1->view).value(), DType::kBF16), DType::kF32)), 0.0);
  EXPECT_EQ(testing::max_abs_diff(to_host(lse_out->view).value(), to_host(gl1->view).value()), 0.0);
}

TEST(FlashSmallKernels, CastRoundTrips) {
  SKIP_WITHOUT_GPU();
  const HostTensor x = testing::random_tensor(DType::kF32, {3, 50, 2, 64}, 51);
  for (DType t : {DType::kBF16, DType::kF16}) {
    auto src = to_device(x);
    auto low = device_zeros(t, {3, 50, 2, 64});
    auto back = device_zeros(DType::kF32, {3, 50, 2, 64});
    ASSERT_TRUE(flash_cast(src->view, low->view).ok());
    ASSERT_TRUE(flash_cast(low->view, back->view).ok());
    // Exactly the CPU's round-to-nearest-even conversion.
    EXPECT_EQ(testing::max_abs_diff(to_host(back->view).value(), cast(cast(x, t), DType::kF32)), 0.0);
  }
}

// Heads 1 and 2 of a bf16 [B, S, 4, D] view (a strided slice).
TensorView middle_heads(TensorView v) {
  v.data = static_cast<char*>(v.data) + v.shape[3] * 2;
  v.shape[2] = 2;
  return v;
}

// flash_copy_many against the CPU: contiguous rows (16-byte units), head slices (one strided
// level), row statistics [B, H, S] cut by rows at odd offsets (4-byte units), bf16 rows starting
// 2 bytes off (2-byte units), a view of two strided levels and a cast (both through flash_cast),
// and more copies than one launch's list takes; everything outside the destinations untouched.
TEST(FlashSmallKernels, CopyManyWritesEachDestinationAndNothingElse) {
  SKIP_WITHOUT_GPU();
  const HostTensor a = testing::random_tensor(DType::kBF16, {2, 37, 4, 64}, 81);
  const HostTensor st = testing::random_tensor(DType::kF32, {1, 4, 1001}, 82);
  auto ga = to_device(a), gst = to_device(st);
  auto out = device_zeros(DType::kBF16, {2, 37, 4, 64});
  auto out_st = device_zeros(DType::kF32, {1, 4, 1001});
  auto out_f = device_zeros(DType::kF32, {2, 37, 4, 64});
  auto out2 = device_zeros(DType::kBF16, {2, 37, 4, 64});
  std::vector<std::pair<TensorView, TensorView>> pairs;
  const TensorView a0 = ga->view.narrow(0, 0, 1), o0 = out->view.narrow(0, 0, 1);
  const TensorView a1 = ga->view.narrow(0, 1, 2), o1 = out->view.narrow(0, 1, 2);
  pairs.emplace_back(a0.narrow(1, 0, 10), o0.narrow(1, 0, 10));                              // contiguous rows
  pairs.emplace_back(middle_heads(a0.narrow(1, 10, 20)), middle_heads(o0.narrow(1, 10, 20)));  // head slice
  TensorView cols_src = a0.narrow(1, 20, 37), cols_dst = o0.narrow(1, 20, 37);  // columns 1..63: 2-byte units
  cols_src.data = static_cast<char*>(cols_src.data) + 2, cols_dst.data = static_cast<char*>(cols_dst.data) + 2;
  cols_src.shape[3] = cols_dst.shape[3] = 63;
  pairs.emplace_back(cols_src, cols_dst);
  pairs.emplace_back(middle_heads(a1.narrow(1, 0, 30)), middle_heads(o1.narrow(1, 0, 30)));
  pairs.emplace_back(a1.narrow(1, 30, 37), o1.narrow(1, 30, 37));
  // Rows 0..29 of both batches, heads 1 and 2: two strided levels.
  pairs.emplace_back(middle_heads(ga->view.narrow(1, 0, 30)), middle_heads(out2->view.narrow(1, 0, 30)));
  for (int64_t i = 0; i < 1001; ++i)  // 1,001 one-element rows of stats: more than one launch's list
    pairs.emplace_back(gst->view.narrow(2, i, i + 1), out_st->view.narrow(2, i, i + 1));
  pairs.emplace_back(ga->view.narrow(1, 36, 37), out_f->view.narrow(1, 36, 37));  // a cast
  ASSERT_TRUE(flash_copy_many(pairs).ok());
  const HostTensor got = cast(to_host(out->view).value(), DType::kF32), want_src = cast(a, DType::kF32);
  const HostTensor got2 = cast(to_host(out2->view).value(), DType::kF32);
  int64_t wrong = 0, wrong2 = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 37; ++i)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t d = 0; d < 64; ++d) {
          const int64_t e = ((b * 37 + i) * 4 + h) * 64 + d;
          const bool mid = h == 1 || h == 2;
          const bool inside = b == 0 ? (i < 10 || (i < 20 && mid) || (i >= 20 && d >= 1)) : ((i < 30 && mid) || i >= 30);
          if (got.data<float>()[e] != (inside ? want_src.data<float>()[e] : 0.f)) ++wrong;
          if (got2.data<float>()[e] != (i < 30 && mid ? want_src.data<float>()[e] : 0.f)) ++wrong2;
        }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(wrong2, 0);
  EXPECT_EQ(testing::max_abs_diff(to_host(out_st->view).value(), st), 0.0);
  const HostTensor got_f = to_host(out_f->view).value();
  int64_t wrong_f = 0;
  for (int64_t e = 0; e < got_f.numel(); ++e) {
    const int64_t i = (e / (4 * 64)) % 37;
    if (got_f.data<float>()[e] != (i == 36 ? want_src.data<float>()[e] : 0.f)) ++wrong_f;
  }
  EXPECT_EQ(wrong_f, 0);
}

// accumulate (dst += src) and add_cast (dst = src + acc) on strided head slices, both with the
// 8-wide path (D = 64) and the per-element one (D = 12), against the same sums on the CPU.
TEST(FlashSmallKernels, AccumulateAndAddCastOnHeadSlices) {
  SKIP_WITHOUT_GPU();
  for (int64_t D : {64, 12}) {
    const HostTensor part = testing::random_tensor(DType::kBF16, {2, 33, 4, D}, 71);
    const HostTensor acc = testing::random_tensor(DType::kF32, {2, 33, 2, D}, 72);
    auto g_part = to_device(part), g_acc = to_device(acc);
    auto out = device_zeros(DType::kBF16, {2, 33, 4, D});
    const TensorView part_heads = middle_heads(g_part->view), out_heads = middle_heads(out->view);
    ASSERT_TRUE(flash_add_cast(part_heads, g_acc->view, out_heads).ok());
    ASSERT_TRUE(flash_accumulate(part_heads, g_acc->view).ok());
    const HostTensor got_out = to_host(out->view).value(), got_acc = to_host(g_acc->view).value();
    double out_err = 0, acc_err = 0;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t i = 0; i < 33; ++i)
        for (int64_t h = 0; h < 4; ++h)
          for (int64_t d = 0; d < D; ++d) {
            const int64_t e = ((b * 33 + i) * 4 + h) * D + d;
            const bool inside = h == 1 || h == 2;
            const float p = bf16_to_float(part.data<bf16_t>()[e]);
            const float a = inside ? acc.data<float>()[((b * 33 + i) * 2 + h - 1) * D + d] : 0.f;
            const float want_out = inside ? bf16_to_float(float_to_bf16(p + a)) : 0.f;
            out_err = std::max(out_err, double(std::abs(bf16_to_float(got_out.data<bf16_t>()[e]) - want_out)));
            if (inside)
              acc_err = std::max(acc_err, double(std::abs(got_acc.data<float>()[((b * 33 + i) * 2 + h - 1) * D + d] - (p + a))));
          }
    EXPECT_EQ(out_err, 0.0) << "D=" << D;
    EXPECT_EQ(acc_err, 0.0) << "D=" << D;
  }
}

// fill on the views the executors clear: a whole tensor (zeros: one memset), rows of it with two
// batch entries and a head slice (the 8-wide path, D = 64), and a head slice with D = 12 (the
// per-element path), and columns 4 to D - 4 (bf16 rows that start off a 16-byte boundary: the
// per-element path, fp32 ones the 8-wide path); every element inside takes the value, every one
// outside keeps its own.
TEST(FlashSmallKernels, FillSetsTheViewAndNothingElse) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::kBF16, DType::kF32})
    for (int64_t D : {64, 12})
      for (float value : {0.0f, -INFINITY, 1.5f}) {
        const HostTensor before = testing::random_tensor(t, {2, 33, 4, D}, 91);
        const HostTensor before_f = cast(before, DType::kF32);
        for (int which = 0; which < 4; ++which) {
          auto g = to_device(before);
          TensorView view = g->view;
          int64_t row_begin = 0, row_end = 33;
          bool all_heads = true;
          int64_t col_begin = 0, col_end = D;
          if (which == 1) row_begin = 5, row_end = 21, view = view.narrow(1, row_begin, row_end);
          if (which == 2) {  // heads 1 and 2
            view.data = static_cast<char*>(view.data) + D * dtype_size(t);
            view.shape[2] = 2, all_heads = false;
          }
          if (which == 3) {  // columns 4 to D - 4: rows of a multiple of 8 that start off 16 bytes in bf16
            col_begin = 4, col_end = D - 4;
            view.data = static_cast<char*>(view.data) + col_begin * dtype_size(t);
            view.shape[3] = col_end - col_begin;
          }
          ASSERT_TRUE(flash_fill(view, value).ok());
          const HostTensor got = cast(to_host(g->view).value(), DType::kF32);
          int64_t wrong = 0;
          for (int64_t e = 0; e < got.numel(); ++e) {
            const int64_t col = e % D, h = (e / D) % 4, row = (e / (D * 4)) % 33;
            const bool inside = row >= row_begin && row < row_end && (all_heads || h == 1 || h == 2) &&
                                col >= col_begin && col < col_end;
            const float want = inside ? value : before_f.data<float>()[e];
            if (!(got.data<float>()[e] == want)) ++wrong;
          }
          EXPECT_EQ(wrong, 0) << dtype_name(t) << " D=" << D << " value " << value << " view " << which;
        }
      }
}

// The sums the two-rank schedules make in place: out = part + out (bf16 addend, on head
// slices, both the 8-wide and per-element paths), and a merge whose running O is the bf16
// output itself, against the same merge from an fp32 copy of it into a separate output.
TEST(FlashSmallKernels, InPlaceSumsAndMergesInTheOutput) {
  SKIP_WITHOUT_GPU();
  for (int64_t D : {64, 12}) {
    const HostTensor part = testing::random_tensor(DType::kBF16, {2, 33, 4, D}, 81);
    const HostTensor before = testing::random_tensor(DType::kBF16, {2, 33, 4, D}, 82);
    auto g_part = to_device(part), out = to_device(before);
    const TensorView part_heads = middle_heads(g_part->view), out_heads = middle_heads(out->view);
    ASSERT_TRUE(flash_add_cast(part_heads, out_heads, out_heads).ok());
    const HostTensor got = to_host(out->view).value();
    double err = 0;
    for (int64_t e = 0; e < part.numel(); ++e) {
      const int64_t h = (e / D) % 4;
      const float o = bf16_to_float(before.data<bf16_t>()[e]);
      const float want = (h == 1 || h == 2) ? bf16_to_float(float_to_bf16(bf16_to_float(part.data<bf16_t>()[e]) + o)) : o;
      err = std::max(err, double(std::abs(bf16_to_float(got.data<bf16_t>()[e]) - want)));
    }
    EXPECT_EQ(err, 0.0) << "D=" << D;
  }
  const HostTensor o_low = testing::random_tensor(DType::kBF16, {2, 37, 3, 64}, 83);
  const HostTensor o_part = testing::random_tensor(DType::kBF16, {2, 37, 3, 64}, 84);
  HostTensor lse = testing::random_tensor(DType::kF32, {2, 3, 37}, 85);
  HostTensor lse_part = testing::random_tensor(DType::kF32, {2, 3, 37}, 86);
  lse.data<float>()[0] = -INFINITY;
  lse_part.data<float>()[1] = -INFINITY;
  auto in_place = to_device(o_low), in_place_lse = to_device(lse), o_wide = to_device(cast(o_low, DType::kF32));
  auto g_lse = to_device(lse), g_part = to_device(o_part), g_part_lse = to_device(lse_part);
  auto want = device_zeros(DType::kBF16, {2, 37, 3, 64});
  auto want_lse = device_zeros(DType::kF32, {2, 3, 37});
  ASSERT_TRUE(flash_merge_partials_into(o_wide->view, g_lse->view, g_part->view, g_part_lse->view, want->view,
                                        want_lse->view).ok());
  ASSERT_TRUE(flash_merge_partials_into(in_place->view, in_place_lse->view, g_part->view, g_part_lse->view,
                                        in_place->view, in_place_lse->view).ok());
  EXPECT_EQ(testing::max_abs_diff(cast(to_host(in_place->view).value(), DType::kF32),
                                  cast(to_host(want->view).value(), DType::kF32)), 0.0);
  EXPECT_EQ(testing::max_abs_diff(to_host(in_place_lse->view).value(), to_host(want_lse->view).value()), 0.0);
}

// FlashPositions::defaults turns a bottom-right mask alignment (S_q < S_k, the KV-cache
// convention) into position runs; the result matches the oracle's bottom-right mask.
TEST(FlashForward, DefaultPositionsFollowTheAlignment) {
  SKIP_WITHOUT_GPU();
  const HostTensor q = testing::random_tensor(DType::kBF16, {1, 100, 2, 64}, 71);
  const HostTensor k = testing::random_tensor(DType::kBF16, {1, 300, 2, 64}, 72);
  const HostTensor v = testing::random_tensor(DType::kBF16, {1, 300, 2, 64}, 73);
  AttentionParams params;
  params.mask = MaskSpec::causal();
  params.mask.align = MaskAlign::kBottomRight;
  const FlashPositions pos = FlashPositions::defaults(params, 100, 300);
  EXPECT_EQ(pos.q.offset, 200);
  auto gq = to_device(q), gk = to_device(k), gv = to_device(v);
  auto acc = device_zeros(DType::kF32, {1, 100, 2, 64});
  auto lse = device_zeros(DType::kF32, {1, 2, 100});
  auto out = device_zeros(DType::kBF16, {1, 100, 2, 64});
  ASSERT_TRUE(flash_attention_forward(gq->view, gk->view, gv->view, params, pos, acc->view, lse->view,
                                      false, out->view).ok());
  auto oracle = reference_attention(q.view(), k.view(), v.view(), TensorView{}, params);
  ASSERT_TRUE(oracle.ok());
  const ReferenceResult plain = testing::plain_lowp_attention(q, k, v, nullptr, params, DType::kBF16);
  const std::string why = testing::check_lowp_rule("O", cast(to_host(out->view).value(), DType::kF64),
                                                   plain.o, oracle->o, DType::kBF16);
  EXPECT_TRUE(why.empty()) << why;
}

// Scores that climb along the keys (k_j grows with j), so a row's maximum outgrows the
// forward's lazy reference by more than its slack every few tiles and the accumulator is
// rescaled mid-row, while other tiles run on a stale reference: O and LSE under the bf16 rule.
TEST(FlashForward, RowMaximaThatKeepGrowing) {
  SKIP_WITHOUT_GPU();
  const int64_t S = 600, H = 2, D = 128;
  HostTensor q64 = testing::random_tensor(DType::kF64, {1, S, H, D}, 75);
  HostTensor k64 = testing::random_tensor(DType::kF64, {1, S, H, D}, 76);
  for (int64_t i = 0; i < q64.numel(); ++i) q64.data<double>()[i] = 0.5 + 0.5 * std::abs(q64.data<double>()[i]);
  for (int64_t j = 0; j < S; ++j)  // scores about 0.14 (log2 units) higher per key
    for (int64_t e = 0; e < H * D; ++e) {
      double& x = k64.data<double>()[j * H * D + e];
      x = (0.02 + 0.015 * double(j)) * (0.5 + 0.5 * std::abs(x));
    }
  const HostTensor q = cast(q64, DType::kBF16), k = cast(k64, DType::kBF16);
  const HostTensor v = testing::random_tensor(DType::kBF16, {1, S, H, D}, 77);
  AttentionParams params;
  params.mask = MaskSpec::causal();
  auto gq = to_device(q), gk = to_device(k), gv = to_device(v);
  auto acc = device_zeros(DType::kF32, {1, S, H, D});
  auto lse = device_zeros(DType::kF32, {1, H, S});
  auto out = device_zeros(DType::kBF16, {1, S, H, D});
  ASSERT_TRUE(flash_attention_forward(gq->view, gk->view, gv->view, params, FlashPositions::defaults(params, S, S),
                                      acc->view, lse->view, false, out->view).ok());
  auto oracle = reference_attention(q.view(), k.view(), v.view(), TensorView{}, params);
  ASSERT_TRUE(oracle.ok());
  const double last = oracle->lse.data<double>()[S - 1] - oracle->lse.data<double>()[0];
  EXPECT_GT(last, 40.0) << "the scores should climb by more than the slack many times over";
  const ReferenceResult plain = testing::plain_lowp_attention(q, k, v, nullptr, params, DType::kBF16);
  std::string why = testing::check_lowp_rule("O", cast(to_host(out->view).value(), DType::kF64), plain.o,
                                             oracle->o, DType::kBF16);
  EXPECT_TRUE(why.empty()) << why;
  why = testing::check_lowp_rule("LSE", cast(to_host(lse->view).value(), DType::kF64), plain.lse, oracle->lse,
                                 DType::kF32);
  EXPECT_TRUE(why.empty()) << why;
}

// A scale fp32 cannot carry (as scale * log2 e, denormals flushed) is refused before any GPU
// work, by both kernels: this runs without a GPU.
TEST(FlashKernels, RefuseAScaleFp32CannotCarry) {
  const HostTensor q = testing::random_tensor(DType::kBF16, {1, 8, 2, 64}, 1);
  const HostTensor acc(DType::kF32, {1, 8, 2, 64}), lse(DType::kF32, {1, 2, 8});
  for (double scale : {1e-60, -1e-45, 1e60, std::numeric_limits<double>::infinity(),
                       std::numeric_limits<double>::quiet_NaN()}) {
    AttentionParams params;
    params.scale = scale;
    Status s = flash_attention_forward(q.view(), q.view(), q.view(), params, {}, acc.view(), lse.view(), false,
                                       TensorView{});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << scale;
    EXPECT_NE(s.message().find("scale"), std::string::npos) << s.message();
    s = flash_attention_backward(q.view(), q.view(), q.view(), q.view(), lse.view(), lse.view(), params, {},
                                 acc.view(), acc.view(), acc.view());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << scale;
    EXPECT_NE(s.message().find("scale"), std::string::npos) << s.message();
  }
}

TEST(FlashForward, RefusesBadInput) {
  SKIP_WITHOUT_GPU();
  const HostTensor q = testing::random_tensor(DType::kBF16, {1, 64, 2, 96}, 1);  // D = 96
  auto d = to_device(q);
  auto acc = device_zeros(DType::kF32, {1, 64, 2, 96});
  auto lse = device_zeros(DType::kF32, {1, 2, 64});
  Status s = flash_attention_forward(d->view, d->view, d->view, {}, {}, acc->view, lse->view, false, TensorView{});
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  const HostTensor q64 = testing::random_tensor(DType::kBF16, {1, 64, 2, 64}, 1);
  auto d64 = to_device(q64);
  s = flash_attention_forward(d64->view, d64->view, d64->view, {}, {}, acc->view, lse->view, false, TensorView{});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);  // o_acc has the wrong head dim
}

}  // namespace
}  // namespace seqpar
