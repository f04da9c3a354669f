// GPU local attention against the CPU fp64 oracle with the bf16 rule (CONVENTIONS.md): the
// cuDNN backend over masks, GQA ratios, head dims 64/128 and odd lengths, bf16 and fp16.
// Skipped when no GPU is present (CI); run on the GPU machine.
#include <gtest/gtest.h>

#include <cctype>
#include <tuple>

#include "seqpar/cudnn_attention.hpp"
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

}  // namespace
}  // namespace seqpar
