// Every algorithm as a schedule: validated symbolically (matched, deadlock-free, each visible
// pair once, results home) for every layout, mask and P in 1..8; run on P thread ranks by the
// CPU executor against the fp64 oracle (packed documents of random lengths, two batch entries:
// against the oracle run on each document alone); bytes measured by the communicator equal the bytes
// walked from the steps, which equal the papers' closed forms. DistFlashAttn's round count and
// odd-P erratum, the double ring's per-link split, and masks that skip transfers.
#include <gtest/gtest.h>

#include <omp.h>

#include <mutex>

#include "parallel/algorithms/plan_events.hpp"
#include "paper_byte_formulas.hpp"
#include "seqpar/distributed_attention.hpp"
#include "schedule_test_util.hpp"
#include "test_util.hpp"

namespace seqpar {
namespace {

// Nodes for the double ring: two nodes when P is even and above 2, else one rank a node.
Topology topology_for(int P) { return {P % 2 == 0 && P > 2 ? P / 2 : 1}; }

// Block-sparse masks on blocks of 4 tokens, so that at 16P + 5 tokens they leave shard pairs
// and tiles out; the test adds a pattern file written for its length (pattern_file_text).
const char* kMasks[] = {"full",         "causal",           "window:9,3",
                        "window:5,0",   "docs:3",           "bigbird:1,1,1,B=4",
                        "bigbird-causal:1,1,2,B=4", "bigbird-causal:0,0,1,B=4"};

// A pattern file for `seq` tokens in blocks of 3: every query block sees itself, the block two
// before it and every fifth key block (some after it: not causal-like).
std::string pattern_file_text(int64_t seq) {
  const int64_t n = (seq + 2) / 3;
  std::string text = "# test_schedules pattern\nblock_size 3\n";
  for (int64_t qb = 0; qb < n; ++qb) {
    for (int64_t kb = 0; kb < n; ++kb) text += kb == qb || kb == qb - 2 || kb % 5 == 4 ? '1' : '0';
    text += '\n';
  }
  return text;
}

// (algorithm, layout, P)
using Case = std::tuple<std::string, LayoutKind, int>;
std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string n = std::get<0>(info.param) + "_" + layout_name(std::get<1>(info.param)) + "_P" +
                  std::to_string(std::get<2>(info.param));
  for (char& c : n) c = c == '-' ? '_' : c;
  return n;
}
class AlgorithmVsOracle : public ::testing::TestWithParam<Case> {};

TEST_P(AlgorithmVsOracle, SchedulesValidAndResultsMatchOracleAndWalkedBytes) {
  const auto& [name, kind, P] = GetParam();
  const Algorithm* algorithm = find_algorithm(name);
  ASSERT_NE(algorithm, nullptr);
  Problem g;
  g.seq = 16 * P + 5;  // never divisible by P or 2P for P > 1
  g.kv_heads = P % 2 ? 1 : 2;  // GQA 4:1 and 4:2
  if (name.rfind("ulysses", 0) == 0) g.heads = std::max(4, P);  // head parts: 8:2 at P = 8 copies K/V heads
  if (name == "ulysses-overlap") g.heads = std::max(4, 2 * P);   // two head parts a rank
  // Packed documents of random lengths: the documents layout balances them, the other layouts
  // ignore them; every mask below runs on the layout they make.
  const std::vector<int64_t> packed = random_document_offsets(g.seq, 100 * P + 7);
  const Layout layout = Layout::create(kind, g.seq, P, packed).value();
  const HostTensor q = testing::random_tensor(g.dtype, {1, g.seq, g.heads, g.head_dim}, 1);
  const HostTensor k = testing::random_tensor(g.dtype, {1, g.seq, g.kv_heads, g.head_dim}, 2);
  const HostTensor v = testing::random_tensor(g.dtype, {1, g.seq, g.kv_heads, g.head_dim}, 3);
  const HostTensor dout = testing::random_tensor(g.dtype, {1, g.seq, g.heads, g.head_dim}, 4);
  Problem batched = g;  // the packed documents run as a batch of two sequences
  batched.batch = 2;
  const Inputs packed_inputs(batched);
  const PlanOptions options{name, topology_for(P)};
  int supported = 0;
  const testing::TempFile pattern("seqpar_schedules_pattern", pattern_file_text(g.seq));
  std::vector<std::string> masks(std::begin(kMasks), std::end(kMasks));
  masks.push_back("blocks:" + pattern.path.string());
  masks.push_back("packed");
  for (const std::string& mask_text : masks) {
    SCOPED_TRACE(mask_text);
    AttentionParams params;
    const bool is_packed = mask_text == "packed";
    params.mask = is_packed ? MaskSpec::documents(packed) : parse_mask(mask_text, g.seq).value();
    const ScheduleRequest req = make_schedule_request(layout, params.mask, g.heads, g.kv_heads, options.topology);
    const std::string why_not = algorithm->supports(req);
    Status status;
    if (!why_not.empty()) {  // refused with its reason, by the planner too
      run_ranks(g, layout, params, options, q, k, v, dout, &status);
      EXPECT_EQ(status.code(), StatusCode::kUnsupported) << status.to_string();
      EXPECT_NE(status.message().find(why_not), std::string::npos) << status.message();
      continue;
    }
    ++supported;
    const std::vector<RankSchedule> all = all_rank_schedules(*algorithm, req);
    for (Pass pass : {Pass::kForward, Pass::kBackward})
      ASSERT_TRUE(validate_schedules(all, req, pass).ok()) << validate_schedules(all, req, pass).to_string();
    const Problem& problem = is_packed ? batched : g;
    const RankResults run =
        is_packed ? run_ranks(batched, layout, params, options, packed_inputs.q, packed_inputs.k, packed_inputs.v,
                              packed_inputs.dout, &status)
                  : run_ranks(g, layout, params, options, q, k, v, dout, &status);
    ASSERT_TRUE(status.ok()) << status.to_string();
    if (is_packed) {
      expect_oracle_per_document(run, packed_inputs.q, packed_inputs.k, packed_inputs.v, packed_inputs.dout, packed,
                                 MaskSpec::causal());
    } else {
      auto ref = reference_attention(q.view(), k.view(), v.view(), dout.view(), params);
      ASSERT_TRUE(ref.ok());
      EXPECT_LE(testing::max_abs_diff(run.o, ref->o), 1e-10) << "O";
      EXPECT_LE(testing::max_abs_diff(run.lse, ref->lse), 1e-10) << "LSE";
      EXPECT_LE(testing::max_abs_diff(run.dq, ref->dq), 1e-10) << "dQ";
      EXPECT_LE(testing::max_abs_diff(run.dk, ref->dk), 1e-10) << "dK";
      EXPECT_LE(testing::max_abs_diff(run.dv, ref->dv), 1e-10) << "dV";
    }
    for (int r = 0; r < P; ++r) {
      EXPECT_EQ(run.counters[r].sent(Phase::kForward),
                walk_bytes(all[r].forward, r, layout, problem.bytes(), options.topology, all[r].head_parts).total)
          << "rank " << r;
      EXPECT_EQ(run.counters[r].sent(Phase::kBackward),
                walk_bytes(all[r].backward, r, layout, problem.bytes(), options.topology, all[r].head_parts).total)
          << "rank " << r;
      EXPECT_EQ(run.counters[r].sent(Phase::kOther), 0) << "rank " << r;
    }
  }
  // Every algorithm runs the full mask or, for DistFlashAttn, causal-like masks on contiguous.
  if (name != "distflash" || kind == LayoutKind::kContiguous || P == 1) EXPECT_GT(supported, 0);
}

INSTANTIATE_TEST_SUITE_P(All, AlgorithmVsOracle,
                         ::testing::Combine(::testing::Values("ring", "burst", "ring-return", "burst-return",
                                                              "distflash", "double-ring"),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kZigzag,
                                                              LayoutKind::kStriped, LayoutKind::kDocuments),
                                            ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8)),
                         case_name);

