// LASP's passes on either device (seqpar/lasp.hpp): the steps of lasp_steps.hpp run over the
// linear-attention backend table (kernels/linear_backend.hpp) and the Communicator, with the
// states on the tensors' device. Nothing here depends on the device but the ordering of the
// communicator's work after the kernels (Link). The ulysses baseline runs through the same
// context and backend, its passes in linear_ulysses.cpp.
#include <array>
#include <cstring>

#include "kernels/linear_backend.hpp"
#include "parallel/lasp_steps.hpp"
#include "parallel/linear_ulysses.hpp"
#include "seqpar/gpu.hpp"
#include "seqpar/lasp.hpp"

namespace seqpar {

// The backend of one rank's passes and its state memory: lasp::slot_count states of `bytes`
// each, slot s at s * bytes, on the backend's device (ulysses: the states of its pieces,
// linear_ulysses.cpp; its all-to-alls' buffers are each pass's scratch, not the context's).
struct LaspBuffers {
  std::unique_ptr<LinearBackend> backend;
  void* memory = nullptr;
  TensorView like;  // one state: dtype, device, [B, H, d_k, d_v]; no data
  size_t bytes = 0;
  int ranks = 0;
  bool forwarded = false;  // the kept states hold a forward's

  TensorView slot(int s) const {
    if (s == lasp::kNoSlot) return {};
    TensorView v = like;
    v.data = static_cast<char*>(memory) + size_t(s) * bytes;
    return v;
  }
};

LaspContext::LaspContext() = default;
LaspContext::~LaspContext() = default;
LaspContext::LaspContext(LaspContext&&) noexcept = default;
LaspContext& LaspContext::operator=(LaspContext&&) noexcept = default;

bool LaspContext::forwarded() const { return buffers && buffers->forwarded; }
TensorView LaspContext::state_in() const {
  return forwarded() && algorithm != LaspAlgorithm::kUlysses ? buffers->slot(lasp::kEntering) : TensorView{};
}
TensorView LaspContext::state_out() const {
  return forwarded() && algorithm != LaspAlgorithm::kUlysses ? buffers->slot(lasp::kLeaving) : TensorView{};
}
int64_t LaspContext::state_bytes() const { return buffers ? int64_t(buffers->bytes) : 0; }

StatusOr<HostTensor> lasp_state_out_on_host(const LaspContext& ctx) {
  const TensorView s = ctx.state_out();
  SP_CHECK_ARG(s.data != nullptr, "no state: the context has not run a forward");
  HostTensor host(s.dtype, {s.shape[0], s.shape[1], s.shape[2], s.shape[3]});
  if (s.device.kind == DeviceKind::kCpu) {
    std::memcpy(host.view().data, s.data, host.bytes());
    return host;
  }
  SP_RETURN_IF_ERROR(copy_bytes(host.view().data, s.data, host.bytes()));
  return host;
}

namespace {

using lasp::Op;
using lasp::Pass;
using lasp::Step;

// The tensors of one pass on this rank (the forward has no dout, dq, dk, dv; the backward no o).
struct PassTensors {
  TensorView q, k, v, o, dout, dq, dk, dv;
};

// Orders the communicator's work after the kernels queued on `stream`: a device backend's batches
// and collectives go on the stream (stream-ordered communicators) or after it is done (host-driven
// ones synchronise it); host memory needs neither.
class Link {
 public:
  Link(Communicator& comm, LinearBackend& backend, void* stream)
      : comm_(comm), backend_(backend), stream_(stream), device_(backend.device() != DeviceKind::kCpu) {}

  StatusOr<std::unique_ptr<PendingExchange>> post(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs) {
    if (!device_) return comm_.start_exchange(sends, recvs);
    if (!comm_.stream_ordered()) SP_RETURN_IF_ERROR(backend_.synchronize(stream_));
    return comm_.start_exchange(sends, recvs, StreamOrder::on(stream_));
  }
  Status wait(PendingExchange& batch) { return device_ ? batch.wait_on_stream(stream_) : batch.wait(); }
  Status all_gather(const void* send, void* recv, size_t bytes) {
    return comm_.all_gather(send, recv, bytes, device_ ? StreamOrder::on(stream_) : StreamOrder{});
  }

