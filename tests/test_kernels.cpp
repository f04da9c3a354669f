// CPU kernels: the oracle checked by finite differences, the fast kernels checked against the
// oracle over masks, GQA ratios, head dims, uneven lengths and both dtypes; continuation,
// fully masked rows and the -inf-safe merge. Also the mask arithmetic of our CUDA kernels
// (kernels/cuda/mask_runs.hpp, plain C++ on the host) against brute force.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/cuda/mask_runs.hpp"
#include "seqpar/attention.hpp"
#include "test_util.hpp"

namespace seqpar {
namespace {

using testing::cast;
using testing::max_abs;
using testing::max_abs_diff;
using testing::random_tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Problem {
  int64_t batch, seq_q, seq_k, heads, kv_heads, head_dim;
};

struct Inputs {
  HostTensor q, k, v, dout;
};

Inputs make_inputs(const Problem& p, DType dtype, uint64_t seed) {
  return {random_tensor(dtype, {p.batch, p.seq_q, p.heads, p.head_dim}, seed),
          random_tensor(dtype, {p.batch, p.seq_k, p.kv_heads, p.head_dim}, seed + 1),
          random_tensor(dtype, {p.batch, p.seq_k, p.kv_heads, p.head_dim}, seed + 2),
          random_tensor(dtype, {p.batch, p.seq_q, p.heads, p.head_dim}, seed + 3)};
}

// Runs the fast forward and backward; returns o, lse, dq, dk, dv.
struct Fast {
  HostTensor o, lse, dq, dk, dv;
};
Fast run_fast(const Inputs& in, const AttentionParams& params) {
  const auto& q = in.q.view();
  const DType t = q.dtype;
  const int64_t B = q.shape[0], Sq = q.shape[1], H = q.shape[2], D = q.shape[3];
  const int64_t Sk = in.k.view().shape[1], Hkv = in.k.view().shape[2];
  Fast f{HostTensor(t, {B, Sq, H, D}), HostTensor(t, {B, H, Sq}), HostTensor(t, {B, Sq, H, D}),
         HostTensor(t, {B, Sk, Hkv, D}), HostTensor(t, {B, Sk, Hkv, D})};
  EXPECT_TRUE(cpu_attention_forward(in.q.view(), in.k.view(), in.v.view(), params, f.o.view(),
                                    f.lse.view(), false)
                  .ok());
  HostTensor delta(t, {B, H, Sq});
  EXPECT_TRUE(cpu_attention_delta(f.o.view(), in.dout.view(), delta.view()).ok());
  const Status s = cpu_attention_backward(in.q.view(), in.k.view(), in.v.view(), in.dout.view(),
                                          f.lse.view(), delta.view(), params, f.dq.view(),
                                          f.dk.view(), f.dv.view());
  EXPECT_TRUE(s.ok()) << s.to_string();
  return f;
}

// Relative tolerance by dtype (CONVENTIONS.md): fp64 ~1e-12, fp32 ~1e-5 of the largest value.
double tolerance(DType t, const HostTensor& reference) {
  return (t == DType::kF64 ? 1e-12 : 1e-5) * std::max(1.0, max_abs(reference));
}

void expect_matches_oracle(const Inputs& in, const AttentionParams& params, const char* what) {
  const DType t = in.q.view().dtype;
  auto ref = reference_attention(in.q.view(), in.k.view(), in.v.view(), in.dout.view(), params);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const Fast f = run_fast(in, params);
  EXPECT_LE(max_abs_diff(f.o, ref->o), tolerance(t, ref->o)) << what << " O";
  EXPECT_LE(max_abs_diff(f.lse, ref->lse), tolerance(t, ref->lse)) << what << " LSE";
  EXPECT_LE(max_abs_diff(f.dq, ref->dq), tolerance(t, ref->dq)) << what << " dQ";
  EXPECT_LE(max_abs_diff(f.dk, ref->dk), tolerance(t, ref->dk)) << what << " dK";
  EXPECT_LE(max_abs_diff(f.dv, ref->dv), tolerance(t, ref->dv)) << what << " dV";
}

TEST(Oracle, SingleKeyGivesValueAndScore) {
  const Inputs in = make_inputs({1, 3, 1, 2, 1, 4}, DType::kF64, 7);
  auto ref = reference_attention(in.q.view(), in.k.view(), in.v.view(), in.dout.view(), {});
  ASSERT_TRUE(ref.ok());
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 3; ++i) {
      double score = 0;
      for (int d = 0; d < 4; ++d)
        score += in.q.data<double>()[(i * 2 + h) * 4 + d] * in.k.data<double>()[d] / 2.0;
      EXPECT_NEAR(ref->lse.data<double>()[h * 3 + i], score, 1e-14);
      for (int d = 0; d < 4; ++d)
        EXPECT_NEAR(ref->o.data<double>()[(i * 2 + h) * 4 + d], in.v.data<double>()[d], 1e-14);
    }
}

// The oracle's gradients against central finite differences of L = sum(O * dO).
TEST(Oracle, GradientsMatchFiniteDifferences) {
  Inputs in = make_inputs({1, 5, 7, 2, 1, 3}, DType::kF64, 11);
  AttentionParams params;
  params.mask = MaskSpec::window(3, 1);
  params.mask.align = MaskAlign::kBottomRight;
  auto loss = [&]() {
    auto r = reference_attention(in.q.view(), in.k.view(), in.v.view(), TensorView{}, params);
    double l = 0;
    for (int64_t i = 0; i < r->o.numel(); ++i)
      l += r->o.data<double>()[i] * in.dout.data<double>()[i];
    return l;
  };
  auto ref = reference_attention(in.q.view(), in.k.view(), in.v.view(), in.dout.view(), params);
  ASSERT_TRUE(ref.ok());
  const double eps = 1e-6;
  for (auto [tensor, grad] : {std::pair{&in.q, &ref->dq}, std::pair{&in.k, &ref->dk},
                              std::pair{&in.v, &ref->dv}}) {
    for (int64_t i = 0; i < tensor->numel(); ++i) {
      double& x = tensor->data<double>()[i];
      const double saved = x;
      x = saved + eps;
      const double up = loss();
      x = saved - eps;
      const double down = loss();
      x = saved;
      EXPECT_NEAR(grad->data<double>()[i], (up - down) / (2 * eps), 1e-8) << "element " << i;
    }
  }
}

// The query side alone (how million-token runs are checked): O, LSE and dQ of the chosen rows,
// kept in list order, equal the full oracle's bit for bit, and dK/dV are not computed. Its K/V
// rows are streamed (converted as read, no fp64 copy), from fp64 and from bf16 inputs. Two
// shapes: GQA self-attention, and S_q > S_k aligned bottom-right, where rows 0-3 see no key
// (O = 0, LSE = -inf) and each key is seen by only some of the chosen rows.
struct QuerySideCase {
  Problem problem;
  MaskAlign align;
  std::vector<int64_t> rows;
};
class OracleQuerySide : public ::testing::TestWithParam<std::tuple<DType, QuerySideCase>> {};

TEST_P(OracleQuerySide, MatchesTheFullOracleOnItsRows) {
  const auto& [dtype, c] = GetParam();
  const Inputs in = make_inputs(c.problem, dtype, 13);
  AttentionParams params;
  params.mask = MaskSpec::causal();
  params.mask.align = c.align;
  ReferenceRows rows;
  rows.query_rows = c.rows;
  rows.query_side_only = true;
  auto part = reference_attention(in.q.view(), in.k.view(), in.v.view(), in.dout.view(), params, rows);
  auto full = reference_attention(in.q.view(), in.k.view(), in.v.view(), in.dout.view(), params);
  ASSERT_TRUE(part.ok() && full.ok());
  EXPECT_EQ(part->dk.view().data, nullptr);
  EXPECT_EQ(part->dv.view().data, nullptr);
  const int64_t B = c.problem.batch, S = c.problem.seq_q, H = c.problem.heads, D = c.problem.head_dim;
  const int64_t R = static_cast<int64_t>(c.rows.size());
  ASSERT_EQ(part->o.view().shape[1], R);
  ASSERT_EQ(part->lse.view().shape[2], R);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < R; ++r) {
      const int64_t i = c.rows[r];
      for (int64_t h = 0; h < H; ++h) {
        EXPECT_EQ(part->lse.data<double>()[(b * H + h) * R + r], full->lse.data<double>()[(b * H + h) * S + i]);
        for (int64_t d = 0; d < D; ++d) {
          const int64_t e = ((b * R + r) * H + h) * D + d, f = ((b * S + i) * H + h) * D + d;
          EXPECT_EQ(part->o.data<double>()[e], full->o.data<double>()[f]);
          EXPECT_EQ(part->dq.data<double>()[e], full->dq.data<double>()[f]);
        }
      }
    }
  // How a full-length result is put beside these rows (take_rows), and that comparing tensors of
  // different shapes fails instead of reading past the shorter one.
  EXPECT_EQ(max_abs_diff(testing::take_rows(full->o, 1, c.rows), part->o), 0.0);
  EXPECT_EQ(max_abs_diff(testing::take_rows(full->lse, 2, c.rows), part->lse), 0.0);
  EXPECT_EQ(max_abs_diff(testing::take_rows(full->dq, 1, c.rows), part->dq), 0.0);
  EXPECT_TRUE(std::isinf(testing::max_abs_diff_rows(full->o, part->o, 1, c.rows)));
  rows.key_rows = {1};
  EXPECT_FALSE(reference_attention(in.q.view(), in.k.view(), in.v.view(), in.dout.view(), params, rows).ok());
  rows.key_rows = {};
  rows.query_rows = {0, 4, 4};  // a repeated row would be added twice
  EXPECT_FALSE(reference_attention(in.q.view(), in.k.view(), in.v.view(), in.dout.view(), params, rows).ok());
}
INSTANTIATE_TEST_SUITE_P(
    Inputs, OracleQuerySide,
    ::testing::Combine(::testing::Values(DType::kF64, DType::kBF16),
                       ::testing::Values(QuerySideCase{{2, 9, 9, 4, 2, 8}, MaskAlign::kTopLeft, {8, 0, 4}},
                                         QuerySideCase{{1, 9, 5, 2, 1, 8}, MaskAlign::kBottomRight, {6, 1, 8, 3}})),
    [](const auto& info) {  // (no structured binding: its comma would split the macro's arguments)
      const bool bottom_right = std::get<1>(info.param).align == MaskAlign::kBottomRight;
      return std::string(dtype_name(std::get<0>(info.param))) + (bottom_right ? "_Sq9_Sk5_bottom_right" : "_gqa");
    });

