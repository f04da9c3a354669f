// LASP over the Communicator: the state chain (LASP-1) and the all-gather of state
// contributions (LASP-2 style), forward and backward, and the sequence groups of a hybrid world.
#include "seqpar/lasp.hpp"

#include <vector>

namespace seqpar {
namespace {

const TensorView kZeroState{};  // an absent state: the kernels read zeros

HostTensor new_state(const TensorView& q, const TensorView& v) {
  return HostTensor(q.dtype, {q.shape[0], q.shape[2], q.shape[3], v.shape[3]});
}

Status check_problem(const Communicator& comm, const Layout& layout, const TensorView& q) {
  SP_CHECK_ARG(layout.kind() == LayoutKind::kContiguous,
               std::string("LASP needs a contiguous layout, got ") + layout_name(layout.kind()));
  SP_CHECK_ARG(layout.ranks() == comm.size(),
               "the layout is over " + std::to_string(layout.ranks()) + " ranks, the communicator has " +
                   std::to_string(comm.size()));
  SP_CHECK_ARG(q.ndim == 4 && q.shape[1] == layout.local_len(comm.rank()),
               "q is " + q.shape_string() + " but rank " + std::to_string(comm.rank()) + " holds " +
                   std::to_string(layout.local_len(comm.rank())) + " tokens");
  return Status::Ok();
}

// Block r of a gathered [ranks * B, H, d_k, d_v] buffer, as a [B, H, d_k, d_v] view.
TensorView block_of(const HostTensor& gathered, const HostTensor& like, int r) {
  const TensorView& s = like.view();
  char* base = static_cast<char*>(gathered.view().data) + r * like.bytes();
  return TensorView::contiguous(base, s.dtype, {s.shape[0], s.shape[1], s.shape[2], s.shape[3]});
}

// Forward, chain: receive the state from rank-1 while this rank's tokens run from a zero state;
// pass the outgoing state on before adding the incoming state's term to o.
Status chain_forward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                     const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                     LaspContext* ctx) {
  const int me = comm.rank(), last = comm.size() - 1;
  const size_t bytes = ctx->state_in.bytes();
  std::unique_ptr<PendingExchange> incoming, outgoing;
  if (me > 0) {
    const RecvSpec from_prev{me - 1, ctx->state_in.view().data, bytes};
    SP_ASSIGN_OR_RETURN(incoming, comm.start_exchange({}, {&from_prev, 1}));
  }
  HostTensor local_state = new_state(q, v);
  SP_RETURN_IF_ERROR(linear_attention_forward(q, k, v, kZeroState, params, o, local_state.view()));
  if (incoming) SP_RETURN_IF_ERROR(incoming->wait());
  SP_RETURN_IF_ERROR(linear_state_combine(ctx->state_in.view(), local_state.view(), layout.local_len(me),
                                          params, ctx->state_out.view()));
  if (me < last) {
    const SendSpec to_next{me + 1, ctx->state_out.view().data, bytes};
    SP_ASSIGN_OR_RETURN(outgoing, comm.start_exchange({&to_next, 1}, {}));
  }
  if (me > 0) SP_RETURN_IF_ERROR(linear_attention_add_state_term(q, ctx->state_in.view(), params, o));
  return outgoing ? outgoing->wait() : Status::Ok();
}

// Forward, all-gather: every rank's contribution from a zero state, gathered; the state entering
// rank r is the decayed prefix over ranks 0..r-1.
Status allgather_forward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                         const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                         LaspContext* ctx) {
  const int me = comm.rank();
  HostTensor local_state = new_state(q, v);
  SP_RETURN_IF_ERROR(linear_attention_forward(q, k, v, kZeroState, params, o, local_state.view()));
  HostTensor gathered(q.dtype, {comm.size() * q.shape[0], q.shape[2], q.shape[3], v.shape[3]});
  SP_RETURN_IF_ERROR(comm.all_gather(local_state.view().data, gathered.view().data, local_state.bytes()));
  for (int r = 0; r < me; ++r)  // state_in starts zeroed
    SP_RETURN_IF_ERROR(linear_state_combine(ctx->state_in.view(), block_of(gathered, local_state, r),
                                            layout.local_len(r), params, ctx->state_in.view()));
  SP_RETURN_IF_ERROR(linear_state_combine(ctx->state_in.view(), local_state.view(), layout.local_len(me), params,
                                          ctx->state_out.view()));
  return me > 0 ? linear_attention_add_state_term(q, ctx->state_in.view(), params, o) : Status::Ok();
}

