// LASP on GPUs (include/seqpar/gpu_lasp.hpp): lasp.cpp's four passes over device tensors. The
// states travel as fp32 device buffers; every kernel and transfer is ordered on the caller's
// stream (a host-driven communicator gets the stream synchronised before a batch is posted).
#include "seqpar/gpu_lasp.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda_check.hpp"
#include "kernels/cuda/linear_host.hpp"

namespace seqpar {
namespace {

const TensorView kZero{};  // an absent state or dState: the kernels read zeros

TensorView state_view(void* data, const GpuLaspContext& c) {
  return TensorView::contiguous(data, DType::kF32, {c.batch, c.heads, c.dk, c.dv}, Device{DeviceKind::kCuda, c.device});
}

int64_t state_bytes(const GpuLaspContext& c) { return c.batch * c.heads * c.dk * c.dv * 4; }

Status check_problem(const Communicator& comm, const Layout& layout, const TensorView& q, const TensorView& v) {
  SP_CHECK_ARG(layout.kind() == LayoutKind::kContiguous,
               std::string("LASP needs a contiguous layout, got ") + layout_name(layout.kind()));
  SP_CHECK_ARG(layout.ranks() == comm.size(), "the layout is over " + std::to_string(layout.ranks()) +
                                                  " ranks, the communicator has " + std::to_string(comm.size()));
  SP_CHECK_ARG(q.ndim == 4 && v.ndim == 4 && q.shape[1] == layout.local_len(comm.rank()),
               "q is " + q.shape_string() + " but rank " + std::to_string(comm.rank()) + " holds " +
                   std::to_string(layout.local_len(comm.rank())) + " tokens");
  SP_CHECK_ARG(q.device.kind == DeviceKind::kCuda, "LASP on GPUs takes device tensors");
  SP_CHECK_SUPPORTED(comm.size() == 1 || comm.moves_device_buffers(),
                     "the " + comm.backend_name() + " communicator cannot move device buffers (use NCCL or thread ranks)");
  return Status::Ok();
}

// Starts a batch ordered after the work queued on `s` (host-driven backends: after it is done).
StatusOr<std::unique_ptr<PendingExchange>> start_on(Communicator& comm, std::span<const SendSpec> sends,
                                                    std::span<const RecvSpec> recvs, cudaStream_t s) {
  if (!comm.stream_ordered()) SP_CUDA_CHECK(cudaStreamSynchronize(s));
  comm.set_stream(s);
  auto started = comm.start_exchange(sends, recvs);
  comm.clear_stream();
  return started;
}

// An all-gather of `bytes` from each rank, ordered on `s`.
Status all_gather_on(Communicator& comm, const void* send, void* recv, size_t bytes, cudaStream_t s) {
  comm.set_stream(s);
  const Status done = comm.all_gather(send, recv, bytes);
  comm.clear_stream();
  return done;
}

LinearCudaOptions kernel_options(GpuLaspContext* ctx, cudaStream_t s) {
  LinearCudaOptions o;
  o.workspace = &ctx->kernel_workspace;
  o.stream = s;
  return o;
}

// This rank's own state (or dState) from a zero start, computed first so that it can leave
// for the next rank while the outputs (gradients) are still to come; the full pass then takes
// the entering state as state_in (dstate_out), on the kernels' tensor cores.
Status own_state(const TensorView& q, const TensorView& k, const TensorView& v, const LinearAttentionParams& params,
                 const TensorView& local, GpuLaspContext* ctx, cudaStream_t s) {
  return linear_attention_forward_cuda(q, k, v, kZero, params, TensorView{}, local, kernel_options(ctx, s));
}
Status own_dstate(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                  const LinearAttentionParams& params, const TensorView& local, GpuLaspContext* ctx, cudaStream_t s) {
  return linear_attention_backward_cuda(q, k, v, kZero, dout, kZero, params, {}, {}, {}, local, kernel_options(ctx, s));
}

// Rank 0 computes its state and sends it on; a middle rank also combines it with the arriving
// one first; the last rank needs no state of its own before the arriving one, so its single pass
// gives the final state.
Status chain_forward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                     const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                     GpuLaspContext* ctx, cudaStream_t s) {
  const int me = comm.rank(), last = comm.size() - 1;
  const size_t bytes = size_t(state_bytes(*ctx));
  const TensorView in = state_view(ctx->state_in.data(), *ctx),
                   out = state_view(ctx->state_out.data(), *ctx),
                   local = state_view(ctx->scratch.data(), *ctx);
  std::unique_ptr<PendingExchange> incoming, outgoing;
  if (me > 0) {
    const RecvSpec from_prev{me - 1, in.data, bytes};
    SP_ASSIGN_OR_RETURN(incoming, start_on(comm, {}, {&from_prev, 1}, s));
  } else {
    SP_CUDA_CHECK(cudaMemsetAsync(in.data, 0, bytes, s));
  }
  if (me < last) {
    SP_RETURN_IF_ERROR(own_state(q, k, v, params, me > 0 ? local : out, ctx, s));
    if (incoming) {
      SP_RETURN_IF_ERROR(incoming->wait_on_stream(s));
      SP_RETURN_IF_ERROR(linear_state_combine_cuda(in, local, layout.local_len(me), params, out, s));
    }
    const SendSpec to_next{me + 1, out.data, bytes};
    SP_ASSIGN_OR_RETURN(outgoing, start_on(comm, {&to_next, 1}, {}, s));
  } else if (incoming) {
    SP_RETURN_IF_ERROR(incoming->wait_on_stream(s));
  }
  SP_RETURN_IF_ERROR(linear_attention_forward_cuda(q, k, v, me > 0 ? in : kZero, params, o,
                                                   me == last ? out : TensorView{}, kernel_options(ctx, s)));
  return outgoing ? outgoing->wait_on_stream(s) : Status::Ok();
}

// Every rank's own state, gathered; the entering state is the earlier ranks' combined.
Status allgather_forward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                         const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                         GpuLaspContext* ctx, cudaStream_t s) {
  const int me = comm.rank();
  const size_t bytes = size_t(state_bytes(*ctx));
  char* scratch = static_cast<char*>(ctx->scratch.data());
  const TensorView in = state_view(ctx->state_in.data(), *ctx),
                   out = state_view(ctx->state_out.data(), *ctx), local = state_view(scratch, *ctx);
  SP_CUDA_CHECK(cudaMemsetAsync(in.data, 0, bytes, s));
  if (comm.size() > 1) {
    SP_RETURN_IF_ERROR(own_state(q, k, v, params, local, ctx, s));
    char* gathered = scratch + bytes;  // rank r's contribution at r * bytes
    SP_RETURN_IF_ERROR(all_gather_on(comm, local.data, gathered, bytes, s));
    for (int r = 0; r < me; ++r)
      SP_RETURN_IF_ERROR(linear_state_combine_cuda(in, state_view(gathered + r * bytes, *ctx),
                                                   layout.local_len(r), params, in, s));
    SP_RETURN_IF_ERROR(linear_state_combine_cuda(in, local, layout.local_len(me), params, out, s));
  }
  return linear_attention_forward_cuda(q, k, v, me > 0 ? in : kZero, params, o,
                                       comm.size() > 1 ? TensorView{} : out, kernel_options(ctx, s));
}

