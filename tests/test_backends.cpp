// Every local-attention backend of this build (all_backends(): the CPU kernels, the fp64
// oracle, and on a GPU our CUDA kernels, cuDNN, the Hopper kernels and "auto", which hands each call
// to one of them) runs every step kind a schedule needs
// against the fp64 oracle computed whole (ggml's test-backend-ops is the model): forward
// continued over two key blocks, backward added over two key blocks against the final LSE and
// D (or O), both again from fresh outputs, delta, merge and accumulate. Rows sit at explicit
// global positions (two query runs, two key runs), as in a zigzag or striped shard (suite Masks), or
// each side one run, as a contiguous shard pair of a ring step is (suite ShardPairs: head dims 64
// and 128, GQA, causal diagonals at offsets, rows and pairs that see no key, odd lengths, and the
// masks the Hopper kernels run as visible-tile lists: documents, windows, block-sparse patterns), or
// each side several runs (suite ManyRuns: zigzag and documents-layout shards, striped ones, and the
// gathered shards of Ulysses whose positions do not increase throughout).
// CPU backends run fp64 (1e-10); GPU backends bf16 under the bf16 rule. A backend that refuses a
// problem must say why (in supports(), or in its first call's status once it sees K/V).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <numeric>
#include <random>
#include <set>
#include <tuple>
#include <utility>

#include "seqpar/backend.hpp"
#include "kernels/hopper/hopper_tiles.hpp"
#include "seqpar/gpu.hpp"
#include "hopper_mask_draws.hpp"
#include "test_util.hpp"

