// The attention session (include/seqpar/session.hpp): the backend choice per device, the plan
// cache keyed by the whole problem, and the passes through the one executor (host memory here,
// CUDA stream buffers through the GPU entry points where CUDA is built).
#include "seqpar/session.hpp"

#include <map>

#ifdef SEQPAR_HAVE_CUDA
#include "parallel/gpu_executor.hpp"
#endif

namespace seqpar {
namespace {

// Everything a plan depends on besides the session's options: the layout (with the documents a
// documents layout was made for), the whole mask (its documents' offsets and its block pattern,
// by identity: patterns are immutable), the scale, the tensors' dims and dtypes, and the backend.
std::string problem_key(const Layout& layout, const AttentionParams& p, const TensorView& q, const TensorView& k,
                        const AttentionBackend& backend) {
  const MaskSpec& m = p.mask;
  std::string key = std::string(layout_name(layout.kind())) + "|" + std::to_string(layout.seq_len()) + "|" +
                    std::to_string(layout.ranks()) + "|" + q.shape_string() + dtype_name(q.dtype) + "|" +
                    k.shape_string() + "|" + std::to_string(p.scale) + "|" + std::to_string(m.window_left) + "," +
                    std::to_string(m.window_right) + "," + std::to_string(int(m.align)) + "|" + backend.name() + "|";
  for (int64_t offset : m.doc_offsets) key += std::to_string(offset) + ",";
  key += "|";  // the documents layout's shards follow the documents it was made for
  for (int64_t offset : layout.doc_offsets()) key += std::to_string(offset) + ",";
  if (m.block_pattern)
    key += "|" + m.block_pattern->name() + "@" + std::to_string(reinterpret_cast<uintptr_t>(m.block_pattern.get()));
  return key;
}

}  // namespace

struct Session::Impl {
  Impl(Communicator& c, SessionOptions o) : comm(c), options(std::move(o)) {}
  Communicator& comm;
  SessionOptions options;
  int device = -1;  // the GPU this session's device state lives on, once it has any
  std::unique_ptr<AttentionBackend> cudnn, cuda, forced;
  std::unique_ptr<AttentionBackend> chosen[2];  // "auto", D in the packs or O (nullptr off sm_90)
  bool chosen_made[2] = {false, false};
#ifdef SEQPAR_HAVE_CUDA
  std::unique_ptr<GpuWorkspace> workspace;
#endif
  std::map<std::string, AttentionPlan> plans;