// Ulysses, its overlapped halves and Ulysses x ring (head parts; the hybrid's grid from the
// nodes: u = 2 at P = 4, u = 4 at P = 8) at P in {1, 2, 4, 8}; Attention2D's two variants at P
// in {1, 4, 9, 16}.
INSTANTIATE_TEST_SUITE_P(Ulysses, AlgorithmVsOracle,
                         ::testing::Combine(::testing::Values("ulysses", "ulysses-overlap", "ulysses-ring"),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kZigzag,
                                                              LayoutKind::kStriped, LayoutKind::kDocuments),
                                            ::testing::Values(1, 2, 4, 8)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Attention2D, AlgorithmVsOracle,
                         ::testing::Combine(::testing::Values("attention2d", "attention2d-overlap"),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kStriped,
                                                              LayoutKind::kDocuments),
                                            ::testing::Values(1, 4, 9, 16)),
                         case_name);

// fp32 and the oracle backend: the executor is backend-agnostic.
TEST(AlgorithmVsOracle, Fp32AndOracleBackend) {
  Problem g;
  g.seq = 61;
  g.dtype = DType::kF32;
  const Layout layout = Layout::create(LayoutKind::kZigzag, g.seq, 3).value();
  AttentionParams params;
  params.mask = MaskSpec::causal();
  const HostTensor q = testing::random_tensor(g.dtype, {1, g.seq, g.heads, g.head_dim}, 5);
  const HostTensor k = testing::random_tensor(g.dtype, {1, g.seq, g.kv_heads, g.head_dim}, 6);
  const HostTensor v = testing::random_tensor(g.dtype, {1, g.seq, g.kv_heads, g.head_dim}, 7);
  const HostTensor dout = testing::random_tensor(g.dtype, {1, g.seq, g.heads, g.head_dim}, 8);
  auto ref = reference_attention(q.view(), k.view(), v.view(), dout.view(), params);
  ASSERT_TRUE(ref.ok());
  for (const AttentionBackend* backend : all_backends()) {
    if (!backend->supports(q.view(), params).empty()) continue;
    SCOPED_TRACE(backend->name());
    Status status;
    const RankResults run = run_ranks(g, layout, params, {"burst"}, q, k, v, dout, &status, *backend);
    ASSERT_TRUE(status.ok()) << status.to_string();
    for (const auto& [got, want] : {std::pair{&run.o, &ref->o}, {&run.dq, &ref->dq}, {&run.dk, &ref->dk}})
      EXPECT_LE(testing::max_abs_diff(*got, *want), 1e-5 * std::max(1.0, testing::max_abs(*want)));
  }
}