namespace seqpar {
namespace {

using testing::cast;

// A shard pair: dims, the mask, and the rows' global positions as runs of consecutive positions
// (start, rows); the keys are passed in two blocks, rows [0, half) and [half, S_k).
struct Case {
  using Runs = std::vector<std::pair<int64_t, int64_t>>;
  // A constructor rather than aggregate initialisation, so cases may leave out the trailing
  // scale and docs without -Wmissing-field-initializers.
  Case(std::string name_, std::string mask_, int64_t B_, int64_t H_, int64_t Hkv_, int64_t D_, Runs q_runs_,
       Runs k_runs_, int64_t half_, double scale_ = 0, std::vector<int64_t> docs_ = {})
      : name(std::move(name_)), mask(std::move(mask_)), B(B_), H(H_), Hkv(Hkv_), D(D_), q_runs(std::move(q_runs_)),
        k_runs(std::move(k_runs_)), half(half_), scale(scale_), docs(std::move(docs_)) {}
  std::string name, mask;
  int64_t B, H, Hkv, D;
  Runs q_runs, k_runs;
  int64_t half;
  double scale;  // 0: 1/sqrt(D)
  std::vector<int64_t> docs;  // document offsets ANDed with the mask (empty: the mask's own)
  int64_t seq_q() const {
    int64_t n = 0;
    for (const auto& r : q_runs) n += r.second;
    return n;
  }
  int64_t seq_k() const {
    int64_t n = 0;
    for (const auto& r : k_runs) n += r.second;
    return n;
  }
};

// The Masks suite's pair: two query runs and two key runs (each key block one run), D = 64, GQA 4:2.
Case zigzag_case(const std::string& mask) {
  return Case{mask, mask, 1, 4, 2, 64, {{100, 35}, {300, 35}}, {{60, 45}, {290, 45}}, 45};
}

std::vector<int64_t> positions_of(const std::vector<std::pair<int64_t, int64_t>>& runs) {
  std::vector<int64_t> p;
  for (const auto& [start, n] : runs)
    for (int64_t i = 0; i < n; ++i) p.push_back(start + i);
  return p;
}

struct Problem {
  std::vector<int64_t> q_pos, k_pos;
  AttentionParams params;  // positions point into q_pos, k_pos
  HostTensor q, k, v, dout;
  ReferenceResult ref;  // whole, in fp64
  HostTensor delta;     // rowsum(dO * O) of the oracle
};

Problem make_problem(const Case& c, DType dtype) {
  const int64_t kB = c.B, kH = c.H, kHkv = c.Hkv, kD = c.D, kSq = c.seq_q(), kSk = c.seq_k();
  Problem p;
  // Keys in runs, the later ones ahead of some queries: dense blocks for cuDNN's planner too
  // (strided shards are the GPU schedule test's).
  p.q_pos = positions_of(c.q_runs);
  p.k_pos = positions_of(c.k_runs);
  p.params.mask = parse_mask(c.mask, 400).value();
  if (!c.docs.empty()) p.params.mask.doc_offsets = c.docs;
  p.params.scale = c.scale;
  p.params.q_positions = p.q_pos.data();
  p.params.k_positions = p.k_pos.data();
  p.q = testing::random_tensor(dtype, {kB, kSq, kH, kD}, 31);
  p.k = testing::random_tensor(dtype, {kB, kSk, kHkv, kD}, 32);
  p.v = testing::random_tensor(dtype, {kB, kSk, kHkv, kD}, 33);
  p.dout = testing::random_tensor(dtype, {kB, kSq, kH, kD}, 34);
  p.ref = reference_attention(p.q.view(), p.k.view(), p.v.view(), p.dout.view(), p.params).value();
  p.delta = HostTensor(DType::kF64, {kB, kH, kSq});
  (void)cpu_oracle_backend().delta(p.ref.o.view(), cast(p.dout, DType::kF64).view(), p.delta.view(), nullptr);
  return p;
}

// Tensors where a backend computes: host for CPU backends, device for GPU ones.
struct Place {
  Place(bool on_device, DType input_dtype, DType acc_dtype) : device(on_device), input(input_dtype), acc(acc_dtype) {}
  bool device;
  DType input, acc;  // inputs; running results and row stats
  StatusOr<TensorView> put(const HostTensor& h, DType dtype, std::vector<DeviceTensor>* keep) const {
    const HostTensor c = cast(h, dtype);
    if (!device) {
      keep_host.push_back(c);
      return keep_host.back().view();
    }
    SP_ASSIGN_OR_RETURN(DeviceTensor d, to_device(c));
    keep->push_back(std::move(d));
    return keep->back().view;
  }
  StatusOr<HostTensor> get(const TensorView& t) const {
    if (!device) {  // a whole contiguous tensor this place made
      HostTensor h(t.dtype, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim));
      std::memcpy(h.view().data, t.data, h.bytes());
      return cast(h, DType::kF64);
    }
    SP_ASSIGN_OR_RETURN(HostTensor h, to_host(t));
    return cast(h, DType::kF64);
  }
  mutable std::deque<HostTensor> keep_host;
};

HostTensor filled(DType dtype, const std::vector<int64_t>& shape, double value) {
  HostTensor t(DType::kF64, shape);
  for (int64_t i = 0; i < t.view().numel(); ++i) t.view().as<double>()[i] = value;
  return cast(t, dtype);
}

// Keys [begin, end) of the pair: the K/V rows and their positions.
AttentionParams keys_of(const Problem& p, int64_t begin) {
  AttentionParams a = p.params;
  a.k_positions = p.k_pos.data() + begin;
  return a;
}

void every_step_kind(const Case& c) {
  const int64_t kB = c.B, kH = c.H, kHkv = c.Hkv, kD = c.D, kSq = c.seq_q(), kSk = c.seq_k(), kHalf = c.half;
  for (const AttentionBackend* backend : all_backends()) {
    SCOPED_TRACE(backend->name());
    const BackendCaps caps = backend->caps();
    if (caps.device && cuda_device_count() == 0) continue;  // GPU backends need a device
    const Place at{caps.device, caps.device ? DType::kBF16 : DType::kF64, caps.device ? DType::kF32 : DType::kF64};
    const Problem p = make_problem(c, at.input);
    std::vector<DeviceTensor> keep;
    const TensorView q = at.put(p.q, at.input, &keep).value();
    const std::string why_not = backend->supports(q, p.params);
    if (!why_not.empty()) {  // refused, with a reason
      EXPECT_GT(why_not.size(), 10u);
      continue;
    }
    const TensorView k = at.put(p.k, at.input, &keep).value(), v = at.put(p.v, at.input, &keep).value();
    const TensorView dout = at.put(p.dout, at.input, &keep).value();
    const auto check = [&](const char* what, const TensorView& got, const HostTensor& want, const HostTensor* plain,
                           DType rounding = DType::kF32) {
      const HostTensor ours = at.get(got).value();
      if (!caps.device) {
        EXPECT_LE(testing::max_abs_diff(ours, want), 1e-10) << what;
      } else if (plain) {
        const std::string why = testing::check_lowp_rule(what, ours, *plain, want, rounding);
        EXPECT_TRUE(why.empty()) << why;
      } else {  // fp32 arithmetic on fp32 data
        EXPECT_LE(testing::max_abs_diff(ours, want), 1e-5 * std::max(1.0, testing::max_abs(want))) << what;
      }
    };
    const ReferenceResult plain =
        caps.device ? testing::plain_lowp_attention(p.q, p.k, p.v, &p.dout, p.params, at.input) : ReferenceResult{};
    const bool lowp = caps.device;

    // forward: continued over two key blocks from the empty result.
    const TensorView o = at.put(filled(at.acc, {kB, kSq, kH, kD}, 0), at.acc, &keep).value();
    const TensorView lse = at.put(filled(at.acc, {kB, kH, kSq}, -INFINITY), at.acc, &keep).value();
    const auto block_end = [&](int64_t b) { return b == 0 ? kHalf : kSk; };
    // A backend may refuse once it sees K/V and their positions (cuDNN: a pair it cannot plan
    // into dense calls), saying why, before it writes anything.
    const Status first_call = backend->forward(q, k.narrow(1, 0, kHalf), v.narrow(1, 0, kHalf), keys_of(p, 0), o, lse,
                                          FreshOutputs{}, nullptr);
    if (first_call.code() == StatusCode::kUnsupported) {
      EXPECT_GT(first_call.message().size(), 10u);
      continue;
    }
    ASSERT_TRUE(first_call.ok()) << first_call.to_string();
    ASSERT_TRUE(backend->forward(q, k.narrow(1, kHalf, kSk), v.narrow(1, kHalf, kSk), keys_of(p, kHalf), o, lse,
                                 FreshOutputs{}, nullptr).ok());
    check("O", o, p.ref.o, lowp ? &plain.o : nullptr);
    check("LSE", lse, p.ref.lse, lowp ? &plain.lse : nullptr);

    // backward: added over two key blocks, against the final LSE and D (or O).
    const TensorView g_lse = at.put(p.ref.lse, at.acc, &keep).value();
    const TensorView g_d = caps.takes_delta ? at.put(p.delta, at.acc, &keep).value()
                                            : at.put(p.ref.o, at.input, &keep).value();
    const TensorView dq = at.put(filled(at.acc, {kB, kSq, kH, kD}, 0), at.acc, &keep).value();
    const TensorView dk = at.put(filled(at.acc, {kB, kSk, kHkv, kD}, 0), at.acc, &keep).value();
    const TensorView dv = at.put(filled(at.acc, {kB, kSk, kHkv, kD}, 0), at.acc, &keep).value();
    for (int64_t b : {int64_t(0), kHalf})
      ASSERT_TRUE(backend->backward(q, k.narrow(1, b, block_end(b)), v.narrow(1, b, block_end(b)), dout, g_lse, g_d,
                                    keys_of(p, b), dq, dk.narrow(1, b, block_end(b)), dv.narrow(1, b, block_end(b)),
                                    FreshOutputs{}, nullptr)
                      .ok());
    check("dQ", dq, p.ref.dq, lowp ? &plain.dq : nullptr);
    check("dK", dk, p.ref.dk, lowp ? &plain.dk : nullptr);
    check("dV", dv, p.ref.dv, lowp ? &plain.dv : nullptr);

    // The same with fresh outputs holding NaN: each call that is its rows' first writes them
    // without reading them (rows no key reaches get the empty result). In the accumulators'
    // dtype and, for a backend that writes parts, in the inputs' (two parts, rounded once).
    std::vector<DType> fresh_dtypes{at.acc};
    if (caps.writes_parts) fresh_dtypes.push_back(at.input);
    for (const DType out : fresh_dtypes) {
      SCOPED_TRACE(std::string("fresh outputs in ") + dtype_name(out));
      const DType rounding = out == at.acc ? DType::kF32 : out;
      const TensorView fo = at.put(filled(out, {kB, kSq, kH, kD}, NAN), out, &keep).value();
      const TensorView fl = at.put(filled(at.acc, {kB, kH, kSq}, NAN), at.acc, &keep).value();
      for (int64_t b : {int64_t(0), kHalf})
        ASSERT_TRUE(backend->forward(q, k.narrow(1, b, block_end(b)), v.narrow(1, b, block_end(b)), keys_of(p, b), fo,
                                     fl, FreshOutputs{b == 0, false, false}, nullptr)
                        .ok());
      check("fresh O", fo, p.ref.o, lowp ? &plain.o : nullptr, rounding);
      check("fresh LSE", fl, p.ref.lse, lowp ? &plain.lse : nullptr);
      const TensorView fdq = at.put(filled(out, {kB, kSq, kH, kD}, NAN), out, &keep).value();
      const TensorView fdk = at.put(filled(out, {kB, kSk, kHkv, kD}, NAN), out, &keep).value();
      const TensorView fdv = at.put(filled(out, {kB, kSk, kHkv, kD}, NAN), out, &keep).value();
      for (int64_t b : {int64_t(0), kHalf})  // each key block's dK/dV rows are fresh in their call
        ASSERT_TRUE(backend->backward(q, k.narrow(1, b, block_end(b)), v.narrow(1, b, block_end(b)), dout, g_lse, g_d,
                                      keys_of(p, b), fdq, fdk.narrow(1, b, block_end(b)),
                                      fdv.narrow(1, b, block_end(b)), FreshOutputs{false, b == 0, true}, nullptr)
                        .ok());
      check("fresh dQ", fdq, p.ref.dq, lowp ? &plain.dq : nullptr, rounding);
      check("fresh dK", fdk, p.ref.dk, lowp ? &plain.dk : nullptr, rounding);
      check("fresh dV", fdv, p.ref.dv, lowp ? &plain.dv : nullptr, rounding);
    }

    // delta = rowsum(dO * O), on O as the oracle left it (rounded to the inputs' dtype on GPU).
    const TensorView o_in = at.put(p.ref.o, at.input, &keep).value();
    const TensorView d = at.put(filled(at.acc, {kB, kH, kSq}, 0), at.acc, &keep).value();
    ASSERT_TRUE(backend->delta(o_in, dout, d, nullptr).ok());
    HostTensor d_want(DType::kF64, {kB, kH, kSq});
    ASSERT_TRUE(cpu_oracle_backend()
                    .delta(cast(cast(p.ref.o, at.input), DType::kF64).view(), cast(p.dout, DType::kF64).view(),
                           d_want.view(), nullptr)
                    .ok());
    check("D", d, d_want, nullptr);

    // merge: the oracle's two halves merged equal the whole.
    AttentionParams first = keys_of(p, 0), second = keys_of(p, kHalf);
    const HostTensor qd = cast(p.q, DType::kF64), kd = cast(p.k, DType::kF64), vd = cast(p.v, DType::kF64);
    HostTensor o1 = filled(DType::kF64, {kB, kSq, kH, kD}, 0), l1 = filled(DType::kF64, {kB, kH, kSq}, -INFINITY);
    HostTensor o2 = o1, l2 = l1;
    ASSERT_TRUE(cpu_oracle_backend().forward(qd.view(), kd.view().narrow(1, 0, kHalf), vd.view().narrow(1, 0, kHalf),
                                             first, o1.view(), l1.view(), FreshOutputs{}, nullptr).ok());
    ASSERT_TRUE(cpu_oracle_backend().forward(qd.view(), kd.view().narrow(1, kHalf, kSk),
                                             vd.view().narrow(1, kHalf, kSk), second, o2.view(), l2.view(),
                                             FreshOutputs{}, nullptr)
                    .ok());
    const TensorView mo = at.put(o1, at.acc, &keep).value(), ml = at.put(l1, at.acc, &keep).value();
    ASSERT_TRUE(backend->merge(mo, ml, at.put(o2, at.acc, &keep).value(), at.put(l2, at.acc, &keep).value(), nullptr).ok());
    HostTensor whole_o = filled(DType::kF64, {kB, kSq, kH, kD}, 0), whole_l = filled(DType::kF64, {kB, kH, kSq}, -INFINITY);
    ASSERT_TRUE(cpu_oracle_backend().forward(qd.view(), kd.view(), vd.view(), p.params, whole_o.view(), whole_l.view(),
                                             FreshOutputs{}, nullptr).ok());
    check("merged O", mo, whole_o, nullptr);
    check("merged LSE", ml, whole_l, nullptr);

    // accumulate: acc += x.
    const HostTensor x = cast(testing::random_tensor(DType::kF64, {kB, kSq, kH, kD}, 35), at.acc);
    const HostTensor y = cast(testing::random_tensor(DType::kF64, {kB, kSq, kH, kD}, 36), at.acc);
    const TensorView acc = at.put(y, at.acc, &keep).value();
    ASSERT_TRUE(backend->accumulate(acc, at.put(x, at.acc, &keep).value(), nullptr).ok());
    HostTensor sum = cast(y, DType::kF64);
    const HostTensor xd = cast(x, DType::kF64);
    for (int64_t i = 0; i < sum.view().numel(); ++i) sum.view().as<double>()[i] += xd.view().as<double>()[i];
    check("accumulated", acc, sum, nullptr);
    if (caps.device) {
      ASSERT_TRUE(stream_synchronize(nullptr).ok());
    }
  }
}

class BackendVsOracle : public ::testing::TestWithParam<std::string> {};
TEST_P(BackendVsOracle, EveryStepKind) { every_step_kind(zigzag_case(GetParam())); }

INSTANTIATE_TEST_SUITE_P(Masks, BackendVsOracle,
                         ::testing::Values("full", "causal", "window:40,0", "window:30,10", "docs:3"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

// Masked D = 128 pairs of the suite below whose backward runs different Hopper kernels
// (HopperTiles.BackendCasesRunEachBackwardKernel checks which): documents of random lengths with
// 1-token ones, causal inside, GQA, odd lengths (64 x 64 tiles, "short64"), and documents of 320
// rows without a band, whose edges 80-row query tiles meet as often as 64-row ones ("q80" on the
// second key block's pair, "short64" on the first's).
const Case kDocsCausalD128{"docs_causal_d128_gqa", "causal", 1, 4, 2, 128, {{0, 301}}, {{0, 301}}, 150, 0,
                           {0, 1, 2, 70, 71, 72, 203, 333, 334, 400}};
const Case kDocsFullQ80{"docs_full_q80_d128_gqa", "full", 1, 4, 2, 128, {{0, 640}}, {{0, 640}}, 300, 0, {0, 320, 640}};
// A window of 300 keys: 64-key tiles cut away less than 15% of base's scores, and 80-row tiles
// meet its edges more often than 64-row ones, so both key blocks' pairs run "base".
const Case kWindowBase{"window_300_0_base_d128_gqa", "window:300,0", 1, 4, 2, 128, {{0, 640}}, {{0, 640}}, 256};
// The forward's lists likewise (HopperTiles.BackendCasesRunEachForwardKernel): the small masked
// cases take 64 x 64 tiles (the short-tile kernel); documents of 500 and 600 rows without a band
// keep 128 x 192 (the persistent kernel with lists).
const Case kDocsFullLong{"docs_full_long_d128_mqa", "full", 1, 2, 1, 128, {{0, 1100}}, {{0, 1100}}, 550, 0,
                         {0, 500, 1100}};

// Shard pairs whose sides are one run each (what the Hopper kernels take; every backend runs
// them). name, mask, B, H, H_kv, D, query runs, key runs, rows of the first key block[, scale].
class BackendVsOracleRuns : public ::testing::TestWithParam<Case> {};
TEST_P(BackendVsOracleRuns, EveryStepKind) { every_step_kind(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    ShardPairs, BackendVsOracleRuns,
    ::testing::Values(
        // The diagonal pair: the second key block is ahead of the first 64 query rows (a pair's
        // rows that see no key of it), GQA 4:2.
        Case{"causal_diagonal_d128_gqa", "causal", 1, 4, 2, 128, {{0, 130}}, {{0, 130}}, 64},
        // A ring step from the past: every key before every query (causal is full here).
        Case{"causal_past_d128", "causal", 1, 2, 2, 128, {{300, 100}}, {{0, 180}}, 90},
        // Keys start after the queries: the first 50 query rows see no key at all (LSE -inf,
        // O = 0), and the second key block is seen by none (an empty pair), MQA 4:1.
        Case{"causal_no_key_rows_d64_mqa", "causal", 1, 4, 1, 64, {{100, 77}}, {{150, 90}}, 45},
        // The diagonal with an offset between the sides (q0 - k0 = 40), D = 64.
        Case{"causal_offset_d64", "causal", 1, 4, 2, 64, {{40, 100}}, {{0, 150}}, 70},
        // Keys in the future of every query: nothing is visible, every row is empty.
        Case{"causal_future_d128", "causal", 1, 2, 1, 128, {{0, 64}}, {{64, 128}}, 64},
        // The causal band shifted right (window -1,16: keys up to 16 ahead).
        Case{"band_right16_d128", "window:-1,16", 1, 2, 2, 128, {{0, 96}}, {{32, 100}}, 50},
        Case{"full_d64_gqa_scale", "full", 1, 4, 2, 64, {{0, 70}}, {{500, 90}}, 45, 0.2},  // a scale of our own
        Case{"full_d128_mqa", "full", 1, 4, 1, 128, {{37, 129}}, {{0, 200}}, 100},
        // Masks the Hopper kernels run as visible-tile lists (issue 34): documents (above).
        kDocsCausalD128, kDocsFullQ80, kDocsFullLong, kWindowBase,
        // Documents without a band, the sides at different positions (keys partly before).
        Case{"docs_full_d64_offset", "full", 1, 4, 2, 64, {{150, 131}}, {{60, 203}}, 100, 0, {0, 97, 98, 180, 260, 400}},
        // A window bounded on both sides (a 4K-style band, scaled down), and a causal one.
        Case{"window_64_0_d128", "window:64,0", 1, 2, 2, 128, {{100, 257}}, {{0, 391}}, 200},
        Case{"window_30_10_d64_mqa", "window:30,10", 1, 4, 1, 64, {{37, 200}}, {{0, 261}}, 130},
        // Queries ahead of every key they could see: the first 50 rows see no key (O = 0, LSE = -inf).
        Case{"window_no_key_rows_d128", "window:20,0", 1, 2, 2, 128, {{0, 100}}, {{50, 100}}, 50},
        // Block-sparse: BigBird with 16- and 32-token blocks, causal and not.
        Case{"bigbird_causal_b16_d128", "bigbird-causal:1,1,1,B=16", 1, 2, 2, 128, {{0, 300}}, {{0, 300}}, 150},
        Case{"bigbird_b32_d64_gqa", "bigbird:1,1,2,B=32", 1, 4, 2, 64, {{64, 200}}, {{0, 350}}, 170}),
    [](const auto& info) { return info.param.name; });

// Shard pairs whose sides are several runs (issue 34: the Hopper kernels take them in one launch
// over tile lists that span the runs, or one launch per pair of increasing segments).
Case striped_case() {  // positions with step 3 on both sides: every row its own run
  Case::Runs q, k;
  for (int64_t i = 0; i < 100; ++i) q.push_back({1 + 3 * i, 1});
  for (int64_t i = 0; i < 110; ++i) k.push_back({3 * i, 1});
  return Case{"causal_striped_d64_gqa", "causal", 1, 4, 2, 64, q, k, 55};
}
Case gathered_many_case() {  // 70 query segments of 2 rows, positions falling between them
  Case::Runs q;
  for (int64_t i = 0; i < 70; ++i) q.push_back({380 - 5 * i, 2});
  return Case{"docs_gathered_70_d64", "causal", 1, 2, 1, 64, q, {{0, 150}, {200, 120}}, 100, 0, {0, 90, 91, 250, 400}};
}
INSTANTIATE_TEST_SUITE_P(
    ManyRuns, BackendVsOracleRuns,
    ::testing::Values(
        // Documents of random lengths over a documents-layout shard (runs of unequal lengths,
        // documents cut between them), GQA, the key blocks split inside a run.
        Case{"docs_causal_runs_d128_gqa", "causal", 1, 4, 2, 128, {{0, 40}, {95, 30}, {170, 61}, {330, 50}},
             {{10, 60}, {100, 90}, {300, 70}}, 75, 0, {0, 1, 60, 61, 140, 200, 333, 400}},
        // Zigzag-like causal shards of three runs, odd lengths; a window; the full mask (no lists).
        Case{"causal_runs_d64", "causal", 1, 4, 2, 64, {{0, 70}, {130, 67}, {330, 60}}, {{0, 65}, {130, 70}, {200, 66}}, 100},
        Case{"window_runs_d128", "window:50,0", 1, 2, 2, 128, {{20, 90}, {200, 77}}, {{0, 100}, {150, 120}}, 100},
        Case{"full_runs_d64_mqa", "full", 1, 4, 1, 64, {{5, 60}, {200, 71}}, {{0, 50}, {100, 81}}, 66},
        striped_case(),
        // Gathered shards (Ulysses): positions fall between segments, one launch per segment pair.
        Case{"causal_gathered_d128", "causal", 1, 2, 2, 128, {{200, 80}, {0, 90}}, {{180, 70}, {10, 100}}, 70},
        Case{"docs_gathered_d64", "causal", 1, 4, 2, 64, {{300, 50}, {100, 60}, {0, 40}}, {{250, 80}, {0, 120}}, 80, 0,
             {0, 50, 51, 190, 260, 400}},
        // More segments than the Hopper kernels take (70 of two rows): "auto" hands it to ours.
        gathered_many_case(),
        // A block pattern on two runs a side: one launch per pair of runs of step 1.
        Case{"bigbird_causal_runs_b16_d128", "bigbird-causal:1,1,1,B=16", 1, 2, 2, 128, {{0, 100}, {200, 100}},
             {{0, 120}, {180, 100}}, 120}),
    [](const auto& info) { return info.param.name; });

// The Hopper kernels' tile lists over shards of several runs (host code, runs without a GPU):
// against brute force on random increasing positions (zigzag-like and documents-layout-like
// runs, striped steps) under causal, window and document masks, both sides' lists hold every
// visible pair; an entry without the range flag is wholly visible; a flagged entry's elements,
// as the kernels evaluate them from the row intervals, are exactly the mask's.
TEST(HopperTiles, ListsOverSeveralRunsMatchTheMask) {
  std::mt19937_64 rng(7);
  const auto positions = [&](int n, int64_t span) {  // n increasing positions in [0, span)
    std::vector<int64_t> all(static_cast<size_t>(span));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(size_t(n));
    std::sort(all.begin(), all.end());
    if (rng() % 2) {  // a few long runs instead: a zigzag or documents-layout shard
      all.clear();
      int64_t at = int64_t(rng() % 50);
      while (int(all.size()) < n) {
        const int64_t run = 1 + int64_t(rng() % 150);
        for (int64_t i = 0; i < run && int(all.size()) < n; ++i) all.push_back(at + i);
        at += run + int64_t(rng() % 200);
      }
    }
    return all;
  };
  for (int trial = 0; trial < 24; ++trial) {
    hopper::PairMask m;
    m.seq_q = 200 + int(rng() % 300), m.seq_k = 200 + int(rng() % 300);
    m.q_pos = positions(m.seq_q, 1500), m.k_pos = positions(m.seq_k, 1500);
    m.q0 = m.q_pos[0], m.k0 = m.k_pos[0];
    const int kind = trial % 3;
    m.window_right = 0;
    if (kind == 1) m.window_left = 64 + int64_t(rng() % 300);
    if (kind == 2) m.doc_offsets = {0, 1, 2, 300, 301, 700, 1200, 3000};
    const auto visible = [&](int i, int j) {
      const int64_t qp = m.q_pos[size_t(i)], kp = m.k_pos[size_t(j)];
      if (kp > qp || (m.window_left >= 0 && qp - kp > m.window_left)) return false;
      if (m.doc_offsets.empty()) return true;
      const auto& o = m.doc_offsets;
      return std::upper_bound(o.begin(), o.end(), qp) == std::upper_bound(o.begin(), o.end(), kp);
    };
    const hopper::TilePlan plan = hopper::plan_tiles(m, 128, 96, 64, 128);
    for (int side = 0; side < 2; ++side) {
      SCOPED_TRACE("trial " + std::to_string(trial) + (side ? ", key side" : ", query side"));
      const hopper::SideTiles& t = side ? plan.bwd : plan.fwd;
      const int n = side ? m.seq_k : m.seq_q, n_other = side ? m.seq_q : m.seq_k;
      const auto sees = [&](int r, int c) { return side ? visible(c, r) : visible(r, c); };
      std::vector<std::vector<int>> flags_of(t.begin.size() - 1, std::vector<int>((n_other + t.other_tile_rows - 1) /
                                                                                    t.other_tile_rows, -1));
      for (size_t tile = 0; tile + 1 < t.begin.size(); ++tile)
        for (int32_t e = t.begin[tile]; e < t.begin[tile + 1]; ++e)
          flags_of[tile][size_t(t.entries[size_t(e)] >> 2)] = t.entries[size_t(e)] & 3;
      int64_t misses = 0, wrong = 0;
      for (int r = 0; r < n; ++r)
        for (int c = 0; c < n_other; ++c) {
          const int f = flags_of[size_t(r / t.tile_rows)][size_t(c / t.other_tile_rows)];
          const bool want = sees(r, c);
          if (f < 0) {
            misses += want;
            continue;
          }
          const bool kept = !(f & hopper::kTileRangeMask) ||
                            (c >= t.ranges[2 * size_t(r)] && c <= t.ranges[2 * size_t(r) + 1]);
          wrong += kept != want;
        }
      EXPECT_EQ(misses, 0);
      EXPECT_EQ(wrong, 0);
    }
  }
}

// A one-run case's pair of key block `block` (rows [0, half) or [half, S_k)) as the Hopper
// backend's tile_lists makes it.
hopper::PairMask one_run_pair(const Case& c, int block) {
  const MaskSpec mask = parse_mask(c.mask, 400).value();
  hopper::PairMask m;
  m.q0 = c.q_runs.at(0).first, m.seq_q = int(c.seq_q());
  m.k0 = c.k_runs.at(0).first + (block ? c.half : 0), m.seq_k = int(block ? c.seq_k() - c.half : c.half);
  m.window_left = mask.window_left, m.window_right = mask.window_right;
  m.doc_offsets = c.docs.empty() ? mask.doc_offsets : c.docs;
  return m;
}

using testing::bigbird_mask;
using testing::documents_mask;
using testing::window_mask;

// At D = 128 the backend plans the backward's lists with 128-key x 64-row tiles (base), 64 x 64
// ones (short64) and 128 x 80 ones (q80) and keeps one per mask (hopper_tiles.hpp): short64 where
// it computes at most 0.85 of base's scores (short_bwd_pays: short documents, windows of 256,
// BigBird of 64-token blocks that base's tiles straddle); else q80 where long documents and
// windows cost it at most 2% more query rows (tall_tiles_pay); base where short documents do or
// where 128-token pattern blocks straddle its tiles (dev/hopper_attention/README.md, "Masked
// backward at D = 128 on q80": at 32K q80 was 1.06-1.07x base on 16 documents and a 4K window,
// 0.90x on 256 documents, 0.73x on BigBird; "Backward on 64-key tiles for short lists": short64
// 1.06-1.07x base at 0.77 of its scores, 0.97-1.01x at 0.90-0.91). The kept lists are exactly
// those of their tiles, and the TileMask the kernels get says those tiles (backward_kernel runs
// the kernel by them); D = 64 has one.
TEST(HopperTiles, BackwardTileChosenPerMask) {
  constexpr int S = 32768;
  using hopper::BwdKernel;
  std::mt19937_64 rng(34);
  const std::vector<std::tuple<std::string, hopper::PairMask, BwdKernel>> masks = {
      {"docs16", documents_mask(S, 16, rng), BwdKernel::kQ80},
      {"window4096", window_mask(S, 4096), BwdKernel::kQ80},
      {"window16384", window_mask(S, 16384), BwdKernel::kQ80},
      {"docs64", documents_mask(S, 64, rng), BwdKernel::kBase},
      {"window1024", window_mask(S, 1024), BwdKernel::kBase},
      {"bigbird128", bigbird_mask(S, 128, rng), BwdKernel::kBase},
      {"docs256", documents_mask(S, 256, rng), BwdKernel::kShort64},
      {"window256", window_mask(S, 256), BwdKernel::kShort64},
      {"bigbird64", bigbird_mask(S, 64, rng), BwdKernel::kShort64}};
  for (const auto& [name, m, kernel] : masks) {
    SCOPED_TRACE(name);
    const int rows = kernel == BwdKernel::kQ80 ? 80 : 64, keys = kernel == BwdKernel::kShort64 ? 64 : 128;
    const hopper::TilePlan plan = hopper::backend_plan(m, 128);
    EXPECT_EQ(plan.bwd.other_tile_rows, rows);
    EXPECT_EQ(plan.bwd.tile_rows, keys);
    const hopper::TilePlan same = hopper::plan_tiles(m, 128, 192, rows, keys);
    EXPECT_EQ(plan.bwd.begin, same.bwd.begin);
    EXPECT_EQ(plan.bwd.entries, same.bwd.entries);
    EXPECT_EQ(plan.bwd.order, same.bwd.order);
    const hopper::PackedTiles packed = hopper::pack_tiles(plan, m);
    hopper::BwdArgs a{};
    a.head_dim = 128, a.seq_q = a.seq_k = S;
    a.tiles = hopper::tile_mask_view(packed, 1, packed.blob.data());
    EXPECT_EQ(a.tiles.query_rows, rows);
    EXPECT_EQ(a.tiles.key_rows, keys);
    EXPECT_EQ(hopper::backward_kernel(a), kernel);
    const hopper::PackedTiles d64 = hopper::pack_tiles(hopper::backend_plan(m, 64), m);
    a.head_dim = 64;
    a.tiles = hopper::tile_mask_view(d64, 1, d64.blob.data());
    EXPECT_EQ(a.tiles.query_rows, 128);
    EXPECT_EQ(a.tiles.key_rows, 128);
    EXPECT_EQ(hopper::backward_kernel(a), BwdKernel::kQ128);
  }
}

// backend_plan plans the short backward only where base's lists could let it pay
// (short_bwd_may_pay: at least 30% of base's entries element-masked or in a last key tile of at most
// 64 rows, since any other base entry is two wholly visible short ones). On every mask here, at
// lengths of whole tiles and not: wherever the short plan pays, the bound says it may; its entries
// are never below the bound; and the backend's choice is the one a plan of both would make.
TEST(HopperTiles, ShortBackwardPlanSkippedOnlyWhereItCannotPay) {
  int pays = 0, skipped = 0;
  for (int S : {300, 4130, 5000, 8192, 32768})
    for (const char* name : {"full2", "docs2", "docs4", "docs16", "docs64", "docs128", "docs256", "docs1024",
                             "window128", "window256", "window512", "window4096", "bigbird64", "bigbird128",
                             "bigbird256"}) {
      SCOPED_TRACE(std::string(name) + " at " + std::to_string(S));
      if (std::string(name).rfind("docs", 0) == 0 && 2 * std::stoi(name + 4) > S) continue;  // cuts to draw
      std::mt19937_64 rng(uint64_t(S) + 36);
      hopper::PairMask m;
      if (std::string(name) == "full2") {  // 320-row documents, no band, keys cut short (S_k = S):
        if (S > 640) continue;               // base's tiles wholly visible, the last key tile short
        m.seq_q = 640, m.seq_k = S;
        m.doc_offsets = {0, 320, 640};
      } else {
        m = testing::draw_mask(name, S, rng);
      }
      const std::vector<int32_t> cols = hopper::column_intervals(hopper::row_intervals(m), m.seq_q, m.seq_k);
      const hopper::SideTiles base = hopper::side_tiles(m, cols, m.seq_k, m.seq_q, 128, 64, 0, 0, true);
      const hopper::SideTiles short_ = hopper::side_tiles(m, cols, m.seq_k, m.seq_q, 64, 64, 0, 0, true);
      int64_t last_tile = 0;  // unflagged entries of a last key tile of at most 64 rows
      if (S % 128 > 0 && S % 128 <= 64)
        for (int32_t e = base.begin[base.begin.size() - 2]; e < base.begin.back(); ++e)
          last_tile += (base.entries[size_t(e)] & 3) == 0;
      EXPECT_GE(short_.entry_count(), 2 * base.entry_count() - hopper::flagged_entries(base) - last_tile);
      const bool short_pays = hopper::short_bwd_pays(base, short_), may_pay = hopper::short_bwd_may_pay(base, S);
      if (short_pays) {
        EXPECT_TRUE(may_pay);
      }
      pays += short_pays, skipped += !may_pay;
      EXPECT_EQ(hopper::backend_plan(m, 128).bwd.tile_rows == 64, short_pays);
    }
  EXPECT_GT(pays, 4);     // the cases hold masks on both sides of the rule
  EXPECT_GT(skipped, 4);
}

// The forward's lists likewise: at D = 128 planned with 128 x 192 tiles (the persistent kernel)
// and 64 x 64 ones (the short-tile kernel, two CTAs per SM), the short ones kept where they compute
// at most 0.80 of the scores (short_tiles_pay, hopper_tiles.hpp; dev/hopper_attention/README.md,
// "Forward on 64 x 64 tiles for short lists": faster on every mask measured at <= 0.77, slower on
// every one at >= 0.85). Short documents and windows and BigBird's blocks take 64 x 64; 16
// documents and windows of 1K and more keep 128 x 192; the kept lists are exactly those of their
// tile, the TileMask says its query rows and forward_kernel runs the kernel of that tile; D = 64
// has one forward tile.
TEST(HopperTiles, ForwardTileChosenPerMask) {
  constexpr int S = 32768;
  std::mt19937_64 rng(35);
  const std::vector<std::tuple<std::string, hopper::PairMask, int>> masks = {
      {"docs256", documents_mask(S, 256, rng), 64},   {"window256", window_mask(S, 256), 64},
      {"bigbird128", bigbird_mask(S, 128, rng), 64},  {"bigbird64", bigbird_mask(S, 64, rng), 64},
      {"docs16", documents_mask(S, 16, rng), 128},    {"window1024", window_mask(S, 1024), 128},
      {"window4096", window_mask(S, 4096), 128}};
  for (const auto& [name, m, rows] : masks) {
    SCOPED_TRACE(name);
    const hopper::TilePlan plan = hopper::backend_plan(m, 128);
    EXPECT_EQ(plan.fwd.tile_rows, rows);
    const hopper::TilePlan same = hopper::plan_tiles(m, rows, rows == 64 ? 64 : 192, 64, 128);
    EXPECT_EQ(plan.fwd.begin, same.fwd.begin);
    EXPECT_EQ(plan.fwd.entries, same.fwd.entries);
    EXPECT_EQ(plan.fwd.order, same.fwd.order);
    const hopper::PackedTiles packed = hopper::pack_tiles(plan, m);
    hopper::FwdArgs a{};
    a.head_dim = 128, a.seq_q = a.seq_k = S;
    a.tiles = hopper::tile_mask_view(packed, 0, packed.blob.data());
    EXPECT_EQ(a.tiles.query_rows, rows);
    EXPECT_EQ(hopper::forward_kernel(a), rows == 64 ? hopper::FwdKernel::kShortLists : hopper::FwdKernel::kPersistLists);
    EXPECT_EQ(hopper::backend_plan(m, 64).fwd.tile_rows, 192);
  }
}

// The arguments of a forward or backward call (FwdArgs or BwdArgs) of the routing rules below: B
// = 1, H = 32, H_kv = 8, S_q = S_k = seq_k, and with `lists` a tile list (its contents unread).
template <class Args>
Args routing_args(int head_dim, int causal, int seq_k, bool lists) {
  static const int32_t no_entries[2] = {0, 0};
  Args a{};
  a.batch = 1, a.heads = 32, a.kv_heads = 8, a.head_dim = head_dim;
  a.seq_q = a.seq_k = seq_k;
  a.causal = causal;
  if (lists) a.tiles.begin = a.tiles.entries = no_entries;
  return a;
}

// The forward's kernel per case (forward_kernel, hopper_args.hpp; host code, runs without a GPU):
// the 2-CTA cluster kernel exactly where it was measured faster on one H200
// (dev/hopper_attention/README.md, "Persistent forward in 2-CTA clusters", calls 3-4, and
// "Session w: the cluster forward at 8K and 128K causal"): D = 128 dense, full from 8K to 64K
// keys, causal from 8K to 128K; not at 128K full (0.996x pp192), not at D = 64 (0.99-1.01x), not
// on tile lists (the kernel takes dense masks only).
TEST(HopperRouting, ClusterForwardOnlyWhereMeasuredFaster) {
  using hopper::FwdKernel;
  const auto route = [&](int head_dim, int causal, int seq_k, bool lists = false) {
    return hopper::forward_kernel(routing_args<hopper::FwdArgs>(head_dim, causal, seq_k, lists));
  };
  for (int s : {8192, 16384, 24576, 32768, 65536}) EXPECT_EQ(route(128, 0, s), FwdKernel::kCluster) << s;
  for (int s : {8192, 16384, 32768, 65536, 131072}) EXPECT_EQ(route(128, 1, s), FwdKernel::kCluster) << s;
  EXPECT_EQ(route(128, 0, 4096), FwdKernel::kPersist);
  EXPECT_EQ(route(128, 0, 8191), FwdKernel::kPersist);
  EXPECT_EQ(route(128, 0, 65537), FwdKernel::kPingPong192);
  EXPECT_EQ(route(128, 0, 131072), FwdKernel::kPingPong192);
  EXPECT_EQ(route(128, 1, 4096), FwdKernel::kPersist);
  EXPECT_EQ(route(128, 1, 8191), FwdKernel::kPersist);
  EXPECT_EQ(route(128, 1, 131073), FwdKernel::kPersist);
  EXPECT_EQ(route(128, 1, 262144), FwdKernel::kPersist);
  for (int causal : {0, 1}) {
    EXPECT_EQ(route(128, causal, 32768, true), FwdKernel::kPersistLists);
    EXPECT_EQ(route(64, causal, 32768, true), FwdKernel::kPersistLists);
    for (int s : {4096, 8192, 16384, 32768, 65536, 131072})
      EXPECT_EQ(route(64, causal, s),
                causal && s <= 16384 ? FwdKernel::kPersistHeadChunks : FwdKernel::kPersist)
          << causal << " " << s;
  }
}

// The cluster forward runs 8 query heads' tile pairs in step only where that was measured faster:
// causal, up to 16K keys, no lists.
TEST(HopperRouting, ForwardHeadChunksOnlyWhereMeasuredFaster) {
  const auto chunk = [&](int causal, int seq_k, bool lists = false) {
    return hopper::forward_head_chunk(routing_args<hopper::FwdArgs>(128, causal, seq_k, lists));
  };
  for (int s : {8192, 12288, 16384}) EXPECT_EQ(chunk(1, s), 8) << s;
  for (int s : {16385, 32768, 131072}) EXPECT_EQ(chunk(1, s), 1) << s;
  for (int s : {8192, 16384}) {
    EXPECT_EQ(chunk(0, s), 1) << s;
    EXPECT_EQ(chunk(1, s, true), 1) << s;
  }
}

// The dense backward takes its key tiles with the K/V heads inner only where it was measured
// faster: causal, up to 16K keys; never on tile lists.
TEST(HopperRouting, BackwardHeadsInnerOnlyWhereMeasuredFaster) {
  const auto inner = [&](int head_dim, int causal, int seq_k, bool lists = false) {
    return hopper::backward_heads_inner(routing_args<hopper::BwdArgs>(head_dim, causal, seq_k, lists));
  };
  for (int d : {64, 128}) {
    for (int s : {1000, 4096, 8192, 16384}) EXPECT_TRUE(inner(d, 1, s)) << d << " " << s;
    for (int s : {16385, 32768, 131072}) EXPECT_FALSE(inner(d, 1, s)) << d << " " << s;
    for (int s : {4096, 8192, 32768}) {
      EXPECT_FALSE(inner(d, 0, s)) << d << " " << s;
      EXPECT_FALSE(inner(d, 1, s, true)) << d << " " << s;
    }
  }
}

// The backend's masked D = 128 cases above run every backward kernel on lists (each key block's
// pair): short64 on the short causal documents and on the 320-row documents' first pair, q80 on
// their second, base on the 300-key window.
TEST(HopperTiles, BackendCasesRunEachBackwardKernel) {
  const auto tiles = [](const Case& c, int block) {
    const hopper::TilePlan p = hopper::backend_plan(one_run_pair(c, block), 128);
    return std::make_pair(p.bwd.tile_rows, p.bwd.other_tile_rows);  // keys, query rows
  };
  for (int block = 0; block < 2; ++block) {
    EXPECT_EQ(tiles(kDocsCausalD128, block), std::make_pair(64, 64)) << block;
    EXPECT_EQ(tiles(kWindowBase, block), std::make_pair(128, 64)) << block;
  }
  EXPECT_EQ(tiles(kDocsFullQ80, 0), std::make_pair(64, 64));
  EXPECT_EQ(tiles(kDocsFullQ80, 1), std::make_pair(128, 80));
}

// And both forward kernels on lists: 64 x 64 tiles for the short causal documents, 128 x 192 for
// the long documents (each key block's pair).
TEST(HopperTiles, BackendCasesRunEachForwardKernel) {
  for (int block = 0; block < 2; ++block) {
    EXPECT_EQ(hopper::backend_plan(one_run_pair(kDocsCausalD128, block), 128).fwd.tile_rows, 64) << block;
    EXPECT_EQ(hopper::backend_plan(one_run_pair(kDocsFullLong, block), 128).fwd.tile_rows, 128) << block;
  }
}

// The shard-pair cases above must not pass by every Hopper case being refused: on an sm_90 GPU
// the backend takes a bf16 causal problem of each head dim.
TEST(HopperBackend, TakesBf16CausalOnHopper) {
  const std::unique_ptr<AttentionBackend> hopper = make_hopper_backend();
  if (!hopper || cuda_device_count() == 0) GTEST_SKIP() << "no Hopper backend in this build, or no GPU";
  AttentionParams causal;
  causal.mask = MaskSpec::causal();
  for (int64_t d : {64, 128}) {
    auto q = device_zeros(DType::kBF16, {1, 256, 4, d}).value();
    const std::string why_not = hopper->supports(q.view, causal);
    if (why_not.find("sm_90") != std::string::npos) GTEST_SKIP() << why_not;  // another GPU
    EXPECT_TRUE(why_not.empty()) << "D = " << d << ": " << why_not;
  }
}

// The mask cases above must not pass by refusal either: on an sm_90 GPU the backend takes
// documents, windows bounded on the left and block-sparse patterns (issue 34), each side one run.
TEST(HopperBackend, TakesDocumentWindowAndBlockMasksOnHopper) {
  const std::unique_ptr<AttentionBackend> hopper = make_hopper_backend();
  if (!hopper || cuda_device_count() == 0) GTEST_SKIP() << "no Hopper backend in this build, or no GPU";
  std::vector<std::pair<std::string, MaskSpec>> masks;
  masks.emplace_back("documents", MaskSpec::documents({0, 1, 100, 256}));
  masks.emplace_back("documents full", MaskSpec::documents({0, 1, 100, 256}, false));
  masks.emplace_back("window 64,0", MaskSpec::window(64, 0));
  masks.emplace_back("window 30,10", MaskSpec::window(30, 10));
  masks.emplace_back("bigbird-causal", MaskSpec::block_sparse(bigbird_pattern(256, 1, 1, 1, 16, true).value(), true));
  masks.emplace_back("bigbird", MaskSpec::block_sparse(bigbird_pattern(256, 1, 1, 2, 64, false).value(), false));
  for (int64_t d : {64, 128}) {
    auto q = device_zeros(DType::kBF16, {1, 256, 4, d}).value();
    for (const auto& [what, mask] : masks) {
      AttentionParams params;
      params.mask = mask;
      const std::string why_not = hopper->supports(q.view, params);
      if (why_not.find("sm_90") != std::string::npos) GTEST_SKIP() << why_not;  // another GPU
      EXPECT_TRUE(why_not.empty()) << what << ", D = " << d << ": " << why_not;
      // And on a zigzag shard (two runs), and a gathered one (two increasing segments).
      for (const std::vector<int64_t>& starts : {std::vector<int64_t>{0, 300}, std::vector<int64_t>{400, 0}}) {
        std::vector<int64_t> positions;
        for (int64_t start : starts)
          for (int64_t i = 0; i < 128; ++i) positions.push_back(start + i);
        params.q_positions = positions.data();
        const std::string why_runs = hopper->supports(q.view, params);
        EXPECT_TRUE(why_runs.empty()) << what << ", D = " << d << ", runs from " << starts[0] << ": " << why_runs;
      }
    }
  }
}

// The forward's 2-CTA cluster kernel runs at D = 128 from 8K keys on (forward_kernel,
// HopperRouting above), past every case of the suite: through the backend at 16K
// tokens, full MHA and causal GQA 4:2 and 8:2, O and the LSE of sampled rows (both ends, tile and
// cluster edges) meet the bf16 rule against the fp64 oracle.
TEST(HopperBackend, ClusterForwardMeetsTheRuleAt16K) {
  const std::unique_ptr<AttentionBackend> hopper = make_hopper_backend();
  if (!hopper || cuda_device_count() == 0) GTEST_SKIP() << "no Hopper backend in this build, or no GPU";
  const int64_t S = 16384, D = 128;
  const std::vector<int64_t> rows{0, 1, 127, 128, 191, 192, 383, 384, 8191, 8192, 12345, 16382, 16383};
  ReferenceRows ref_rows;
  ref_rows.query_rows = rows;
  ref_rows.query_side_only = true;
  // H = 8 causal: 8 heads' tile pairs in step (forward_head_chunk); H = 4 leaves them head by head.
  for (const auto& [H, Hkv, causal] :
       {std::tuple<int64_t, int64_t, bool>{2, 2, false}, {4, 2, true}, {8, 2, true}}) {
    SCOPED_TRACE(std::string(causal ? "causal" : "full") + " H " + std::to_string(H) + ":" + std::to_string(Hkv));
    const HostTensor q = testing::random_tensor(DType::kBF16, {1, S, H, D}, 71);
    const HostTensor k = testing::random_tensor(DType::kBF16, {1, S, Hkv, D}, 72);
    const HostTensor v = testing::random_tensor(DType::kBF16, {1, S, Hkv, D}, 73);
    AttentionParams params;
    params.mask = causal ? MaskSpec::causal() : MaskSpec::none();
    const std::string why_not = hopper->supports(to_device(q).value().view, params);
    if (why_not.find("sm_90") != std::string::npos) GTEST_SKIP() << why_not;  // another GPU
    ASSERT_TRUE(why_not.empty()) << why_not;
    auto oracle = reference_attention(q.view(), k.view(), v.view(), TensorView{}, params, ref_rows);
    ASSERT_TRUE(oracle.ok());
    const ReferenceResult plain = testing::plain_lowp_attention(q, k, v, nullptr, params, DType::kBF16, rows);
    auto gq = to_device(q).value(), gk = to_device(k).value(), gv = to_device(v).value();
    auto o = device_zeros(DType::kBF16, {1, S, H, D}).value();
    auto lse = device_zeros(DType::kF32, {1, H, S}).value();
    const Status f = hopper->forward(gq.view, gk.view, gv.view, params, o.view, lse.view,
                                     FreshOutputs{true, false, false}, nullptr);
    ASSERT_TRUE(f.ok()) << f.to_string();
    ASSERT_TRUE(stream_synchronize(nullptr).ok());
    // The oracle holds the sampled rows alone (query_side_only); ours and the plain baseline are
    // full length, so their sampled rows are taken out first.
    std::string why = testing::check_lowp_rule(
        "O", testing::take_rows(to_host(o.view).value(), 1, rows), testing::take_rows(plain.o, 1, rows), oracle->o,
        DType::kBF16);
    EXPECT_TRUE(why.empty()) << why;
    why = testing::check_lowp_rule("LSE", testing::take_rows(to_host(lse.view).value(), 2, rows),
                                   testing::take_rows(plain.lse, 2, rows), oracle->lse, DType::kF32);
    EXPECT_TRUE(why.empty()) << why;
  }
}

// One forward and one backward call of an "auto" backend on zero tensors [1, 256, 4, D] (the
// backward given D or, where its caps say so, O), for the routing tests below.
struct AutoCalls {
  static constexpr int64_t S = 256, H = 4;
  explicit AutoCalls(int64_t D)
      : q(device_zeros(DType::kBF16, {1, S, H, D}).value()), kv(device_zeros(DType::kBF16, {1, S, H, D}).value()),
        o(device_zeros(DType::kBF16, {1, S, H, D}).value()), lse(device_zeros(DType::kF32, {1, H, S}).value()),
        dq(device_zeros(DType::kBF16, {1, S, H, D}).value()), dk(device_zeros(DType::kBF16, {1, S, H, D}).value()),
        dv(device_zeros(DType::kBF16, {1, S, H, D}).value()), delta(device_zeros(DType::kF32, {1, H, S}).value()) {}
  void run(const AttentionBackend& chosen, const AttentionParams& params) {
    ASSERT_TRUE(chosen.supports(q.view, params).empty()) << chosen.supports(q.view, params);
    const Status f = chosen.forward(q.view, kv.view, kv.view, params, o.view, lse.view, FreshOutputs{true, false, false}, nullptr);
    ASSERT_TRUE(f.ok()) << f.to_string();
    const TensorView d_or_o = chosen.caps().takes_delta ? delta.view : o.view;
    const Status b = chosen.backward(q.view, kv.view, kv.view, q.view, lse.view, d_or_o, params, dq.view, dk.view,
                                     dv.view, FreshOutputs{false, true, true}, nullptr);
    ASSERT_TRUE(b.ok()) << b.to_string();
    ASSERT_TRUE(stream_synchronize(nullptr).ok());
  }
  // Rows 0..127, then 1000..1127: two runs, as a zigzag shard.
  static std::vector<int64_t> zigzag() {
    std::vector<int64_t> positions;
    for (int64_t i = 0; i < S / 2; ++i) positions.push_back(i);
    for (int64_t i = 0; i < S / 2; ++i) positions.push_back(1000 + i);
    return positions;
  }
  DeviceTensor q, kv, o, lse, dq, dk, dv, delta;
};

// "auto" hands each call to the backend its table names: masked calls on shards of several runs
// to the Hopper kernels (forward and backward), calls the Hopper kernels refuse (more segments of
// positions than they take) to ours, through fp32 parts where the outputs are bf16, and it says
// which ran.
TEST(AutoBackend, HandsEachCallToTheBackendThatTakesIt) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  const std::unique_ptr<AttentionBackend> chosen = make_auto_backend(0);
  if (!chosen) GTEST_SKIP() << "no Hopper backend in this build, or GPU 0 is not sm_90";
  EXPECT_STREQ(chosen->name(), "auto");
  EXPECT_TRUE(chosen->caps().takes_delta);
  const int64_t S = AutoCalls::S;
  AutoCalls calls(128);
  const auto run = [&](const AttentionParams& params) { calls.run(*chosen, params); };
  std::vector<int64_t> zigzag = AutoCalls::zigzag(), gathered;
  for (int64_t i = 0; i < S; ++i) gathered.push_back(2 * S - 2 * (i / 2) * 2 + i % 2);  // 128 segments of 2 rows
  using Calls = std::vector<std::pair<std::string, int64_t>>;
  AttentionParams docs;
  docs.mask = MaskSpec::documents({0, 100, 1050, 2000});
  docs.q_positions = docs.k_positions = zigzag.data();
  run(docs);
  EXPECT_EQ(chosen->calls_by_backend(), (Calls{{"forward hopper", 1}, {"backward hopper", 1}}));
  docs.q_positions = docs.k_positions = gathered.data();  // more segments than the Hopper kernels take
  run(docs);
  EXPECT_EQ(chosen->calls_by_backend(),
            (Calls{{"forward hopper", 1}, {"forward cuda", 1}, {"backward hopper", 1}, {"backward cuda", 1}}));
  AttentionParams causal;  // dense, below 8K rows: cuDNN's forward where built
  causal.mask = MaskSpec::causal();
  causal.q_positions = causal.k_positions = zigzag.data();
  run(causal);
  const bool has_cudnn = make_cudnn_backend() != nullptr;
  const Calls want = has_cudnn ? Calls{{"forward cudnn", 1}, {"forward hopper", 1}, {"forward cuda", 1},
                                       {"backward hopper", 2}, {"backward cuda", 1}}
                               : Calls{{"forward hopper", 2}, {"forward cuda", 1}, {"backward hopper", 2},
                                       {"backward cuda", 1}};
  EXPECT_EQ(chosen->calls_by_backend(), want);
}

// The variant made with backward_from_o takes O in the backward (caps). No head dim has cuDNN's
// backward first any more (D = 64 did until the Hopper backward's 128-row query tiles beat it), so
// no problem picks this variant by itself; made by hand, it runs a dense call's backward at D = 64
// on the Hopper kernels with D made from O for its rows, as it does a masked one. (Its results
// are checked against the oracle with every backend's, above.)
TEST(AutoBackend, TakesOAndMakesDForTheHopperBackward) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  const std::unique_ptr<AttentionBackend> chosen = make_auto_backend(0, 0, true);
  if (!chosen) GTEST_SKIP() << "no Hopper or cuDNN backend in this build, or GPU 0 is not sm_90";
  EXPECT_FALSE(chosen->caps().takes_delta);
  EXPECT_FALSE(auto_backward_from_o(64));
  EXPECT_FALSE(auto_backward_from_o(128));
  AutoCalls calls(64);
  const auto run = [&](const AttentionParams& params) { calls.run(*chosen, params); };
  const std::vector<int64_t> zigzag = AutoCalls::zigzag();
  using Calls = std::vector<std::pair<std::string, int64_t>>;
  AttentionParams causal;
  causal.mask = MaskSpec::causal();
  causal.q_positions = causal.k_positions = zigzag.data();
  run(causal);
  EXPECT_EQ(chosen->calls_by_backend(), (Calls{{"forward cudnn", 1}, {"backward hopper", 1}}));
  AttentionParams docs;
  docs.mask = MaskSpec::documents({0, 100, 1050, 2000});
  docs.q_positions = docs.k_positions = zigzag.data();
  run(docs);
  EXPECT_EQ(chosen->calls_by_backend(),
            (Calls{{"forward cudnn", 1}, {"forward hopper", 1}, {"backward hopper", 2}}));
}

}  // namespace
}  // namespace seqpar
