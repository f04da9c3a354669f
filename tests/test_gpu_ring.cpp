// Ring attention and BurstAttention on GPU ranks against the CPU fp64 oracle with the bf16
// rule: P in {1, 2, 3, 4, 8} ranks sharing one GPU (threads, the local communicator moving
// device buffers), every layout, causal/full/window/document masks, GQA, split head groups,
// and both backwards; and the NCCL communicator on two, four and eight GPUs when the machine
// has them.
// Skipped without a GPU (CI), except the head-group policy, which is host logic.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cctype>
#include <mutex>

#include "seqpar/gpu.hpp"
#include "seqpar/gpu_ring.hpp"
#include "seqpar/nccl_comm.hpp"
#include "test_util.hpp"

namespace seqpar {
namespace {

using testing::cast;

struct Case {
  int ranks;
  LayoutKind layout;
  std::string mask;
  BackwardSchedule schedule;
  int64_t seq, heads, kv_heads, head_dim;
  int head_groups;  // 0: auto
  bool nccl;
  int64_t max_call_rows = 0;  // GpuRingOptions::max_call_rows
};

std::string name(const Case& c) {
  std::string mask = c.mask;
  for (char& ch : mask)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return std::string(c.nccl ? "nccl" : "local") + "_P" + std::to_string(c.ranks) + "_" +
         layout_name(c.layout) + "_" + mask + "_" + backward_schedule_name(c.schedule) + "_S" +
         std::to_string(c.seq) + "_H" + std::to_string(c.heads) + "_Hkv" + std::to_string(c.kv_heads) +
         "_D" + std::to_string(c.head_dim) + "_G" + std::to_string(c.head_groups) +
         (c.max_call_rows ? "_rows" + std::to_string(c.max_call_rows) : "");
}

void PrintTo(const Case& c, std::ostream* os) { *os << name(c); }

struct Globals {
  HostTensor o, lse, dq, dk, dv;
};

// The milestones of one forward and one backward: per group, three per step and one at its
// end (the backward: four per step, one at its end, and one when the side stream is joined),
// in stream order.
Status check_trace(GpuRingContext& ctx, int P) {
  SP_ASSIGN_OR_RETURN(const auto marks, ctx.take_trace());
  size_t fwd = 0, bwd = 0;
  double last = 0;
  for (const auto& [label, ms] : marks) {
    (label.rfind("fwd g", 0) == 0 ? fwd : bwd) += 1;
    SP_CHECK_ARG(ms >= last, "trace out of order at " + label);
    last = ms;
  }
  SP_CHECK_ARG(fwd > 0 && fwd % (3 * P + 1) == 0 && bwd > 1 && (bwd - 1) % (4 * P + 1) == 0,
               "trace has " + std::to_string(fwd) + " forward and " + std::to_string(bwd) + " backward marks");
  SP_ASSIGN_OR_RETURN(const auto again, ctx.take_trace());
  SP_CHECK_ARG(again.empty(), "take_trace must empty the trace");
  return Status::Ok();
}

// Runs forward + backward on every rank and scatters each rank's results into global tensors.
Status run_case(const Case& c, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                const HostTensor& dout, const AttentionParams& params, Globals* out) {
  SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(c.layout, c.seq, c.ranks));
  const DType t = q.view().dtype;
  out->o = HostTensor(t, {1, c.seq, c.heads, c.head_dim});
  out->lse = HostTensor(DType::kF32, {1, c.heads, c.seq});
  out->dq = HostTensor(t, {1, c.seq, c.heads, c.head_dim});
  out->dk = HostTensor(t, {1, c.seq, c.kv_heads, c.head_dim});
  out->dv = HostTensor(t, {1, c.seq, c.kv_heads, c.head_dim});
  auto rank_fn = [&](Communicator& comm) -> Status {
    const int r = comm.rank();
    const int64_t n = layout.local_len(r);
    auto local = [&](const HostTensor& g, int64_t heads) -> StatusOr<DeviceTensor> {
      HostTensor shard(t, {1, n, heads, c.head_dim});
      SP_RETURN_IF_ERROR(layout.shard(g.view(), 1, r, shard.view()));
      return to_device(shard);
    };
    SP_ASSIGN_OR_RETURN(DeviceTensor lq, local(q, c.heads));
    SP_ASSIGN_OR_RETURN(DeviceTensor lk, local(k, c.kv_heads));
    SP_ASSIGN_OR_RETURN(DeviceTensor lv, local(v, c.kv_heads));
    SP_ASSIGN_OR_RETURN(DeviceTensor ldo, local(dout, c.heads));
    SP_ASSIGN_OR_RETURN(DeviceTensor lo, device_zeros(t, {1, n, c.heads, c.head_dim}));
    SP_ASSIGN_OR_RETURN(DeviceTensor llse, device_zeros(DType::kF32, {1, c.heads, n}));
    SP_ASSIGN_OR_RETURN(DeviceTensor ldq, device_zeros(t, {1, n, c.heads, c.head_dim}));
    SP_ASSIGN_OR_RETURN(DeviceTensor ldk, device_zeros(t, {1, n, c.kv_heads, c.head_dim}));
    SP_ASSIGN_OR_RETURN(DeviceTensor ldv, device_zeros(t, {1, n, c.kv_heads, c.head_dim}));
    GpuRingOptions options;
    options.head_groups = c.head_groups;
    options.max_call_rows = c.max_call_rows;
    options.trace = true;  // the milestones must not change the results (and are checked below)
    GpuRingContext ctx(options);
    cudaStream_t stream;
    if (cudaStreamCreate(&stream) != cudaSuccess) return SP_STATUS(StatusCode::kInternal, "stream");
    Status s = gpu_ring_attention_forward(comm, layout, params, lq.view, lk.view, lv.view, lo.view,
                                          llse.view, ctx, stream);
    if (s.ok())
      s = gpu_attention_backward(comm, layout, params, c.schedule, lq.view, lk.view, lv.view, lo.view,
                                 llse.view, ldo.view, ldq.view, ldk.view, ldv.view, ctx, stream);
    if (s.ok()) s = comm.synchronize(stream);
    (void)cudaStreamDestroy(stream);
    SP_RETURN_IF_ERROR(s);
    SP_RETURN_IF_ERROR(check_trace(ctx, c.ranks));
    const std::pair<const DeviceTensor*, HostTensor*> results[] = {
        {&lo, &out->o}, {&llse, &out->lse}, {&ldq, &out->dq}, {&ldk, &out->dk}, {&ldv, &out->dv}};
    for (const auto& [dev, global] : results) {
      SP_ASSIGN_OR_RETURN(HostTensor h, to_host(dev->view));
      SP_RETURN_IF_ERROR(layout.unshard(h.view(), dev->view.ndim == 3 ? 2 : 1, r, global->view()));
    }
    return Status::Ok();
  };
  return c.nccl ? run_nccl_local_ranks(c.ranks, rank_fn) : run_local_ranks(c.ranks, rank_fn);
}

class GpuRingVsOracle : public ::testing::TestWithParam<Case> {};

TEST_P(GpuRingVsOracle, MeetsTheLowPrecisionRule) {
  const Case c = GetParam();
  if (cuda_device_count() < (c.nccl ? c.ranks : 1)) GTEST_SKIP() << "needs more CUDA devices";
  SCOPED_TRACE(name(c));
  const DType t = DType::kBF16;
  const HostTensor q = testing::random_tensor(t, {1, c.seq, c.heads, c.head_dim}, 21);
  const HostTensor k = testing::random_tensor(t, {1, c.seq, c.kv_heads, c.head_dim}, 22);
  const HostTensor v = testing::random_tensor(t, {1, c.seq, c.kv_heads, c.head_dim}, 23);
  const HostTensor dout = testing::random_tensor(t, {1, c.seq, c.heads, c.head_dim}, 24);
  AttentionParams params;
  params.mask = parse_mask(c.mask, c.seq).value();
  Globals ours;
  const Status s = run_case(c, q, k, v, dout, params, &ours);
  ASSERT_TRUE(s.ok()) << s.to_string();

  auto oracle = reference_attention(q.view(), k.view(), v.view(), dout.view(), params);
  ASSERT_TRUE(oracle.ok());
  const ReferenceResult plain = testing::plain_lowp_attention(q, k, v, &dout, params, t);
  const std::tuple<const char*, const HostTensor*, const HostTensor*, const HostTensor*, DType> checks[] = {
      {"O", &ours.o, &plain.o, &oracle->o, t},       {"LSE", &ours.lse, &plain.lse, &oracle->lse, DType::kF32},
      {"dQ", &ours.dq, &plain.dq, &oracle->dq, t},   {"dK", &ours.dk, &plain.dk, &oracle->dk, t},
      {"dV", &ours.dv, &plain.dv, &oracle->dv, t}};
  for (const auto& [what, got, base, ref, rounding] : checks) {
    const std::string why = testing::check_lowp_rule(what, cast(*got, DType::kF64), *base, *ref, rounding);
    EXPECT_TRUE(why.empty()) << why;
  }
}

std::vector<Case> cases() {
  std::vector<Case> all;
  const auto ring = BackwardSchedule::kRing, burst = BackwardSchedule::kBurst;
  for (int P : {1, 2, 3, 4})
    for (LayoutKind layout : {LayoutKind::kContiguous, LayoutKind::kZigzag, LayoutKind::kStriped})
      for (BackwardSchedule schedule : {ring, burst})
        all.push_back({P, layout, "causal", schedule, 1000, 4, 2, 128, 0, false});
  for (const char* mask : {"full", "window:100,0", "docs:3"})
    for (BackwardSchedule schedule : {ring, burst})
      all.push_back({3, LayoutKind::kZigzag, mask, schedule, 777, 4, 4, 64, 0, false});
  // Split head groups (GQA 8:2 in two groups of 4:1), and MQA.
  all.push_back({4, LayoutKind::kZigzag, "causal", ring, 1536, 8, 2, 128, 2, false});
  all.push_back({4, LayoutKind::kZigzag, "causal", burst, 1536, 8, 2, 128, 2, false});
  all.push_back({2, LayoutKind::kStriped, "causal", burst, 1001, 8, 1, 64, 0, false});
  // Two groups of 3 heads over 1025 local rows: the second group's LSE slice starts 12300
  // bytes in, not 16-byte aligned, so it must be copied before cuDNN or a send sees it.
  for (BackwardSchedule schedule : {ring, burst})
    all.push_back({2, LayoutKind::kZigzag, "causal", schedule, 2050, 6, 6, 64, 2, false});
  // Two ranks on our own kernels in two head groups: fp32 results returned, and a group's
  // finish on the side stream that the next group must wait for.
  for (BackwardSchedule schedule : {ring, burst})
    all.push_back({2, LayoutKind::kContiguous, "window:300,0", schedule, 1500, 4, 4, 64, 2, false});
  // cuDNN calls of at most 100 rows: every shard pair tiled, so results gather many parts
  // (diagonal tiles causal, the rest full), on two and four ranks, both backwards.
  for (BackwardSchedule schedule : {ring, burst}) {
    all.push_back({2, LayoutKind::kZigzag, "causal", schedule, 1000, 4, 2, 64, 0, false, 100});
    all.push_back({4, LayoutKind::kZigzag, "causal", schedule, 1000, 4, 4, 64, 2, false, 100});
  }
  // Eight ranks (the 8-GPU scaling run's count) sharing one GPU: seven hops of the travelling
  // accumulators, GQA in two head groups.
  for (BackwardSchedule schedule : {ring, burst})
    all.push_back({8, LayoutKind::kZigzag, "causal", schedule, 2064, 8, 2, 128, 2, false});
  // NCCL, one GPU per rank (needs as many GPUs as ranks; skipped otherwise). Four and eight
  // ranks take the P > 2 schedules, whose accumulators travel, over NCCL.
  for (BackwardSchedule schedule : {ring, burst}) {
    all.push_back({2, LayoutKind::kZigzag, "causal", schedule, 2048, 8, 8, 128, 0, true});
    all.push_back({2, LayoutKind::kZigzag, "causal", schedule, 2050, 8, 2, 128, 2, true});
    all.push_back({2, LayoutKind::kContiguous, "window:300,0", schedule, 1500, 4, 4, 64, 0, true});
    all.push_back({4, LayoutKind::kZigzag, "causal", schedule, 4096, 8, 8, 128, 0, true});
    all.push_back({4, LayoutKind::kZigzag, "causal", schedule, 4100, 8, 2, 128, 2, true});
    all.push_back({8, LayoutKind::kZigzag, "causal", schedule, 8208, 8, 8, 128, 0, true});
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuRingVsOracle, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return name(info.param); });

// The head-group policy (host logic, runs without a GPU): small problems are never split; on
// two ranks (the executor's two-rank path) the MHA configurations measured on 2 x H200 (H = 32,
// D = 128, 8K to 256K tokens per GPU) keep the ring backward whole and split Burst's in two,
// within seven q shards; the 16 GiB cap splits 512K and 1M per GPU further; GQA shrinks both;
// more ranks use the accumulating schedules' larger workspace; an explicit count must divide
// the K/V heads.
TEST(GpuRingHeadGroups, FollowTheWorkspaceLimits) {
  const auto burst = BackwardSchedule::kBurst, ring = BackwardSchedule::kRing;
  const auto groups = [&](int P, int64_t rows, int64_t H, int64_t Hkv, BackwardSchedule s,
                          const GpuRingOptions& o = GpuRingOptions{}) {
    auto g = gpu_ring_head_groups(o, P, 1, rows, H, Hkv, 128, s);
    return g.ok() ? g.value() : -1;
  };
  EXPECT_EQ(groups(2, 500, 4, 2, burst), 1);
  for (int64_t rows : {8192, 32768, 65536, 131072, 262144}) {
    EXPECT_EQ(groups(2, rows, 32, 32, ring), 1) << rows;
    EXPECT_EQ(groups(2, rows, 32, 32, burst), 2) << rows;
  }
  EXPECT_EQ(groups(4, 8192, 32, 32, burst), 4);
  EXPECT_EQ(groups(2, 524288, 32, 32, burst), 4);
  EXPECT_EQ(groups(2, 1048576, 32, 32, burst), 8);
  EXPECT_EQ(groups(2, 1048576, 32, 32, ring), 8);
  EXPECT_EQ(groups(2, 16384, 32, 8, burst), 1);
  EXPECT_EQ(groups(2, 16384, 32, 8, ring), 1);
  // Our own kernels keep fp32 results on two ranks too, so they split sooner.
  const auto own_groups = [&](BackwardSchedule s) {
    auto g = gpu_ring_head_groups(GpuRingOptions{}, 2, 1, 8192, 32, 32, 128, s, /*own_kernels=*/true);
    return g.ok() ? g.value() : -1;
  };
  EXPECT_EQ(own_groups(ring), 4);
  EXPECT_EQ(own_groups(burst), 2);
  GpuRingOptions fixed;
  fixed.head_groups = 8;
  EXPECT_EQ(groups(2, 8192, 32, 32, burst, fixed), 8);
  fixed.head_groups = 3;
  EXPECT_EQ(groups(2, 8192, 32, 32, burst, fixed), -1);
  GpuRingOptions roomy;
  roomy.workspace_limit_shards = 100;
  EXPECT_EQ(groups(2, 8192, 32, 32, burst, roomy), 1);
}

// Outputs are written while inputs are still read, so views that share memory are refused
// before any GPU work (host logic: the pointers are never dereferenced, no GPU needed).
TEST(GpuRingArguments, RefuseOutputsOverlappingInputs) {
  std::vector<uint16_t> memory(4 * 64 * 2 * 16);  // room for q, k, v and one more
  const Layout layout = Layout::create(LayoutKind::kZigzag, 64, 1).value();
  const Device gpu{DeviceKind::kCuda, 0};
  const auto view = [&](int slot) {
    return TensorView::contiguous(memory.data() + slot * 64 * 2 * 16, DType::kBF16, std::vector<int64_t>{1, 64, 2, 16}, gpu);
  };
  std::vector<float> stats(2 * 64);
  const TensorView q = view(0), k = view(1), v = view(2), lse = TensorView::contiguous(stats.data(), DType::kF32, std::vector<int64_t>{1, 2, 64}, gpu);
  AttentionParams params;
  params.mask = MaskSpec::causal();
  auto comms = make_local_communicators(1);
  GpuRingContext ctx;
  const Status s = gpu_ring_attention_forward(*comms[0], layout, params, q, k, v, /*o=*/view(1), lse, ctx, nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("output o overlaps input k"), std::string::npos) << s.message();
}

// A rank that fails makes the others return an error instead of waiting for it.
TEST(NcclCommunicator, FailingRankAbortsTheOthers) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const Status s = run_nccl_local_ranks(2, [](Communicator& comm) -> Status {
    if (comm.rank() == 1) return SP_STATUS(StatusCode::kInternal, "rank 1 gives up");
    auto buf = DeviceBuffer::allocate(1 << 20);
    if (!buf.ok()) return buf.status();
    auto other = DeviceBuffer::allocate(1 << 20);
    if (!other.ok()) return other.status();
    const SendSpec send{1, buf->data(), 1 << 20};
    const RecvSpec recv{1, other->data(), 1 << 20};
    return comm.exchange({&send, 1}, {&recv, 1});  // rank 1 never posts
  });
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 1 gives up"), std::string::npos) << s.message();
}

