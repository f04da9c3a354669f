// LASP over in-process CPU ranks: the chain and the all-gather variant against the fp64 oracle
// (outputs, final state, dq, dk, dv) over decays, GQA, d_k != d_v, uneven lengths, odd chunk
// lengths and T in {1, 2, 3, 4, 8}; bytes per rank equal to the walk of the passes and the
// formula, and independent of N; sequence groups in a data-parallel world. The ulysses baseline
// against the oracle too, with its all-to-alls' bytes. The errata have their
// own file (test_lasp_errata.cpp), the GPU half test_gpu_lasp.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>

#include "linear_test_util.hpp"
#include "seqpar/lasp.hpp"

namespace seqpar {
namespace {

using testing::expect_close;
using testing::LinearInputs;
using testing::LinearProblem;
using testing::make_linear_inputs;

const TensorView kNone{};

struct LaspRun {
  HostTensor o, dq, dk, dv, final_state;
  std::vector<CommCounters> counters;  // per rank of the sequence group
  LaspAlgorithm ran = LaspAlgorithm::kAuto;
};

LaspRun empty_run(const LinearProblem& p, int ranks) {
  LaspRun run{HostTensor(DType::kF64, {p.batch, p.seq, p.heads, p.dv}), HostTensor(DType::kF64, {p.batch, p.seq, p.heads, p.dk}),
              HostTensor(DType::kF64, {p.batch, p.seq, p.kv_heads, p.dk}), HostTensor(DType::kF64, {p.batch, p.seq, p.kv_heads, p.dv}),
              HostTensor(), std::vector<CommCounters>(ranks), LaspAlgorithm::kAuto};
  return run;
}

// Forward + backward of the global problem `in` on the ranks of `comm`; rows go back into *run.
Status lasp_on_ranks(Communicator& comm, const LinearInputs& in, const LinearProblem& p, LaspAlgorithm algo,
                     LaspRun* run) {
  const int me = comm.rank();
  SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(LayoutKind::kContiguous, p.seq, comm.size()));
  const int64_t n = layout.local_len(me);
  auto local = [&](const HostTensor& global, int64_t heads, int64_t dim) -> StatusOr<HostTensor> {
    HostTensor t(DType::kF64, {p.batch, n, heads, dim});
    SP_RETURN_IF_ERROR(layout.shard(global.view(), 1, me, t.view()));
    return t;
  };
  SP_ASSIGN_OR_RETURN(const HostTensor q, local(in.q, p.heads, p.dk));
  SP_ASSIGN_OR_RETURN(const HostTensor k, local(in.k, p.kv_heads, p.dk));
  SP_ASSIGN_OR_RETURN(const HostTensor v, local(in.v, p.kv_heads, p.dv));
  SP_ASSIGN_OR_RETURN(const HostTensor dout, local(in.dout, p.heads, p.dv));
  HostTensor o(DType::kF64, {p.batch, n, p.heads, p.dv}), dq(DType::kF64, {p.batch, n, p.heads, p.dk});
  HostTensor dk(DType::kF64, {p.batch, n, p.kv_heads, p.dk}), dv(DType::kF64, {p.batch, n, p.kv_heads, p.dv});
  LaspContext ctx;
  SP_RETURN_IF_ERROR(lasp_forward(comm, layout, p.params(), algo, q.view(), k.view(), v.view(), o.view(), &ctx));
  SP_RETURN_IF_ERROR(lasp_backward(comm, layout, p.params(), &ctx, q.view(), k.view(), v.view(), dout.view(),
                                   dq.view(), dk.view(), dv.view()));
  SP_RETURN_IF_ERROR(layout.unshard(o.view(), 1, me, run->o.view()));
  SP_RETURN_IF_ERROR(layout.unshard(dq.view(), 1, me, run->dq.view()));
  SP_RETURN_IF_ERROR(layout.unshard(dk.view(), 1, me, run->dk.view()));
  SP_RETURN_IF_ERROR(layout.unshard(dv.view(), 1, me, run->dv.view()));
  if (me == comm.size() - 1 && algo != LaspAlgorithm::kUlysses) {  // ulysses's stays in head parts
    SP_ASSIGN_OR_RETURN(run->final_state, lasp_state_out_on_host(ctx));
  }
  run->counters[me] = comm.counters();
  if (me == 0) run->ran = ctx.algorithm;
  return Status::Ok();
}

LaspRun run_lasp(const LinearInputs& in, const LinearProblem& p, int ranks, LaspAlgorithm algo) {
  LaspRun run = empty_run(p, ranks);
  const Status s = run_local_ranks(ranks, [&](Communicator& comm) { return lasp_on_ranks(comm, in, p, algo, &run); });
  EXPECT_TRUE(s.ok()) << s.to_string();
  return run;
}

LinearReferenceResult oracle(const LinearInputs& in, const LinearProblem& p) {
  auto r = linear_attention_reference(in.q.view(), in.k.view(), in.v.view(), kNone, in.dout.view(), kNone,
                                      p.params(), LinearOracleForm::kRecurrent);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

void expect_matches_oracle(const LaspRun& run, const LinearReferenceResult& want, double rel) {
  expect_close("o", run.o, want.o, rel);
  if (run.ran != LaspAlgorithm::kUlysses) expect_close("final state", run.final_state, want.state_out, rel);
  expect_close("dq", run.dq, want.dq, rel);
  expect_close("dk", run.dk, want.dk, rel);
  expect_close("dv", run.dv, want.dv, rel);
}

std::vector<LinearProblem> problems() {
  return {
      {1, 203, 2, 2, 8, 8, {1.0}, 1.0, 48},                 // plain linear attention
      {2, 203, 2, 2, 6, 4, {0.9}, 1.0, 40},                 // decay, d_k != d_v, B = 2
      {1, 203, 4, 2, 5, 7, {0.5, 0.8, 0.95, 1.0}, 0.5, 48},  // per-head decays, GQA, a scale
      {1, 203, 3, 1, 4, 6, {0.7, 0.99, 0.85}, 1.0, 40},      // MQA
  };
}

TEST(Lasp, ChainAndAllGatherMatchTheOracle) {
  for (const LinearProblem& p : problems()) {
    const LinearInputs in = make_linear_inputs(p, DType::kF64, 101);
    const LinearReferenceResult want = oracle(in, p);
    for (int ranks : {1, 2, 3, 4, 8})
      for (LaspAlgorithm algo : {LaspAlgorithm::kChain, LaspAlgorithm::kAllGather}) {
        SCOPED_TRACE(std::string(lasp_algorithm_name(algo)) + " T=" + std::to_string(ranks) +
                     " H=" + std::to_string(p.heads) + "/" + std::to_string(p.kv_heads));
        const LaspRun run = run_lasp(in, p, ranks, algo);
        EXPECT_EQ(run.ran, algo);
        expect_matches_oracle(run, want, 1e-10);
      }
  }
}

// The LASP paper's baseline (LaspAlgorithm::kUlysses): q, k, v to head parts by one all-to-all,
// the whole sequence per part, o home by another; the backward q, k, v again with dO over, dq,
// dk, dv back. Against the oracle where T divides the query and K/V heads (uneven lengths, B = 2,
// GQA, per-head decays, d_k != d_v), refused elsewhere; each rank sends, per pass, its rows of
// every other part one way and the other ranks' rows of its part the other way:
//   forward   (T-1) m_me (w_q + w_k + w_v) + (M - m_me) w_o                 bytes,
//   backward  (T-1) m_me (w_q + w_k + w_v + w_o) + (M - m_me) (w_q + w_k + w_v),
// m_r = B S_r rows of rank r, M = B N, w_* a part's heads x head dim x dtype size.
TEST(Lasp, UlyssesMatchesTheOracleAndSendsItsAllToAlls) {
  std::vector<LinearProblem> cases = problems();
  cases.push_back({2, 203, 4, 4, 5, 7, {0.5, 0.8, 0.95, 1.0}, 0.5, 48});
  for (const LinearProblem& p : cases) {
    const LinearInputs in = make_linear_inputs(p, DType::kF64, 141);
    const LinearReferenceResult want = oracle(in, p);
    for (int ranks : {1, 2, 3, 4, 8}) {
      SCOPED_TRACE("T=" + std::to_string(ranks) + " H=" + std::to_string(p.heads) + "/" + std::to_string(p.kv_heads) +
                   " B=" + std::to_string(p.batch));
      if (p.heads % ranks != 0 || p.kv_heads % ranks != 0) {
        LaspRun run = empty_run(p, ranks);
        const Status s = run_local_ranks(
            ranks, [&](Communicator& comm) { return lasp_on_ranks(comm, in, p, LaspAlgorithm::kUlysses, &run); });
        EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
        EXPECT_NE(s.message().find("ulysses over " + std::to_string(ranks) + " ranks"), std::string::npos)
            << s.to_string();
        continue;
      }
      const LaspRun run = run_lasp(in, p, ranks, LaspAlgorithm::kUlysses);
      EXPECT_EQ(run.ran, LaspAlgorithm::kUlysses);
      expect_matches_oracle(run, want, 1e-10);
      const Layout layout = Layout::create(LayoutKind::kContiguous, p.seq, ranks).value();
      const int64_t es = 8, hq = p.heads / ranks, hk = p.kv_heads / ranks;
      const int64_t qkv = (hq * p.dk + hk * p.dk + hk * p.dv) * es, o = hq * p.dv * es, M = p.batch * p.seq;
      for (int r = 0; r < ranks; ++r) {
        const int64_t m = p.batch * layout.local_len(r);
        EXPECT_EQ(run.counters[r].sent(Phase::kForward), (ranks - 1) * m * qkv + (M - m) * o) << "rank " << r;
        EXPECT_EQ(run.counters[r].sent(Phase::kBackward), (ranks - 1) * m * (qkv + o) + (M - m) * qkv)
            << "rank " << r;
      }
    }
  }
}

TEST(Lasp, Fp32MatchesTheOracle) {
  LinearProblem p = problems()[2];
  const LinearInputs in = make_linear_inputs(p, DType::kF64, 111);
  // The ranks compute in fp32 from the same values rounded; the oracle sees those values.
  const LinearInputs in32{testing::cast(in.q, DType::kF32), testing::cast(in.k, DType::kF32),
                          testing::cast(in.v, DType::kF32), testing::cast(in.dout, DType::kF32), {}, {}};
  const LinearInputs rounded{testing::cast(in32.q, DType::kF64), testing::cast(in32.k, DType::kF64),
                             testing::cast(in32.v, DType::kF64), testing::cast(in32.dout, DType::kF64), {}, {}};
  const LinearReferenceResult want32 = oracle(rounded, p);
  const Status s = run_local_ranks(3, [&](Communicator& comm) -> Status {
    SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(LayoutKind::kContiguous, p.seq, 3));
    const int64_t n = layout.local_len(comm.rank());
    HostTensor q(DType::kF32, {1, n, p.heads, p.dk}), k(DType::kF32, {1, n, p.kv_heads, p.dk});
    HostTensor v(DType::kF32, {1, n, p.kv_heads, p.dv}), o(DType::kF32, {1, n, p.heads, p.dv});
    SP_RETURN_IF_ERROR(layout.shard(in32.q.view(), 1, comm.rank(), q.view()));
    SP_RETURN_IF_ERROR(layout.shard(in32.k.view(), 1, comm.rank(), k.view()));
    SP_RETURN_IF_ERROR(layout.shard(in32.v.view(), 1, comm.rank(), v.view()));
    LaspContext ctx;
    SP_RETURN_IF_ERROR(lasp_forward(comm, layout, p.params(), LaspAlgorithm::kChain, q.view(), k.view(), v.view(),
                                    o.view(), &ctx));
    HostTensor want_rows(DType::kF64, {1, n, p.heads, p.dv});
    SP_RETURN_IF_ERROR(layout.shard(want32.o.view(), 1, comm.rank(), want_rows.view()));
    expect_close("o (fp32)", o, want_rows, 1e-5);
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.to_string();
}

// Every chain message is one state of every (batch, query head): B H d_k d_v elements; T-1 of
// them per pass; the same bytes whatever N is. The all-gather sends (T-1) states per rank.
TEST(Lasp, BytesAreOneStatePerHopAndIndependentOfN) {
  const int T = 4;
  std::map<LaspAlgorithm, std::vector<CommCounters>> first;
  for (int64_t N : {256, 1024, 4096, 16384}) {
    const LinearProblem p{1, N, 2, 2, 8, 8, {0.9}, 1.0, 64};
    const LinearInputs in = make_linear_inputs(p, DType::kF64, 121);
    const int64_t state_bytes = lasp_state_bytes(1, 2, 8, 8, DType::kF64);
    ASSERT_EQ(state_bytes, 1 * 2 * 8 * 8 * 8);
    for (LaspAlgorithm algo : {LaspAlgorithm::kChain, LaspAlgorithm::kAllGather}) {
      const LaspRun run = run_lasp(in, p, T, algo);
      int64_t chain_messages[2] = {0, 0};
      for (int r = 0; r < T; ++r) {
        const LaspTraffic want = lasp_expected_bytes(algo, T, r, state_bytes);
        const LaspTraffic walked = lasp_walked_bytes(algo, T, r, state_bytes);
        EXPECT_EQ(run.counters[r].sent(Phase::kForward), walked.forward) << "N=" << N << " rank " << r;
        EXPECT_EQ(run.counters[r].sent(Phase::kBackward), walked.backward) << "N=" << N << " rank " << r;
        EXPECT_EQ(run.counters[r].sent(Phase::kForward), want.forward) << "N=" << N << " rank " << r;
        EXPECT_EQ(run.counters[r].sent(Phase::kBackward), want.backward) << "N=" << N << " rank " << r;
        EXPECT_EQ(run.counters[r].received(Phase::kForward), algo == LaspAlgorithm::kChain ? (r > 0) * state_bytes
                                                                                           : want.forward);
        chain_messages[0] += run.counters[r].sent(Phase::kForward) / state_bytes;
        chain_messages[1] += run.counters[r].sent(Phase::kBackward) / state_bytes;
      }
      if (algo == LaspAlgorithm::kChain) {
        EXPECT_EQ(chain_messages[0], T - 1);
        EXPECT_EQ(chain_messages[1], T - 1);
      }
      if (!first.count(algo)) first[algo] = run.counters;
      for (int r = 0; r < T; ++r)
        for (Phase ph : {Phase::kForward, Phase::kBackward})
          EXPECT_EQ(run.counters[r].sent(ph), first[algo][r].sent(ph)) << "N=" << N << " rank " << r;
    }
  }
}

// The bytes walked from every rank's steps are the paper's formula: the chain sends one state
// downstream per pass (none from the last rank of the pass), the all-gather (T-1) states.
TEST(Lasp, WalkedBytesAreTheFormula) {
  for (int ranks : {1, 2, 3, 4, 8})
    for (LaspAlgorithm algo : {LaspAlgorithm::kChain, LaspAlgorithm::kAllGather})
      for (int r = 0; r < ranks; ++r) {
        const LaspTraffic walked = lasp_walked_bytes(algo, ranks, r, 4096), formula = lasp_expected_bytes(algo, ranks, r, 4096);
        EXPECT_EQ(walked.forward, formula.forward) << lasp_algorithm_name(algo) << " T=" << ranks << " rank " << r;
        EXPECT_EQ(walked.backward, formula.backward) << lasp_algorithm_name(algo) << " T=" << ranks << " rank " << r;
      }
}

TEST(Lasp, AutoPicksTheChainUnderTheRingModel) {
  for (int ranks : {1, 2, 3, 8, 64}) {
    EXPECT_EQ(choose_lasp_algorithm(ranks, 1 << 20), LaspAlgorithm::kChain);
    EXPECT_EQ(lasp_chain_seconds(ranks, 4096, {}), lasp_allgather_seconds(ranks, 4096, {}));
  }
  const LinearProblem p{1, 64, 2, 2, 4, 4, {0.9}, 1.0, 16};
  EXPECT_EQ(run_lasp(make_linear_inputs(p, DType::kF64, 131), p, 3, LaspAlgorithm::kAuto).ran, LaspAlgorithm::kChain);
  EXPECT_EQ(parse_lasp_algorithm("lasp2").value(), LaspAlgorithm::kAllGather);
  EXPECT_FALSE(parse_lasp_algorithm("ring").ok());
}

// W = 8 ranks as G = 2 sequence groups of T = 4 (Fig. 2): each group runs its own sequence,
// matches that sequence's oracle, and its ranks send the bytes of a group of 4.
TEST(Lasp, SequenceGroupsInsideADataParallelWorld) {
  const int W = 8, T = 4, G = 2;
  const LinearProblem p{1, 150, 4, 2, 6, 5, {0.6, 0.9, 1.0, 0.8}, 1.0, 40};
  std::vector<LinearInputs> inputs;
  std::vector<LaspRun> runs;
  for (int g = 0; g < G; ++g) {
    inputs.push_back(make_linear_inputs(p, DType::kF64, 200 + 10 * g));
    runs.push_back(empty_run(p, T));
  }
  for (LaspAlgorithm algo : {LaspAlgorithm::kChain, LaspAlgorithm::kAllGather}) {
    const Status s = run_local_ranks(W, [&](Communicator& world) -> Status {
      SP_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> group, make_sequence_group(world, T));
      SP_CHECK_ARG(group->size() == T && group->rank() == world.rank() % T, "unexpected group");
      const int g = world.rank() / T;
      return lasp_on_ranks(*group, inputs[g], p, algo, &runs[g]);
    });
    ASSERT_TRUE(s.ok()) << s.to_string();
    const int64_t state_bytes = lasp_state_bytes(1, 4, 6, 5, DType::kF64);
    for (int g = 0; g < G; ++g) {
      SCOPED_TRACE(std::string(lasp_algorithm_name(algo)) + " group " + std::to_string(g));
      expect_matches_oracle(runs[g], oracle(inputs[g], p), 1e-10);
      for (int r = 0; r < T; ++r) {
        EXPECT_EQ(runs[g].counters[r].sent(Phase::kForward), lasp_expected_bytes(algo, T, r, state_bytes).forward);
        EXPECT_EQ(runs[g].counters[r].sent(Phase::kBackward), lasp_expected_bytes(algo, T, r, state_bytes).backward);
      }
    }
    EXPECT_GT(testing::max_abs_diff(runs[0].o, runs[1].o), 0.1);  // two different sequences
  }
}

TEST(Lasp, RefusesWhatItCannotRun) {
  const LinearProblem p{1, 40, 2, 2, 4, 4, {0.9}, 1.0, 16};
  const Status s = run_local_ranks(2, [&](Communicator& comm) -> Status {
    SP_ASSIGN_OR_RETURN(const Layout zigzag, Layout::create(LayoutKind::kZigzag, p.seq, 2));
    HostTensor q(DType::kF64, {1, zigzag.local_len(comm.rank()), 2, 4});
    LaspContext ctx;
    const Status bad_layout = lasp_forward(comm, zigzag, p.params(), LaspAlgorithm::kChain, q.view(), q.view(),
                                           q.view(), q.view(), &ctx);
    SP_CHECK_ARG(bad_layout.code() == StatusCode::kInvalidArgument, "zigzag accepted");
    SP_ASSIGN_OR_RETURN(const Layout three, Layout::create(LayoutKind::kContiguous, p.seq, 3));
    SP_CHECK_ARG(!lasp_forward(comm, three, p.params(), LaspAlgorithm::kChain, q.view(), q.view(), q.view(),
                               q.view(), &ctx).ok(), "a layout over 3 ranks accepted on 2");
    SP_ASSIGN_OR_RETURN(const Layout two, Layout::create(LayoutKind::kContiguous, p.seq, 2));
    LaspContext never_forwarded;
    SP_CHECK_ARG(!lasp_backward(comm, two, p.params(), &never_forwarded, q.view(), q.view(), q.view(), q.view(),
                                q.view(), q.view(), q.view()).ok(), "a backward without its forward ran");
    HostTensor bf16(DType::kBF16, {1, two.local_len(comm.rank()), 2, 4});
    SP_CHECK_ARG(lasp_forward(comm, two, p.params(), LaspAlgorithm::kChain, bf16.view(), bf16.view(), bf16.view(),
                              bf16.view(), &never_forwarded).code() == StatusCode::kUnsupported,
                 "bf16 host tensors accepted by the CPU backend");
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.to_string();
}

}  // namespace
}  // namespace seqpar
