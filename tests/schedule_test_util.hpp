// Running a planned algorithm on P thread ranks of the CPU executor, for the schedule tests:
// shard the global inputs, plan, forward + backward, unshard, and keep each rank's counters;
// random inputs, packed documents of random lengths, and the checks of a run against the fp64
// oracle (on the whole sequence, or on each packed document alone).
#pragma once

#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>

#include "seqpar/distributed_attention.hpp"
#include "test_util.hpp"

namespace seqpar {

struct Problem {
  int64_t seq = 0, heads = 4, kv_heads = 2, head_dim = 16;
  DType dtype = DType::kF64;
  int64_t batch = 1;
  BlockBytes bytes() const { return {batch, heads, kv_heads, head_dim, dtype, dtype, dtype, true}; }
};

struct RankResults {
  HostTensor o, lse, dq, dk, dv;
  std::vector<CommCounters> counters;
  std::vector<PassStats> fwd;
};

// Random global inputs of a problem (seeds 11-14).
struct Inputs {
  HostTensor q, k, v, dout;
  explicit Inputs(const Problem& g)
      : q(testing::random_tensor(g.dtype, {g.batch, g.seq, g.heads, g.head_dim}, 11)),
        k(testing::random_tensor(g.dtype, {g.batch, g.seq, g.kv_heads, g.head_dim}, 12)),
        v(testing::random_tensor(g.dtype, {g.batch, g.seq, g.kv_heads, g.head_dim}, 13)),
        dout(testing::random_tensor(g.dtype, {g.batch, g.seq, g.heads, g.head_dim}, 14)) {}
};

// O, LSE, dQ, dK and dV of a run against the fp64 oracle, to 1e-10.
inline void expect_oracle(const RankResults& run, const Inputs& in, const AttentionParams& params) {
  auto ref = reference_attention(in.q.view(), in.k.view(), in.v.view(), in.dout.view(), params);
  ASSERT_TRUE(ref.ok());
  for (const auto& [got, want] : {std::pair{&run.o, &ref->o}, {&run.lse, &ref->lse}, {&run.dq, &ref->dq},
                                  {&run.dk, &ref->dk}, {&run.dv, &ref->dv}})
    EXPECT_LE(testing::max_abs_diff(*got, *want), 1e-10);
}

// Offsets (cu_seqlens) of documents packed into `seq` tokens, lengths log-uniform from 1 to the
// whole sequence (many short documents, some long), the last one cut at the end.
inline std::vector<int64_t> random_document_offsets(int64_t seq, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log_len(0.0, std::log(double(seq) + 1));
  std::vector<int64_t> offsets{0};
  while (offsets.back() < seq)
    offsets.push_back(std::min(seq, offsets.back() + std::max<int64_t>(1, int64_t(std::exp(log_len(rng))))));
  return offsets;
}

// Rows [begin, end) along seq_dim of a dense host tensor, as a tensor of their own.
inline HostTensor rows_of(const HostTensor& t, int seq_dim, int64_t begin, int64_t end) {
  const TensorView& v = t.view();
  std::vector<int64_t> shape(v.shape.begin(), v.shape.begin() + v.ndim);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < v.ndim; ++d) {
    if (d < seq_dim) outer *= v.shape[d];
    if (d > seq_dim) inner *= v.shape[d];
  }
  shape[seq_dim] = end - begin;
  HostTensor out(v.dtype, shape);
  const size_t es = dtype_size(v.dtype), row = size_t(inner) * es;
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(static_cast<char*>(out.view().data) + size_t(o * (end - begin)) * row,
                static_cast<const char*>(v.data) + size_t(o * v.shape[seq_dim] + begin) * row, size_t(end - begin) * row);
  return out;
}