// Walked bytes of one rank's pass.
int64_t walked(const std::string& algo, const Layout& layout, const MaskSpec& mask, const Problem& g, int rank,
               Pass pass, Topology topology = {}, int link = -1) {
  const ScheduleRequest req = make_schedule_request(layout, mask, g.heads, g.kv_heads, topology);
  const RankSchedule s = find_algorithm(algo)->make_schedule(req, rank);
  const WalkedBytes w = walk_bytes(s.pass(pass), rank, layout, g.bytes(), topology);
  return link < 0 ? w.total : w.by_link[link];
}

// With the full mask the walks equal the papers' closed forms: the ring 2(P-1) K/V shards
// forward and P dK/dV hops backward; Burst's backward (P-1) query packs and P dQ hops.
TEST(ScheduleBytes, ClosedFormsOfRingAndBurst) {
  Problem g;
  g.dtype = DType::kF32;
  for (int P : {1, 2, 3, 4, 8}) {
    g.seq = 64 * P + 3;
    const Layout layout = Layout::create(LayoutKind::kZigzag, g.seq, P).value();
    for (int r = 0; r < P; ++r) {
      const testing::TrafficBytes ring = testing::ring_expected_bytes(layout, r, 1, g.kv_heads, g.head_dim, g.dtype, g.dtype);
      EXPECT_EQ(walked("ring", layout, MaskSpec::none(), g, r, Pass::kForward), ring.forward);
      EXPECT_EQ(walked("ring", layout, MaskSpec::none(), g, r, Pass::kBackward), ring.backward);
      EXPECT_EQ(walked("burst", layout, MaskSpec::none(), g, r, Pass::kBackward),
                testing::burst_backward_expected_bytes(layout, r, 1, g.heads, g.head_dim, g.dtype, g.dtype));
      // Returned once: (P-1) parts instead of P hops.
      EXPECT_LE(walked("ring-return", layout, MaskSpec::none(), g, r, Pass::kBackward), ring.backward);
    }
  }
}

// The double ring on I nodes of L ranks, full mask, equal shards: each rank receives (and so
// sends) P - I K/V shards over intra-node links and I - 1 over inter-node links forward; the
// flat ring puts a node boundary on every hop of the ranks at a node's edge.
TEST(ScheduleBytes, DoubleRingSplitsByLinkClass) {
  Problem g;
  g.dtype = DType::kF32;
  for (auto [P, L] : {std::pair{8, 4}, {8, 2}, {6, 3}, {4, 2}}) {
    const int I = P / L;
    g.seq = 32 * P;
    const Layout layout = Layout::create(LayoutKind::kContiguous, g.seq, P).value();
    const int64_t kv = 2 * (g.seq / P) * g.kv_heads * g.head_dim * 4;
    const Topology topo{L};
    for (int r = 0; r < P; ++r) {
      EXPECT_EQ(walked("double-ring", layout, MaskSpec::none(), g, r, Pass::kForward, topo, 0), (P - I) * kv);
      EXPECT_EQ(walked("double-ring", layout, MaskSpec::none(), g, r, Pass::kForward, topo, 1), (I - 1) * kv);
    }
    // Measured by the counters, split by the peers' nodes.
    AttentionParams full;
    const HostTensor q = testing::random_tensor(g.dtype, {1, g.seq, g.heads, g.head_dim}, 1);
    const HostTensor k = testing::random_tensor(g.dtype, {1, g.seq, g.kv_heads, g.head_dim}, 2);
    Status status;
    const RankResults run = run_ranks(g, layout, full, {"double-ring", topo}, q, k, k, q, &status);
    ASSERT_TRUE(status.ok()) << status.to_string();
    for (int r = 0; r < P; ++r) {
      int64_t inter = 0;
      for (int peer = 0; peer < P; ++peer)
        if (topo.node_of(peer) != topo.node_of(r)) inter += run.counters[r].sent_to[peer][0];
      EXPECT_EQ(inter, (I - 1) * kv) << "rank " << r;
    }
  }
}

// DistFlashAttn: floor(P/2) + 1 rounds (5 at P = 8), and the report's per-worker receives at
// P = 8 in units of one shard of one tensor: forward [3,4,5,6,8,9,10,11] (K/V 2, Q 1, O 1),
// backward with O in the pack [17,16,15,14,14,13,12,11] (K/V 2, Q/dO/O 3, dQ 1, dK/dV 2).
TEST(DistFlash, RoundsAndReportVolumes) {
  for (int P = 1; P <= 9; ++P) {
    const Layout layout = Layout::create(LayoutKind::kContiguous, 8 * P, P).value();
    const ScheduleRequest req = make_schedule_request(layout, MaskSpec::causal(), 1, 1);
    const auto all = all_rank_schedules(*find_algorithm("distflash"), req);
    int rounds = 0;
    for (const auto& s : all)
      for (const Step& step : s.forward)
        if (step.kind == StepKind::kCompute) rounds = std::max(rounds, step.round + 1);
    EXPECT_EQ(rounds, P / 2 + 1) << "P = " << P;
    for (Pass pass : {Pass::kForward, Pass::kBackward}) EXPECT_TRUE(validate_schedules(all, req, pass).ok());
  }
  const Layout layout = Layout::create(LayoutKind::kContiguous, 64, 8).value();
  const auto all = all_rank_schedules(*find_algorithm("distflash"), make_schedule_request(layout, MaskSpec::causal(), 1, 1));
  const auto units = [](BlockKind kind) {
    switch (kind) {
      case BlockKind::kKV: case BlockKind::kDKV: return 2;
      case BlockKind::kQueryPack: return 3;
      default: return 1;  // Q, O, dQ
    }
  };
  const int forward[] = {3, 4, 5, 6, 8, 9, 10, 11}, backward[] = {17, 16, 15, 14, 14, 13, 12, 11};
  for (int r = 0; r < 8; ++r)
    for (Pass pass : {Pass::kForward, Pass::kBackward}) {
      int received = 0;
      for (const Step& s : all[r].pass(pass))
        for (const Transfer& t : s.recvs) received += units(t.block.kind);
      EXPECT_EQ(received, (pass == Pass::kForward ? forward : backward)[r]) << "rank " << r;
    }
}

