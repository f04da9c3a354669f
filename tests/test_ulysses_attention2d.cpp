// Ulysses, Ulysses x ring and Attention2D beyond the oracle runs of test_schedules: bytes a
// rank sends, measured by the communicator, equal the closed forms (Attention2D: report 003
// §3.3 in our words; Ulysses: the all-to-alls of the sequence shard, K/V copies under GQA
// counted); bytes x sqrt(P) / N levels off for Attention2D and grows for the ring; and one
// regression test per erratum of the report (§8), each failing on the printed algorithm.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <mutex>

#include "parallel/algorithms/attention2d.hpp"
#include "schedule_test_util.hpp"

namespace seqpar {
namespace {

using parallel::attention2d_grid;
using parallel::Grid;
using parallel::PrintedErrata;

AttentionParams causal() {
  AttentionParams p;
  p.mask = MaskSpec::causal();
  return p;
}

// Attention2D, full and causal masks on the striped (1-D cyclic) layout, N = P n: a rank at
// grid (r, c) sends, in words of one dtype a head (D = head dim, H = heads = K/V heads here),
//   forward   (s-1) n (4D + 1) + 2 n D [r != c]
//             row gather Q (D), column gather K/V (2D), AttnFix ring (O, LSE: D + 1), swap K/V;
//   backward  (s-1) n (7D + 2) + 4 n D [r != c]
//             row gather of the pack (Q, dO, D, LSE: 2D + 2), column gather K/V (2D), dQ ring
//             (D), dK/dV ring (2D), swap K/V again and dK/dV back.
// The report's (4H + 2) and (8H + 2) carry M and D (two stats) and O in place of D; with the
// LSE the partials take one stat word, and D (one word) replaces O (D words). Its backward
// swaps only dK/dV because its forward saves K_t, V_t (report §8.10): so does ours with
// keep_forward_state; without, the backward swaps K/V again (4 n D off the diagonal).
TEST(Attention2DBytes, MeasuredEqualClosedForms) {
  for (int P : {1, 4, 9, 16})
    for (const char* algo : {"attention2d", "attention2d-overlap"})
      for (const char* mask : {"full", "causal"})
        for (bool keep : {false, true}) {
          SCOPED_TRACE(std::string(algo) + " P=" + std::to_string(P) + " " + mask + (keep ? " keep" : ""));
          Problem g;
          const int64_t n = 5;
          g.seq = P * n, g.heads = 3, g.kv_heads = 3, g.head_dim = 4;
          const Layout layout = Layout::create(LayoutKind::kStriped, g.seq, P).value();
          AttentionParams params;
          params.mask = parse_mask(mask, g.seq).value();
          PlanOptions options{algo};
          options.keep_forward_state = keep;
          const Inputs in(g);
          Status status;
          const RankResults run = run_ranks(g, layout, params, options, in.q, in.k, in.v, in.dout, &status);
          ASSERT_TRUE(status.ok()) << status.to_string();
          auto ref = reference_attention(in.q.view(), in.k.view(), in.v.view(), in.dout.view(), params);
          for (const auto& [got, want] : {std::pair{&run.o, &ref->o}, {&run.dq, &ref->dq}, {&run.dk, &ref->dk}})
            EXPECT_LE(testing::max_abs_diff(*got, *want), 1e-10);
          const Grid grid = attention2d_grid(P);
          const int64_t s = grid.s, D = g.head_dim, word = 8 * g.heads;
          for (int r = 0; r < P; ++r) {
            const int64_t swap = grid.row(r) != grid.col(r) ? 2 * n * D : 0;
            EXPECT_EQ(run.counters[r].sent(Phase::kForward), word * ((s - 1) * n * (4 * D + 1) + swap)) << "rank " << r;
            EXPECT_EQ(run.counters[r].sent(Phase::kBackward), word * ((s - 1) * n * (7 * D + 2) + (keep ? 1 : 2) * swap))
                << "rank " << r;
          }
        }
}

// Ulysses of degree u over P = u ranks, N = P n: each pass sends (u - 1) of the u head parts
// of the rank's sequence shard: forward Q, K, V and (O, LSE) (the four all-to-alls), backward
// the query pack (Q, dO, D, LSE), K, V, and dQ, dK, dV. A part holds H/u query heads and the
// K/V heads they read: H_kv/u, or one (copied to u/H_kv parts) when u exceeds H_kv.
TEST(UlyssesBytes, MeasuredEqualAllToAllsOfTheShard) {
  for (int P : {2, 4, 8})
    for (int64_t kv_heads : {int64_t(8), int64_t(2), int64_t(1)}) {
      SCOPED_TRACE("P=" + std::to_string(P) + " H_kv=" + std::to_string(kv_heads));
      Problem g;
      const int64_t n = 3;
      g.seq = P * n, g.heads = 8, g.kv_heads = kv_heads, g.head_dim = 4;
      const Layout layout = Layout::create(LayoutKind::kZigzag, g.seq, P).value();
      const Inputs in(g);
      Status status;
      const RankResults run = run_ranks(g, layout, causal(), {"ulysses"}, in.q, in.k, in.v, in.dout, &status);
      ASSERT_TRUE(status.ok()) << status.to_string();
      const int64_t D = g.head_dim, hq = g.heads / P, hkv = std::max<int64_t>(g.kv_heads / P, 1);
      const int64_t fwd = (P - 1) * n * (hq * D + 2 * hkv * D + hq * (D + 1)) * 8;
      const int64_t bwd = (P - 1) * n * (hq * (2 * D + 2) + 2 * hkv * D + hq * D + 2 * hkv * D) * 8;
      for (int r = 0; r < P; ++r) {
        EXPECT_EQ(run.counters[r].sent(Phase::kForward), fwd) << "rank " << r;
        EXPECT_EQ(run.counters[r].sent(Phase::kBackward), bwd) << "rank " << r;
      }
    }
}

// Ulysses receiving its pieces straight into the spans they join (receive_into_spans, which
// plans set where the accumulators are wider than the inputs: on devices) computes what it does
// with a buffer per piece, bit for bit, and sends the same bytes: a piece travels in its shard's
// row runs in the span (two for a zigzag shard, one for a striped shard's), per batch entry and,
// for the row stats, per head. Lengths that do not divide, B = 2, GQA, kept forward state.
TEST(UlyssesBytes, ReceivingIntoTheSpansChangesNoBitNorByte) {
  const int P = 4;
  for (const char* algo : {"ulysses", "ulysses-ring"})
    for (LayoutKind kind : {LayoutKind::kZigzag, LayoutKind::kStriped})
      for (bool keep : {false, true}) {
        SCOPED_TRACE(std::string(algo) + (kind == LayoutKind::kZigzag ? " zigzag" : " striped") + (keep ? " keep" : ""));
        Problem g;
        g.seq = 8 * P + 5, g.batch = 2, g.heads = 8, g.kv_heads = 2, g.head_dim = 4;
        const Layout layout = Layout::create(kind, g.seq, P).value();
        PlanOptions options{algo, {2}};  // ulysses-ring: u = 2 inside a node, a ring of 2
        options.keep_forward_state = keep;
        size_t received_into = 0;
        std::mutex mu;
        const auto into_spans = [&](AttentionPlan& plan) {
          plan.request.receive_into_spans = true;
          plan.schedule = plan.algorithm->make_schedule(plan.request, plan.rank);
          std::lock_guard lock(mu);
          for (Pass pass : {Pass::kForward, Pass::kBackward})
            for (const Step& s : plan.schedule.pass(pass))
              for (const Transfer& t : s.recvs) received_into += t.into_span.has_value();
        };
        const Inputs in(g);
        Status status;
        const RankResults pieces = run_ranks(g, layout, causal(), options, in.q, in.k, in.v, in.dout, &status);
        ASSERT_TRUE(status.ok()) << status.to_string();
        const RankResults spans = run_ranks(g, layout, causal(), options, in.q, in.k, in.v, in.dout, &status,
                                            cpu_kernel_backend(), into_spans);
        ASSERT_TRUE(status.ok()) << status.to_string();
        EXPECT_GT(received_into, 0u);
        expect_oracle(spans, in, causal());
        for (const auto& [got, want] : {std::pair{&spans.o, &pieces.o}, {&spans.lse, &pieces.lse},
                                        {&spans.dq, &pieces.dq}, {&spans.dk, &pieces.dk}, {&spans.dv, &pieces.dv}})
          EXPECT_EQ(testing::max_abs_diff(*got, *want), 0.0);
        for (int r = 0; r < P; ++r)
          for (Phase phase : {Phase::kForward, Phase::kBackward})
            EXPECT_EQ(spans.counters[r].sent(phase), pieces.counters[r].sent(phase)) << "rank " << r;
      }
}

// With the forward's head-part Q and K/V kept for the backward (keep_forward_state, as
// DeepSpeed's autograd keeps them), the backward's all-to-alls carry dO and the row stats (D,
// LSE) in and dQ, dK, dV out: four all-to-alls of the sequence shard a pass, plus two stat
// words a row. Still the oracle to 1e-10, with masks and GQA, for Ulysses, its overlapped
// halves and the hybrid.
TEST(UlyssesBytes, KeptForwardStateLeavesFourAllToAllsAPass) {
  for (const char* algo : {"ulysses", "ulysses-overlap", "ulysses-ring"})
    for (int P : {2, 4, 8})
      for (const char* mask : {"causal", "window:7,2", "docs:3"}) {
        if (std::string(algo) == "ulysses-overlap" && P == 8) continue;  // 16 head parts of 8 heads
        SCOPED_TRACE(std::string(algo) + " P=" + std::to_string(P) + " " + mask);
        Problem g;
        const int64_t n = 5;
        g.seq = P * n, g.heads = 8, g.kv_heads = 2, g.head_dim = 4;
        const Layout layout = Layout::create(LayoutKind::kZigzag, g.seq, P).value();
        AttentionParams params;
        params.mask = parse_mask(mask, g.seq).value();
        PlanOptions options{algo, {P > 2 ? P / 2 : 0}};  // the hybrid: u = P/2 inside a node, a ring of 2
        options.keep_forward_state = true;
        ScheduleRequest req = make_schedule_request(layout, params.mask, g.heads, g.kv_heads, options.topology);
        req.keep_forward_state = true;
        const auto all = all_rank_schedules(*find_algorithm(algo), req);
        for (Pass pass : {Pass::kForward, Pass::kBackward})
          EXPECT_TRUE(validate_schedules(all, req, pass).ok()) << validate_schedules(all, req, pass).to_string();
        EXPECT_FALSE(all[0].kept.empty());
        const Inputs in(g);
        Status status;
        const RankResults run = run_ranks(g, layout, params, options, in.q, in.k, in.v, in.dout, &status);
        ASSERT_TRUE(status.ok()) << status.to_string();
        expect_oracle(run, in, params);
        if (std::string(algo) != "ulysses") continue;
        const int64_t D = g.head_dim, hq = g.heads / P, hkv = std::max<int64_t>(g.kv_heads / P, 1);
        for (int r = 0; r < P; ++r)
          EXPECT_EQ(run.counters[r].sent(Phase::kBackward), (P - 1) * n * (hq * (D + 2) + hq * D + 2 * hkv * D) * 8)
              << "rank " << r;
      }
}

// ulysses-overlap's order is its point: both halves' all-to-alls are posted before either is
// waited for, the first half computes before the second half's wait, and the first half's
// results are posted home before the second half computes; the bytes are Ulysses' where the
// K/V heads split into 2P parts (no K/V head copied twice).
TEST(UlyssesBytes, OverlapPostsTheSecondHalfBeforeTheFirstComputes) {
  const int P = 4;
  Problem g;
  g.seq = 8 * P, g.heads = 16, g.kv_heads = 8, g.head_dim = 4;
  const Layout layout = Layout::create(LayoutKind::kZigzag, g.seq, P).value();
  const ScheduleRequest req = make_schedule_request(layout, MaskSpec::causal(), g.heads, g.kv_heads);
  for (Pass pass : {Pass::kForward, Pass::kBackward}) {
    const std::vector<Step> steps = find_algorithm("ulysses-overlap")->make_schedule(req, 1).pass(pass);
    std::vector<std::string> order;  // post b / wait b / compute part
    for (const Step& s : steps) {
      if (s.kind == StepKind::kPost) order.push_back("post " + std::to_string(s.batch));
      if (s.kind == StepKind::kWait) order.push_back("wait " + std::to_string(s.batch));
      if (s.kind == StepKind::kCompute) order.push_back("compute " + std::to_string(s.part));
    }
    EXPECT_EQ(order, (std::vector<std::string>{"post 0", "post 1", "wait 0", "compute 1", "post 2", "wait 1", "compute 5",
                                               "post 3", "wait 2", "wait 3"}));
  }
  Status status;
  const Inputs in(g);
  PlanOptions overlap{"ulysses-overlap"}, plain{"ulysses"};
  AttentionParams params;
  params.mask = MaskSpec::causal();
  const RankResults a = run_ranks(g, layout, params, overlap, in.q, in.k, in.v, in.dout, &status);
  ASSERT_TRUE(status.ok()) << status.to_string();
  expect_oracle(a, in, params);
  const RankResults b = run_ranks(g, layout, params, plain, in.q, in.k, in.v, in.dout, &status);
  ASSERT_TRUE(status.ok()) << status.to_string();
  for (int r = 0; r < P; ++r)
    for (Phase phase : {Phase::kForward, Phase::kBackward})
      EXPECT_EQ(a.counters[r].sent(phase), b.counters[r].sent(phase)) << "rank " << r;
}

// Ulysses x ring with a returning ring across the groups: the ring dimension's blocks span u
// shards, so its returns carry every row (the per-shard row hulls that trim ring-return's and
// burst-return's returns do not apply to group spans). The oracle to 1e-10, valid schedules,
// measured = walked bytes. (Trimming them with the shards' hulls lost dK/dV or dQ rows.)
TEST(UlyssesRing, ReturningRingsAcrossGroupsMatchTheOracle) {
  for (const char* ring : {"ring-return", "burst-return"})
    for (int P : {4, 8})
      for (const char* mask : {"causal", "docs:3"}) {
        SCOPED_TRACE(std::string(ring) + " P=" + std::to_string(P) + " " + mask);
        Problem g;
        g.seq = P * 6, g.heads = 4, g.kv_heads = 2, g.head_dim = 4;
        const Layout layout = Layout::create(LayoutKind::kZigzag, g.seq, P).value();
        AttentionParams params;
        params.mask = parse_mask(mask, g.seq).value();
        PlanOptions options{"ulysses-ring"};
        options.ulysses = 2;
        options.ring_algorithm = ring;
        ScheduleRequest req = make_schedule_request(layout, params.mask, g.heads, g.kv_heads);
        req.ulysses = 2;
        req.ring_algorithm = ring;
        const auto all = all_rank_schedules(*find_algorithm("ulysses-ring"), req);
        for (Pass pass : {Pass::kForward, Pass::kBackward})
          EXPECT_TRUE(validate_schedules(all, req, pass).ok()) << validate_schedules(all, req, pass).to_string();
        expect_exact_with_walked_backward(g, layout, params, options, all);
      }
}

// Attention2D keeping the swapped K/V (the report's K_t, V_t): valid schedules, with masks
// that leave some swaps out, and the oracle to 1e-10.
TEST(Attention2DBytes, KeptSwappedKVIsValidAndExact) {
  for (int P : {4, 9})
    for (const char* algo : {"attention2d", "attention2d-overlap"})
      for (const char* mask : {"causal", "window:3,0", "docs:3"}) {
        SCOPED_TRACE(std::string(algo) + " P=" + std::to_string(P) + " " + mask);
        Problem g;
        g.seq = 7 * P + 2;
        const Layout layout = Layout::create(LayoutKind::kStriped, g.seq, P).value();
        AttentionParams params;
        params.mask = parse_mask(mask, g.seq).value();
        ScheduleRequest req = make_schedule_request(layout, params.mask, g.heads, g.kv_heads);
        req.keep_forward_state = true;
        const auto all = all_rank_schedules(*find_algorithm(algo), req);
        for (Pass pass : {Pass::kForward, Pass::kBackward})
          EXPECT_TRUE(validate_schedules(all, req, pass).ok()) << validate_schedules(all, req, pass).to_string();
        PlanOptions options{algo};
        options.keep_forward_state = true;
        const Inputs in(g);
        Status status;
        const RankResults run = run_ranks(g, layout, params, options, in.q, in.k, in.v, in.dout, &status);
        ASSERT_TRUE(status.ok()) << status.to_string();
        expect_oracle(run, in, params);
      }
}

// A plan that keeps forward blocks refuses to run without a ForwardState, and a backward
// refuses a state its forward did not fill.
TEST(UlyssesBytes, KeptForwardStateIsRequiredAndChecked) {
  Problem g;
  g.seq = 24, g.heads = 4, g.kv_heads = 2;
  const Layout layout = Layout::create(LayoutKind::kContiguous, g.seq, 2).value();
  PlanOptions options{"ulysses"};
  options.keep_forward_state = true;
  const Inputs in(g);
  const Status status = run_local_ranks(2, [&](Communicator& comm) -> Status {
    SP_ASSIGN_OR_RETURN(const AttentionPlan plan,
                        plan_attention(options, layout, causal(), g.bytes(), comm.rank(), cpu_kernel_backend()));
    const int64_t n = layout.local_len(comm.rank());
    HostTensor q(g.dtype, {1, n, g.heads, g.head_dim}), kv(g.dtype, {1, n, g.kv_heads, g.head_dim});
    HostTensor o = q, dq = q, dout = q, k = kv, v = kv, dk = kv, dv = kv, lse(g.dtype, {1, g.heads, n});
    const ShardTensors st{q.view(), k.view(), v.view(), o.view(), lse.view(), dout.view(), dq.view(), dk.view(), dv.view()};
    const Status without = run_forward_cpu(comm, plan, st);
    SP_CHECK_ARG(!without.ok() && without.message().find("ForwardState") != std::string::npos,
                 "the forward ran without a ForwardState: " + without.to_string());
    ForwardState empty;
    const Status unfilled = run_backward_cpu(comm, plan, st, nullptr, &empty);
    SP_CHECK_ARG(!unfilled.ok() && unfilled.message().find("run the forward with it first") != std::string::npos,
                 "the backward ran on an empty ForwardState: " + unfilled.to_string());
    return Status::Ok();
  });
  EXPECT_TRUE(status.ok()) << status.to_string();
}

// The hybrid's bytes split into its two dimensions: the all-to-alls of degree u and, across
// the R groups, the ring's K/V (forward: R - 1 hops of the group's head part) and dK/dV.
TEST(UlyssesBytes, HybridIsAllToAllsPlusARingOfGroupSpans) {
  Problem g;
  const int u = 2, R = 4, P = u * R;
  const int64_t n = 3;
  g.seq = P * n, g.heads = 4, g.kv_heads = 2, g.head_dim = 4;
  const Layout layout = Layout::create(LayoutKind::kContiguous, g.seq, P).value();
  AttentionParams full;
  full.mask = MaskSpec{};
  PlanOptions options{"ulysses-ring"};
  options.ulysses = u;
  const ScheduleRequest req = [&] {
    ScheduleRequest r = make_schedule_request(layout, full.mask, g.heads, g.kv_heads);
    r.ulysses = u;
    return r;
  }();
  const Inputs in(g);
  Status status;
  const RankResults run = run_ranks(g, layout, full, options, in.q, in.k, in.v, in.dout, &status);
  ASSERT_TRUE(status.ok()) << status.to_string();
  const int64_t D = g.head_dim, hq = g.heads / u, hkv = g.kv_heads / u;
  const int64_t a2a_fwd = (u - 1) * n * (hq * D + 2 * hkv * D + hq * (D + 1)) * 8;
  const int64_t ring_fwd = (R - 1) * (u * n) * 2 * hkv * D * 8;
  for (int r = 0; r < P; ++r) {
    const RankSchedule s = find_algorithm("ulysses-ring")->make_schedule(req, r);
    const WalkedBytes w = walk_bytes(s.forward, r, layout, g.bytes(), {}, s.head_parts);
    EXPECT_EQ(w.by_collective[int(Collective::kAllToAll)], a2a_fwd) << "rank " << r;
    EXPECT_EQ(w.by_collective[int(Collective::kPointToPoint)], ring_fwd) << "rank " << r;
    EXPECT_EQ(run.counters[r].sent(Phase::kForward), a2a_fwd + ring_fwd) << "rank " << r;
  }
}

// bytes x sqrt(P) / N at fixed N (full mask, walked; the runs above show measured = walked):
// Attention2D's approaches a constant (s (s-1)/s words -> 11D + 3 a head over both passes),
// the ring's grows with sqrt(P).
TEST(Attention2DBytes, ScaleAsNOverSqrtPWhileTheRingStaysLinear) {
  Problem g;
  g.heads = 1, g.kv_heads = 1, g.head_dim = 8;
  g.seq = 3600;  // divisible by 4, 9, 16, 25 and 36
  std::printf("%4s %16s %16s   (bytes x sqrt(P) / N, fwd + bwd, busiest rank)\n", "P", "attention2d", "ring");
  double last_a2d = 0, last_ring = 0;
  for (int P : {4, 9, 16, 25, 36}) {
    const Layout layout = Layout::create(LayoutKind::kStriped, g.seq, P).value();
    const ScheduleRequest req = make_schedule_request(layout, MaskSpec{}, g.heads, g.kv_heads);
    double per[2] = {0, 0};
    const char* names[2] = {"attention2d", "ring"};
    for (int a = 0; a < 2; ++a) {
      const auto all = all_rank_schedules(*find_algorithm(names[a]), req);
      int64_t most = 0;
      for (int r = 0; r < P; ++r)
        most = std::max(most, walk_bytes(all[r].forward, r, layout, g.bytes(), {}).total +
                                  walk_bytes(all[r].backward, r, layout, g.bytes(), {}).total);
      per[a] = double(most) * std::sqrt(double(P)) / double(g.seq);
    }
    std::printf("%4d %16.1f %16.1f\n", P, per[0], per[1]);
    const double limit = (11 * g.head_dim + 3) * 8.0;  // words -> bytes (fp64)
    EXPECT_GT(per[0], last_a2d);                         // rising to its limit from below
    EXPECT_LT(per[0], limit + 4 * g.head_dim * 8.0);     // the swaps' 4D/s on top, falling
    EXPECT_GT(per[1], last_ring * 1.05);                 // the ring's keeps growing
    last_a2d = per[0], last_ring = per[1];
  }
  EXPECT_GT(last_ring, 2 * last_a2d);
}

// Every rank's steps of a pass built by `pass` (with or without the printed errata).
std::vector<RankSchedule> project_all(const ScheduleRequest& req, const PrintedErrata& printed,
                                      parallel::PlanEvents (*pass)(const ScheduleRequest&, Pass,
                                                                   const PrintedErrata&)) {
  const parallel::PlanEvents fwd = pass(req, Pass::kForward, printed), bwd = pass(req, Pass::kBackward, printed);
  std::vector<RankSchedule> all;
  for (int r = 0; r < req.ranks; ++r) all.push_back({parallel::project(fwd, r), parallel::project(bwd, r)});
  return all;
}

// Runs attention2d-overlap with each rank's backward replaced by the printed one; the max
// |error| of dK against the oracle.
double printed_dk_error(int P, const PrintedErrata& printed) {
  Problem g;
  g.seq = 7 * P + 2;
  const Layout layout = Layout::create(LayoutKind::kStriped, g.seq, P).value();
  const Inputs in(g);
  const ScheduleRequest req = make_schedule_request(layout, MaskSpec::causal(), g.heads, g.kv_heads);
  const auto schedules = project_all(req, printed, parallel::attention2d_overlap_pass);
  Status status;
  const RankResults run = run_ranks(g, layout, causal(), {"attention2d-overlap"}, in.q, in.k, in.v, in.dout, &status,
                                    cpu_kernel_backend(),
                                    [&](AttentionPlan& plan) { plan.schedule = schedules[plan.rank]; });
  EXPECT_TRUE(status.ok()) << status.to_string();
  auto ref = reference_attention(in.q.view(), in.k.view(), in.v.view(), in.dout.view(), causal());
  return testing::max_abs_diff(run.dk, ref->dk);
}

// Erratum 1 (Algorithm 11 line 18): the rank's own dK_1, dV_1, accumulated over every earlier
// query block, must be added to what the column ring brings; the printed line replaces them.
TEST(Attention2DErrata, Algorithm11Line18AddsTheOwnBlocksGradient) {
  for (int P : {4, 9}) {
    SCOPED_TRACE("P=" + std::to_string(P));
    const Layout layout = Layout::create(LayoutKind::kStriped, 7 * P + 2, P).value();
    const ScheduleRequest req = make_schedule_request(layout, MaskSpec::causal(), 4, 2);
    EXPECT_TRUE(validate_schedules(project_all(req, {}, parallel::attention2d_overlap_pass), req, Pass::kBackward).ok());
    PrintedErrata printed;
    printed.alg11_drops_own_dkv = true;
    const Status literal = validate_schedules(project_all(req, printed, parallel::attention2d_overlap_pass), req,
                                              Pass::kBackward);
    EXPECT_FALSE(literal.ok());
    EXPECT_LE(printed_dk_error(P, {}), 1e-10);
    EXPECT_GT(printed_dk_error(P, printed), 1e-3);
  }
}

// Erratum 2 (Algorithm 8): dK/dV must be swapped back from (r,c) to (c,r), their owner.
TEST(Attention2DErrata, Algorithm8SwapsGradientsBackToTheirOwner) {
  for (int P : {4, 9}) {
    SCOPED_TRACE("P=" + std::to_string(P));
    const Layout layout = Layout::create(LayoutKind::kStriped, 7 * P + 2, P).value();
    const ScheduleRequest req = make_schedule_request(layout, MaskSpec::causal(), 4, 2);
    PrintedErrata printed;
    printed.alg8_no_swap_back = true;
    const Status literal = validate_schedules(project_all(req, printed, parallel::attention2d_overlap_pass), req,
                                              Pass::kBackward);
    EXPECT_FALSE(literal.ok());
    EXPECT_NE(literal.message().find("never went home"), std::string::npos) << literal.message();
    EXPECT_GT(printed_dk_error(P, printed), 1e-3);
  }
}

// Erratum 3 (Algorithm 3 lines 7-8): the backward reduce-scatters the gradients dQ_g and
// dK_g, dV_g; the printed lines reduce Q_g and K_g, V_g, and no gradient gets home.
TEST(Attention2DErrata, Algorithm3ReduceScattersTheGradients) {
  for (int P : {4, 9}) {
    const Layout layout = Layout::create(LayoutKind::kStriped, 7 * P + 2, P).value();
    const ScheduleRequest req = make_schedule_request(layout, MaskSpec::causal(), 4, 2);
    EXPECT_TRUE(validate_schedules(project_all(req, {}, parallel::attention2d_pass), req, Pass::kBackward).ok());
    PrintedErrata printed;
    printed.alg3_reduces_inputs = true;
    EXPECT_FALSE(validate_schedules(project_all(req, printed, parallel::attention2d_pass), req, Pass::kBackward).ok());
  }
}

// Erratum 4 (Algorithm 7 lines 3 and 6): in step i rank column c holds the partial of the
// gathered rows (c + i) % s + j s for j in [0, N/P) (one query shard), not j in [0, N/sqrt(P)),
// which runs past the end of Q_g. The rows are the global tokens of the block the schedule's
// row ring sends in that step.
TEST(Attention2DErrata, Algorithm7IndexRangeIsOneShard) {
  for (int P : {4, 9, 16}) {
    const Grid g = attention2d_grid(P);
    const int64_t n = 3, N = P * n;
    const Layout layout = Layout::create(LayoutKind::kStriped, N, P).value();
    const ScheduleRequest req = make_schedule_request(layout, MaskSpec{}, 1, 1);
    const auto all = all_rank_schedules(*find_algorithm("attention2d"), req);
    for (int l = 0; l < P; ++l) {
      const int r = g.row(l), c = g.col(l);
      int step = 0;
      for (const Step& s : all[l].forward) {
        if (s.kind != StepKind::kPost || s.collective != Collective::kRowReduceScatter) continue;
        ++step;
        ASSERT_EQ(s.sends.size(), 1u);
        std::vector<int64_t> tokens;  // gathered row k of row r is global token r + k s
        for (int64_t k : parallel::attnfix_ring_rows(g.s, n, c, step, false)) tokens.push_back(r + k * g.s);
        EXPECT_EQ(tokens, layout.positions(s.sends[0].block.shard)) << "rank " << l << " step " << step;
        const auto printed = parallel::attnfix_ring_rows(g.s, n, c, step, true);
        EXPECT_GE(printed.back(), g.s * n) << "the printed range stays inside Q_g";
      }
      EXPECT_EQ(step, g.s - 1);
    }
  }
}

// Erratum 5 (Figure 2's caption): with N = 8 on a 2 x 2 grid under a causal mask the ranks
// compute 10, 10, 10 and 6 scores, not "exactly ten" each: n(n+1)/2 where r >= c and n(n-1)/2
// where r < c (n = N / sqrt(P) = 4).
TEST(Attention2DErrata, Figure2RanksAboveTheDiagonalComputeFewerScores) {
  const int P = 4;
  const Grid g = attention2d_grid(P);
  const Layout layout = Layout::create(LayoutKind::kStriped, 8, P).value();
  const ScheduleRequest req = make_schedule_request(layout, MaskSpec::causal(), 1, 1);
  const auto all = all_rank_schedules(*find_algorithm("attention2d"), req);
  for (int l = 0; l < P; ++l) {
    int scores = 0;
    for (const Step& s : all[l].forward)
      if (s.kind == StepKind::kCompute)
        for (int64_t qp : layout.positions(s.q_shard))
          for (int64_t kp : layout.positions(s.kv_shard)) scores += kp <= qp;
    EXPECT_EQ(scores, g.row(l) >= g.col(l) ? 10 : 6) << "rank " << l;
  }
}

}  // namespace
}  // namespace seqpar
