// BurstAttention's backward with the corrected overlap schedule (see include/seqpar/burst.hpp):
// the query-side pack (Q, dO, D, LSE) runs one ring step ahead of the compute, the dQ ring one
// step behind it, and dQ's last hop brings it home.
#include "seqpar/burst.hpp"

#include <algorithm>
#include <cstring>

#include "parallel/ring_common.hpp"
#include "seqpar/block_plan.hpp"

namespace seqpar {
namespace {

using parallel::add_into;
using parallel::check_backward_args;
using parallel::check_ring_args;
using parallel::copy_bshd;
using parallel::pair_visible;
using parallel::ShardBuffer;
using parallel::wrap;

// D and LSE of a query shard, [B, H, rows] each, in one buffer for the longest shard.
struct RowStatsBuffer {
  std::vector<uint64_t> storage;
  DType dtype = DType::kF32;
  int64_t batch = 0, heads = 0;
  void allocate(DType t, int64_t b, int64_t h, int64_t max_rows) {
    dtype = t;
    batch = b;
    heads = h;
    storage.assign((2 * b * h * max_rows * dtype_size(t) + 7) / 8, 0);
  }
  size_t bytes(int64_t rows) const { return batch * heads * rows * dtype_size(dtype); }
  TensorView view(int64_t rows, int part) const {  // part 0: D, part 1: LSE
    char* base = reinterpret_cast<char*>(const_cast<uint64_t*>(storage.data()));
    return TensorView::contiguous(base + part * bytes(rows), dtype, {batch, heads, rows});
  }
};

// Copies a [B, H, S] view into a contiguous one.
void copy_bhs(const TensorView& src, const TensorView& dst) {
  const size_t es = dtype_size(src.dtype);
  for (int64_t b = 0; b < src.shape[0]; ++b)
    for (int64_t h = 0; h < src.shape[1]; ++h)
      for (int64_t s = 0; s < src.shape[2]; ++s)
        std::memcpy(static_cast<char*>(dst.data) + cpu::bhs_offset(dst, b, h, s) * es,
                    static_cast<const char*>(src.data) + cpu::bhs_offset(src, b, h, s) * es, es);
}

}  // namespace

Status burst_attention_backward(Communicator& comm, const Layout& layout,
                                const AttentionParams& params, const TensorView& q,
                                const TensorView& k, const TensorView& v, const TensorView& o,
                                const TensorView& lse, const TensorView& dout,
                                const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                RingStats* stats) {
  cpu::AttentionDims dims;
  SP_RETURN_IF_ERROR(
      check_backward_args(comm, layout, params, q, k, v, o, lse, dout, dq, dk, dv, &dims));
  const DType t = q.dtype;
  const int64_t B = dims.batch, S = dims.seq_q, H = dims.heads, Hkv = dims.kv_heads,
                D = dims.head_dim;
  const int P = comm.size(), me = comm.rank();
  const PhaseScope phase(comm, Phase::kBackward);
  RingStats local_stats;

  // Home: K, V and the dK, dV accumulators (contiguous copies so views are simple).
  HostTensor k_home(t, {B, S, Hkv, D}), v_home(t, {B, S, Hkv, D});
  HostTensor dk_acc(t, {B, S, Hkv, D}), dv_acc(t, {B, S, Hkv, D});
  copy_bshd(k, k_home.view());
  copy_bshd(v, v_home.view());

  // Travelling: (Q, dO) and (D, LSE) of the query shard held; double-buffered.
  const int64_t max_rows = layout.max_local_len();
  ShardBuffer q_pack[2], dq_part, dq_in, dq_out;  // q_pack parts: Q, dO; dq_* use part 0
  RowStatsBuffer stats_pack[2];
  for (auto& buf : q_pack) buf.allocate(t, B, max_rows, H, D);
  for (auto* buf : {&dq_part, &dq_in, &dq_out}) buf->allocate(t, B, max_rows, H, D);
  for (auto& buf : stats_pack) buf.allocate(t, B, H, max_rows);
  copy_bshd(q, q_pack[0].view(S, 0));
  copy_bshd(dout, q_pack[0].view(S, 1));
  SP_RETURN_IF_ERROR(cpu_attention_delta(o, dout, stats_pack[0].view(S, 0)));
  copy_bhs(lse, stats_pack[0].view(S, 1));

  const auto& k_pos = layout.positions(me);
  for (int step = 0; step < P; ++step) {
    const int held = wrap(me - step, P), incoming = wrap(me - step - 1, P);
    const int64_t rows = layout.local_len(held), in_rows = layout.local_len(incoming);
    const int next_rank = wrap(me + 1, P), prev_rank = wrap(me - 1, P);
    ShardBuffer& cur = q_pack[step % 2];
    ShardBuffer& nxt = q_pack[(step + 1) % 2];
    RowStatsBuffer& cur_stats = stats_pack[step % 2];
    RowStatsBuffer& nxt_stats = stats_pack[(step + 1) % 2];
    std::vector<SendSpec> sends;
    std::vector<RecvSpec> recvs;
    if (step < P - 1) {  // the query side for the next step goes on ahead
      sends.push_back({next_rank, cur.view(rows).data, 2 * cur.bytes(rows)});
      sends.push_back({next_rank, cur_stats.view(rows, 0).data, 2 * cur_stats.bytes(rows)});
      recvs.push_back({prev_rank, nxt.view(in_rows).data, 2 * nxt.bytes(in_rows)});
      recvs.push_back({prev_rank, nxt_stats.view(in_rows, 0).data, 2 * nxt_stats.bytes(in_rows)});
    }
    if (step >= 1) {  // dQ finished last step goes on; the dQ of the shard held now arrives
      const int64_t finished_rows = layout.local_len(wrap(held + 1, P));
      sends.push_back({next_rank, dq_out.view(finished_rows).data, dq_out.bytes(finished_rows)});
      recvs.push_back({prev_rank, dq_in.view(rows).data, dq_in.bytes(rows)});
    }
    std::unique_ptr<PendingExchange> pending;
    if (!sends.empty()) {
      SP_ASSIGN_OR_RETURN(pending, comm.start_exchange(sends, recvs));
    }

    // This step's contribution goes into a scratch dQ, never into a buffer in flight.
    std::memset(dq_part.view(rows).data, 0, dq_part.bytes(rows));
    const auto& q_pos = layout.positions(held);
    if (pair_visible(params, q_pos, k_pos)) {
      AttentionParams step_params = params;
      step_params.q_positions = q_pos.data();
      step_params.k_positions = k_pos.data();
      SP_RETURN_IF_ERROR(cpu_attention_backward(
          cur.view(rows, 0), k_home.view(), v_home.view(), cur.view(rows, 1),
          cur_stats.view(rows, 1), cur_stats.view(rows, 0), step_params, dq_part.view(rows),
          dk_acc.view(), dv_acc.view()));
      ++local_stats.pairs_computed;
    } else {
      ++local_stats.pairs_skipped;
    }
    if (pending) SP_RETURN_IF_ERROR(pending->wait());
    if (step >= 1) {
      const TensorView part = TensorView::contiguous(dq_part.view(rows).data, t, {B * rows * H * D});
      const TensorView in = TensorView::contiguous(dq_in.view(rows).data, t, {B * rows * H * D});
      if (t == DType::kF32) add_into<float>(part, in);
      else add_into<double>(part, in);
    }
    std::swap(dq_out, dq_part);  // dq_out: the dQ accumulated for `held`, sent next step
  }
  // The last dQ (shard me+1) takes its hop home; ours arrives from me-1.
  ShardBuffer* home = &dq_out;
  if (P > 1) {
    const int64_t last_rows = layout.local_len(wrap(me + 1, P));
    const SendSpec send{wrap(me + 1, P), dq_out.view(last_rows).data, dq_out.bytes(last_rows)};
    const RecvSpec recv{wrap(me - 1, P), dq_in.view(S).data, dq_in.bytes(S)};
    SP_RETURN_IF_ERROR(comm.exchange({&send, 1}, {&recv, 1}));
    home = &dq_in;
  }
  copy_bshd(home->view(S), dq);
  copy_bshd(dk_acc.view(), dk);
  copy_bshd(dv_acc.view(), dv);
  if (stats) *stats = local_stats;
  return Status::Ok();
}

int64_t burst_backward_expected_bytes(const Layout& layout, int rank, int64_t batch,
                                      int64_t heads, int64_t head_dim, DType dtype,
                                      DType accumulator_dtype, BurstPack pack) {
  const int P = layout.ranks();
  int64_t bytes = 0;
  for (int step = 0; step < P - 1; ++step) {
    const int64_t rows = layout.local_len(wrap(rank - step, P));
    const int64_t tensor = batch * rows * heads * head_dim, row_stat = batch * heads * rows;
    bytes += pack == BurstPack::kDeltaLse
                 ? (2 * tensor + 2 * row_stat) * dtype_size(dtype)
                 : 3 * tensor * dtype_size(dtype) + row_stat * dtype_size(DType::kF32);
  }
  if (P > 1)
    for (int shard = 0; shard < P; ++shard)
      bytes += batch * layout.local_len(shard) * heads * head_dim * dtype_size(accumulator_dtype);
  return bytes;
}

const char* backward_schedule_name(BackwardSchedule schedule) {
  return schedule == BackwardSchedule::kRing ? "ring" : "burst";
}

BackwardSchedule choose_backward(const Layout& layout, int64_t batch, int64_t heads,
                                 int64_t kv_heads, int64_t head_dim, DType dtype,
                                 DType accumulator_dtype, BurstPack pack) {
  int64_t ring = 0, burst = 0;
  for (int r = 0; r < layout.ranks(); ++r) {
    ring = std::max(ring, ring_expected_bytes(layout, r, batch, kv_heads, head_dim, dtype,
                                              accumulator_dtype).backward);
    burst = std::max(burst, burst_backward_expected_bytes(layout, r, batch, heads, head_dim, dtype,
                                                          accumulator_dtype, pack));
  }
  return burst <= ring ? BackwardSchedule::kBurst : BackwardSchedule::kRing;
}

TrafficBytes gpu_expected_bytes(const Layout& layout, int rank, BackwardSchedule schedule,
                                const AttentionParams& params, int64_t batch, int64_t heads,
                                int64_t kv_heads, int64_t head_dim, DType dtype, bool own_kernels) {
  TrafficBytes bytes = ring_expected_bytes(layout, rank, batch, kv_heads, head_dim, dtype, DType::kF32);
  const bool burst = schedule == BackwardSchedule::kBurst;
  if (layout.ranks() != 2) {
    if (burst)
      bytes.backward = burst_backward_expected_bytes(layout, rank, batch, heads, head_dim, dtype,
                                                     DType::kF32, BurstPack::kOutputLse);
    return bytes;
  }
  // Two ranks: the pack once, then what this rank computed for its peer, returned as the one
  // dense call left it (rows of that call, in dtype) or summed in fp32 over every peer row.
  const int peer = 1 - rank;
  const int64_t rows = layout.local_len(rank), peer_rows = layout.local_len(peer);
  const int64_t h = burst ? heads : kv_heads, tensors = burst ? 1 : 2;
  bytes.backward = burst ? batch * rows * (3 * heads * head_dim * dtype_size(dtype) + heads * 4)
                         : 2 * batch * rows * kv_heads * head_dim * dtype_size(dtype);
  const std::vector<int64_t> q_pos = layout.positions(burst ? peer : rank);
  const std::vector<int64_t> k_pos = layout.positions(burst ? rank : peer);
  if (!parallel::pair_visible(params, q_pos, k_pos)) return bytes;
  const BlockPlan plan = plan_block_pair(q_pos, k_pos, params.mask);
  if (!own_kernels && plan.dense && plan.calls.size() == 1) {
    const BlockCall& c = plan.calls[0];
    const int64_t call_rows = burst ? c.q_end - c.q_begin : c.k_end - c.k_begin;
    bytes.backward += tensors * batch * call_rows * h * head_dim * dtype_size(dtype);
  } else {
    bytes.backward += tensors * batch * peer_rows * h * head_dim * 4;
  }
  return bytes;
}

BackwardSchedule choose_gpu_backward(const Layout& layout, const AttentionParams& params, int64_t batch,
                                     int64_t heads, int64_t kv_heads, int64_t head_dim, DType dtype,
                                     bool own_kernels) {
  int64_t ring = 0, burst = 0;
  for (int r = 0; r < layout.ranks(); ++r) {
    ring = std::max(ring, gpu_expected_bytes(layout, r, BackwardSchedule::kRing, params, batch, heads,
                                             kv_heads, head_dim, dtype, own_kernels).backward);
    burst = std::max(burst, gpu_expected_bytes(layout, r, BackwardSchedule::kBurst, params, batch, heads,
                                               kv_heads, head_dim, dtype, own_kernels).backward);
  }
  return burst <= ring ? BackwardSchedule::kBurst : BackwardSchedule::kRing;
}

}  // namespace seqpar