  StatusOr<const AttentionBackend*> backend_for(const TensorView& q, const AttentionParams& params) {
    if (q.device.kind == DeviceKind::kCpu) return &cpu_kernel_backend();
    SP_CHECK_ARG(device < 0 || device == q.device.index,
                 "this session's GPU state lives on GPU " + std::to_string(device) + "; the tensors are on GPU " +
                     std::to_string(q.device.index));
    device = q.device.index;
    // SEQPAR_ATTN_BACKEND forces one backend (A/B runs), whatever the options prefer.
    SP_ASSIGN_OR_RETURN(const std::string forced_name, forced_gpu_backend());
    if (!forced_name.empty() && forced_name != "auto" && !options.deterministic) {
      if (!forced) forced = make_gpu_backend_named(forced_name, device, options.max_call_rows);
      SP_CHECK_SUPPORTED(forced != nullptr, "SEQPAR_ATTN_BACKEND=" + forced_name + ": this build or GPU lacks it");
      const std::string why_not = forced->supports(q, params);
      SP_CHECK_SUPPORTED(why_not.empty(), "SEQPAR_ATTN_BACKEND=" + forced_name + ": " + why_not);
      return forced.get();
    }
    // The fastest: per call among cuDNN, Hopper and our kernels on sm_90 devices.
    const bool forced_auto = forced_name == "auto" && !options.deterministic;
    if ((options.prefer_cudnn || forced_auto) && !options.deterministic) {
      const int o = q.ndim > 3 && auto_backward_from_o(q.shape[3]) ? 1 : 0;  // where the table puts cuDNN's backward first
      if (!chosen_made[o]) chosen[o] = make_auto_backend(device, options.max_call_rows, o == 1), chosen_made[o] = true;
      const std::string why_not = chosen[o] ? chosen[o]->supports(q, params) : "this build or GPU lacks it";
      if (why_not.empty()) return chosen[o].get();
      SP_CHECK_SUPPORTED(!forced_auto, "SEQPAR_ATTN_BACKEND=auto: " + why_not);
    }
    if (options.prefer_cudnn || options.deterministic) {
      if (!cudnn) cudnn = make_cudnn_backend(options.max_call_rows, options.deterministic);
      const std::string why_not = cudnn ? cudnn->supports(q, params) : "this build has no cuDNN";
      if (why_not.empty()) return cudnn.get();
      SP_CHECK_SUPPORTED(!options.deterministic, "a deterministic backward needs cuDNN, which refuses this problem: " +
                                                     why_not);
    }
    if (!cuda) cuda = make_cuda_backend();
    SP_CHECK_SUPPORTED(cuda != nullptr, "seqpar was built without CUDA: device tensors cannot be computed");
    const std::string why_not = cuda->supports(q, params);
    SP_CHECK_SUPPORTED(why_not.empty(), why_not);
    return cuda.get();
  }
};

Session::Session(Communicator& comm, SessionOptions options)
    : impl_(std::make_unique<Impl>(comm, std::move(options))) {}
Session::~Session() = default;

Communicator& Session::comm() const { return impl_->comm; }

StatusOr<const AttentionPlan*> Session::plan(const Layout& layout, const AttentionParams& params, const TensorView& q,
                                             const TensorView& k) {
  Impl& I = *impl_;
  SP_CHECK_ARG(q.ndim == 4 && k.ndim == 4, "q and k must be [B, S, H, D]; got q " + q.shape_string() + ", k " +
                                               k.shape_string());
  SP_ASSIGN_OR_RETURN(const AttentionBackend* backend, I.backend_for(q, params));
  const std::string key = problem_key(layout, params, q, k, *backend);
  auto found = I.plans.find(key);
  if (found != I.plans.end()) return &found->second;
  SP_ASSIGN_OR_RETURN(AttentionPlan made, plan_attention(I.options.plan, layout, params, block_bytes_for(q, k, *backend),
                                                         I.comm.rank(), *backend));
  if (I.plans.size() >= I.options.max_plans) I.plans.clear();
  return &I.plans.emplace(key, std::move(made)).first->second;
}

void Session::keep_choice(const AttentionPlan& plan) {
  PlanOptions& o = impl_->options.plan;
  o.algorithm = plan.algorithm->name;
  o.ulysses = plan.request.ulysses;
  o.ring_algorithm = plan.request.ring_algorithm;
}

Status Session::run(const AttentionPlan& plan, Pass pass, const ShardTensors& t, const PassOptions& o) {
  Impl& I = *impl_;
  if (t.q.device.kind == DeviceKind::kCpu)
    return pass == Pass::kForward ? run_forward_cpu(I.comm, plan, t, o.stats, o.state)
                                  : run_backward_cpu(I.comm, plan, t, o.stats, o.state);
#ifdef SEQPAR_HAVE_CUDA
  if (!I.workspace) I.workspace = std::make_unique<GpuWorkspace>(I.options.trace);
  return pass == Pass::kForward ? run_forward_gpu(I.comm, plan, t, *I.workspace, o.stream, o.stats, o.state)
                                : run_backward_gpu(I.comm, plan, t, *I.workspace, o.stream, o.stats, o.state);
#else
  return SP_STATUS(StatusCode::kUnsupported, "seqpar was built without CUDA: device tensors cannot be computed");
#endif
}

Status Session::forward(const Layout& layout, const AttentionParams& params, const ShardTensors& t,
                        const PassOptions& pass) {
  SP_ASSIGN_OR_RETURN(const AttentionPlan* p, plan(layout, params, t.q, t.k));
  return run(*p, Pass::kForward, t, pass);
}

Status Session::backward(const Layout& layout, const AttentionParams& params, const ShardTensors& t,
                         const PassOptions& pass) {
  SP_ASSIGN_OR_RETURN(const AttentionPlan* p, plan(layout, params, t.q, t.k));
  return run(*p, Pass::kBackward, t, pass);
}

StatusOr<std::vector<std::pair<std::string, double>>> Session::take_trace() {
#ifdef SEQPAR_HAVE_CUDA
  if (impl_->workspace) return impl_->workspace->take_trace();
#endif
  return std::vector<std::pair<std::string, double>>{};
}

}  // namespace seqpar