// Backward, chain: receive dState from rank+1 while this rank's tokens run with a zero one
// (dq is complete: it needs the cached incoming state alone); send dState on to rank-1, then
// add the received dState's terms to dk, dv.
Status chain_backward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                      const LaspContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv) {
  const int me = comm.rank(), last = comm.size() - 1;
  HostTensor dstate_out = new_state(q, v), local_dstate = new_state(q, v);
  const size_t bytes = dstate_out.bytes();
  std::unique_ptr<PendingExchange> incoming, outgoing;
  if (me < last) {
    const RecvSpec from_next{me + 1, dstate_out.view().data, bytes};
    SP_ASSIGN_OR_RETURN(incoming, comm.start_exchange({}, {&from_next, 1}));
  }
  SP_RETURN_IF_ERROR(linear_attention_backward(q, k, v, ctx.state_in.view(), dout, kZeroState, params, dq, dk,
                                               dv, local_dstate.view()));
  if (incoming) SP_RETURN_IF_ERROR(incoming->wait());
  if (me > 0) {  // dState entering this rank's tokens, for rank-1 (Algorithm 3 line 19: to i-1)
    SP_RETURN_IF_ERROR(linear_state_combine(dstate_out.view(), local_dstate.view(), layout.local_len(me), params,
                                            local_dstate.view()));
    const SendSpec to_prev{me - 1, local_dstate.view().data, bytes};
    SP_ASSIGN_OR_RETURN(outgoing, comm.start_exchange({&to_prev, 1}, {}));
  }
  if (me < last) SP_RETURN_IF_ERROR(linear_attention_add_dstate_term(k, v, dstate_out.view(), params, dk, dv));
  return outgoing ? outgoing->wait() : Status::Ok();
}

// Backward, all-gather: every rank's dState contribution (from a zero incoming dState),
// gathered; the dState leaving rank r is the decayed suffix over ranks r+1..T-1.
Status allgather_backward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                          const LaspContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv) {
  const int me = comm.rank(), last = comm.size() - 1;
  HostTensor local_dstate = new_state(q, v), dstate_out = new_state(q, v);
  SP_RETURN_IF_ERROR(linear_attention_backward(q, k, v, ctx.state_in.view(), dout, kZeroState, params, dq, dk,
                                               dv, local_dstate.view()));
  HostTensor gathered(q.dtype, {comm.size() * q.shape[0], q.shape[2], q.shape[3], v.shape[3]});
  SP_RETURN_IF_ERROR(comm.all_gather(local_dstate.view().data, gathered.view().data, local_dstate.bytes()));
  for (int r = last; r > me; --r)
    SP_RETURN_IF_ERROR(linear_state_combine(dstate_out.view(), block_of(gathered, local_dstate, r),
                                            layout.local_len(r), params, dstate_out.view()));
  return me < last ? linear_attention_add_dstate_term(k, v, dstate_out.view(), params, dk, dv) : Status::Ok();
}

}  // namespace

const char* lasp_algorithm_name(LaspAlgorithm algorithm) {
  switch (algorithm) {
    case LaspAlgorithm::kChain: return "lasp";
    case LaspAlgorithm::kAllGather: return "lasp2";
    case LaspAlgorithm::kAuto: return "auto";
  }
  return "?";
}

