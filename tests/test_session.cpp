// The attention Session (include/seqpar/session.hpp): its plan cache keys the whole problem
// (a mask with other documents or another block pattern is another plan, and so is a documents
// layout made for other documents; the same problem is the same plan), a kept auto choice serves
// later problems, and its passes on thread ranks match the fp64 oracle under a documents mask.
#include <gtest/gtest.h>

#include <omp.h>

#include <mutex>

#include "schedule_test_util.hpp"
#include "seqpar/session.hpp"

namespace seqpar {
namespace {

TEST(Session, PlansOncePerProblemAndTellsMasksApart) {
  auto comms = make_local_communicators(1);
  Session session(*comms[0], {PlanOptions("ring")});
  const Layout layout = Layout::create(LayoutKind::kZigzag, 64, 1).value();
  HostTensor q(DType::kF64, {1, 64, 4, 8}), k(DType::kF64, {1, 64, 2, 8});
  AttentionParams docs;
  docs.mask = MaskSpec::documents({0, 10, 64});
  const AttentionPlan* first = session.plan(layout, docs, q.view(), k.view()).value();
  EXPECT_EQ(session.plan(layout, docs, q.view(), k.view()).value(), first);
  AttentionParams other = docs;
  other.mask.doc_offsets = {0, 11, 64};  // same count, other offsets
  const AttentionPlan* second = session.plan(layout, other, q.view(), k.view()).value();
  EXPECT_NE(second, first);
  EXPECT_EQ(second->params.mask.doc_offsets, other.mask.doc_offsets);
  AttentionParams sparse;
  sparse.mask = MaskSpec::block_sparse(bigbird_pattern(64, 1, 1, 1, 8, true).value(), true);
  EXPECT_NE(session.plan(layout, sparse, q.view(), k.view()).value(), first);
  HostTensor q32(DType::kF32, {1, 64, 4, 8}), k32(DType::kF32, {1, 64, 2, 8});
  EXPECT_NE(session.plan(layout, docs, q32.view(), k32.view()).value(), first);  // another dtype
  EXPECT_EQ(session.plan(layout, docs, q.view(), k.view()).value(), first);
  // Documents layouts made for other documents hold other rows (here as many on rank 0, so the
  // tensors' shapes alone do not tell them apart): under one mask, other plans, each with its
  // own layout (planned for rank 0 of 2).
  for (const std::vector<int64_t>& made_for : {std::vector<int64_t>{0, 10, 64}, std::vector<int64_t>{0, 54, 64}}) {
    const Layout balanced = Layout::create(LayoutKind::kDocuments, 64, 2, made_for).value();
    HostTensor lq(DType::kF64, {1, balanced.local_len(0), 4, 8}), lk(DType::kF64, {1, balanced.local_len(0), 2, 8});
    const AttentionPlan* plan = session.plan(balanced, docs, lq.view(), lk.view()).value();
    EXPECT_EQ(plan->layout.positions(0), balanced.positions(0));
  }
}

// keep_choice: after it, a layout that auto would give another algorithm gets the kept one (a
// trainer on the documents layout chooses once, not per batch); before it, auto chooses per layout.
TEST(Session, KeptChoiceServesLaterLayouts) {
  auto comms = make_local_communicators(2);
  Session session(*comms[0], {PlanOptions("auto")});
  HostTensor q(DType::kF64, {1, 64, 4, 8}), k(DType::kF64, {1, 64, 4, 8});
  AttentionParams causal;
  causal.mask = MaskSpec::causal();
  const Layout zigzag = Layout::create(LayoutKind::kZigzag, 128, 2).value();
  const Layout contiguous = Layout::create(LayoutKind::kContiguous, 128, 2).value();
  const AttentionPlan* kept = session.plan(zigzag, causal, q.view(), k.view()).value();
  const std::string first = kept->algorithm->name;
  const std::string other = session.plan(contiguous, causal, q.view(), k.view()).value()->algorithm->name;
  ASSERT_NE(first, other) << "auto picks alike on both layouts: the test says nothing";
  session.keep_choice(*kept);
  AttentionParams scaled = causal;
  scaled.scale = 0.5;  // a problem not planned before, on the layout auto gave the other algorithm
  EXPECT_EQ(std::string(session.plan(contiguous, scaled, q.view(), k.view()).value()->algorithm->name), first);
}

TEST(Session, PassesOnThreadRanksMatchTheOracleUnderDocuments) {
  Problem g;
  g.seq = 3 * 16 + 5;
  const Layout layout = Layout::create(LayoutKind::kZigzag, g.seq, 3).value();
  AttentionParams params;
  params.mask = MaskSpec::documents({0, 7, 8, 30, g.seq});
  const Inputs in(g);
  RankResults run{HostTensor(g.dtype, {1, g.seq, g.heads, g.head_dim}), HostTensor(g.dtype, {1, g.heads, g.seq}),
                  HostTensor(g.dtype, {1, g.seq, g.heads, g.head_dim}),
                  HostTensor(g.dtype, {1, g.seq, g.kv_heads, g.head_dim}),
                  HostTensor(g.dtype, {1, g.seq, g.kv_heads, g.head_dim}), {}, {}};
  std::mutex mu;
  const Status status = run_local_ranks(3, [&](Communicator& comm) -> Status {
    omp_set_num_threads(1);
    const int r = comm.rank();
    const int64_t n = layout.local_len(r);
    const DType t = g.dtype;
    HostTensor lq(t, {1, n, g.heads, g.head_dim}), lk(t, {1, n, g.kv_heads, g.head_dim});
    HostTensor lv = lk, ldo = lq, lo = lq, ldq = lq, ldk = lk, ldv = lk, llse(t, {1, g.heads, n});
    SP_RETURN_IF_ERROR(layout.shard(in.q.view(), 1, r, lq.view()));
    SP_RETURN_IF_ERROR(layout.shard(in.k.view(), 1, r, lk.view()));
    SP_RETURN_IF_ERROR(layout.shard(in.v.view(), 1, r, lv.view()));
    SP_RETURN_IF_ERROR(layout.shard(in.dout.view(), 1, r, ldo.view()));
    const ShardTensors st{lq.view(), lk.view(), lv.view(), lo.view(), llse.view(),
                          ldo.view(), ldq.view(), ldk.view(), ldv.view()};
    Session session(comm, {PlanOptions("burst-return")});
    SP_RETURN_IF_ERROR(session.forward(layout, params, st));
    SP_RETURN_IF_ERROR(session.backward(layout, params, st));
    std::lock_guard lock(mu);
    SP_RETURN_IF_ERROR(layout.unshard(lo.view(), 1, r, run.o.view()));
    SP_RETURN_IF_ERROR(layout.unshard(llse.view(), 2, r, run.lse.view()));
    SP_RETURN_IF_ERROR(layout.unshard(ldq.view(), 1, r, run.dq.view()));
    SP_RETURN_IF_ERROR(layout.unshard(ldk.view(), 1, r, run.dk.view()));
    return layout.unshard(ldv.view(), 1, r, run.dv.view());
  });
  ASSERT_TRUE(status.ok()) << status.to_string();
  expect_oracle(run, in, params);
}

TEST(Session, RefusesDeviceTensorsWithoutCuda) {
#ifdef SEQPAR_HAVE_CUDA
  GTEST_SKIP() << "this build has CUDA: the GPU tests cover device tensors";
#endif
  auto comms = make_local_communicators(1);
  Session session(*comms[0]);
  const Layout layout = Layout::create(LayoutKind::kZigzag, 16, 1).value();
  TensorView q = TensorView::contiguous(nullptr, DType::kBF16, {1, 16, 2, 8}, Device{DeviceKind::kCuda, 0});
  const auto plan = session.plan(layout, {}, q, q);
  EXPECT_EQ(plan.status().code(), StatusCode::kUnsupported) << plan.status().to_string();
}

}  // namespace
}  // namespace seqpar