// The backward's states in the scratch: this rank's own dState contribution (from a zero
// arriving one), the dState arriving from later ranks, the one leaving for rank - 1; and the
// forward's kept incoming state (none on rank 0).
struct BackwardStates {
  TensorView local, arriving, leaving, in;
};
BackwardStates backward_states(const GpuLaspContext& ctx, int me) {
  char* scratch = static_cast<char*>(ctx.scratch.data());
  const size_t bytes = size_t(state_bytes(ctx));
  return {state_view(scratch, ctx), state_view(scratch + bytes, ctx),
          state_view(scratch + 2 * bytes, ctx), me > 0 ? state_view(ctx.state_in.data(), ctx) : kZero};
}

// The forward's chain reversed: the last rank computes its dState and sends it on; a middle rank
// also combines it with the arriving one first; rank 0 needs none of its own.
Status chain_backward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                      GpuLaspContext* ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                      cudaStream_t s) {
  const int me = comm.rank(), last = comm.size() - 1;
  const size_t bytes = size_t(state_bytes(*ctx));
  const BackwardStates st = backward_states(*ctx, me);
  std::unique_ptr<PendingExchange> incoming, outgoing;
  if (me < last) {
    const RecvSpec from_next{me + 1, st.arriving.data, bytes};
    SP_ASSIGN_OR_RETURN(incoming, start_on(comm, {}, {&from_next, 1}, s));
  }
  if (me > 0) {
    SP_RETURN_IF_ERROR(own_dstate(q, k, v, dout, params, st.local, ctx, s));
    if (incoming) {
      SP_RETURN_IF_ERROR(incoming->wait_on_stream(s));
      SP_RETURN_IF_ERROR(linear_state_combine_cuda(st.arriving, st.local, layout.local_len(me), params, st.leaving, s));
    }
    const SendSpec to_prev{me - 1, incoming ? st.leaving.data : st.local.data, bytes};
    SP_ASSIGN_OR_RETURN(outgoing, start_on(comm, {&to_prev, 1}, {}, s));
  } else if (incoming) {
    SP_RETURN_IF_ERROR(incoming->wait_on_stream(s));
  }
  SP_RETURN_IF_ERROR(linear_attention_backward_cuda(q, k, v, st.in, dout, incoming ? st.arriving : kZero, params,
                                                    dq, dk, dv, TensorView{}, kernel_options(ctx, s)));
  return outgoing ? outgoing->wait_on_stream(s) : Status::Ok();
}

