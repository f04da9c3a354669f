// Core: status macros, dtype conversions, tensor views, mask parsing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "seqpar/dtype.hpp"
#include "seqpar/mask.hpp"
#include "seqpar/status.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar {
namespace {

Status fails_when_negative(int x) {
  SP_CHECK_ARG(x >= 0, "x must be >= 0");
  return Status::Ok();
}

TEST(Status, CheckMacroAddsLocation) {
  EXPECT_TRUE(fails_when_negative(1).ok());
  const Status s = fails_when_negative(-1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("test_core.cpp:"), std::string::npos) << s.message();
  EXPECT_NE(s.to_string().find("invalid argument: x must be >= 0"), std::string::npos);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  // 1 + 2^-8 lies exactly between two bf16 values; ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(-INFINITY)), -INFINITY);
}

TEST(DType, Fp16RoundTripsAndSaturates) {
  for (float x : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f}) {
    EXPECT_EQ(fp16_to_float(float_to_fp16(x)), x) << x;
  }
  EXPECT_EQ(fp16_to_float(float_to_fp16(1e6f)), INFINITY);
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + 1.0f / 4096)), 1.0f);  // below half an ulp
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(NAN))));
  EXPECT_EQ(parse_dtype("bf16").value(), DType::kBF16);
  EXPECT_FALSE(parse_dtype("int8").ok());
}

TEST(Tensor, ContiguousViewAndCopy) {
  HostTensor t(DType::kF32, {2, 3, 4, 5});
  EXPECT_EQ(t.numel(), 120);
  EXPECT_EQ(t.bytes(), 480u);
  EXPECT_TRUE(t.view().is_contiguous());
  EXPECT_EQ(t.view().strides[1], 20);
  t.data<float>()[7] = 3.0f;
  HostTensor copy = t;
  copy.data<float>()[7] = 4.0f;
  EXPECT_EQ(t.data<float>()[7], 3.0f);
  EXPECT_NE(copy.view().data, t.view().data);
  EXPECT_EQ(t.view().shape_string(), "[2, 3, 4, 5] fp32");
}

// A narrowed view: the same memory from the first kept index, that extent shorter, and the
// span (what the cuDNN and overlap checks measure) from its first to its last element.
TEST(Tensor, NarrowAndSpan) {
  HostTensor t(DType::kF32, {2, 3, 4, 5});
  for (int64_t e = 0; e < t.numel(); ++e) t.data<float>()[e] = float(e);
  const TensorView heads = t.view().narrow(2, 1, 3);  // [2, 3, 2, 5], heads 1 and 2
  EXPECT_EQ(heads.shape[2], 2);
  EXPECT_EQ(heads.strides[2], 5);
  EXPECT_EQ(static_cast<const float*>(heads.data)[0], 5.0f);  // (0, 0, 1, 0)
  EXPECT_FALSE(heads.is_contiguous());
  EXPECT_EQ(heads.span_elements(), 60 + 40 + 5 + 4 + 1);  // its last element: (1, 2, 1, 4) of the narrowed view
  EXPECT_EQ(t.view().span_elements(), 120);
  EXPECT_EQ(t.view().narrow(1, 2, 2).span_elements(), 0);  // empty
}

TEST(Mask, ParseAndDescribe) {
  EXPECT_EQ(parse_mask("causal", 10).value().describe(), "causal");
  EXPECT_EQ(parse_mask("full", 10).value().describe(), "full");
  const MaskSpec w = parse_mask("window:3,1", 10).value();
  EXPECT_EQ(w.window_left, 3);
  EXPECT_EQ(w.window_right, 1);
  EXPECT_TRUE(w.band_allows(5, 2));
  EXPECT_FALSE(w.band_allows(5, 1));
  EXPECT_FALSE(w.band_allows(5, 7));
  const MaskSpec d = parse_mask("docs:3", 12).value();
  ASSERT_EQ(d.doc_offsets.size(), 4u);
  EXPECT_EQ(d.doc_offsets.front(), 0);
  EXPECT_EQ(d.doc_offsets.back(), 12);
  EXPECT_TRUE(d.validate(12).ok());
  EXPECT_FALSE(d.validate(13).ok());
  for (const char* bad : {"windo:1,2", "window:1", "window:-5,0", "docs:0", "docs:99", "x", "docs-lognormal:",
                          "docs-lognormal:0", "docs-lognormal:8,-1", "docs-lognormal:8,2,", "docs-lognormal:8,2,1,4"})
    EXPECT_FALSE(parse_mask(bad, 12).ok()) << bad;
}

// Lognormal documents: seeded (the same offsets every time, others for another seed), covering
// the sequence, each at least one token, the mean near the one asked for over many documents,
// and a long tail that the sequence's end cuts.
TEST(Mask, LognormalDocuments) {
  const int64_t S = int64_t(1) << 26;
  const MaskSpec a = parse_mask("docs-lognormal:8192", S).value();
  EXPECT_EQ(a.doc_offsets, parse_mask("docs-lognormal:8192,2,1", S).value().doc_offsets);
  EXPECT_NE(a.doc_offsets, parse_mask("docs-lognormal:8192,2,2", S).value().doc_offsets);
  ASSERT_TRUE(a.validate(S).ok());
  EXPECT_EQ(a.doc_offsets.back(), S);
  int64_t longest = 0, over_16x = 0;
  for (size_t d = 1; d < a.doc_offsets.size(); ++d) {
    const int64_t len = a.doc_offsets[d] - a.doc_offsets[d - 1];
    EXPECT_GE(len, 1);
    longest = std::max(longest, len);
    over_16x += len > 16 * 8192;
  }
  const double docs = double(a.doc_offsets.size() - 1);
  EXPECT_NEAR(double(S) / docs, 8192.0, 8192.0 * 0.25);  // 8K documents: the mean within 25%
  EXPECT_GT(over_16x, 0);
  EXPECT_LT(double(over_16x), 0.02 * docs);
  // Capped at the sequence: one document may cover it all, never more.
  const MaskSpec one = parse_mask("docs-lognormal:1e9,0", 1000).value();
  EXPECT_EQ(one.doc_offsets, (std::vector<int64_t>{0, 1000}));
  // sigma 0: every document the mean, the last cut.
  EXPECT_EQ(parse_mask("docs-lognormal:4,0", 10).value().doc_offsets, (std::vector<int64_t>{0, 4, 8, 10}));
}

}  // namespace
}  // namespace seqpar