 private:
  Communicator& comm_;
  LinearBackend& backend_;
  void* stream_;
  bool device_;
};

Status run_steps(const std::vector<Step>& steps, Pass pass, Communicator& comm, const Layout& layout,
                 const LinearAttentionParams& params, const PassTensors& t, const LaspBuffers& b, void* stream) {
  LinearBackend& be = *b.backend;
  Link link(comm, be, stream);
  std::array<std::unique_ptr<PendingExchange>, 2> batches;
  const bool forward = pass == Pass::kForward;
  for (const Step& s : steps) {
    switch (s.op) {
      case Op::kZero:
        SP_RETURN_IF_ERROR(be.zero(b.slot(s.slot), stream));
        break;
      case Op::kOwn:
        SP_RETURN_IF_ERROR(forward ? be.forward(t.q, t.k, t.v, {}, params, {}, b.slot(s.slot), stream)
                                   : be.backward(t.q, t.k, t.v, {}, t.dout, {}, params, {}, {}, {}, b.slot(s.slot),
                                                 stream));
        break;
      case Op::kPostRecv: {
        const RecvSpec from{s.peer, b.slot(s.slot).data, b.bytes};
        SP_ASSIGN_OR_RETURN(batches.at(s.batch), link.post({}, {&from, 1}));
        break;
      }
      case Op::kPostSend: {
        const SendSpec to{s.peer, b.slot(s.slot).data, b.bytes};
        SP_ASSIGN_OR_RETURN(batches.at(s.batch), link.post({&to, 1}, {}));
        break;
      }
      case Op::kWait:
        SP_RETURN_IF_ERROR(link.wait(*batches.at(s.batch)));
        batches.at(s.batch).reset();
        break;
      case Op::kGather:
        SP_RETURN_IF_ERROR(link.all_gather(b.slot(s.slot).data, b.slot(lasp::kGathered).data, b.bytes));
        break;
      case Op::kCombine:
        SP_RETURN_IF_ERROR(
            be.combine(b.slot(s.carried), b.slot(s.slot), layout.local_len(s.peer), params, b.slot(s.out), stream));
        break;
      case Op::kFull:
        SP_RETURN_IF_ERROR(forward ? be.forward(t.q, t.k, t.v, b.slot(s.carried), params, t.o, b.slot(s.out), stream)
                                   : be.backward(t.q, t.k, t.v, b.slot(s.kept), t.dout, b.slot(s.carried), params,
                                                 t.dq, t.dk, t.dv, b.slot(s.out), stream));
        break;
    }
  }
  return Status::Ok();
}

Status check_problem(const Communicator& comm, const Layout& layout, const TensorView& q, const TensorView& v) {
  SP_CHECK_ARG(layout.kind() == LayoutKind::kContiguous,
               std::string("LASP needs a contiguous layout, got ") + layout_name(layout.kind()));
  SP_CHECK_ARG(layout.ranks() == comm.size(), "the layout is over " + std::to_string(layout.ranks()) +
                                                  " ranks, the communicator has " + std::to_string(comm.size()));
  SP_CHECK_ARG(q.ndim == 4 && v.ndim == 4 && q.shape[1] == layout.local_len(comm.rank()),
               "q is " + q.shape_string() + " but rank " + std::to_string(comm.rank()) + " holds " +
                   std::to_string(layout.local_len(comm.rank())) + " tokens");
  return Status::Ok();
}

// lasp_reserve less ulysses's scratch, which each pass takes itself. A ulysses context is sized
// for every rank holding one row more than this one (a contiguous layout's shards differ by one
// row at most); the forward reserves the layout's exact size, no more.
Status reserve_context(LaspContext* ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                       const LinearAttentionParams& params, int ranks, LaspAlgorithm algorithm) {
  SP_CHECK_ARG(ctx != nullptr && ranks >= 1, "lasp_reserve needs a context and at least one rank");
  SP_CHECK_ARG(q.ndim == 4 && v.ndim == 4, "q must be [B, S, H, d_k] and v [B, S, H_kv, d_v]");
  std::unique_ptr<LaspBuffers>& b = ctx->buffers;
  if (!b || b->backend->device() != q.device.kind) {
    b = std::make_unique<LaspBuffers>();
    SP_ASSIGN_OR_RETURN(b->backend, make_linear_backend(q.device.kind));
  }
  const std::string refused = b->backend->supports(q, k, v, params);
  SP_CHECK_SUPPORTED(refused.empty(), std::string("LASP on the ") + b->backend->name() + " backend: " + refused);
  const DType state_dtype = b->backend->state_dtype(q.dtype);
  // ulysses: the states of one head part (the heads this rank runs the whole sequence for).
  const int64_t heads = algorithm == LaspAlgorithm::kUlysses ? q.shape[2] / ranks : q.shape[2];
  b->like = TensorView::contiguous(nullptr, state_dtype, {q.shape[0], heads, q.shape[3], v.shape[3]}, q.device);
  b->bytes = size_t(lasp_state_bytes(q.shape[0], heads, q.shape[3], v.shape[3], state_dtype));
  b->ranks = ranks;
  b->forwarded = false;
  ctx->algorithm = algorithm != LaspAlgorithm::kAuto ? algorithm : choose_lasp_algorithm(ranks, int64_t(b->bytes));
  if (ctx->algorithm == LaspAlgorithm::kUlysses)
    return linear_ulysses::reserve(*b->backend, std::vector<int64_t>(size_t(ranks), q.shape[1] + 1), 0, q, k, v,
                                   params, &b->memory);
  return b->backend->reserve(q, k, v, b->bytes * size_t(lasp::slot_count(ctx->algorithm, ranks)), &b->memory);
}

}  // namespace

Status lasp_reserve(LaspContext* ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                    const LinearAttentionParams& params, int ranks, LaspAlgorithm algorithm, void* stream) {
  SP_RETURN_IF_ERROR(reserve_context(ctx, q, k, v, params, ranks, algorithm));
  if (ctx->algorithm != LaspAlgorithm::kUlysses) return Status::Ok();
  // A pass's scratch taken once and given back: on a device, the stream's arena keeps its memory
  // for the passes, so running short of memory shows here, before any rank communicates.
  LinearBackend& be = *ctx->buffers->backend;
  SP_ASSIGN_OR_RETURN(const size_t bytes,
                      linear_ulysses::scratch_bytes(be, std::vector<int64_t>(size_t(ranks), q.shape[1] + 1), 0, q, k, v));
  return be.scratch(bytes, stream).status();
}

Status lasp_forward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                    LaspAlgorithm algorithm, const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& o, LaspContext* ctx, void* stream) {
  SP_RETURN_IF_ERROR(check_problem(comm, layout, q, v));
  SP_RETURN_IF_ERROR(reserve_context(ctx, q, k, v, params, comm.size(), algorithm));
  LaspBuffers& b = *ctx->buffers;
  SP_CHECK_SUPPORTED(b.backend->device() == DeviceKind::kCpu || comm.size() == 1 || comm.moves_device_buffers(),
                     "the " + comm.backend_name() + " communicator cannot move device buffers (use NCCL or thread ranks)");
  PhaseScope phase(comm, Phase::kForward);
  if (ctx->algorithm == LaspAlgorithm::kUlysses) {
    SP_RETURN_IF_ERROR(linear_ulysses::reserve(*b.backend, linear_ulysses::rows_of(layout), comm.rank(), q, k, v,
                                               params, &b.memory));
    SP_RETURN_IF_ERROR(linear_ulysses::forward(comm, layout, params, *b.backend, b.memory, q, k, v, o, stream));
    b.forwarded = true;
    return Status::Ok();
  }
  const auto steps = lasp::pass_steps(ctx->algorithm, Pass::kForward, comm.rank(), comm.size());
  SP_RETURN_IF_ERROR(run_steps(steps, Pass::kForward, comm, layout, params, {q, k, v, o, {}, {}, {}, {}}, b, stream));
  b.forwarded = true;
  return Status::Ok();
}

