// LASP on GPUs (seqpar/lasp.hpp with device tensors): the state chain and the all-gather over P
// ranks, each holding a contiguous shard on the device, gathered and held to the whole sequence's
// fp64 oracle under the bf16 rule (tests/linear_lowp.hpp's plain low-precision baseline, one call
// over the whole sequence): outputs, the final state, and every gradient; the bytes each rank
// sent equal the walk of its passes and lasp_expected_bytes of an fp32 state. Thread ranks share
// GPU 0 (P = 1, 2, 3, shards of unequal length), and on two GPUs the NCCL communicator. The
// LASP paper's ulysses baseline the same way where P splits the heads (its final state stays in
// head parts, and test_lasp.cpp counts its bytes). Skipped without a GPU. The backend table's
// state combine and zero are also held to the CPU row.
#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/linear_backend.hpp"
#include "linear_lowp.hpp"
#include "linear_test_util.hpp"
#include "seqpar/gpu.hpp"
#include "seqpar/lasp.hpp"
#include "seqpar/nccl_comm.hpp"

namespace seqpar {
namespace {

using testing::cast;
using testing::LinearProblem;

// Rank `rank`'s rows of a [B, S, H, D] host tensor.
HostTensor shard_of(const Layout& layout, int rank, const HostTensor& t) {
  const TensorView& v = t.view();
  HostTensor local(v.dtype, {v.shape[0], layout.local_len(rank), v.shape[2], v.shape[3]});
  EXPECT_TRUE(layout.shard(v, 1, rank, local.view()).ok());
  return local;
}

struct Gathered {
  HostTensor o, dq, dk, dv, final_state;
  std::string failure;
};

using Launcher = Status (*)(int, const std::function<Status(Communicator&)>&);

// Each rank runs its shard's forward and backward; results land in the whole-sequence tensors.
Gathered run_lasp(const LinearProblem& p, LaspAlgorithm algorithm, int ranks, Launcher launch,
                  const testing::LinearInputs& in, DType dtype) {
  Gathered g{HostTensor(dtype, {p.batch, p.seq, p.heads, p.dv}), HostTensor(dtype, {p.batch, p.seq, p.heads, p.dk}),
             HostTensor(dtype, {p.batch, p.seq, p.kv_heads, p.dk}),
             HostTensor(dtype, {p.batch, p.seq, p.kv_heads, p.dv}), HostTensor(), {}};
  std::mutex mu;
  const Layout layout = Layout::create(LayoutKind::kContiguous, p.seq, ranks).value();
  const Status s = launch(ranks, [&](Communicator& comm) -> Status {
    const int me = comm.rank();
    const int64_t n = layout.local_len(me);
    SP_ASSIGN_OR_RETURN(DeviceTensor q, to_device(shard_of(layout, me, in.q)));
    SP_ASSIGN_OR_RETURN(DeviceTensor k, to_device(shard_of(layout, me, in.k)));
    SP_ASSIGN_OR_RETURN(DeviceTensor v, to_device(shard_of(layout, me, in.v)));
    SP_ASSIGN_OR_RETURN(DeviceTensor dout, to_device(shard_of(layout, me, in.dout)));
    SP_ASSIGN_OR_RETURN(DeviceTensor o, device_zeros(dtype, {p.batch, n, p.heads, p.dv}));
    SP_ASSIGN_OR_RETURN(DeviceTensor dq, device_zeros(dtype, {p.batch, n, p.heads, p.dk}));
    SP_ASSIGN_OR_RETURN(DeviceTensor dk, device_zeros(dtype, {p.batch, n, p.kv_heads, p.dk}));
    SP_ASSIGN_OR_RETURN(DeviceTensor dv, device_zeros(dtype, {p.batch, n, p.kv_heads, p.dv}));
    LaspContext ctx;
    comm.reset_counters();
    SP_RETURN_IF_ERROR(lasp_forward(comm, layout, p.params(), algorithm, q.view, k.view, v.view, o.view, &ctx,
                                    nullptr));
    SP_RETURN_IF_ERROR(lasp_backward(comm, layout, p.params(), &ctx, q.view, k.view, v.view, dout.view, dq.view,
                                     dk.view, dv.view, nullptr));
    SP_RETURN_IF_ERROR(comm.synchronize(nullptr));
    const bool lasp = algorithm != LaspAlgorithm::kUlysses;
    const int64_t state_bytes = lasp_state_bytes(p.batch, p.heads, p.dk, p.dv, DType::kF32);
    SP_CHECK_ARG(ctx.state_bytes() == state_bytes / (lasp ? 1 : comm.size()), "the states are not fp32");
    const LaspTraffic want = lasp_expected_bytes(ctx.algorithm, comm.size(), me, state_bytes);
    const LaspTraffic walked = lasp_walked_bytes(ctx.algorithm, comm.size(), me, state_bytes);
    SP_CHECK_ARG(!lasp || (walked.forward == want.forward && walked.backward == want.backward),
                 "the walk is not the formula");
    SP_CHECK_ARG(!lasp || (comm.counters().sent(Phase::kForward) == want.forward &&
                           comm.counters().sent(Phase::kBackward) == want.backward),
                 "rank " + std::to_string(me) + " sent " + std::to_string(comm.counters().sent(Phase::kForward)) +
                     " + " + std::to_string(comm.counters().sent(Phase::kBackward)) + " bytes, expected " +
                     std::to_string(want.forward) + " + " + std::to_string(want.backward));
    SP_ASSIGN_OR_RETURN(HostTensor ho, to_host(o.view));
    SP_ASSIGN_OR_RETURN(HostTensor hdq, to_host(dq.view));
    SP_ASSIGN_OR_RETURN(HostTensor hdk, to_host(dk.view));
    SP_ASSIGN_OR_RETURN(HostTensor hdv, to_host(dv.view));
    std::lock_guard lock(mu);
    for (auto [local, whole] : {std::pair{&ho, &g.o}, {&hdq, &g.dq}, {&hdk, &g.dk}, {&hdv, &g.dv}})
      SP_RETURN_IF_ERROR(layout.unshard(local->view(), 1, me, whole->view()));
    if (lasp && me == comm.size() - 1) {
      SP_ASSIGN_OR_RETURN(g.final_state, lasp_state_out_on_host(ctx));
    }
    return Status::Ok();
  });
  if (!s.ok()) g.failure = s.to_string();
  return g;
}

// "" when every result meets the bf16 rule against the whole sequence's oracle.
std::string check(const LinearProblem& p, const testing::LinearInputs& in, const Gathered& g, DType dtype) {
  auto oracle = linear_attention_reference(in.q.view(), in.k.view(), in.v.view(), {}, in.dout.view(), {}, p.params(),
                                           LinearOracleForm::kRecurrent);
  if (!oracle.ok()) return oracle.status().to_string();
  const LinearReferenceResult plain =
      testing::plain_lowp_linear(in.q, in.k, in.v, nullptr, &in.dout, nullptr, p.params(), dtype);
  std::string why;
  const auto add = [&](const char* what, const HostTensor& got, const HostTensor& base, const HostTensor& ref,
                       DType rounding) {
    const std::string w = testing::check_lowp_rule(what, cast(got, DType::kF64), base, ref, rounding);
    if (!w.empty()) why += w + "\n";
  };
  add("O", g.o, plain.o, oracle->o, dtype);
  if (g.final_state.view().data) add("final state", g.final_state, plain.state_out, oracle->state_out, DType::kF32);
  add("dQ", g.dq, plain.dq, oracle->dq, dtype);
  add("dK", g.dk, plain.dk, oracle->dk, dtype);
  add("dV", g.dv, plain.dv, oracle->dv, dtype);
  return why;
}

LinearProblem problem() {
  LinearProblem p;
  p.batch = 1, p.seq = 1000, p.heads = 4, p.kv_heads = 2, p.dk = 64, p.dv = 128;
  p.decay = {0.999, 0.9, 0.5, 0.99};
  p.scale = 0.125;
  return p;
}

class GpuLasp : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device here";
  }
};

