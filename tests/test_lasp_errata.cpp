// One regression test per erratum of the LASP paper (papers/004_lasp.md, section 2.9 and 8.1):
// the literal printed version fails each, the corrected version, as the library implements it,
// passes. The chain is simulated on T ranks in one thread, messages waiting in a mailbox; every
// rank computes through the linear-attention backend table LASP runs on, on both devices: the
// CPU row in fp64, held to the fp64 oracle at 1e-10, and the CUDA row in bf16 with fp32 states,
// held to the bf16 rule (tests/linear_lowp.hpp's plain baseline; skipped without a GPU). The
// divisibility and decay-factor errata involve no kernel and run once.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <ostream>
#include <memory>

#include "kernels/linear_backend.hpp"
#include "linear_lowp.hpp"
#include "linear_test_util.hpp"
#include "seqpar/gpu.hpp"
#include "seqpar/lasp.hpp"

namespace seqpar {
namespace {

using testing::LinearInputs;
using testing::LinearProblem;
using testing::make_linear_inputs;

const TensorView kNone{};

struct DeviceCase {
  const char* name;
  DeviceKind device;
  DType dtype;  // of the inputs and the rows (states: the backend's)
  LinearProblem problem;
};

// gtest names each case by it (ctest lists the name, not the struct's bytes).
void PrintTo(const DeviceCase& c, std::ostream* os) { *os << c.name; }

// A tensor on the device under test: the host tensor itself on the CPU, a copy on the GPU.
struct Placed {
  HostTensor host;
  DeviceTensor device;
  TensorView view;
};

// The whole sequence's oracle and, on the GPU, the plain low-precision baseline of the rule.
struct Reference {
  LinearReferenceResult oracle, plain;
};

// Public: the simulation below (free functions) places, fetches and judges through it.
class LaspErrata : public ::testing::TestWithParam<DeviceCase> {
 public:
  void SetUp() override {
    if (GetParam().device == DeviceKind::kCuda && cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device here";
    auto backend = make_linear_backend(GetParam().device);
    ASSERT_TRUE(backend.ok()) << backend.status().to_string();
    backend_ = std::move(backend).value();
  }

  const LinearProblem& problem() const { return GetParam().problem; }
  bool on_gpu() const { return GetParam().device == DeviceKind::kCuda; }
  DType state_dtype() const { return backend_->state_dtype(GetParam().dtype); }

  Placed place(const HostTensor& t) const {
    Placed p{t, {}, {}};
    if (!on_gpu()) {
      p.view = p.host.view();
      return p;
    }
    auto d = to_device(t);
    EXPECT_TRUE(d.ok()) << d.status().to_string();
    if (d.ok()) p.device = std::move(d).value(), p.view = p.device.view;
    return p;
  }
  Placed zeros(DType dtype, const std::vector<int64_t>& shape) const { return place(HostTensor(dtype, shape)); }
  Placed zero_state() const {
    const LinearProblem& p = problem();
    return zeros(state_dtype(), {p.batch, p.heads, p.dk, p.dv});
  }
  // Back on the host, in fp64.
  HostTensor fetch(const Placed& t) const {
    if (!on_gpu()) return testing::cast(t.host, DType::kF64);
    auto host = to_host(t.view);
    EXPECT_TRUE(host.ok()) << host.status().to_string();
    return host.ok() ? testing::cast(host.value(), DType::kF64) : HostTensor();
  }

  Reference reference(const LinearInputs& in) const {
    const LinearProblem& p = problem();
    Reference r{linear_attention_reference(in.q.view(), in.k.view(), in.v.view(), kNone, in.dout.view(), kNone,
                                           p.params(), LinearOracleForm::kRecurrent).value(), {}};
    if (on_gpu()) r.plain = testing::plain_lowp_linear(in.q, in.k, in.v, nullptr, &in.dout, nullptr, p.params(),
                                                       GetParam().dtype);
    return r;
  }
  // "" when `got` meets the device's bar against the oracle: 1e-10 relative in fp64 on the CPU,
  // the bf16 rule on the GPU.
  std::string meets(const char* what, const HostTensor& got, const HostTensor& oracle, const HostTensor& plain) const {
    if (on_gpu()) return testing::check_lowp_rule(what, got, plain, oracle, GetParam().dtype);
    const double err = testing::max_abs_diff(got, oracle), bound = 1e-10 * std::max(1.0, testing::max_abs(oracle));
    return err <= bound ? "" : std::string(what) + ": error " + std::to_string(err);
  }
  // Whether `got` is grossly wrong: off by more than 1e-2 of the largest value, and (GPU) outside
  // the rule as well, so that rounding alone can never pass for the erratum.
  bool wrong(const HostTensor& got, const HostTensor& oracle, const HostTensor& plain) const {
    return testing::max_abs_diff(got, oracle) > 1e-2 * testing::max_abs(oracle) &&
           (!on_gpu() || !testing::check_lowp_rule("", got, plain, oracle, GetParam().dtype).empty());
  }

  std::unique_ptr<LinearBackend> backend_;
};

// The global problem cut into T contiguous segments on the device, with the state entering each
// (computed serially, rank by rank, through the backend).
struct Segments {
  Layout layout;
  std::vector<Placed> q, k, v, dout, state_in;
};

Segments split(const LaspErrata& t, LinearBackend& be, const LinearInputs& in, int T) {
  const LinearProblem& p = t.GetParam().problem;
  Segments seg{Layout::create(LayoutKind::kContiguous, p.seq, T).value(), {}, {}, {}, {}, {}};
  auto shard = [&](const HostTensor& whole, int r) {
    const TensorView& w = whole.view();
    HostTensor local(w.dtype, {w.shape[0], seg.layout.local_len(r), w.shape[2], w.shape[3]});
    EXPECT_TRUE(seg.layout.shard(w, 1, r, local.view()).ok());
    return t.place(local);
  };
  Placed carried = t.zero_state();
  for (int r = 0; r < T; ++r) {
    seg.q.push_back(shard(in.q, r)), seg.k.push_back(shard(in.k, r)), seg.v.push_back(shard(in.v, r));
    seg.dout.push_back(shard(in.dout, r));
    Placed next = t.zero_state();
    EXPECT_TRUE(be.forward(seg.q[r].view, seg.k[r].view, seg.v[r].view, carried.view, p.params(), kNone, next.view,
                           nullptr).ok());
    seg.state_in.push_back(std::move(carried));
    carried = std::move(next);
  }
  return seg;
}

struct Gradients {
  HostTensor dk, dv;  // fp64, the whole sequence
};

Gradients no_gradients(const LinearProblem& p) {
  return {HostTensor(DType::kF64, {p.batch, p.seq, p.kv_heads, p.dk}),
          HostTensor(DType::kF64, {p.batch, p.seq, p.kv_heads, p.dv})};
}

// One rank's backward given the dState arriving from the later ranks; its dk, dv go into *g.
Placed rank_backward(const LaspErrata& t, LinearBackend& be, const Segments& seg, int r, const Placed& dstate_out,
                     Gradients* g) {
  const LinearProblem& p = t.GetParam().problem;
  const DType dtype = t.GetParam().dtype;
  const int64_t n = seg.layout.local_len(r);
  Placed dq = t.zeros(dtype, {p.batch, n, p.heads, p.dk}), dk = t.zeros(dtype, {p.batch, n, p.kv_heads, p.dk});
  Placed dv = t.zeros(dtype, {p.batch, n, p.kv_heads, p.dv}), dstate_in = t.zero_state();
  const Status s = be.backward(seg.q[r].view, seg.k[r].view, seg.v[r].view, seg.state_in[r].view, seg.dout[r].view,
                               dstate_out.view, p.params(), dq.view, dk.view, dv.view, dstate_in.view, nullptr);
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(seg.layout.unshard(t.fetch(dk).view(), 1, r, g->dk.view()).ok());
  EXPECT_TRUE(seg.layout.unshard(t.fetch(dv).view(), 1, r, g->dv.view()).ok());
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

ChainOutcome simulate_backward_chain(const LaspErrata& t, LinearBackend& be, const Segments& seg,
                                     const std::function<int(int)>& send_to, bool missing_is_zero) {
  const int T = seg.layout.ranks();
  ChainOutcome out{-1, no_gradients(t.GetParam().problem)};
  std::map<std::pair<int, int>, Placed> mailbox;  // (from, to) -> dKV
  for (int i = T - 1; i >= 0; --i) {
    Placed dkv = t.zero_state();
    if (i < T - 1) {
      const auto letter = mailbox.find({i + 1, i});
      if (letter != mailbox.end()) {
        dkv = std::move(letter->second);
      } else if (!missing_is_zero) {
        out.stuck_rank = i;
        return out;
      }
    }
    Placed sent = rank_backward(t, be, seg, i, dkv, &out.grads);
    const int to = send_to(i);
    if (to >= 0 && to < T) mailbox[{i, to}] = std::move(sent);
  }
  return out;
}

// Erratum A2: Algorithm 3 line 19 prints "Send dKV_t to rank i"; the text after Eq. 21 (and
// ours) sends to rank i-1. Read as i, or as i+1, rank T-2 waits for a message that went elsewhere.
TEST_P(LaspErrata, Algorithm3Line19SendsDkvToRankIMinus1) {
  const int T = 4;
  const LinearInputs in = make_linear_inputs(problem(), GetParam().dtype, 301);
  const Reference ref = reference(in);
  const Segments seg = split(*this, *backend_, in, T);
  const ChainOutcome corrected = simulate_backward_chain(*this, *backend_, seg, [](int i) { return i - 1; }, false);
  EXPECT_EQ(corrected.stuck_rank, -1);
  EXPECT_EQ(meets("dk", corrected.grads.dk, ref.oracle.dk, ref.plain.dk), "");
  EXPECT_EQ(meets("dv", corrected.grads.dv, ref.oracle.dv, ref.plain.dv), "");
  for (const auto& printed : {std::function<int(int)>([](int i) { return i; }), std::function<int(int)>([](int i) { return i + 1; })})
    EXPECT_EQ(simulate_backward_chain(*this, *backend_, seg, printed, false).stuck_rank, T - 2);
  // Read leniently (a missing dKV taken as the zero the last rank starts from) it runs, wrongly.
  const ChainOutcome lenient = simulate_backward_chain(*this, *backend_, seg, [](int i) { return i; }, true);
  EXPECT_TRUE(wrong(lenient.grads.dk, ref.oracle.dk, ref.plain.dk));
}

// scale * sum_{s >= from} lambda^(s - anchor) q_s dout_s^T per (batch, head), global positions,
// in fp64 from the inputs' values; `transposed` stores dout_s q_s^T instead (needs d_k = d_v).
HostTensor suffix_dstate(const LinearInputs& in, const LinearProblem& p, int64_t from, int64_t anchor, bool transposed) {
  const HostTensor q = testing::cast(in.q, DType::kF64), dout = testing::cast(in.dout, DType::kF64);
  HostTensor out(DType::kF64, {p.batch, p.heads, p.dk, p.dv});
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t s = from; s < p.seq; ++s) {
        const double w = p.scale * decay_power(p.params(), h, s - anchor);
        const double* qs = q.data<double>() + ((b * p.seq + s) * p.heads + h) * p.dk;
        const double* g = dout.data<double>() + ((b * p.seq + s) * p.heads + h) * p.dv;
        double* S = out.data<double>() + (b * p.heads + h) * p.dk * p.dv;
        for (int64_t a = 0; a < p.dk; ++a)
          for (int64_t e = 0; e < p.dv; ++e) S[a * p.dv + e] += w * (transposed ? qs[e] * g[a] : qs[a] * g[e]);
      }
  return out;
}

// Erratum A3: Eq. 21's first line defines dKV_t over s > tC, the suffix *after* chunk t, while
// chunk t's inter terms use dKV_{t+1}, which must be the suffix *from* chunk t+1; its second line
// writes q_s^T do_s for q_s do_s^T. Either literal reading gives wrong dk, dv; ours is right.
TEST_P(LaspErrata, Eq21DkvIsTheSuffixFromTheNextChunk) {
  const int T = 4;
  const LinearProblem& p = problem();
  ASSERT_EQ(p.dk, p.dv);  // the transposed reading needs square states
  const LinearInputs in = make_linear_inputs(p, GetParam().dtype, 311);
  const Reference ref = reference(in);
  const Segments seg = split(*this, *backend_, in, T);
  auto run = [&](const std::function<HostTensor(int64_t next, int64_t after_next)>& dkv_for) {
    Gradients g = no_gradients(p);
    for (int r = 0; r < T; ++r) {
      const int64_t next = r + 1 < T ? seg.layout.positions(r + 1)[0] : p.seq;
      const int64_t after_next = r + 2 < T ? seg.layout.positions(r + 2)[0] : p.seq;
      (void)rank_backward(*this, *backend_, seg, r, place(testing::cast(dkv_for(next, after_next), state_dtype())), &g);
    }
    return g;
  };
  const Gradients ours = run([&](int64_t next, int64_t) { return suffix_dstate(in, p, next, next - 1, false); });
  EXPECT_EQ(meets("dk", ours.dk, ref.oracle.dk, ref.plain.dk), "");
  EXPECT_EQ(meets("dv", ours.dv, ref.oracle.dv, ref.plain.dv), "");
  const Gradients printed_range =
      run([&](int64_t, int64_t after_next) { return suffix_dstate(in, p, after_next, after_next - 1, false); });
  EXPECT_TRUE(wrong(printed_range.dk, ref.oracle.dk, ref.plain.dk));
  const Gradients printed_transpose = run([&](int64_t next, int64_t) { return suffix_dstate(in, p, next, next - 1, true); });
  EXPECT_TRUE(wrong(printed_transpose.dv, ref.oracle.dv, ref.plain.dv));
}

// The CPU row computes in fp64 on small heads; the CUDA row takes bf16 rows of 64 dims (its
// smallest), with a scale that keeps the scores near 1.
INSTANTIATE_TEST_SUITE_P(
    Devices, LaspErrata,
    ::testing::Values(DeviceCase{"cpu", DeviceKind::kCpu, DType::kF64, {1, 150, 2, 1, 4, 4, {0.9, 0.7}, 1.0, 40}},
                      DeviceCase{"cuda", DeviceKind::kCuda, DType::kBF16, {1, 150, 2, 1, 64, 64, {0.9, 0.7}, 0.125, 64}}),
    [](const ::testing::TestParamInfo<DeviceCase>& info) { return std::string(info.param.name); });

// Erratum A1: the paper says T must be divisible by W; G = W / T needs W divisible by T.
TEST(LaspErrataHost, WorldSizeDivisibleBySequenceParallelSize) {
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
TEST(LaspErrataHost, DecayFactorsAreOneExpOfTheDistance) {
  const LinearAttentionParams params{{0.01}, 1.0, 256};
  const int64_t C = 256, j = 200;
  const double printed = std::pow(0.01, double(C)) * std::pow(0.01, -double(j));
  const double exact = std::pow(10.0, -2.0 * double(C - j));  // 1e-112
  EXPECT_FALSE(std::abs(printed - exact) <= 1e-12 * exact) << printed;
  EXPECT_NEAR(decay_power(params, 0, C - j) / exact, 1.0, 1e-12);
}

}  // namespace
}  // namespace seqpar
