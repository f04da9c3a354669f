// Ring attention, forward and backward, as explicit loops over ring steps with double
// buffers (see include/seqpar/ring.hpp for the schedule and its byte formula).
#include "seqpar/ring.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "parallel/ring_common.hpp"

namespace seqpar {
namespace {

using parallel::add_into;
using parallel::check_backward_args;
using parallel::check_ring_args;
using parallel::copy_bshd;
using parallel::pair_visible;
using parallel::ShardBuffer;
using parallel::wrap;

// Where a rank stands at one ring step: the K/V shard it holds (it started with its own and
// receives from the previous rank each step), the shard arriving for the next step, and its
// neighbours.
struct RingStep {
  int held, incoming, next_rank, prev_rank;
  int64_t held_rows, incoming_rows;
  AttentionParams params;  // the global mask with this step's query and key positions
};

RingStep ring_step(const Layout& layout, const AttentionParams& params, int me, int step) {
  const int P = layout.ranks();
  RingStep s{wrap(me - step, P), wrap(me - step - 1, P), wrap(me + 1, P), wrap(me - 1, P), 0, 0,
             params};
  s.held_rows = layout.local_len(s.held);
  s.incoming_rows = layout.local_len(s.incoming);
  s.params.q_positions = layout.positions(me).data();
  s.params.k_positions = layout.positions(s.held).data();
  return s;
}

}  // namespace

Status ring_attention_forward(Communicator& comm, const Layout& layout,
                              const AttentionParams& params, const TensorView& q,
                              const TensorView& k, const TensorView& v, const TensorView& o,
                              const TensorView& lse, RingStats* stats) {
  cpu::AttentionDims dims;
  SP_RETURN_IF_ERROR(check_ring_args(comm, layout, params, q, k, v, &dims));
  const int P = comm.size(), me = comm.rank();
  const PhaseScope phase(comm, Phase::kForward);
  RingStats local_stats;

  ShardBuffer kv[2];  // current and next; each holds K then V
  for (auto& buf : kv)
    buf.allocate(q.dtype, dims.batch, layout.max_local_len(), dims.kv_heads, dims.head_dim);
  copy_bshd(k, kv[0].view(dims.seq_k, 0));
  copy_bshd(v, kv[0].view(dims.seq_k, 1));

  // Start from an empty running result: O = 0, LSE = -inf.
  SP_RETURN_IF_ERROR(cpu::validate_like("o", o, q.dtype, dims.batch, dims.seq_q, dims.heads,
                                        dims.head_dim));
  SP_RETURN_IF_ERROR(cpu::validate_like("lse", lse, q.dtype, dims.batch, dims.heads, dims.seq_q));
  for (int64_t b = 0; b < dims.batch; ++b)
    for (int64_t s = 0; s < dims.seq_q; ++s)
      for (int64_t h = 0; h < dims.heads; ++h) {
        std::memset(static_cast<char*>(o.data) + cpu::bshd_offset(o, b, s, h) * dtype_size(o.dtype),
                    0, dims.head_dim * dtype_size(o.dtype));
        const int64_t at = cpu::bhs_offset(lse, b, h, s);
        if (q.dtype == DType::kF32) lse.as<float>()[at] = -INFINITY;
        else lse.as<double>()[at] = -INFINITY;
      }

  const auto& q_pos = layout.positions(me);
  for (int step = 0; step < P; ++step) {
    const RingStep st = ring_step(layout, params, me, step);
    ShardBuffer& cur = kv[step % 2];
    ShardBuffer& next = kv[(step + 1) % 2];
    std::unique_ptr<PendingExchange> pending;
    if (step < P - 1) {
      const SendSpec send{st.next_rank, cur.view(st.held_rows).data, 2 * cur.bytes(st.held_rows)};
      const RecvSpec recv{st.prev_rank, next.view(st.incoming_rows).data,
                          2 * next.bytes(st.incoming_rows)};
      SP_ASSIGN_OR_RETURN(pending, comm.start_exchange({&send, 1}, {&recv, 1}));
    }
    if (pair_visible(params, q_pos, layout.positions(st.held))) {
      SP_RETURN_IF_ERROR(cpu_attention_forward(q, cur.view(st.held_rows, 0),
                                               cur.view(st.held_rows, 1), st.params, o, lse,
                                               /*accumulate=*/true));
      ++local_stats.pairs_computed;
    } else {
      ++local_stats.pairs_skipped;
    }
    if (pending) SP_RETURN_IF_ERROR(pending->wait());
  }
  if (stats) *stats = local_stats;
  return Status::Ok();
}

Status ring_attention_backward(Communicator& comm, const Layout& layout,
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

  HostTensor delta(t, {B, H, S});
  SP_RETURN_IF_ERROR(cpu_attention_delta(o, dout, delta.view()));
  HostTensor dq_acc(t, {B, S, H, D});  // zeroed; dq accumulates over every K/V shard

  const int64_t max_rows = layout.max_local_len();
  ShardBuffer kv[2], grad_part, grad_in, grad_out;  // grad buffers hold dK then dV
  for (ShardBuffer* buf : {&kv[0], &kv[1], &grad_part, &grad_in, &grad_out})
    buf->allocate(t, B, max_rows, Hkv, D);
  copy_bshd(k, kv[0].view(S, 0));
  copy_bshd(v, kv[0].view(S, 1));

  const auto& q_pos = layout.positions(me);
  for (int step = 0; step < P; ++step) {
    const RingStep st = ring_step(layout, params, me, step);
    const int64_t rows = st.held_rows;
    ShardBuffer& cur = kv[step % 2];
    ShardBuffer& next = kv[(step + 1) % 2];
    // K/V for the next step, and (from step 1) the accumulator of the shard finished last
    // step goes on while the accumulator of the shard held now arrives.
    std::vector<SendSpec> sends;
    std::vector<RecvSpec> recvs;
    if (step < P - 1) {
      sends.push_back({st.next_rank, cur.view(rows).data, 2 * cur.bytes(rows)});
      recvs.push_back({st.prev_rank, next.view(st.incoming_rows).data,
                       2 * next.bytes(st.incoming_rows)});
    }
    if (step >= 1) {
      const int64_t finished_rows = layout.local_len(wrap(st.held + 1, P));
      sends.push_back({st.next_rank, grad_out.view(finished_rows).data,
                       2 * grad_out.bytes(finished_rows)});
      recvs.push_back({st.prev_rank, grad_in.view(rows).data, 2 * grad_in.bytes(rows)});
    }
    std::unique_ptr<PendingExchange> pending;
    if (!sends.empty()) {
      SP_ASSIGN_OR_RETURN(pending, comm.start_exchange(sends, recvs));
    }

    grad_part.zero(rows, 2);
    if (pair_visible(params, q_pos, layout.positions(st.held))) {
      SP_RETURN_IF_ERROR(cpu_attention_backward(
          q, cur.view(rows, 0), cur.view(rows, 1), dout, lse, delta.view(), st.params,
          dq_acc.view(), grad_part.view(rows, 0), grad_part.view(rows, 1)));
      ++local_stats.pairs_computed;
    } else {
      ++local_stats.pairs_skipped;
    }
    if (pending) SP_RETURN_IF_ERROR(pending->wait());
    if (step >= 1) {
      const int64_t n = 2 * B * rows * Hkv * D;
      const TensorView part = TensorView::contiguous(grad_part.view(rows).data, t, {n});
      const TensorView in = TensorView::contiguous(grad_in.view(rows).data, t, {n});
      if (t == DType::kF32) add_into<float>(part, in);
      else add_into<double>(part, in);
    }
    std::swap(grad_out, grad_part);  // grad_out: the accumulator of `held`, sent next step
  }
  // The last accumulator (shard me+1) takes its final hop home; ours arrives from me-1.
  ShardBuffer* home = &grad_out;
  if (P > 1) {
    const int64_t last_rows = layout.local_len(wrap(me + 1, P));
    const SendSpec send{wrap(me + 1, P), grad_out.view(last_rows).data, 2 * grad_out.bytes(last_rows)};
    const RecvSpec recv{wrap(me - 1, P), grad_in.view(S).data, 2 * grad_in.bytes(S)};
    SP_RETURN_IF_ERROR(comm.exchange({&send, 1}, {&recv, 1}));
    home = &grad_in;
  }
  copy_bshd(dq_acc.view(), dq);
  copy_bshd(home->view(S, 0), dk);
  copy_bshd(home->view(S, 1), dv);
  if (stats) *stats = local_stats;
  return Status::Ok();
}

TrafficBytes ring_expected_bytes(const Layout& layout, int rank, int64_t batch, int64_t kv_heads,
                                 int64_t head_dim, DType kv_dtype, DType accumulator_dtype) {
  const int P = layout.ranks();
  const int64_t per_token = batch * kv_heads * head_dim;
  TrafficBytes bytes;
  for (int step = 0; step < P - 1; ++step) {
    const int64_t rows = layout.local_len(wrap(rank - step, P));
    bytes.forward += 2 * rows * per_token * dtype_size(kv_dtype);
  }
  bytes.backward = bytes.forward;
  if (P > 1)
    for (int shard = 0; shard < P; ++shard)
      bytes.backward += 2 * layout.local_len(shard) * per_token * dtype_size(accumulator_dtype);
  return bytes;
}

}  // namespace seqpar