TEST_F(GpuLasp, ThreadRanksSharingTheGpuMeetTheRule) {
  LinearProblem p = problem();
  for (int64_t batch : {1, 2}) {
    p.batch = batch;
    const testing::LinearInputs in = testing::make_linear_inputs(p, DType::kBF16, 7 + batch);
    for (LaspAlgorithm algo : {LaspAlgorithm::kChain, LaspAlgorithm::kAllGather, LaspAlgorithm::kUlysses})
      for (int ranks : {1, 2, 3}) {
        const bool ulysses = algo == LaspAlgorithm::kUlysses;  // 2 K/V heads: P = 1, 2
        if (ulysses ? ranks == 3 : batch > 1 && ranks != 3) continue;  // LASP: B = 2 through a middle rank
        SCOPED_TRACE(std::string(lasp_algorithm_name(algo)) + " P=" + std::to_string(ranks) + " B=" +
                     std::to_string(batch));
        const Gathered g = run_lasp(p, algo, ranks, run_local_ranks, in, DType::kBF16);
        ASSERT_EQ(g.failure, "");
        EXPECT_EQ(check(p, in, g, DType::kBF16), "");
      }
  }
}

TEST_F(GpuLasp, RanksOnTwoGpusMeetTheRule) {
  if (!nccl_available() || cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs and NCCL";
  LinearProblem p = problem();
  p.seq = 4096;
  const testing::LinearInputs in = testing::make_linear_inputs(p, DType::kBF16, 11);
  for (LaspAlgorithm algo : {LaspAlgorithm::kChain, LaspAlgorithm::kAllGather, LaspAlgorithm::kUlysses}) {
    SCOPED_TRACE(lasp_algorithm_name(algo));
    const Gathered g = run_lasp(p, algo, 2, run_nccl_local_ranks, in, DType::kBF16);
    ASSERT_EQ(g.failure, "");
    EXPECT_EQ(check(p, in, g, DType::kBF16), "");
  }
}

// The combine of the backend table's two rows: the CUDA one against the CPU one on fp32 states.
TEST_F(GpuLasp, StateCombineMatchesTheCpu) {
  const LinearProblem p = problem();
  const testing::LinearInputs in = testing::make_linear_inputs(p, DType::kBF16, 5);
  const HostTensor S = cast(in.state_in, DType::kF32), G = cast(in.dstate_out, DType::kF32);
  HostTensor want(DType::kF32, {p.batch, p.heads, p.dk, p.dv});
  const std::unique_ptr<LinearBackend> cpu = make_cpu_linear_backend(), gpu = make_cuda_linear_backend();
  ASSERT_TRUE(gpu != nullptr);
  ASSERT_TRUE(cpu->combine(S.view(), G.view(), 123, p.params(), want.view(), nullptr).ok());
  auto s = to_device(S), g = to_device(G);
  auto out = device_zeros(DType::kF32, {p.batch, p.heads, p.dk, p.dv});
  ASSERT_TRUE(s.ok() && g.ok() && out.ok());
  ASSERT_TRUE(gpu->combine(s->view, g->view, 123, p.params(), out->view, nullptr).ok());
  const HostTensor ref = cast(want, DType::kF64);
  EXPECT_LE(testing::max_abs_diff(cast(to_host(out->view).value(), DType::kF64), ref), 1e-5 * testing::max_abs(ref));
  // In place, as the all-gather's prefix calls it (out is carried).
  ASSERT_TRUE(gpu->combine(s->view, g->view, 123, p.params(), s->view, nullptr).ok());
  EXPECT_LE(testing::max_abs_diff(cast(to_host(s->view).value(), DType::kF64), ref), 1e-5 * testing::max_abs(ref));
  // zero, on the stream.
  ASSERT_TRUE(gpu->zero(s->view, nullptr).ok());
  EXPECT_EQ(testing::max_abs(cast(to_host(s->view).value(), DType::kF64)), 0.0);
}

}  // namespace
}  // namespace seqpar