StatusOr<LaspAlgorithm> parse_lasp_algorithm(const std::string& name) {
  if (name == "lasp") return LaspAlgorithm::kChain;
  if (name == "lasp2") return LaspAlgorithm::kAllGather;
  if (name == "auto") return LaspAlgorithm::kAuto;
  return SP_STATUS(StatusCode::kInvalidArgument,
                   "unknown LASP algorithm '" + name + "' (expected lasp, lasp2 or auto)");
}

double lasp_chain_seconds(int ranks, int64_t state_bytes, const LaspLinkModel& link) {
  return (ranks - 1) * (link.latency_s + static_cast<double>(state_bytes) / link.bytes_per_s);
}

double lasp_allgather_seconds(int ranks, int64_t state_bytes, const LaspLinkModel& link) {
  // The Communicator's ring all_gather: T-1 dependent steps, one block each.
  return (ranks - 1) * (link.latency_s + static_cast<double>(state_bytes) / link.bytes_per_s);
}

LaspAlgorithm choose_lasp_algorithm(int ranks, int64_t state_bytes, const LaspLinkModel& link) {
  return lasp_allgather_seconds(ranks, state_bytes, link) < lasp_chain_seconds(ranks, state_bytes, link)
             ? LaspAlgorithm::kAllGather
             : LaspAlgorithm::kChain;
}

int64_t lasp_state_bytes(int64_t batch, int64_t heads, int64_t dk, int64_t dv, DType dtype) {
  return batch * heads * dk * dv * static_cast<int64_t>(dtype_size(dtype));
}

LaspTraffic lasp_expected_bytes(LaspAlgorithm algorithm, int ranks, int rank, int64_t state_bytes) {
  if (algorithm == LaspAlgorithm::kAllGather) {
    const int64_t gathered = (ranks - 1) * state_bytes;
    return {gathered, gathered};
  }
  return {rank < ranks - 1 ? state_bytes : 0, rank > 0 ? state_bytes : 0};
}

Status lasp_forward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                    LaspAlgorithm algorithm, const TensorView& q, const TensorView& k,
                    const TensorView& v, const TensorView& o, LaspContext* ctx) {
  SP_RETURN_IF_ERROR(check_problem(comm, layout, q));
  SP_CHECK_ARG(v.ndim == 4, "v must be [B, S, H_kv, d_v]");
  PhaseScope phase(comm, Phase::kForward);
  ctx->state_in = new_state(q, v);
  ctx->state_out = new_state(q, v);
  ctx->algorithm = algorithm != LaspAlgorithm::kAuto
                       ? algorithm
                       : choose_lasp_algorithm(comm.size(), static_cast<int64_t>(ctx->state_in.bytes()));
  if (ctx->algorithm == LaspAlgorithm::kChain) return chain_forward(comm, layout, params, q, k, v, o, ctx);
  return allgather_forward(comm, layout, params, q, k, v, o, ctx);
}

Status lasp_backward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                     const LaspContext& ctx, const TensorView& q, const TensorView& k,
                     const TensorView& v, const TensorView& dout, const TensorView& dq,
                     const TensorView& dk, const TensorView& dv) {
  SP_RETURN_IF_ERROR(check_problem(comm, layout, q));
  SP_CHECK_ARG(ctx.state_in.view().data != nullptr && ctx.algorithm != LaspAlgorithm::kAuto,
               "lasp_backward needs the context its forward filled");
  PhaseScope phase(comm, Phase::kBackward);
  if (ctx.algorithm == LaspAlgorithm::kChain)
    return chain_backward(comm, layout, params, ctx, q, k, v, dout, dq, dk, dv);
  return allgather_backward(comm, layout, params, ctx, q, k, v, dout, dq, dk, dv);
}

StatusOr<std::unique_ptr<Communicator>> make_sequence_group(Communicator& world, int sequence_ranks) {
  SP_CHECK_ARG(sequence_ranks >= 1 && world.size() % sequence_ranks == 0,
               "the world size (" + std::to_string(world.size()) + ") must be divisible by the sequence-parallel size (" +
                   std::to_string(sequence_ranks) + ")");
  return world.split(world.rank() / sequence_ranks, world.rank());
}

}  // namespace seqpar