// (mask, GQA heads/kv_heads, head dim, dtype)
using KernelCase = std::tuple<std::string, std::pair<int, int>, int, DType>;
class FastKernelVsOracle : public ::testing::TestWithParam<KernelCase> {};

TEST_P(FastKernelVsOracle, SelfAttentionUnevenLength) {
  const auto& [mask_text, heads, head_dim, dtype] = GetParam();
  const int64_t seq = 150;  // not a multiple of the 64-row tiles
  const Problem p{2, seq, seq, heads.first, heads.second, head_dim};
  AttentionParams params;
  params.mask = parse_mask(mask_text, seq).value();
  expect_matches_oracle(make_inputs(p, dtype, 100 + head_dim), params, mask_text.c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Masks, FastKernelVsOracle,
    ::testing::Combine(::testing::Values("full", "causal", "window:20,5", "window:0,30", "docs:4",
                                         "bigbird:1,1,1,B=8", "bigbird-causal:1,1,2,B=16",
                                         "bigbird:0,0,1,B=64"),
                       ::testing::Values(std::pair{4, 4}, std::pair{4, 2}, std::pair{4, 1}),
                       ::testing::Values(16, 40, 64), ::testing::Values(DType::kF64, DType::kF32)));

TEST(FastKernel, CrossLengthsBottomRightAndExplicitPositions) {
  for (DType t : {DType::kF64, DType::kF32}) {
    // S_q < S_k with bottom-right alignment: the KV-cache convention.
    AttentionParams br;
    br.mask = MaskSpec::causal();
    br.mask.align = MaskAlign::kBottomRight;
    expect_matches_oracle(make_inputs({1, 37, 130, 3, 1, 32}, t, 5), br, "bottom-right");
    // Arbitrary global positions (a zigzag-like shard against a striped one).
    std::vector<int64_t> qp, kp;
    for (int64_t i = 0; i < 40; ++i) qp.push_back(i < 20 ? i : 200 + i);
    for (int64_t j = 0; j < 90; ++j) kp.push_back(3 * j + 1);
    AttentionParams pos;
    pos.mask = MaskSpec::window(60, 0);
    pos.q_positions = qp.data();
    pos.k_positions = kp.data();
    expect_matches_oracle(make_inputs({1, 40, 90, 2, 2, 16}, t, 6), pos, "positions");
    pos.mask = parse_mask("bigbird-causal:1,1,1,B=16", 270).value();  // block-sparse on them
    expect_matches_oracle(make_inputs({1, 40, 90, 2, 2, 16}, t, 6), pos, "positions, bigbird");
  }
}

TEST(FastKernel, ForwardContinuesFromRunningResult) {
  for (DType t : {DType::kF64, DType::kF32}) {
    const Inputs in = make_inputs({2, 70, 100, 4, 2, 32}, t, 21);
    AttentionParams params;
    params.mask = MaskSpec::causal();
    params.mask.align = MaskAlign::kBottomRight;
    const Fast whole = run_fast(in, params);
    // Same keys in two calls: positions 0..59 then 60..99, second call accumulating.
    std::vector<int64_t> qp(70), kp(100);
    for (int i = 0; i < 70; ++i) qp[i] = i + 30;
    for (int j = 0; j < 100; ++j) kp[j] = j;
    auto key_slice = [&](const HostTensor& x, int64_t from, int64_t n) {
      TensorView v = x.view();
      v.data = static_cast<char*>(v.data) + from * v.strides[1] * dtype_size(t);
      v.shape[1] = n;
      return v;
    };
    HostTensor o(t, {2, 70, 4, 32}), lse(t, {2, 4, 70});
    for (auto [from, n, acc] : {std::tuple{0, 60, false}, std::tuple{60, 40, true}}) {
      AttentionParams part = params;
      part.q_positions = qp.data();
      part.k_positions = kp.data() + from;
      ASSERT_TRUE(cpu_attention_forward(in.q.view(), key_slice(in.k, from, n),
                                        key_slice(in.v, from, n), part, o.view(), lse.view(), acc)
                      .ok());
    }
    EXPECT_LE(max_abs_diff(o, whole.o), tolerance(t, whole.o));
    EXPECT_LE(max_abs_diff(lse, whole.lse), tolerance(t, whole.lse));
  }
}

TEST(FastKernel, FullyMaskedRowsGiveZeroAndMinusInf) {
  for (DType t : {DType::kF64, DType::kF32}) {
    // Bottom-right causal with S_q > S_k: the first 20 query rows see no key at all.
    const Inputs in = make_inputs({1, 50, 30, 2, 1, 16}, t, 3);
    AttentionParams params;
    params.mask = MaskSpec::causal();
    params.mask.align = MaskAlign::kBottomRight;
    const Fast f = run_fast(in, params);
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 50; ++i) {
        const double lse = cast(f.lse, DType::kF64).data<double>()[h * 50 + i];
        if (i < 20) EXPECT_EQ(lse, -kInf) << i;
        else EXPECT_TRUE(std::isfinite(lse)) << i;
      }
    const HostTensor o = cast(f.o, DType::kF64), dq = cast(f.dq, DType::kF64);
    for (int i = 0; i < 20 * 2 * 16; ++i) {
      EXPECT_EQ(o.data<double>()[i], 0.0);
      EXPECT_EQ(dq.data<double>()[i], 0.0);
    }
    for (const HostTensor* g : {&f.dk, &f.dv}) EXPECT_LT(max_abs(*g), kInf);
    expect_matches_oracle(in, params, "masked rows");
  }
}