// Shards the global inputs, plans and runs forward + backward on P thread ranks, unshards.
// `tweak` may change each rank's plan before it runs (the errata tests swap in printed schedules).
inline RankResults run_ranks(const Problem& g, const Layout& layout, const AttentionParams& params,
                             const PlanOptions& options, const HostTensor& q, const HostTensor& k,
                             const HostTensor& v, const HostTensor& dout, Status* status,
                             const AttentionBackend& backend = cpu_kernel_backend(),
                             const std::function<void(AttentionPlan&)>& tweak = {}) {
  const int P = layout.ranks();
  const DType t = g.dtype;
  const int64_t B = g.batch;
  RankResults run{HostTensor(t, {B, g.seq, g.heads, g.head_dim}), HostTensor(t, {B, g.heads, g.seq}),
          HostTensor(t, {B, g.seq, g.heads, g.head_dim}), HostTensor(t, {B, g.seq, g.kv_heads, g.head_dim}),
          HostTensor(t, {B, g.seq, g.kv_heads, g.head_dim}), std::vector<CommCounters>(P),
          std::vector<PassStats>(P)};
  std::mutex mu;
  *status = run_local_ranks(P, [&](Communicator& comm) -> Status {
    omp_set_num_threads(1);
    const int r = comm.rank();
    const int64_t n = layout.local_len(r);
    SP_ASSIGN_OR_RETURN(AttentionPlan plan, plan_attention(options, layout, params, g.bytes(), r, backend));
    if (tweak) tweak(plan);
    HostTensor lq(t, {B, n, g.heads, g.head_dim}), lk(t, {B, n, g.kv_heads, g.head_dim});
    HostTensor lv = lk, ldo = lq, lo = lq, ldq = lq, ldk = lk, ldv = lk, llse(t, {B, g.heads, n});
    SP_RETURN_IF_ERROR(layout.shard(q.view(), 1, r, lq.view()));
    SP_RETURN_IF_ERROR(layout.shard(k.view(), 1, r, lk.view()));
    SP_RETURN_IF_ERROR(layout.shard(v.view(), 1, r, lv.view()));
    SP_RETURN_IF_ERROR(layout.shard(dout.view(), 1, r, ldo.view()));
    const ShardTensors st{lq.view(), lk.view(), lv.view(), lo.view(), llse.view(),
                          ldo.view(), ldq.view(), ldk.view(), ldv.view()};
    ForwardState kept;  // used by plans that keep forward blocks (PlanOptions::keep_forward_state)
    SP_RETURN_IF_ERROR(run_forward_cpu(comm, plan, st, &run.fwd[r], &kept));
    SP_RETURN_IF_ERROR(run_backward_cpu(comm, plan, st, nullptr, &kept));
    std::lock_guard lock(mu);
    run.counters[r] = comm.counters();
    SP_RETURN_IF_ERROR(layout.unshard(lo.view(), 1, r, run.o.view()));
    SP_RETURN_IF_ERROR(layout.unshard(llse.view(), 2, r, run.lse.view()));
    SP_RETURN_IF_ERROR(layout.unshard(ldq.view(), 1, r, run.dq.view()));
    SP_RETURN_IF_ERROR(layout.unshard(ldk.view(), 1, r, run.dk.view()));
    return layout.unshard(ldv.view(), 1, r, run.dv.view());
  });
  return run;
}

// A run on packed documents against the fp64 oracle run on each document alone, as a sequence of
// its own under `inside` (the mask within a document, e.g. causal), to 1e-10: O, LSE, dQ, dK, dV.
inline void expect_oracle_per_document(const RankResults& run, const HostTensor& q, const HostTensor& k,
                                       const HostTensor& v, const HostTensor& dout,
                                       const std::vector<int64_t>& doc_offsets, const MaskSpec& inside) {
  AttentionParams alone;
  alone.mask = inside;
  for (size_t d = 0; d + 1 < doc_offsets.size(); ++d) {
    const int64_t a = doc_offsets[d], b = doc_offsets[d + 1];
    if (a == b) continue;
    SCOPED_TRACE("document " + std::to_string(d) + " [" + std::to_string(a) + ", " + std::to_string(b) + ")");
    const HostTensor dq = rows_of(q, 1, a, b), dk = rows_of(k, 1, a, b), dv = rows_of(v, 1, a, b),
                     ddo = rows_of(dout, 1, a, b);
    auto ref = reference_attention(dq.view(), dk.view(), dv.view(), ddo.view(), alone);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    EXPECT_LE(testing::max_abs_diff(rows_of(run.o, 1, a, b), ref->o), 1e-10) << "O";
    EXPECT_LE(testing::max_abs_diff(rows_of(run.lse, 2, a, b), ref->lse), 1e-10) << "LSE";
    EXPECT_LE(testing::max_abs_diff(rows_of(run.dq, 1, a, b), ref->dq), 1e-10) << "dQ";
    EXPECT_LE(testing::max_abs_diff(rows_of(run.dk, 1, a, b), ref->dk), 1e-10) << "dK";
    EXPECT_LE(testing::max_abs_diff(rows_of(run.dv, 1, a, b), ref->dv), 1e-10) << "dV";
  }
}

// Runs the plan on the problem's random inputs: the oracle to 1e-10, and each rank's backward
// bytes equal to those walked from its schedule (`all`, every rank's).
inline void expect_exact_with_walked_backward(const Problem& g, const Layout& layout, const AttentionParams& params,
                                              const PlanOptions& options, const std::vector<RankSchedule>& all) {
  const Inputs in(g);
  Status status;
  const RankResults run = run_ranks(g, layout, params, options, in.q, in.k, in.v, in.dout, &status);
  ASSERT_TRUE(status.ok()) << status.to_string();
  expect_oracle(run, in, params);
  for (int r = 0; r < layout.ranks(); ++r)
    EXPECT_EQ(run.counters[r].sent(Phase::kBackward),
              walk_bytes(all[r].backward, r, layout, g.bytes(), options.topology, all[r].head_parts).total)
        << "rank " << r;
}

}  // namespace seqpar
