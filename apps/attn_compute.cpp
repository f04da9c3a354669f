// One rank's forward + backward for `seqpar attn` (attn_compute.hpp), through a Session.
#include "attn_compute.hpp"

#include <chrono>
#include <cstdlib>
#include <thread>

#ifdef SEQPAR_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "attn_report.hpp"
#include "seqpar/gpu.hpp"
#include "seqpar/session.hpp"

namespace seqpar::app {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

PlanOptions plan_options(const Job& job, const std::string& algo) {
  PlanOptions options(algo, Topology{job.opt.ranks_per_node});
  options.head_groups = job.opt.head_groups;
  options.ulysses = job.opt.ulysses;
  options.ring_algorithm = job.opt.ring_algo;
  options.keep_forward_state = job.opt.keep_forward_state;
  return options;
}

BlockBytes cpu_block_bytes(const Job& job) {
  return {job.opt.batch, job.opt.heads, job.kv_heads, job.opt.head_dim, job.dtype, job.dtype, job.dtype, true};
}

Status run_cpu_rank(Communicator& comm, const Job& job, const Layout& layout, const AttentionParams& params,
                    const std::string& algo, const Inputs& in, RankRun* run) {
  const AttnOptions& o = job.opt;
  const int me = comm.rank();
  Session session(comm, {plan_options(job, algo)});
  SP_ASSIGN_OR_RETURN(const AttentionPlan* plan, session.plan(layout, params, in.q.view(), in.k.view()));
  run->plan = *plan;
  run->backend = plan->backend->name();
  const int64_t B = o.batch, H = o.heads, Hkv = job.kv_heads, D = o.head_dim, n = layout.local_len(me);
  const DType t = job.dtype;
  run->out = HostTensor(t, {B, n, H, D});
  run->lse = HostTensor(t, {B, H, n});
  run->dq = HostTensor(t, {B, n, H, D});
  run->dk = HostTensor(t, {B, n, Hkv, D});
  run->dv = HostTensor(t, {B, n, Hkv, D});
  const ShardTensors tensors{in.q.view(),    in.k.view(),   in.v.view(),   run->out.view(), run->lse.view(),
                             in.dout.view(), run->dq.view(), run->dk.view(), run->dv.view()};
  SP_RETURN_IF_ERROR(comm.barrier());
  auto t0 = Clock::now();
  ForwardState kept;  // what --keep-forward-state plans keep between the passes
  SP_RETURN_IF_ERROR(session.run(*plan, Pass::kForward, tensors, {nullptr, &kept, &run->fwd_stats}));
  run->times[0] = seconds_since(t0);
  SP_RETURN_IF_ERROR(comm.barrier());
  if (me == 0) progress("running backward");
  t0 = Clock::now();
  SP_RETURN_IF_ERROR(session.run(*plan, Pass::kBackward, tensors, {nullptr, &kept}));
  run->times[1] = seconds_since(t0);
  return Status::Ok();
}

Status run_gpu_rank(Communicator& comm, const Job& job, const Layout& layout, const AttentionParams& params,
                    const std::string& algo, Inputs& in, bool keep_inputs, const std::string& who, RankRun* run) {
#ifndef SEQPAR_HAVE_CUDA
  (void)comm, (void)job, (void)layout, (void)params, (void)algo, (void)in, (void)keep_inputs, (void)who, (void)run;
  return SP_STATUS(StatusCode::kUnsupported, "seqpar was built without CUDA");
#else
  const AttnOptions& o = job.opt;
  const int me = comm.rank();
  const int64_t B = o.batch, H = o.heads, Hkv = job.kv_heads, D = o.head_dim, n = layout.local_len(me);
  const DType t = job.dtype;
  auto upload = [&](HostTensor& host) -> StatusOr<DeviceTensor> {
    auto dev = to_device(host);
    if (!keep_inputs) host = HostTensor();
    return dev;
  };
  SP_ASSIGN_OR_RETURN(DeviceTensor q, upload(in.q));
  SP_ASSIGN_OR_RETURN(DeviceTensor k, upload(in.k));
  SP_ASSIGN_OR_RETURN(DeviceTensor v, upload(in.v));
  SP_ASSIGN_OR_RETURN(DeviceTensor dout, upload(in.dout));
  SP_ASSIGN_OR_RETURN(DeviceTensor out, device_zeros(t, {B, n, H, D}));
  SP_ASSIGN_OR_RETURN(DeviceTensor lse, device_zeros(DType::kF32, {B, H, n}));
  SP_ASSIGN_OR_RETURN(DeviceTensor dq, device_zeros(t, {B, n, H, D}));
  SP_ASSIGN_OR_RETURN(DeviceTensor dk, device_zeros(t, {B, n, Hkv, D}));
  SP_ASSIGN_OR_RETURN(DeviceTensor dv, device_zeros(t, {B, n, Hkv, D}));
  SessionOptions session_options{plan_options(job, algo)};
  session_options.max_call_rows = o.max_call_rows;
  Session session(comm, session_options);  // "auto" on sm_90, else cuDNN where it takes the problem, else ours
  SP_ASSIGN_OR_RETURN(const AttentionPlan* plan, session.plan(layout, params, q.view, k.view));
  run->plan = *plan;
  run->backend = plan->backend->name();
  cudaStream_t stream = nullptr;  // a stream of our own, ordered only by explicit events
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
    return SP_STATUS(StatusCode::kInternal, "cannot create a CUDA stream");
  struct StreamOwner {
    cudaStream_t s;
    ~StreamOwner() {
      if (!device_abandoned()) (void)cudaStreamDestroy(s);
    }
  } owner{stream};
  // The uploads and zeroing above ran on the legacy stream, which ours does not wait for.
  if (cudaDeviceSynchronize() != cudaSuccess) return SP_STATUS(StatusCode::kInternal, "CUDA error while preparing the inputs");
  const ShardTensors st{q.view, k.view, v.view, out.view, lse.view, dout.view, dq.view, dk.view, dv.view};
  SP_RETURN_IF_ERROR(comm.barrier());
  auto t0 = Clock::now();
  ForwardState kept;  // what --keep-forward-state plans keep between the passes
  SP_RETURN_IF_ERROR(session.run(*plan, Pass::kForward, st, {stream, &kept, &run->fwd_stats}));
  SP_RETURN_IF_ERROR(comm.synchronize(stream));
  run->times[0] = seconds_since(t0);
  SP_RETURN_IF_ERROR(comm.barrier());
  if (me == 0) progress(who + "running backward");
  // Fault injection for the failure tests: this rank stops here, as if it hung.
  if (const char* stall = std::getenv("SEQPAR_FAULT_STALL_RANK"); stall && std::atoi(stall) == me) {
    progress("rank " + std::to_string(me) + " stalling (SEQPAR_FAULT_STALL_RANK)");
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  t0 = Clock::now();
  SP_RETURN_IF_ERROR(session.run(*plan, Pass::kBackward, st, {stream, &kept}));
  SP_RETURN_IF_ERROR(comm.synchronize(stream));
  run->times[1] = seconds_since(t0);
  run->backend_calls = plan->backend->calls_by_backend();
  SP_ASSIGN_OR_RETURN(run->out, to_host(out.view));
  SP_ASSIGN_OR_RETURN(run->lse, to_host(lse.view));
  SP_ASSIGN_OR_RETURN(run->dq, to_host(dq.view));
  SP_ASSIGN_OR_RETURN(run->dk, to_host(dk.view));
  SP_ASSIGN_OR_RETURN(run->dv, to_host(dv.view));
  return Status::Ok();
#endif
}

}  // namespace seqpar::app
