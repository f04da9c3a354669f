// Every algorithm on GPU ranks through the GPU executor, against the CPU fp64 oracle with the
// bf16 rule: P in {2, 3, 4, 8} ranks sharing one GPU (a thread and a stream per rank, the local
// communicator moving device buffers and counting their bytes), layouts, masks, GQA, head
// groups, the GPU backends ("auto" on sm_90, which hands each call to cuDNN, the Hopper kernels or
// ours; cuDNN or ours elsewhere; ours where a case asks); measured bytes per rank equal the bytes walked from the schedule;
// and the NCCL communicator on two, four and eight GPUs when the machine has them.
// Skipped without a GPU (CI).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cctype>
#include <cmath>
#include <mutex>

#include "kernels/cuda/flash_cuda.hpp"
#include "seqpar/gpu.hpp"
#include "parallel/gpu_executor.hpp"
#include "seqpar/nccl_comm.hpp"
#include "test_util.hpp"

namespace seqpar {
namespace {

using testing::cast;

struct Case {
  std::string algo;
  int ranks;
  LayoutKind layout;
  std::string mask;
  int64_t seq, heads, kv_heads, head_dim;
  int head_groups = 0;  // 0: the planner's
  bool nccl = false;
  bool own_kernels = false;  // our kernels even where cuDNN would take the problem
  int64_t max_call_rows = 0;
  int ranks_per_node = 0;
  int64_t batch = 1;
  int ulysses = 0;                 // ulysses-ring's degree (0: the planner's)
  std::string ring_algo = "ring";  // ulysses-ring's ring dimension
  bool keep = false;               // keep_forward_state
};

std::string name(const Case& c) {
  std::string n = std::string(c.nccl ? "nccl" : "local") + "_" + c.algo + "_P" + std::to_string(c.ranks) + "_" +
                  layout_name(c.layout) + "_" + c.mask + "_S" + std::to_string(c.seq) + "_H" + std::to_string(c.heads) +
                  "_Hkv" + std::to_string(c.kv_heads) + "_D" + std::to_string(c.head_dim) + "_G" +
                  std::to_string(c.head_groups) + (c.own_kernels ? "_own" : "") +
                  (c.max_call_rows ? "_rows" + std::to_string(c.max_call_rows) : "") +
                  (c.ranks_per_node ? "_L" + std::to_string(c.ranks_per_node) : "") +
                  (c.batch > 1 ? "_B" + std::to_string(c.batch) : "") +
                  (c.ulysses ? "_U" + std::to_string(c.ulysses) : "") + (c.ring_algo != "ring" ? "_" + c.ring_algo : "") + (c.keep ? "_keep" : "");
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}
void PrintTo(const Case& c, std::ostream* os) { *os << name(c); }

struct Globals {
  HostTensor o, lse, dq, dk, dv;
};

// The milestones of one forward and one backward: in stream order, one per step and one per
// group's end, in every group.
Status check_trace(GpuWorkspace& ws, const AttentionPlan& plan) {
  SP_ASSIGN_OR_RETURN(const auto marks, ws.take_trace());
  size_t fwd = 0, bwd = 0;
  double last = 0;
  for (const auto& [label, ms] : marks) {
    (label.rfind("fwd g", 0) == 0 ? fwd : bwd) += 1;
    SP_CHECK_ARG(ms >= last, "trace out of order at " + label);
    last = ms;
  }
  const size_t G = plan.head_groups;
  SP_CHECK_ARG(fwd == G * (plan.schedule.forward.size() + 1) && bwd == G * (plan.schedule.backward.size() + 1),
               "trace has " + std::to_string(fwd) + " forward and " + std::to_string(bwd) + " backward marks");
  SP_ASSIGN_OR_RETURN(const auto again, ws.take_trace());
  SP_CHECK_ARG(again.empty(), "take_trace must empty the trace");
  return Status::Ok();
}

// Runs forward + backward on every rank, scatters each rank's results into global tensors,
// and checks each rank's measured bytes against the walked ones.
Status run_case(const Case& c, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                const HostTensor& dout, const AttentionParams& params, Globals* out) {
  SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(c.layout, c.seq, c.ranks, params.mask.doc_offsets));
  const DType t = q.view().dtype;
  out->o = HostTensor(t, {c.batch, c.seq, c.heads, c.head_dim});
  out->lse = HostTensor(DType::kF32, {c.batch, c.heads, c.seq});
  out->dq = HostTensor(t, {c.batch, c.seq, c.heads, c.head_dim});
  out->dk = HostTensor(t, {c.batch, c.seq, c.kv_heads, c.head_dim});
  out->dv = HostTensor(t, {c.batch, c.seq, c.kv_heads, c.head_dim});
  std::mutex mu;
  auto rank_fn = [&](Communicator& comm) -> Status {
    const int r = comm.rank();
    const int64_t n = layout.local_len(r);
    auto local = [&](const HostTensor& g, int64_t heads) -> StatusOr<DeviceTensor> {
      HostTensor shard(t, {c.batch, n, heads, c.head_dim});
      SP_RETURN_IF_ERROR(layout.shard(g.view(), 1, r, shard.view()));
      return to_device(shard);
    };
    SP_ASSIGN_OR_RETURN(DeviceTensor lq, local(q, c.heads));
    SP_ASSIGN_OR_RETURN(DeviceTensor lk, local(k, c.kv_heads));
    SP_ASSIGN_OR_RETURN(DeviceTensor lv, local(v, c.kv_heads));
    SP_ASSIGN_OR_RETURN(DeviceTensor ldo, local(dout, c.heads));
    SP_ASSIGN_OR_RETURN(DeviceTensor lo, device_zeros(t, {c.batch, n, c.heads, c.head_dim}));
    SP_ASSIGN_OR_RETURN(DeviceTensor llse, device_zeros(DType::kF32, {c.batch, c.heads, n}));
    SP_ASSIGN_OR_RETURN(DeviceTensor ldq, device_zeros(t, {c.batch, n, c.heads, c.head_dim}));
    SP_ASSIGN_OR_RETURN(DeviceTensor ldk, device_zeros(t, {c.batch, n, c.kv_heads, c.head_dim}));
    SP_ASSIGN_OR_RETURN(DeviceTensor ldv, device_zeros(t, {c.batch, n, c.kv_heads, c.head_dim}));
    // The outputs hold NaN: the executor must write every element (results written fresh).
    for (const DeviceTensor* d : {&lo, &llse, &ldq, &ldk, &ldv}) SP_RETURN_IF_ERROR(flash_fill(d->view, NAN));
    const std::unique_ptr<AttentionBackend> backend =
        make_gpu_backend(lq.view, params, /*prefer_cudnn=*/!c.own_kernels, c.max_call_rows);
    SP_CHECK_SUPPORTED(backend != nullptr, "no GPU backend in this build");
    PlanOptions options;
    options.algorithm = c.algo;
    options.topology.ranks_per_node = c.ranks_per_node;
    options.head_groups = c.head_groups;
    options.ulysses = c.ulysses;
    options.ring_algorithm = c.ring_algo;
    options.keep_forward_state = c.keep;
    SP_ASSIGN_OR_RETURN(const AttentionPlan plan,
                        plan_attention(options, layout, params, block_bytes_for(lq.view, lk.view, *backend), r, *backend));
    GpuWorkspace ws(/*trace=*/true);  // the milestones must not change the results (and are checked)
    cudaStream_t stream;
    if (cudaStreamCreate(&stream) != cudaSuccess) return SP_STATUS(StatusCode::kInternal, "stream");
    const ShardTensors st{lq.view, lk.view, lv.view, lo.view, llse.view, ldo.view, ldq.view, ldk.view, ldv.view};
    ForwardState kept;
    Status s = run_forward_gpu(comm, plan, st, ws, stream, nullptr, &kept);
    if (s.ok()) s = run_backward_gpu(comm, plan, st, ws, stream, nullptr, &kept);
    if (s.ok()) s = comm.synchronize(stream);
    (void)forget_stream_arenas(stream);
    (void)cudaStreamDestroy(stream);
    SP_RETURN_IF_ERROR(s);
    SP_RETURN_IF_ERROR(check_trace(ws, plan));
    // "auto" (sm_90): every call of these cases is one the Hopper kernels (or cuDNN's forward)
    // take, bf16 at head dim 64 or 128 on any layout's positions; none may fall to ours.
    if (std::string(backend->name()) == "auto")
      for (const auto& [what, calls] : backend->calls_by_backend())
        SP_CHECK_ARG(what.find("cuda") == std::string::npos,
                     "auto handed " + std::to_string(calls) + " calls to our mma.sync kernels (" + what + ")");
    for (Pass p : {Pass::kForward, Pass::kBackward}) {
      const int64_t walked = walk_bytes(plan.schedule.pass(p), r, layout, plan.block_bytes, plan.request.topology,
                                          plan.schedule.head_parts).total;
      const int64_t sent = comm.counters().sent(p == Pass::kForward ? Phase::kForward : Phase::kBackward);
      SP_CHECK_ARG(sent == walked, "rank " + std::to_string(r) + " sent " + std::to_string(sent) + " bytes in the " +
                                       (p == Pass::kForward ? "forward" : "backward") + ", walked " +
                                       std::to_string(walked));
    }
    const std::pair<const DeviceTensor*, HostTensor*> results[] = {
        {&lo, &out->o}, {&llse, &out->lse}, {&ldq, &out->dq}, {&ldk, &out->dk}, {&ldv, &out->dv}};
    std::lock_guard lock(mu);
    for (const auto& [dev, global] : results) {
      SP_ASSIGN_OR_RETURN(HostTensor h, to_host(dev->view));
      SP_RETURN_IF_ERROR(layout.unshard(h.view(), dev->view.ndim == 3 ? 2 : 1, r, global->view()));
    }
    return Status::Ok();
  };
  return c.nccl ? run_nccl_local_ranks(c.ranks, rank_fn) : run_local_ranks(c.ranks, rank_fn);
}

class GpuScheduleVsOracle : public ::testing::TestWithParam<Case> {};

TEST_P(GpuScheduleVsOracle, MeetsTheLowPrecisionRule) {
  const Case c = GetParam();
  if (cuda_device_count() < (c.nccl ? c.ranks : 1)) GTEST_SKIP() << "needs more CUDA devices";
  if (c.nccl && !nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  SCOPED_TRACE(name(c));
  const DType t = DType::kBF16;
  const HostTensor q = testing::random_tensor(t, {c.batch, c.seq, c.heads, c.head_dim}, 21);
  const HostTensor k = testing::random_tensor(t, {c.batch, c.seq, c.kv_heads, c.head_dim}, 22);
  const HostTensor v = testing::random_tensor(t, {c.batch, c.seq, c.kv_heads, c.head_dim}, 23);
  const HostTensor dout = testing::random_tensor(t, {c.batch, c.seq, c.heads, c.head_dim}, 24);
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

const char* kAlgorithms[] = {"ring", "burst", "ring-return", "burst-return", "distflash", "double-ring"};

std::vector<Case> cases() {
  std::vector<Case> all;
  const auto Z = LayoutKind::kZigzag, C = LayoutKind::kContiguous, St = LayoutKind::kStriped;
  // Every algorithm at P = 2, 3, 4, 8 on one GPU (DistFlashAttn balances the contiguous causal
  // layout; the double ring takes two nodes where P is even), uneven shards, GQA 4:2.
  for (const char* algo : kAlgorithms)
    for (int P : {2, 3, 4, 8}) {
      Case c{algo, P, std::string(algo) == "distflash" ? C : Z, "causal", 125 * P + 3, 4, 2, 128};
      if (std::string(algo) == "double-ring" && P % 2 == 0 && P > 2) c.ranks_per_node = P / 2;
      all.push_back(c);
    }
  // Masks cuDNN cannot take run on the Hopper kernels (auto, sm_90; on zigzag shards of two runs)
  // or elsewhere ours; the full mask on both.
  for (const char* algo : {"ring", "burst"})
    for (const char* mask : {"full", "window:100,0", "docs:3"}) all.push_back({algo, 3, Z, mask, 777, 4, 4, 64});
  for (const char* mask : {"window:100,0", "docs:3"}) all.push_back({"distflash", 3, C, mask, 777, 4, 4, 64});
  all.push_back({"burst", 3, Z, "full", 777, 4, 4, 64, 0, false, /*own_kernels=*/true});
  all.push_back({"ring", 4, Z, "causal", 1000, 4, 2, 128, 0, false, /*own_kernels=*/true});
  for (LayoutKind layout : {C, St})
    for (const char* algo : {"ring", "burst"}) all.push_back({algo, 4, layout, "causal", 1001, 4, 2, 64});
  // The documents layout (packed documents dealt whole or in per-document zigzag pieces: many
  // position runs a shard) on the Hopper kernels (auto, sm_90) or elsewhere ours.
  for (const char* algo : {"ring", "burst", "ring-return", "burst-return"})
    all.push_back({algo, 3, LayoutKind::kDocuments, "docs:7", 1999, 4, 2, 128});
  all.push_back({"ulysses", 2, LayoutKind::kDocuments, "docs:5", 1001, 8, 2, 64});
  // Documents of lognormal lengths (issue 37's mix, scaled down: mean 200 tokens, a few over 1K).
  for (const char* algo : {"ring", "burst-return"})
    all.push_back({algo, 4, LayoutKind::kDocuments, "docs-lognormal:200", 3001, 4, 2, 128});
  all.push_back({"ring", 3, Z, "docs-lognormal:200", 2002, 4, 2, 64});
  all.push_back({"ring", 4, LayoutKind::kDocuments, "docs:9", 4099, 8, 2, 128, 0, /*nccl=*/true});
  // Head groups (GQA 8:2 in two groups of 4:1), MQA, and two groups of 3 heads over 1025 rows:
  // the second group's LSE slice starts 12300 bytes in, not 16-byte aligned, so it is copied.
  for (const char* algo : {"ring", "burst", "distflash"}) all.push_back({algo, 4, std::string(algo) == "distflash" ? C : Z, "causal", 1536, 8, 2, 128, 2});
  all.push_back({"burst", 2, St, "causal", 1001, 8, 1, 64});
  for (const char* algo : {"ring-return", "burst-return"}) all.push_back({algo, 2, Z, "causal", 2050, 6, 6, 64, 2});
  all.push_back({"ring", 2, C, "window:300,0", 1500, 4, 4, 64, 2});
  // Two batch entries in two head groups: the groups' LSE and output slices are strided (copied
  // in and cast out), on both backends.
  for (bool own : {false, true}) {
    Case c{"burst", 3, Z, "causal", 600, 4, 2, 64, 2, false, own};
    c.batch = 2;
    all.push_back(c);
  }
  // cuDNN calls of at most 100 rows: every pair tiled into many parts.
  for (const char* algo : {"ring", "burst"}) all.push_back({algo, 4, Z, "causal", 1000, 4, 4, 64, 2, false, false, 100});
  // Ulysses at P = 2, 4, 8 (GQA 8:2: at P = 8 each K/V head goes to four head parts), Ulysses x
  // ring on 2 x 2, 4 x 2 and 2 x 4 grids with the ring, Burst and DistFlashAttn across groups,
  // head groups and two batch entries with head parts; Attention2D's two variants at P = 4, 9.
  for (int P : {2, 4, 8}) all.push_back({"ulysses", P, Z, "causal", 125 * P + 3, 8, 2, 128});
  all.push_back({"ulysses", 4, St, "full", 1001, 8, 8, 64});
  // Ulysses with its halves overlapped (two head parts a rank): zigzag causal with GQA (each K/V
  // head to two parts), documents of lognormal lengths on the documents layout, the kept forward.
  all.push_back({"ulysses-overlap", 4, Z, "causal", 1003, 8, 2, 128});
  all.push_back({"ulysses-overlap", 4, LayoutKind::kDocuments, "docs-lognormal:200", 3001, 8, 8, 128});
  {
    Case c{"ulysses-overlap", 2, Z, "causal", 1003, 8, 2, 64, 2};
    c.keep = true;
    all.push_back(c);
  }
  for (int P : {4, 8}) {
    Case c{"ulysses-ring", P, Z, "causal", 125 * P + 3, 8, 2, 128};
    c.ranks_per_node = P / 2;
    all.push_back(c);
  }
  for (const char* ring : {"burst", "distflash"}) {
    Case c{"ulysses-ring", 8, std::string(ring) == "distflash" ? C : Z, "causal", 1003, 8, 2, 128};
    c.ulysses = 2, c.ring_algo = ring;
    all.push_back(c);
  }
  all.push_back({"ulysses", 2, Z, "causal", 1003, 8, 2, 64, 2});
  for (int P : {2, 4}) {  // the forward's head-part Q and K/V kept for the backward, two head groups
    Case c{P == 2 ? "ulysses" : "ulysses-ring", P, Z, "causal", 125 * P + 3, 8, 2, 128, 2};
    c.keep = true, c.ulysses = P == 4 ? 2 : 0;
    all.push_back(c);
  }
  {
    Case c{"ulysses-ring", 4, Z, "window:100,0", 603, 4, 2, 64};
    c.ulysses = 2, c.batch = 2;
    all.push_back(c);
  }
  for (const char* algo : {"attention2d", "attention2d-overlap"})
    for (int P : {4, 9}) {
      all.push_back({algo, P, St, "causal", 125 * P + 3, 4, 2, 128});
      all.push_back({algo, P, St, "full", 111 * P + 5, 4, 4, 64});
    }
  for (const char* algo : {"attention2d", "attention2d-overlap"}) {  // the swapped K/V kept, two head groups
    Case c{algo, 4, St, "causal", 503, 4, 2, 128, 2};
    c.keep = true;
    all.push_back(c);
  }
  // NCCL, one GPU per rank (skipped below that many GPUs).
  for (const char* algo : {"ulysses", "attention2d"}) all.push_back({algo, 4, St, "causal", 2050, 8, 2, 128, 0, true});
  for (const char* algo : {"ring", "burst", "ring-return", "burst-return"}) {
    all.push_back({algo, 2, Z, "causal", 2048, 8, 8, 128, 0, true});
    all.push_back({algo, 2, Z, "causal", 2050, 8, 2, 128, 2, true});
  }
  for (const char* algo : kAlgorithms)
    for (int P : {4, 8}) {
      Case c{algo, P, std::string(algo) == "distflash" ? C : Z, "causal", 1026 * P, 8, 2, 128, 0, true};
      if (std::string(algo) == "double-ring") c.ranks_per_node = P / 2;
      all.push_back(c);
    }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuScheduleVsOracle, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return name(info.param); });

// The executor refuses a plan made for another rank and tensors the layout does not ask for.
TEST(GpuExecutorArguments, RefusesWrongPlansAndShapes) {
  if (cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device";
  const Layout layout = Layout::create(LayoutKind::kZigzag, 64, 2).value();
  AttentionParams params;
  params.mask = MaskSpec::causal();
  auto q = device_zeros(DType::kBF16, {1, 32, 2, 64}).value();
  auto k = device_zeros(DType::kBF16, {1, 32, 2, 64}).value();
  auto small = device_zeros(DType::kBF16, {1, 31, 2, 64}).value();
  auto lse = device_zeros(DType::kF32, {1, 2, 32}).value();
  const auto backend = make_cuda_backend();
  auto comms = make_local_communicators(2);
  PlanOptions ring;
  ring.algorithm = "ring";
  const AttentionPlan other = plan_attention(ring, layout, params, block_bytes_for(q.view, k.view, *backend), 1,
                                             *backend).value();
  GpuWorkspace ws;
  const ShardTensors good{q.view, k.view, k.view, q.view, lse.view, q.view, q.view, k.view, k.view};
  Status s = run_forward_gpu(*comms[0], other, good, ws, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  const AttentionPlan mine = plan_attention(ring, layout, params, block_bytes_for(q.view, k.view, *backend), 0,
                                            *backend).value();
  ShardTensors bad = good;
  bad.o = small.view;
  s = run_forward_gpu(*comms[0], mine, bad, ws, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("o must be"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace seqpar