Status lasp_backward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                     LaspContext* ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                     void* stream) {
  SP_RETURN_IF_ERROR(check_problem(comm, layout, q, v));
  const LaspBuffers* b = ctx ? ctx->buffers.get() : nullptr;
  const bool ulysses = b && ctx->algorithm == LaspAlgorithm::kUlysses;
  SP_CHECK_ARG(b && b->forwarded && ctx->algorithm != LaspAlgorithm::kAuto && b->ranks == comm.size() &&
                   b->like.device.kind == q.device.kind && b->like.shape[0] == q.shape[0] &&
                   b->like.shape[1] == q.shape[2] / (ulysses ? comm.size() : 1) && b->like.shape[2] == q.shape[3] &&
                   b->like.shape[3] == v.shape[3],
               "lasp_backward needs the context its forward filled for this problem and communicator");
  PhaseScope phase(comm, Phase::kBackward);
  if (ulysses)
    return linear_ulysses::backward(comm, layout, params, *b->backend, b->memory, q, k, v, dout, dq, dk, dv, stream);
  const auto steps = lasp::pass_steps(ctx->algorithm, Pass::kBackward, comm.rank(), comm.size());
  return run_steps(steps, Pass::kBackward, comm, layout, params, {q, k, v, {}, dout, dq, dk, dv}, *b, stream);
}

}  // namespace seqpar