TEST(NcclCommunicator, HostCollectives) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const Status s = run_nccl_local_ranks(2, [](Communicator& comm) -> Status {
    double x[2] = {1.0 + comm.rank(), 10.0 * comm.rank()};
    SP_RETURN_IF_ERROR(comm.all_reduce(x, 2, DType::kF64, ReduceOp::kSum));
    SP_CHECK_ARG(x[0] == 3.0 && x[1] == 10.0, "all_reduce gave " + std::to_string(x[0]));
    // Splits are cached per (color, key): both views talk through one NCCL communicator.
    for (int again = 0; again < 2; ++again) {
      SP_ASSIGN_OR_RETURN(auto alone, comm.split(comm.rank(), 0));
      SP_CHECK_ARG(alone->size() == 1 && alone->rank() == 0, "a split of one rank");
      SP_ASSIGN_OR_RETURN(auto both, comm.split(0, -comm.rank()));
      SP_CHECK_ARG(both->size() == 2 && both->rank() == 1 - comm.rank(),
                   "keys order the split: rank " + std::to_string(comm.rank()) + " became " +
                       std::to_string(both->rank()) + " of " + std::to_string(both->size()));
      double y = 1.0;
      SP_RETURN_IF_ERROR(both->all_reduce(&y, 1, DType::kF64, ReduceOp::kSum));
      SP_CHECK_ARG(y == 2.0 && both->counters().sent(Phase::kOther) > 0, "all_reduce on the split");
    }
    return comm.barrier();
  });
  EXPECT_TRUE(s.ok()) << s.to_string();
}

}  // namespace
}  // namespace seqpar
