// One regression test per erratum of the LASP paper (papers/004_lasp.md, section 2.9 and 8.1):
// the literal printed version fails each, the corrected version, as the library implements it,
// passes. The chain is simulated on T ranks in one thread, messages waiting in a mailbox.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "linear_test_util.hpp"
#include "seqpar/lasp.hpp"

namespace seqpar {
namespace {

using testing::expect_close;
using testing::LinearInputs;
using testing::LinearProblem;
using testing::make_linear_inputs;

const TensorView kNone{};

HostTensor zeros_like(const HostTensor& t) {
  return HostTensor(t.view().dtype, std::vector<int64_t>(t.view().shape.begin(), t.view().shape.begin() + 4));
}

// The global problem cut into T contiguous segments, with the state entering each (serial).
struct Segments {
  Layout layout;
  std::vector<LinearInputs> rank;  // q, k, v, dout of each rank; state_in set, dstate_out unused
};

Segments split(const LinearInputs& in, const LinearProblem& p, int T) {
  Segments seg{Layout::create(LayoutKind::kContiguous, p.seq, T).value(), {}};
  HostTensor carried(DType::kF64, {p.batch, p.heads, p.dk, p.dv});
  for (int r = 0; r < T; ++r) {
    const int64_t n = seg.layout.local_len(r);
    LinearInputs mine{HostTensor(DType::kF64, {p.batch, n, p.heads, p.dk}), HostTensor(DType::kF64, {p.batch, n, p.kv_heads, p.dk}),
                      HostTensor(DType::kF64, {p.batch, n, p.kv_heads, p.dv}), HostTensor(DType::kF64, {p.batch, n, p.heads, p.dv}),
                      carried, {}};
    EXPECT_TRUE(seg.layout.shard(in.q.view(), 1, r, mine.q.view()).ok());
    EXPECT_TRUE(seg.layout.shard(in.k.view(), 1, r, mine.k.view()).ok());
    EXPECT_TRUE(seg.layout.shard(in.v.view(), 1, r, mine.v.view()).ok());
    EXPECT_TRUE(seg.layout.shard(in.dout.view(), 1, r, mine.dout.view()).ok());
    EXPECT_TRUE(linear_attention_forward(mine.q.view(), mine.k.view(), mine.v.view(), mine.state_in.view(), p.params(),
                                         kNone, carried.view()).ok());
    seg.rank.push_back(std::move(mine));
  }
  return seg;
}

struct Gradients {
  HostTensor dk, dv;
};

// One rank's backward given the dState arriving from the later ranks; its dk, dv go into *g.
HostTensor rank_backward(const Segments& seg, const LinearProblem& p, int r, const HostTensor& dstate_out,
                         Gradients* g) {
  const LinearInputs& in = seg.rank[r];
  HostTensor dq = zeros_like(in.q), dk = zeros_like(in.k), dv = zeros_like(in.v), dstate_in = zeros_like(dstate_out);
  EXPECT_TRUE(linear_attention_backward(in.q.view(), in.k.view(), in.v.view(), in.state_in.view(), in.dout.view(),
                                        dstate_out.view(), p.params(), dq.view(), dk.view(), dv.view(),
                                        dstate_in.view()).ok());
  EXPECT_TRUE(seg.layout.unshard(dk.view(), 1, r, g->dk.view()).ok());
  EXPECT_TRUE(seg.layout.unshard(dv.view(), 1, r, g->dv.view()).ok());
  return dstate_in;
}

// Algorithm 3's reverse chain: rank i takes the dKV rank i+1 addressed to it (the last rank
// starts from zero), computes, and sends its dKV to send_to(i) when that is a rank. A rank whose
// message was never sent waits forever on real ranks; here it is reported as stuck, or, with
// missing_is_zero, it goes on with a zero dKV as if nothing were owed.
struct ChainOutcome {
  int stuck_rank = -1;
  Gradients grads;
};

ChainOutcome simulate_backward_chain(const Segments& seg, const LinearProblem& p, const std::function<int(int)>& send_to,
                                     bool missing_is_zero) {
  const int T = seg.layout.ranks();
  ChainOutcome out{-1, {HostTensor(DType::kF64, {p.batch, p.seq, p.kv_heads, p.dk}),
                        HostTensor(DType::kF64, {p.batch, p.seq, p.kv_heads, p.dv})}};
  std::map<std::pair<int, int>, HostTensor> mailbox;  // (from, to) -> dKV
  for (int i = T - 1; i >= 0; --i) {
    HostTensor dkv(DType::kF64, {p.batch, p.heads, p.dk, p.dv});
    if (i < T - 1) {
      const auto letter = mailbox.find({i + 1, i});
      if (letter != mailbox.end()) {
        dkv = letter->second;
      } else if (!missing_is_zero) {
        out.stuck_rank = i;
        return out;
      }
    }
    const HostTensor sent = rank_backward(seg, p, i, dkv, &out.grads);
    const int to = send_to(i);
    if (to >= 0 && to < T) mailbox[{i, to}] = sent;
  }
  return out;
}

LinearReferenceResult oracle(const LinearInputs& in, const LinearProblem& p) {
  return linear_attention_reference(in.q.view(), in.k.view(), in.v.view(), kNone, in.dout.view(), kNone, p.params(),
                                    LinearOracleForm::kRecurrent).value();
}

const LinearProblem kProblem{1, 150, 2, 1, 4, 4, {0.9, 0.7}, 1.0, 40};

// Erratum A2: Algorithm 3 line 19 prints "Send dKV_t to rank i"; the text after Eq. 21 (and
// ours) sends to rank i-1. Read as i, or as i+1, rank T-2 waits for a message that went elsewhere.
TEST(LaspErrata, Algorithm3Line19SendsDkvToRankIMinus1) {
  const int T = 4;
  const LinearInputs in = make_linear_inputs(kProblem, DType::kF64, 301);
  const LinearReferenceResult want = oracle(in, kProblem);
  const Segments seg = split(in, kProblem, T);
  const ChainOutcome corrected = simulate_backward_chain(seg, kProblem, [](int i) { return i - 1; }, false);
  EXPECT_EQ(corrected.stuck_rank, -1);
  expect_close("dk", corrected.grads.dk, want.dk, 1e-10);
  expect_close("dv", corrected.grads.dv, want.dv, 1e-10);
  for (const auto& printed : {std::function<int(int)>([](int i) { return i; }), std::function<int(int)>([](int i) { return i + 1; })})
    EXPECT_EQ(simulate_backward_chain(seg, kProblem, printed, false).stuck_rank, T - 2);
  // Read leniently (a missing dKV taken as the zero the last rank starts from) it runs, wrongly.
  const ChainOutcome lenient = simulate_backward_chain(seg, kProblem, [](int i) { return i; }, true);
  EXPECT_GT(testing::max_abs_diff(lenient.grads.dk, want.dk), 1e-2 * testing::max_abs(want.dk));
}

// scale * sum_{s >= from} lambda^(s - anchor) q_s dout_s^T per (batch, head), global positions;
// `transposed` stores dout_s q_s^T instead (needs d_k = d_v).
HostTensor suffix_dstate(const LinearInputs& in, const LinearProblem& p, int64_t from, int64_t anchor, bool transposed) {
  HostTensor out(DType::kF64, {p.batch, p.heads, p.dk, p.dv});
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t s = from; s < p.seq; ++s) {
        const double w = p.scale * decay_power(p.params(), h, s - anchor);
        const double* q = in.q.data<double>() + ((b * p.seq + s) * p.heads + h) * p.dk;
        const double* g = in.dout.data<double>() + ((b * p.seq + s) * p.heads + h) * p.dv;
        double* S = out.data<double>() + (b * p.heads + h) * p.dk * p.dv;
        for (int64_t a = 0; a < p.dk; ++a)
          for (int64_t e = 0; e < p.dv; ++e) S[a * p.dv + e] += w * (transposed ? q[e] * g[a] : q[a] * g[e]);
      }
  return out;
}

// Erratum A3: Eq. 21's first line defines dKV_t over s > tC, the suffix *after* chunk t, while
// chunk t's inter terms use dKV_{t+1}, which must be the suffix *from* chunk t+1; its second line
// writes q_s^T do_s for q_s do_s^T. Either literal reading gives wrong dk, dv; ours is right.
TEST(LaspErrata, Eq21DkvIsTheSuffixFromTheNextChunk) {
  const int T = 4;
  const LinearInputs in = make_linear_inputs(kProblem, DType::kF64, 311);
  const LinearReferenceResult want = oracle(in, kProblem);
  const Segments seg = split(in, kProblem, T);
  auto run = [&](const std::function<HostTensor(int64_t next, int64_t after_next)>& dkv_for) {
    Gradients g{HostTensor(DType::kF64, {1, kProblem.seq, 1, 4}), HostTensor(DType::kF64, {1, kProblem.seq, 1, 4})};
    for (int r = 0; r < T; ++r) {
      const int64_t next = r + 1 < T ? seg.layout.positions(r + 1)[0] : kProblem.seq;
      const int64_t after_next = r + 2 < T ? seg.layout.positions(r + 2)[0] : kProblem.seq;
      (void)rank_backward(seg, kProblem, r, dkv_for(next, after_next), &g);
    }
    return g;
  };
  const Gradients ours = run([&](int64_t next, int64_t) { return suffix_dstate(in, kProblem, next, next - 1, false); });
  expect_close("dk", ours.dk, want.dk, 1e-10);
  expect_close("dv", ours.dv, want.dv, 1e-10);
  const Gradients printed_range =
      run([&](int64_t, int64_t after_next) { return suffix_dstate(in, kProblem, after_next, after_next - 1, false); });
  EXPECT_GT(testing::max_abs_diff(printed_range.dk, want.dk), 1e-2 * testing::max_abs(want.dk));
  const Gradients printed_transpose =
      run([&](int64_t next, int64_t) { return suffix_dstate(in, kProblem, next, next - 1, true); });
  EXPECT_GT(testing::max_abs_diff(printed_transpose.dv, want.dv), 1e-2 * testing::max_abs(want.dv));
}

// Erratum A1: the paper says T must be divisible by W; G = W / T needs W divisible by T.
TEST(LaspErrata, WorldSizeDivisibleBySequenceParallelSize) {
  const auto printed = [](int W, int T) { return T % W == 0; };
  EXPECT_FALSE(printed(8, 4));  // refuses Fig. 2's own example
  EXPECT_TRUE(printed(4, 8));   // accepts 8 sequence ranks in a world of 4
  const Status s = run_local_ranks(8, [&](Communicator& world) -> Status {
    SP_ASSIGN_OR_RETURN(auto group, make_sequence_group(world, 4));
    SP_CHECK_ARG(group->size() == 4, "Fig. 2: groups of 4");
    SP_CHECK_ARG(!make_sequence_group(world, 3).ok(), "8 ranks split into groups of 3");
    SP_CHECK_ARG(!make_sequence_group(world, 16).ok(), "groups larger than the world");
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.to_string();
}

// Checklist item 5: lambda^C Lambda^-1 = diag(lambda^(C-1-j)) evaluated as lambda^C * lambda^-j
// underflows to 0 times an overflow (NaN) for a strong decay over a long chunk; ours takes one
// exp of the distance.
TEST(LaspErrata, DecayFactorsAreOneExpOfTheDistance) {
  const LinearAttentionParams params{{0.01}, 1.0, 256};
  const int64_t C = 256, j = 200;
  const double printed = std::pow(0.01, double(C)) * std::pow(0.01, -double(j));
  const double exact = std::pow(10.0, -2.0 * double(C - j));  // 1e-112
  EXPECT_FALSE(std::abs(printed - exact) <= 1e-12 * exact) << printed;
  EXPECT_NEAR(decay_power(params, 0, C - j) / exact, 1.0, 1e-12);
}

}  // namespace
}  // namespace seqpar