// Every rank's own dState, gathered; the arriving dState is the later ranks' combined.
Status allgather_backward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                          GpuLaspContext* ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                          cudaStream_t s) {
  const int me = comm.rank(), last = comm.size() - 1;
  const size_t bytes = size_t(state_bytes(*ctx));
  const BackwardStates st = backward_states(*ctx, me);
  if (comm.size() > 1) {
    SP_RETURN_IF_ERROR(own_dstate(q, k, v, dout, params, st.local, ctx, s));
    char* gathered = static_cast<char*>(ctx->scratch.data()) + 2 * bytes;  // after local and arriving
    SP_RETURN_IF_ERROR(all_gather_on(comm, st.local.data, gathered, bytes, s));
    SP_CUDA_CHECK(cudaMemsetAsync(st.arriving.data, 0, bytes, s));
    for (int r = last; r > me; --r)
      SP_RETURN_IF_ERROR(linear_state_combine_cuda(st.arriving, state_view(gathered + r * bytes, *ctx),
                                                   layout.local_len(r), params, st.arriving, s));
  }
  return linear_attention_backward_cuda(q, k, v, st.in, dout, me < last ? st.arriving : kZero, params, dq, dk, dv,
                                        TensorView{}, kernel_options(ctx, s));
}

}  // namespace

TensorView GpuLaspContext::state_in_view() const { return state_view(state_in.data(), *this); }
TensorView GpuLaspContext::state_out_view() const { return state_view(state_out.data(), *this); }

// Every buffer the passes use, sized once: two states, the scratch (the local state, the
// arriving and leaving dStates, and with the all-gather every rank's contribution), and the
// kernels' workspace at the backward's size (the forward's is smaller), so no pass grows a
// buffer mid-schedule. The inputs are checked here, before any rank posts a transfer.
Status lasp_reserve_gpu(GpuLaspContext* ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                        const LinearAttentionParams& params, int ranks) {
  cuda::LinearCudaDims d;
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda(q, k, v, params, &d));
  int device = 0;
  SP_CUDA_CHECK(cudaGetDevice(&device));
  SP_CHECK_ARG(q.device.index == device, "q is on GPU " + std::to_string(q.device.index) + " but the current device is " +
                                             std::to_string(device));
  ctx->batch = d.batch, ctx->heads = d.heads, ctx->dk = d.dk, ctx->dv = d.dv, ctx->ranks = ranks, ctx->device = device;
  const size_t one = size_t(state_bytes(*ctx));
  SP_RETURN_IF_ERROR(ctx->state_in.reserve(one));
  SP_RETURN_IF_ERROR(ctx->state_out.reserve(one));
  SP_RETURN_IF_ERROR(ctx->scratch.reserve(one * (size_t(ranks) + 2)));
  const cuda::LinearPlan plan = cuda::plan_linear(d, 0);
  const size_t floats = std::max(cuda::linear_forward_workspace(d, plan), cuda::linear_backward_workspace(d, plan));
  return ctx->kernel_workspace.reserve(std::max<size_t>(floats * sizeof(float), 256));
}


Status lasp_forward_gpu(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                        LaspAlgorithm algorithm, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& o, GpuLaspContext* ctx, void* stream) {
  SP_RETURN_IF_ERROR(check_problem(comm, layout, q, v));
  PhaseScope phase(comm, Phase::kForward);
  SP_RETURN_IF_ERROR(lasp_reserve_gpu(ctx, q, k, v, params, comm.size()));
  ctx->algorithm = algorithm != LaspAlgorithm::kAuto ? algorithm
                                                     : choose_lasp_algorithm(comm.size(), state_bytes(*ctx));
  const auto s = static_cast<cudaStream_t>(stream);
  if (ctx->algorithm == LaspAlgorithm::kChain) return chain_forward(comm, layout, params, q, k, v, o, ctx, s);
  return allgather_forward(comm, layout, params, q, k, v, o, ctx, s);
}

Status lasp_backward_gpu(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                         GpuLaspContext* ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                         void* stream) {
  SP_RETURN_IF_ERROR(check_problem(comm, layout, q, v));
  SP_CHECK_ARG(ctx->state_in.data() != nullptr && ctx->algorithm != LaspAlgorithm::kAuto && ctx->batch == q.shape[0] &&
                   ctx->heads == q.shape[2] && ctx->dk == q.shape[3] && ctx->dv == v.shape[3] &&
                   ctx->ranks == comm.size(),
               "lasp_backward_gpu needs the context its forward filled for this problem and communicator");
  SP_RETURN_IF_ERROR(lasp_reserve_gpu(ctx, q, k, v, params, comm.size()));  // checks; no growth after the forward
  PhaseScope phase(comm, Phase::kBackward);
  const auto s = static_cast<cudaStream_t>(stream);
  if (ctx->algorithm == LaspAlgorithm::kChain)
    return chain_backward(comm, layout, params, ctx, q, k, v, dout, dq, dk, dv, s);
  return allgather_backward(comm, layout, params, ctx, q, k, v, dout, dq, dk, dv, s);
}

}  // namespace seqpar