TEST(FastKernel, BackwardAccumulates) {
  const Inputs in = make_inputs({1, 33, 33, 2, 2, 16}, DType::kF64, 8);
  AttentionParams params;
  const Fast once = run_fast(in, params);
  HostTensor delta(DType::kF64, {1, 2, 33});
  ASSERT_TRUE(cpu_attention_delta(once.o.view(), in.dout.view(), delta.view()).ok());
  Fast twice = once;
  ASSERT_TRUE(cpu_attention_backward(in.q.view(), in.k.view(), in.v.view(), in.dout.view(),
                                     once.lse.view(), delta.view(), params, twice.dq.view(),
                                     twice.dk.view(), twice.dv.view())
                  .ok());
  for (int64_t i = 0; i < once.dk.numel(); ++i)
    EXPECT_NEAR(twice.dk.data<double>()[i], 2 * once.dk.data<double>()[i], 1e-13);
}

TEST(FastKernel, RefusesBadInput) {
  const Inputs in = make_inputs({1, 8, 8, 3, 2, 16}, DType::kF32, 1);  // 3 heads, 2 kv heads
  HostTensor o(DType::kF32, {1, 8, 3, 16}), lse(DType::kF32, {1, 3, 8});
  Status s = cpu_attention_forward(in.q.view(), in.k.view(), in.v.view(), {}, o.view(),
                                   lse.view(), false);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("divisible"), std::string::npos) << s.message();
  const Inputs bf = make_inputs({1, 8, 8, 2, 2, 16}, DType::kBF16, 1);
  HostTensor ob(DType::kBF16, {1, 8, 2, 16}), lb(DType::kBF16, {1, 2, 8});
  s = cpu_attention_forward(bf.q.view(), bf.k.view(), bf.v.view(), {}, ob.view(), lb.view(), false);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  HostTensor wrong_lse(DType::kF32, {1, 8, 2});
  const Inputs ok = make_inputs({1, 8, 8, 2, 2, 16}, DType::kF32, 1);
  s = cpu_attention_forward(ok.q.view(), ok.k.view(), ok.v.view(), {}, o.view(),
                            wrong_lse.view(), false);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(Merge, EqualsOneCallAndIsSafeForInfinities) {
  // Two disjoint key halves merged equal attention over all keys.
  Inputs in = make_inputs({1, 20, 40, 2, 2, 16}, DType::kF64, 4);
  const Fast whole = run_fast(in, {});
  std::vector<int64_t> kp(40);
  for (int j = 0; j < 40; ++j) kp[j] = j;
  HostTensor o1(DType::kF64, {1, 20, 2, 16}), l1(DType::kF64, {1, 2, 20});
  HostTensor o2 = o1, l2 = l1;
  for (auto [o, l, from] : {std::tuple{&o1, &l1, 0}, std::tuple{&o2, &l2, 20}}) {
    TensorView k = in.k.view(), v = in.v.view();
    k.data = in.k.data<double>() + from * k.strides[1];
    v.data = in.v.data<double>() + from * v.strides[1];
    k.shape[1] = v.shape[1] = 20;
    AttentionParams part;
    part.k_positions = kp.data() + from;
    ASSERT_TRUE(cpu_attention_forward(in.q.view(), k, v, part, o->view(), l->view(), false).ok());
  }
  ASSERT_TRUE(merge_attention_partials(o1.view(), l1.view(), o2.view(), l2.view()).ok());
  EXPECT_LE(max_abs_diff(o1, whole.o), 1e-13);
  EXPECT_LE(max_abs_diff(l1, whole.lse), 1e-13);

  // Row-wise infinities: (-inf, finite), (finite, -inf), (-inf, -inf), (+inf from a backend).
  HostTensor o(DType::kF64, {1, 4, 1, 2}), lse(DType::kF64, {1, 1, 4});
  HostTensor op(DType::kF64, {1, 4, 1, 2}), lp(DType::kF64, {1, 1, 4});
  const double run_lse[4] = {-kInf, 0.5, -kInf, kInf};
  const double part_lse[4] = {0.25, -kInf, -kInf, 1.0};
  for (int i = 0; i < 4; ++i) {
    lse.data<double>()[i] = run_lse[i];
    lp.data<double>()[i] = part_lse[i];
    for (int d = 0; d < 2; ++d) {
      o.data<double>()[i * 2 + d] = run_lse[i] == 0.5 ? 3.0 : 0.0;
      op.data<double>()[i * 2 + d] = part_lse[i] > -kInf ? 7.0 : 0.0;
    }
  }
  ASSERT_TRUE(merge_attention_partials(o.view(), lse.view(), op.view(), lp.view()).ok());
  const double want_lse[4] = {0.25, 0.5, -kInf, 1.0};
  const double want_o[4] = {7.0, 3.0, 0.0, 7.0};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(lse.data<double>()[i], want_lse[i]) << i;
    EXPECT_EQ(o.data<double>()[i * 2], want_o[i]) << i;
  }
}

