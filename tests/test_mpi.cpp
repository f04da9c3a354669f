// Run under `mpirun -np 4`: the MPI communicator's collectives and ring attention over MPI
// processes, each rank comparing its own rows with the fp64 oracle and its bytes with the
// formula.
#include <gtest/gtest.h>
#include <omp.h>

#include "seqpar/distributed_attention.hpp"
#include "test_util.hpp"

namespace seqpar {
namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> comm = [] {
    auto c = make_mpi_world_communicator();
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", c.status().to_string().c_str());
      std::abort();
    }
    return std::move(c).value();
  }();
  return *comm;
}

TEST(Mpi, Collectives) {
  Communicator& c = world();
  const int P = c.size(), r = c.rank();
  ASSERT_GE(P, 2) << "run this test under mpirun -np 4";
  std::vector<double> x{double(r), 1.0};
  ASSERT_TRUE(c.all_reduce(x.data(), 2, DType::kF64, ReduceOp::kSum).ok());
  EXPECT_EQ(x[0], P * (P - 1) / 2.0);
  EXPECT_EQ(x[1], double(P));
  std::vector<int> a2a_in(P), a2a_out(P);
  for (int q = 0; q < P; ++q) a2a_in[q] = 100 * r + q;
  ASSERT_TRUE(c.all_to_all(a2a_in.data(), a2a_out.data(), sizeof(int)).ok());
  for (int q = 0; q < P; ++q) EXPECT_EQ(a2a_out[q], 100 * q + r);
  auto sub = c.split(r % 2, r);
  ASSERT_TRUE(sub.ok());
  EXPECT_EQ(sub.value()->size(), (P - r % 2 + 1) / 2);
  ASSERT_TRUE(c.barrier().ok());
}

TEST(Mpi, EveryAlgorithmMatchesOracleOnEveryLayout) {
  Communicator& c = world();
  omp_set_num_threads(1);
  const int P = c.size(), r = c.rank();
  const int64_t S = 16 * P + 3, H = 4, Hkv = 2, D = 16;
  const HostTensor q = testing::random_tensor(DType::kF64, {1, S, H, D}, 1);
  const HostTensor k = testing::random_tensor(DType::kF64, {1, S, Hkv, D}, 2);
  const HostTensor v = testing::random_tensor(DType::kF64, {1, S, Hkv, D}, 3);
  const HostTensor dout = testing::random_tensor(DType::kF64, {1, S, H, D}, 4);
  for (LayoutKind kind : {LayoutKind::kContiguous, LayoutKind::kZigzag, LayoutKind::kStriped}) {
    for (const char* mask : {"causal", "window:7,2", "docs:3"})
    for (const Algorithm* algo : all_algorithms()) {
      SCOPED_TRACE(std::string(layout_name(kind)) + " " + mask + " " + algo->name);
      AttentionParams params;
      params.mask = parse_mask(mask, S).value();
      const Layout layout = Layout::create(kind, S, P).value();
      const int64_t n = layout.local_len(r);
      HostTensor lq(DType::kF64, {1, n, H, D}), lk(DType::kF64, {1, n, Hkv, D});
      HostTensor lv = lk, ldo = lq, lo = lq, ldq = lq, ldk = lk, ldv = lk;
      HostTensor llse(DType::kF64, {1, H, n});
      ASSERT_TRUE(layout.shard(q.view(), 1, r, lq.view()).ok());
      ASSERT_TRUE(layout.shard(k.view(), 1, r, lk.view()).ok());
      ASSERT_TRUE(layout.shard(v.view(), 1, r, lv.view()).ok());
      ASSERT_TRUE(layout.shard(dout.view(), 1, r, ldo.view()).ok());
      c.reset_counters();
      const BlockBytes bytes{1, H, Hkv, D, DType::kF64, DType::kF64, DType::kF64, true};
      const Topology two_nodes{P % 2 == 0 ? P / 2 : 1};
      auto plan = plan_attention({algo->name, two_nodes}, layout, params, bytes, r, cpu_kernel_backend());
      if (!plan.ok()) {  // refused alike on every rank (distflash off the contiguous layout)
        EXPECT_EQ(plan.status().code(), StatusCode::kUnsupported);
        continue;
      }
      const ShardTensors t{lq.view(), lk.view(), lv.view(), lo.view(), llse.view(),
                           ldo.view(), ldq.view(), ldk.view(), ldv.view()};
      ASSERT_TRUE(run_forward_cpu(c, plan.value(), t).ok());
      ASSERT_TRUE(run_backward_cpu(c, plan.value(), t).ok());
      auto ref = reference_attention(q.view(), k.view(), v.view(), dout.view(), params);
      ASSERT_TRUE(ref.ok());
      HostTensor want_o(DType::kF64, {1, n, H, D}), want_dk(DType::kF64, {1, n, Hkv, D});
      HostTensor want_lse(DType::kF64, {1, H, n});
      ASSERT_TRUE(layout.shard(ref->o.view(), 1, r, want_o.view()).ok());
      ASSERT_TRUE(layout.shard(ref->lse.view(), 2, r, want_lse.view()).ok());
      ASSERT_TRUE(layout.shard(ref->dk.view(), 1, r, want_dk.view()).ok());
      EXPECT_LE(testing::max_abs_diff(lo, want_o), 1e-10);
      EXPECT_LE(testing::max_abs_diff(llse, want_lse), 1e-10);
      EXPECT_LE(testing::max_abs_diff(ldk, want_dk), 1e-10);
      EXPECT_EQ(c.counters().sent(Phase::kForward),
                walk_bytes(plan->schedule.forward, r, layout, bytes, two_nodes, plan->schedule.head_parts).total);
      EXPECT_EQ(c.counters().sent(Phase::kBackward),
                walk_bytes(plan->schedule.backward, r, layout, bytes, two_nodes, plan->schedule.head_parts).total);
    }
  }
}

}  // namespace
}  // namespace seqpar