// Erratum (report 002, section 2.3): Algorithm 2 as printed skips the helpers' work in the last
// round for every P (t != floor(P/2)); for odd P that drops (P-1)/2 causal pairs. Built
// literally, the validator finds a pair never computed; the library's guard (t != P/2, even P
// only) covers every pair once.
TEST(DistflashErratum, PrintedGuardLosesPairsForOddP) {
  for (int P : {3, 5, 7}) {
    const Layout layout = Layout::create(LayoutKind::kContiguous, 4 * P, P).value();
    const ScheduleRequest req = make_schedule_request(layout, MaskSpec::causal(), 1, 1);
    parallel::PlanEvents printed;
    for (int p = 0; p < P; ++p) printed.compute(p, 0, p, p);
    for (int t = 1; t <= P / 2; ++t)
      for (int p = 0; p < P; ++p) {
        if (p >= t) {
          printed.compute(p, t, p, p - t);
          printed.move(p - t, p, t - 1, t - 1, {BlockKind::kKV, p - t});
        } else if (t != P / 2) {  // the printed guard
          const int r = p - t + P;
          printed.compute(p, t, r, p);
          printed.move(r, p, t - 1, t - 1, {BlockKind::kQuery, r});
          printed.move(p, r, t + 1, t + 1, {BlockKind::kOutput, r}, Combine::kMerge);
        }
      }
    std::vector<RankSchedule> literal;
    for (int r = 0; r < P; ++r) literal.push_back({parallel::project(printed, r), {}});
    const Status s = validate_schedules(literal, req, Pass::kForward);
    EXPECT_FALSE(s.ok()) << "P = " << P;
    EXPECT_NE(s.message().find("computed 0 times"), std::string::npos) << s.message();
    EXPECT_TRUE(validate_schedules(all_rank_schedules(*find_algorithm("distflash"), req), req, Pass::kForward).ok());
  }
}

// The validator catches what a broken schedule does: a dropped send, a result left away from
// home, a pair computed twice (planted faults).
TEST(ScheduleValidator, CatchesPlantedFaults) {
  const Layout layout = Layout::create(LayoutKind::kContiguous, 32, 4).value();
  const ScheduleRequest req = make_schedule_request(layout, MaskSpec::none(), 1, 1);
  auto all = all_rank_schedules(*find_algorithm("ring"), req);
  ASSERT_TRUE(validate_schedules(all, req, Pass::kBackward).ok());
  auto no_send = all;  // rank 1 forgets its first send: rank 2 waits forever
  for (Step& s : no_send[1].backward)
    if (s.kind == StepKind::kPost && !s.sends.empty()) {
      s.sends.erase(s.sends.begin());
      break;
    }
  EXPECT_FALSE(validate_schedules(no_send, req, Pass::kBackward).ok());
  auto twice = all;  // rank 0 computes its diagonal pair twice
  for (size_t i = 0; i < twice[0].forward.size(); ++i)
    if (twice[0].forward[i].kind == StepKind::kCompute) {
      twice[0].forward.insert(twice[0].forward.begin() + i, twice[0].forward[i]);
      break;
    }
  EXPECT_FALSE(validate_schedules(twice, req, Pass::kForward).ok());
  auto no_home = all;  // dK/dV's last hop home dropped on every rank
  for (auto& s : no_home) {
    s.backward.pop_back();  // the final wait
    s.backward.pop_back();  // the final post
  }
  EXPECT_FALSE(validate_schedules(no_home, req, Pass::kBackward).ok());
}

// Masks that skip transfers: window 4096 on the contiguous layout, 64K tokens, 8 ranks. Each
// shard's K/V reach only the next rank, so the ring sends at most a quarter of the bytes of the
// ring that carries every block all the way (measured by the counters).
TEST(MaskSkipsTransfers, Window4096At64KTokensOn8Ranks) {
  Problem g;
  g.seq = 65536;
  g.heads = g.kv_heads = 1;
  g.head_dim = 8;
  g.dtype = DType::kF32;
  const Layout layout = Layout::create(LayoutKind::kContiguous, g.seq, 8).value();
  AttentionParams params;
  params.mask = parse_mask("window:4096,0", g.seq).value();
  const HostTensor q = testing::random_tensor(g.dtype, {1, g.seq, 1, g.head_dim}, 1);
  Status status;
  const RankResults run = run_ranks(g, layout, params, {"ring"}, q, q, q, q, &status);
  ASSERT_TRUE(status.ok()) << status.to_string();
  int64_t sent = 0, full_ring = 0;
  for (int r = 0; r < 8; ++r) {
    sent += run.counters[r].sent(Phase::kForward) + run.counters[r].sent(Phase::kBackward);
    const testing::TrafficBytes all_the_way = testing::ring_expected_bytes(layout, r, 1, 1, g.head_dim, g.dtype, g.dtype);
    full_ring += all_the_way.forward + all_the_way.backward;
  }
  EXPECT_LE(sent * 4, full_ring) << sent << " of " << full_ring;
  // Causal contiguous: a shard's K/V go only to later ranks; the full ring sends twice as many.
  EXPECT_EQ(walked("ring", layout, MaskSpec::causal(), g, 6, Pass::kForward),
            7 * 2 * (g.seq / 8) * g.head_dim * 4);
  EXPECT_EQ(walked("ring", layout, MaskSpec::causal(), g, 7, Pass::kForward), 0);
}