// ---- the CUDA kernels' mask arithmetic, on the host ------------------------------------------

// Position runs and masks as the kernels get them: offsets, strides, windows bounded or not on
// either side, and documents in order (the first from 0, the last past every position).
cuda::MaskRuns random_mask_runs(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  cuda::MaskRuns m{};
  m.q_offset = pick(0, 400);
  m.q_stride = pick(0, 2) ? 1 : pick(2, 4);
  m.k_offset = pick(0, 400);
  m.k_stride = pick(0, 2) ? 1 : pick(2, 4);
  m.window_left = pick(0, 2) ? -1 : pick(0, 150);
  m.window_right = pick(0, 2) ? pick(0, 1) * pick(0, 40) : -1;
  if (pick(0, 2) == 0) {
    m.num_docs = int(pick(1, 6));
    std::vector<int64_t> cuts;
    for (int d = 1; d < m.num_docs; ++d) cuts.push_back(pick(1, 2000));
    std::sort(cuts.begin(), cuts.end());
    m.doc_offsets[0] = 0;
    for (int d = 1; d < m.num_docs; ++d) m.doc_offsets[d] = std::max(cuts[d - 1], m.doc_offsets[d - 1] + 1);
    m.doc_offsets[m.num_docs] = m.doc_offsets[m.num_docs - 1] + 4000;
  }
  return m;
}

