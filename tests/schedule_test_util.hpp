// Running a planned algorithm on P thread ranks of the CPU executor, for the schedule tests:
// shard the global inputs, plan, forward + backward, unshard, and keep each rank's counters.
#pragma once

#include <omp.h>

#include <functional>
#include <mutex>

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

}  // namespace seqpar