// Block-sparse masks skip transfers too: on the contiguous layout a shard's K/V travel only as
// far as the last rank whose queries see one of its keys (MaskSpec::sees_any, exact with the
// pattern), so BigBird-causal with one-block windows sends less than causal (measured by the
// counters), with results equal to the oracle's. The ring's forward is the hop count from the
// mask's per-element definition.
TEST(MaskSkipsTransfers, BlockSparseSendsLessThanCausal) {
  Problem g;
  g.seq = 1024;
  g.heads = 2;
  g.kv_heads = 1;
  g.head_dim = 8;
  const int P = 8;
  const Layout layout = Layout::create(LayoutKind::kContiguous, g.seq, P).value();
  const HostTensor q = testing::random_tensor(g.dtype, {1, g.seq, g.heads, g.head_dim}, 1);
  const HostTensor k = testing::random_tensor(g.dtype, {1, g.seq, g.kv_heads, g.head_dim}, 2);
  const HostTensor v = testing::random_tensor(g.dtype, {1, g.seq, g.kv_heads, g.head_dim}, 3);
  AttentionParams causal, sparse;
  causal.mask = MaskSpec::causal();
  sparse.mask = parse_mask("bigbird-causal:1,1,1,B=64", g.seq).value();
  for (const char* algo : {"ring", "burst", "distflash"}) {
    SCOPED_TRACE(algo);
    int64_t sent[2] = {0, 0}, forward_sent = 0;  // causal, bigbird-causal
    for (const AttentionParams* params : {&causal, &sparse}) {
      Status status;
      const RankResults run = run_ranks(g, layout, *params, {algo}, q, k, v, q, &status);
      ASSERT_TRUE(status.ok()) << status.to_string();
      auto ref = reference_attention(q.view(), k.view(), v.view(), q.view(), *params);
      ASSERT_TRUE(ref.ok());
      for (const auto& [got, want] : {std::pair{&run.o, &ref->o}, {&run.dq, &ref->dq}, {&run.dk, &ref->dk}})
        EXPECT_LE(testing::max_abs_diff(*got, *want), 1e-10);
      forward_sent = 0;
      for (int r = 0; r < P; ++r) {
        forward_sent += run.counters[r].sent(Phase::kForward);
        sent[params == &sparse] += run.counters[r].sent(Phase::kForward) + run.counters[r].sent(Phase::kBackward);
      }
    }
    EXPECT_LT(sent[1], sent[0]) << sent[1] << " of " << sent[0];
    if (std::string(algo) != "ring") continue;
    int64_t hops = 0;
    for (int b = 0; b < P; ++b) {
      int last = b;
      for (int a = b + 1; a < P; ++a)
        for (const int64_t qp : layout.positions(a))
          for (const int64_t kp : layout.positions(b)) last = sparse.mask.allows(qp, kp) ? a : last;
      hops += last - b;
    }
    EXPECT_LE(hops, 22);  // of causal's 7 + 6 + ... + 1 = 28
    EXPECT_EQ(forward_sent, hops * 2 * (g.seq / P) * g.kv_heads * g.head_dim * 8);
  }
}