// The backward walks only the rows rows_with returns, so they must be exactly the rows whose
// intervals touch (or cover) the key block: a wrong run loses or double-counts gradients.
TEST(MaskRuns, RowsWithFindsExactlyTheRowsThatSeeAKeyBlock) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const cuda::MaskRuns m = random_mask_runs(rng);
    const int seq_q = int(std::uniform_int_distribution<int>(1, 300)(rng));
    const int key0 = int(std::uniform_int_distribution<int>(0, 300)(rng));
    const int keys = int(std::uniform_int_distribution<int>(1, 64)(rng));
    const int64_t first = m.k_offset + m.k_stride * key0, last = first + m.k_stride * (keys - 1);
    int seen_begin, seen_end, full_begin, full_end;
    cuda::rows_with(m, seq_q, first, last, &seen_begin, &seen_end);
    cuda::rows_with(m, seq_q, last, first, &full_begin, &full_end);
    for (int row = 0; row < seq_q; ++row) {
      const cuda::RowInterval iv = cuda::row_interval(m, row, seq_q);
      const bool sees = iv.lo <= last && iv.hi >= first, sees_all = iv.lo <= first && iv.hi >= last;
      ASSERT_EQ(sees, row >= seen_begin && row < seen_end) << "trial " << trial << " row " << row;
      ASSERT_EQ(sees_all, row >= full_begin && row < full_end) << "trial " << trial << " row " << row;
    }
  }
}

// visible_columns turns a row's interval into the block's columns it sees; each column's
// position must fall in the interval exactly when it is in [c_lo, c_hi].
TEST(MaskRuns, VisibleColumnsAreTheColumnsInsideTheRowsInterval) {
  std::mt19937_64 rng(12);
  for (int trial = 0; trial < 2000; ++trial) {
    const cuda::MaskRuns m = random_mask_runs(rng);
    const int seq_q = 300;
    const int row = int(std::uniform_int_distribution<int>(0, seq_q - 1)(rng));
    const int key0 = int(std::uniform_int_distribution<int>(0, 300)(rng));
    const int n = int(std::uniform_int_distribution<int>(1, 64)(rng));
    const int64_t first = m.k_offset + m.k_stride * key0;
    const cuda::RowInterval iv = cuda::row_interval(m, row, seq_q);
    int c_lo, c_hi;
    cuda::visible_columns(m, first, iv, n, &c_lo, &c_hi);
    for (int c = 0; c < n; ++c) {
      const int64_t kp = first + m.k_stride * c;
      ASSERT_EQ(kp >= iv.lo && kp <= iv.hi, c >= c_lo && c <= c_hi) << "trial " << trial << " column " << c;
    }
  }
}

}  // namespace
}  // namespace seqpar