TEST(AlgorithmRegistry, NamesAndRefusals) {
  EXPECT_EQ(algorithm_names(),
            "ring|burst|ring-return|burst-return|distflash|double-ring|ulysses|ulysses-overlap|ulysses-ring|attention2d|"
            "attention2d-overlap");
  const Layout layout = Layout::create(LayoutKind::kZigzag, 64, 4).value();
  AttentionParams causal;
  causal.mask = MaskSpec::causal();
  Problem g;
  auto plan = plan_attention({"distflash"}, layout, causal, g.bytes(), 0, cpu_kernel_backend());
  EXPECT_EQ(plan.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(plan.status().message().find("use ring or burst"), std::string::npos);
  plan = plan_attention({"no-such"}, layout, causal, g.bytes(), 0, cpu_kernel_backend());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  plan = plan_attention({"double-ring", {3}}, layout, causal, g.bytes(), 0, cpu_kernel_backend());
  EXPECT_EQ(plan.status().code(), StatusCode::kUnsupported);
  // auto: Ulysses where the heads split over the ranks (balanced and fewest bytes); else, on
  // contiguous causal, DistFlashAttn's balance.
  const Layout contiguous = Layout::create(LayoutKind::kContiguous, 64, 4).value();
  plan = plan_attention({"auto"}, contiguous, causal, g.bytes(), 0, cpu_kernel_backend());
  ASSERT_TRUE(plan.ok());
  EXPECT_STREQ(plan->algorithm->name, "ulysses") << plan->choice;
  Problem odd_heads;
  odd_heads.heads = 6, odd_heads.kv_heads = 3;
  plan = plan_attention({"auto"}, contiguous, causal, odd_heads.bytes(), 0, cpu_kernel_backend());
  ASSERT_TRUE(plan.ok());
  EXPECT_STREQ(plan->algorithm->name, "distflash") << plan->choice;
  // Ulysses refuses heads it cannot split, and attention2d a non-square grid, with reasons.
  plan = plan_attention({"ulysses"}, contiguous, causal, odd_heads.bytes(), 0, cpu_kernel_backend());
  EXPECT_EQ(plan.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(plan.status().message().find("do not split into 4"), std::string::npos) << plan.status().message();
  const Layout six = Layout::create(LayoutKind::kStriped, 60, 6).value();
  plan = plan_attention({"attention2d"}, six, causal, g.bytes(), 0, cpu_kernel_backend());
  EXPECT_EQ(plan.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(plan.status().message().find("square number of ranks"), std::string::npos) << plan.status().message();
  PlanOptions hybrid{"ulysses-ring"};
  hybrid.ring_algorithm = "attention2d";
  plan = plan_attention(hybrid, contiguous, causal, g.bytes(), 0, cpu_kernel_backend());
  EXPECT_EQ(plan.status().code(), StatusCode::kUnsupported);
  // Algorithm specs, as the Python binding passes them.
  auto spec = plan_options_from_spec("ulysses-ring:ulysses=2,ring=burst");
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->algorithm, "ulysses-ring");
  EXPECT_EQ(spec->ulysses, 2);
  EXPECT_EQ(spec->ring_algorithm, "burst");
  for (const char* bad : {"nope", "ring:ulysses=x", "ring:ring=nope", "ring:color=red", "ring:ulysses"})
    EXPECT_EQ(plan_options_from_spec(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  hybrid.ring_algorithm = "ring", hybrid.ulysses = 3;
  plan = plan_attention(hybrid, contiguous, causal, g.bytes(), 0, cpu_kernel_backend());
  EXPECT_EQ(plan.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(plan.status().message().find("must divide the ranks"), std::string::npos) << plan.status().message();
}

}  // namespace
}  // namespace seqpar

namespace seqpar {
namespace {

// A device backend for the planner's head-group policy (host logic: nothing runs on it).
class PlanOnlyDeviceBackend : public AttentionBackend {
 public:
  const char* name() const override { return "plan-only"; }
  BackendCaps caps() const override {
    BackendCaps c;
    c.device = true;
    c.takes_delta = false;
    return c;
  }
  std::string supports(const TensorView&, const AttentionParams&) const override { return {}; }
  Status forward(const TensorView&, const TensorView&, const TensorView&, const AttentionParams&, const TensorView&,
                 const TensorView&, FreshOutputs, void*) const override { return unused(); }
  Status backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                  const TensorView&, const AttentionParams&, const TensorView&, const TensorView&, const TensorView&,
                  FreshOutputs, void*) const override { return unused(); }
  Status delta(const TensorView&, const TensorView&, const TensorView&, void*) const override { return unused(); }
  Status merge(const TensorView&, const TensorView&, const TensorView&, const TensorView&, void*) const override {
    return unused();
  }
  Status accumulate(const TensorView&, const TensorView&, void*) const override { return unused(); }

 private:
  static Status unused() { return SP_STATUS(StatusCode::kInternal, "plan-only backend"); }
};

// Head groups on device backends: small problems stay whole; the MHA shapes measured on
// 2 x H200 (H = 32, D = 128) split as their peak block bytes pass seven q shards; the 16 GiB
// cap splits a million tokens a GPU further; every rank plans the same count; an explicit
// count must divide the K/V heads; CPU backends never split.
TEST(PlanHeadGroups, FollowTheWorkspaceBudget) {
  const PlanOnlyDeviceBackend device;
  AttentionParams causal;
  causal.mask = MaskSpec::causal();
  const auto groups = [&](const std::string& algo, int P, int64_t per_rank, int64_t H, int64_t Hkv, int rank = 0) {
    const Layout layout = Layout::create(LayoutKind::kZigzag, per_rank * P, P).value();
    const BlockBytes bytes{1, H, Hkv, 128, DType::kBF16, DType::kF32, DType::kF32, false};
    return plan_attention({algo}, layout, causal, bytes, rank, device).value().head_groups;
  };
  EXPECT_EQ(groups("ring", 2, 1024, 32, 32), 1);  // under the 1 GiB floor
  // 8K tokens a GPU (16K on two): every ring-family backward's peak is under the floor, so the
  // two-rank schedules run whole, as the hand-written two-rank ring did.
  for (const char* algo : {"ring", "ring-return", "burst", "burst-return", "auto"}) {
    SCOPED_TRACE(algo);
    EXPECT_EQ(groups(algo, 2, 8192, 32, 32), 1);
    EXPECT_GT(groups(algo, 2, 16384, 32, 32), 1);  // 32K on two: 1.4-1.8 GiB whole, so split
  }
  for (const char* algo : {"ring", "burst"}) {
    SCOPED_TRACE(algo);
    const int at_64k = groups(algo, 2, 65536, 32, 32);
    EXPECT_GT(at_64k, 1);  // three fp32 accumulators and two packs pass seven bf16 q shards
    EXPECT_GE(groups(algo, 2, 1 << 20, 32, 32), at_64k);
    EXPECT_EQ(groups(algo, 4, 65536, 32, 32, 0), groups(algo, 4, 65536, 32, 32, 3));
    EXPECT_LE(groups(algo, 2, 65536, 32, 8), at_64k);  // GQA: smaller K/V blocks
  }
  // Results held as the GPU executor holds them behind a backend that writes parts (bf16 where
  // at most two parts reach them, a rank's own in the caller's tensors): the two-rank return
  // schedules run whole at 64K (32K a GPU), where fp32 accumulators made them split; the ring,
  // whose dK/dV travels on as an accumulator, still splits.
  const auto held_rounded_groups = [&](const std::string& algo, int64_t per_rank) {
    const Layout layout = Layout::create(LayoutKind::kZigzag, per_rank * 2, 2).value();
    BlockBytes bytes{1, 32, 32, 128, DType::kBF16, DType::kF32, DType::kF32, false};
    bytes.results_rounded = true;
    return plan_attention({algo}, layout, causal, bytes, 0, device).value().head_groups;
  };
  for (const char* algo : {"ring-return", "burst-return"}) {
    SCOPED_TRACE(algo);
    EXPECT_GT(groups(algo, 2, 32768, 32, 32), 1);
    EXPECT_EQ(held_rounded_groups(algo, 32768), 1);
  }
  EXPECT_GT(held_rounded_groups("ring", 32768), 1);
  const Layout layout = Layout::create(LayoutKind::kZigzag, 4096, 2).value();
  const BlockBytes bytes{1, 32, 8, 128, DType::kBF16, DType::kF32, DType::kF32, false};
  PlanOptions three("ring");
  three.head_groups = 3;
  EXPECT_EQ(plan_attention(three, layout, causal, bytes, 0, device).status().code(), StatusCode::kInvalidArgument);
  three.head_groups = 4;
  EXPECT_EQ(plan_attention(three, layout, causal, bytes, 0, device).value().head_groups, 4);
  EXPECT_EQ(plan_attention(three, layout, causal, bytes, 0, cpu_kernel_backend()).value().head_groups, 4);
  EXPECT_EQ(plan_attention({"ring"}, layout, causal, bytes, 0, cpu_kernel_backend()).value().head_groups, 1);
}

// The one executor's head-group loop on the host: every schedule family run in 2 head groups
// (GQA 8:4, so each group's 4:2 heads still take Ulysses' head parts), keeping forward blocks
// per group where the algorithm can, matches the oracle, and each rank sends what the walk of
// its plan says for groups of half the heads.
TEST(HeadGroupsOnTheHost, MatchTheOracleAndTheWalk) {
  for (const char* algo : {"ring", "burst", "ring-return", "burst-return", "ulysses", "ulysses-ring", "attention2d"}) {
    SCOPED_TRACE(algo);
    Problem g;
    g.heads = 8, g.kv_heads = 4;
    g.seq = 4 * 16 + 5;
    const Layout layout = Layout::create(LayoutKind::kStriped, g.seq, 4).value();
    AttentionParams params;
    params.mask = MaskSpec::causal();
    PlanOptions options{algo, topology_for(4)};
    options.head_groups = 2;
    options.keep_forward_state = true;
    const Inputs in(g);
    Status status;
    const RankResults run = run_ranks(g, layout, params, options, in.q, in.k, in.v, in.dout, &status);
    ASSERT_TRUE(status.ok()) << status.to_string();
    expect_oracle(run, in, params);
    for (int r = 0; r < layout.ranks(); ++r) {
      const AttentionPlan plan = plan_attention(options, layout, params, g.bytes(), r, cpu_kernel_backend()).value();
      ASSERT_EQ(plan.head_groups, 2);
      for (Pass pass : {Pass::kForward, Pass::kBackward})
        EXPECT_EQ(run.counters[r].sent(pass == Pass::kForward ? Phase::kForward : Phase::kBackward),
                  walk_bytes(plan.schedule.pass(pass), r, layout, plan.block_bytes, options.topology,
                             plan.schedule.head_parts).total)
            << "rank " << r;
    }
  }
}

// Results sent home carry only the rows their pair touched (Transfer::trimmed). On two zigzag
// ranks under the causal mask, shard 1's queries see only the first chunk of shard 0's keys,
// and only the second chunk of shard 0's queries sees shard 1's keys: ring-return's rank 1
// sends half of dK/dV[0] home, burst-return's rank 1 half of dQ[0]; the walk counts half those
// bytes; the validator refuses a trim that drops a row a pair touched. Contiguous shards (one
// run each) are never trimmed.
TEST(TrimmedReturns, CarryTheRowsTheirPairTouched) {
  const int64_t n = 32;
  const Layout layout = Layout::create(LayoutKind::kZigzag, 2 * n, 2).value();
  const ScheduleRequest req = make_schedule_request(layout, MaskSpec::causal(), 2, 2);
  const auto& r10 = req.pair_rows[1][0];
  const auto& r01 = req.pair_rows[0][1];
  EXPECT_EQ(std::vector<int64_t>({r10.q_begin, r10.q_end, r10.k_begin, r10.k_end}), std::vector<int64_t>({0, n, 0, n / 2}));
  EXPECT_EQ(std::vector<int64_t>({r01.q_begin, r01.q_end, r01.k_begin, r01.k_end}), std::vector<int64_t>({n / 2, n, 0, n}));
  const BlockBytes bytes{1, 2, 2, 8, DType::kF32, DType::kF32, DType::kF32, true};
  for (const char* algo : {"ring-return", "burst-return"}) {
    SCOPED_TRACE(algo);
    std::vector<RankSchedule> all = all_rank_schedules(*find_algorithm(algo), req);
    Transfer* sent = nullptr;
    for (Step& s : all[1].backward)
      for (Transfer& t : s.sends)
        if (is_result(t.block.kind)) sent = &t;
    ASSERT_NE(sent, nullptr);
    EXPECT_TRUE(sent->trimmed());
    EXPECT_EQ(sent->row_end - sent->row_begin, n / 2);
    EXPECT_EQ(transfer_bytes(*sent, 0, layout, bytes) * 2, bytes.of(sent->block, layout, 1));
    EXPECT_TRUE(validate_schedules(all, req, Pass::kBackward).ok());
    // One row fewer, on both sides: the pair's touched rows are no longer all sent.
    Transfer* recv = nullptr;
    for (Step& s : all[0].backward)
      for (Transfer& t : s.recvs)
        if (t.trimmed()) recv = &t;
    ASSERT_NE(recv, nullptr);
    sent->row_end -= 1;
    recv->row_end -= 1;
    const Status bad = validate_schedules(all, req, Pass::kBackward);
    EXPECT_FALSE(bad.ok());
    EXPECT_NE(bad.message().find("touched others"), std::string::npos) << bad.to_string();
  }
  const Layout contiguous = Layout::create(LayoutKind::kContiguous, 2 * n, 2).value();
  const ScheduleRequest whole = make_schedule_request(contiguous, MaskSpec::causal(), 2, 2);
  for (const Step& s : find_algorithm("ring-return")->make_schedule(whole, 1).backward)
    for (const Transfer& t : s.sends) EXPECT_FALSE(t.trimmed());
}

// Trimmed returns with two batch entries (each entry's rows travel as a piece of their own), on
// P = 2-4 zigzag ranks: the oracle to 1e-10 and measured = walked bytes.
TEST(TrimmedReturns, BatchesOfTwoMatchTheOracle) {
  for (const char* algo : {"ring-return", "burst-return"})
    for (int P : {2, 3, 4}) {
      SCOPED_TRACE(std::string(algo) + " P=" + std::to_string(P));
      Problem g;
      g.seq = 8 * P + 3, g.batch = 2, g.head_dim = 8;
      const Layout layout = Layout::create(LayoutKind::kZigzag, g.seq, P).value();
      AttentionParams params;
      params.mask = MaskSpec::causal();
      const ScheduleRequest req = make_schedule_request(layout, params.mask, g.heads, g.kv_heads);
      const std::vector<RankSchedule> all = all_rank_schedules(*find_algorithm(algo), req);
      int trimmed = 0;
      for (const RankSchedule& rs : all)
        for (const Step& s : rs.backward)
          for (const Transfer& t : s.sends) trimmed += t.trimmed();
      EXPECT_GT(trimmed, 0);
      expect_exact_with_walked_backward(g, layout, params, {algo}, all);
    }
}

// result_uses, on the two-rank ring's backward (rank 0): its own dK/dV is computed, sent on
// with the K/V and added into at home (2 parts, travels on); rank 1's is computed, gets rank
// 1's part added and goes home (2 parts); its dQ takes both computes. With four ranks the
// dQ takes four parts.
TEST(BlockLifetimes, ResultUsesFollowTheRing) {
  const Layout layout = Layout::create(LayoutKind::kZigzag, 64, 2).value();
  const ScheduleRequest req = make_schedule_request(layout, MaskSpec::causal(), 2, 2);
  const std::vector<Step> steps = find_algorithm("ring")->make_schedule(req, 0).backward;
  const auto uses = result_uses(steps, Pass::kBackward);
  ASSERT_EQ(uses.size(), 3u) << describe_steps(steps, {}, 0);
  const ResultUse own = uses.at({BlockKind::kDKV, 0}), peers = uses.at({BlockKind::kDKV, 1}),
                  dq = uses.at({BlockKind::kDQ, 0});
  EXPECT_EQ(own.parts, 2);
  EXPECT_TRUE(own.travels_on);
  EXPECT_EQ(peers.parts, 2);
  EXPECT_FALSE(peers.travels_on);
  EXPECT_EQ(dq.parts, 2);
  EXPECT_FALSE(dq.travels_on || dq.regrouped || own.regrouped);
  const Layout four = Layout::create(LayoutKind::kZigzag, 64, 4).value();
  const ScheduleRequest req4 = make_schedule_request(four, MaskSpec::causal(), 2, 2);
  EXPECT_EQ(result_uses(find_algorithm("ring")->make_schedule(req4, 0).backward, Pass::kBackward)
                .at({BlockKind::kDQ, 0})
                .parts,
            4);
  // Ulysses joins its gathered results from span pieces.
  const auto ulysses = result_uses(find_algorithm("ulysses")->make_schedule(req, 0).forward, Pass::kForward);
  EXPECT_TRUE(std::any_of(ulysses.begin(), ulysses.end(), [](const auto& u) { return u.second.regrouped; }));
}

}  // namespace
}  // namespace seqpar
