// cuDNN SDPA adapter: maps our BSHD views and global-position masks onto cuDNN frontend
// graphs (dims [B, H, S, D] with our strides), builds each graph once, and executes it with
// a stream buffer for its workspace (gpu.hpp).
#include "kernels/cudnn/cudnn_attention.hpp"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cmath>
#include <map>
#include <memory>
#include <unordered_map>

#include "core/cuda_check.hpp"
#include "kernels/cpu/attention_common.hpp"
#include "kernels/cuda/flash_cuda.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar {
namespace {

namespace fe = cudnn_frontend;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDout, kDq, kDk, kDv };

#define SP_CUDNN_CHECK(expr)                                                        \
  do {                                                                              \
    const cudnnStatus_t sp_cudnn_status_ = (expr);                                  \
    if (sp_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                   \
      return SP_STATUS(StatusCode::kInternal, std::string(#expr) + " failed: " +    \
                                                  cudnnGetErrorString(sp_cudnn_status_)); \
  } while (0)

#define SP_FE_CHECK(expr)                                                                \
  do {                                                                                   \
    fe::error_t sp_fe_err_ = (expr);                                                     \
    if (!sp_fe_err_.is_good())                                                           \
      return SP_STATUS(StatusCode::kUnsupported, std::string("cuDNN: ") + #expr + ": " + \
                                                     sp_fe_err_.get_message());          \
  } while (0)

// Per thread and device: the handle, the built graphs, and the compact copies
// of long backward calls (backward_in_head_chunks).
struct DeviceContext {
  cudnnHandle_t handle = nullptr;
  std::unordered_map<std::string, std::shared_ptr<fe::graph::Graph>> graphs;
  DeviceBuffer compact;
  ~DeviceContext() {
    if (handle) cudnnDestroy(handle);
  }
};

// One thread's contexts. A thread that ends once the device is abandoned leaves them to the
// process's end: PyTorch joins its autograd threads from a static destructor, after cuDNN's own
// teardown, where cudnnDestroy crashed (SIGSEGV at exit under torchrun); the Python package
// abandons the device at interpreter exit for that reason.
struct ThreadContexts {
  std::map<int, std::unique_ptr<DeviceContext>> by_device;
  ~ThreadContexts() {
    if (!device_abandoned()) return;
    for (auto& entry : by_device) (void)entry.second.release();
  }
};

StatusOr<DeviceContext*> context_for_current_device() {
  thread_local ThreadContexts thread_contexts;
  auto& contexts = thread_contexts.by_device;
  int device = 0;
  SP_CUDA_CHECK(cudaGetDevice(&device));
  auto& ctx = contexts[device];
  if (!ctx) {
    ctx = std::make_unique<DeviceContext>();
    SP_CUDNN_CHECK(cudnnCreate(&ctx->handle));
  }
  return ctx.get();
}

fe::DataType_t fe_dtype(DType t) {
  return t == DType::kBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

// cuDNN sees [B, H, S, D]; ours is [B, S, H, D]: swap the middle strides.
std::vector<int64_t> bhsd_dims(const TensorView& t) { return {t.shape[0], t.shape[2], t.shape[1], t.shape[3]}; }
std::vector<int64_t> bhsd_strides(const TensorView& t) {
  return {t.strides[0], t.strides[2], t.strides[1], t.strides[3]};
}

std::string key_of(const char* pass, const std::vector<const TensorView*>& views,
                   const AttentionParams& p, double scale) {
  std::string key = pass;
  for (const TensorView* v : views) {
    key += '|' + std::to_string(int(v->dtype));
    for (int i = 0; i < v->ndim; ++i) key += ',' + std::to_string(v->shape[i]) + ':' + std::to_string(v->strides[i]);
  }
  key += "|m" + std::to_string(p.mask.window_left) + ',' + std::to_string(p.mask.window_right) + ',' +
         std::to_string(int(p.mask.align)) + "|s" + std::to_string(scale);
  return key;
}

template <class Attributes>
void apply_mask(const MaskSpec& mask, Attributes& attrs) {
  if (mask.window_left < 0 && mask.window_right < 0) return;
  attrs.set_diagonal_alignment(mask.align == MaskAlign::kBottomRight
                                   ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                   : fe::DiagonalAlignment_t::TOP_LEFT);
  // cuDNN keeps key column c of row r when c <= r + right_bound and c + left_bound > r, so
  // our "at most L before" is left_bound = L + 1.
  if (mask.window_right >= 0) attrs.set_diagonal_band_right_bound(int(mask.window_right));
  if (mask.window_left >= 0) attrs.set_diagonal_band_left_bound(int(mask.window_left + 1));
}

Status check_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                     const AttentionParams& params, cpu::AttentionDims* dims) {
  SP_CHECK_ARG(q.ndim == 4 && k.ndim == 4 && v.ndim == 4, "q, k, v must be [B, S, H, D]");
  const std::string reason = cudnn_attention_unsupported_reason(q, params);
  SP_CHECK_SUPPORTED(reason.empty(), reason);
  dims->batch = q.shape[0];
  dims->seq_q = q.shape[1];
  dims->heads = q.shape[2];
  dims->head_dim = q.shape[3];
  dims->seq_k = k.shape[1];
  dims->kv_heads = k.shape[2];
  SP_CHECK_ARG(dims->kv_heads > 0 && dims->heads % dims->kv_heads == 0,
               "query heads must be divisible by K/V heads");
  for (const TensorView* t : {&k, &v})
    SP_CHECK_ARG(t->dtype == q.dtype && t->shape[0] == dims->batch && t->shape[1] == dims->seq_k &&
                     t->shape[2] == dims->kv_heads && t->shape[3] == dims->head_dim &&
                     t->strides[3] == 1 && t->device.kind == DeviceKind::kCuda,
                 "k and v must be device [B, S_k, H_kv, D] tensors of q's dtype; got " +
                     t->shape_string());
  return Status::Ok();
}

Status check_lse(const TensorView& lse, const cpu::AttentionDims& d) {
  SP_CHECK_ARG(lse.ndim == 3 && lse.dtype == DType::kF32 && lse.shape[0] == d.batch &&
                   lse.shape[1] == d.heads && lse.shape[2] == d.seq_q && lse.is_contiguous() &&
                   lse.device.kind == DeviceKind::kCuda,
               "lse must be a contiguous device [B, H, S_q] fp32 tensor; got " + lse.shape_string());
  return Status::Ok();
}

Status check_like(const char* name, const TensorView& t, const TensorView& like) {
  SP_CHECK_ARG(t.same_shape(like) && t.dtype == like.dtype && t.strides[3] == 1 &&
                   t.device.kind == DeviceKind::kCuda,
               std::string(name) + " must be a device tensor shaped like " + like.shape_string() +
                   "; got " + t.shape_string());
  return Status::Ok();
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name,
                                                    Uid uid, const TensorView& t) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(bhsd_dims(t)).set_stride(bhsd_strides(t)));
}

// A graph with bf16/fp16 I/O and fp32 intermediates and compute.
std::shared_ptr<fe::graph::Graph> new_graph(DType io) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe_dtype(io))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

Status build(DeviceContext& ctx, fe::graph::Graph& graph) {
  SP_FE_CHECK(graph.validate());
  SP_FE_CHECK(graph.build_operation_graph(ctx.handle));
  SP_FE_CHECK(graph.create_execution_plans({fe::HeurMode_t::A}));
  SP_FE_CHECK(graph.check_support(ctx.handle));
  SP_FE_CHECK(graph.build_plans(ctx.handle));
  return Status::Ok();
}

Status execute(DeviceContext& ctx, fe::graph::Graph& graph,
               std::unordered_map<int64_t, void*>& pack, void* stream) {
  int64_t workspace = 0;
  SP_FE_CHECK(graph.get_workspace_size(workspace));
  // A stream buffer for this call: given back in stream order, its memory serves the blocks and
  // parts that follow (a backward's workspace holds an fp32 dQ of the call's rows).
  SP_ASSIGN_OR_RETURN(StreamBuffer space, StreamBuffer::allocate(size_t(std::max<int64_t>(workspace, 1)), stream));
  SP_CUDNN_CHECK(cudnnSetStream(ctx.handle, static_cast<cudaStream_t>(stream)));
  SP_FE_CHECK(graph.execute(ctx.handle, pack, space.data()));
  return Status::Ok();
}

double scale_of(const AttentionParams& p, int64_t head_dim) {
  return p.scale != 0.0 ? p.scale : 1.0 / std::sqrt(double(head_dim));
}

}  // namespace

std::string cudnn_attention_unsupported_reason(const TensorView& q, const AttentionParams& params) {
  if (q.dtype != DType::kBF16 && q.dtype != DType::kF16)
    return std::string("cuDNN attention runs bf16/fp16, not ") + dtype_name(q.dtype);
  if (q.device.kind != DeviceKind::kCuda) return "cuDNN attention needs device tensors";
  if (params.mask.has_documents()) return "the cuDNN backend does not take document masks";
  if (params.q_positions || params.k_positions)
    return "the cuDNN backend takes no explicit positions (only top-left/bottom-right alignment)";
  if (params.mask.window_left >= 0 && params.mask.window_right < 0)
    return "cuDNN needs a right bound with a left window (window:L,R with R >= 0)";
  if (q.ndim == 4 && (q.shape[3] % 8 != 0 || q.shape[3] > 256))
    return "cuDNN attention needs a head dim that is a multiple of 8, at most 256";
  return {};
}

Status cudnn_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const AttentionParams& params, const TensorView& o,
                               const TensorView& lse, void* stream) {
  cpu::AttentionDims d;
  SP_RETURN_IF_ERROR(check_problem(q, k, v, params, &d));
  SP_RETURN_IF_ERROR(check_like("o", o, q));
  SP_RETURN_IF_ERROR(check_lse(lse, d));
  SP_ASSIGN_OR_RETURN(DeviceContext * ctx, context_for_current_device());
  const double scale = scale_of(params, d.head_dim);
  const std::string key = key_of("fwd", {&q, &k, &v, &o}, params, scale);
  auto& graph = ctx->graphs[key];
  if (!graph) {
    auto g = new_graph(q.dtype);
    auto Q = input(*g, "Q", kQ, q), K = input(*g, "K", kK, k), V = input(*g, "V", kV, v);
    auto attrs = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(float(scale));
    apply_mask(params.mask, attrs);
    auto [O, Stats] = g->sdpa(Q, K, V, attrs);
    O->set_output(true).set_uid(kO).set_dim(bhsd_dims(o)).set_stride(bhsd_strides(o));
    Stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT)
        .set_dim({d.batch, d.heads, d.seq_q, 1}).set_stride({d.heads * d.seq_q, d.seq_q, 1, 1});
    SP_RETURN_IF_ERROR(build(*ctx, *g));
    graph = g;
  }
  std::unordered_map<int64_t, void*> pack{{kQ, q.data}, {kK, k.data}, {kV, v.data},
                                          {kO, o.data}, {kStats, lse.data}};
  return execute(*ctx, *graph, pack, stream);
}

namespace {

// One cuDNN backward graph over the views as they are (checked by the caller).
Status backward_call(DeviceContext* ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& o, const TensorView& dout, const TensorView& lse,
                     const AttentionParams& params, const TensorView& dq, const TensorView& dk,
                     const TensorView& dv, const cpu::AttentionDims& d, void* stream, bool deterministic) {
  const double scale = scale_of(params, d.head_dim);
  const std::string key = key_of(deterministic ? "bwd-deterministic" : "bwd", {&q, &k, &v, &o, &dout, &dq, &dk, &dv},
                                 params, scale);
  auto& graph = ctx->graphs[key];
  if (!graph) {
    auto g = new_graph(q.dtype);
    auto Q = input(*g, "Q", kQ, q), K = input(*g, "K", kK, k), V = input(*g, "V", kV, v);
    auto O = input(*g, "O", kO, o), dO = input(*g, "dO", kDout, dout);
    auto Stats = g->tensor(fe::graph::Tensor_attributes().set_name("Stats").set_uid(kStats)
                               .set_dim({d.batch, d.heads, d.seq_q, 1})
                               .set_stride({d.heads * d.seq_q, d.seq_q, 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("sdpa_backward")
                     .set_attn_scale(float(scale))
                     .set_deterministic_algorithm(deterministic);
    apply_mask(params.mask, attrs);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, attrs);
    dQ->set_output(true).set_uid(kDq).set_dim(bhsd_dims(dq)).set_stride(bhsd_strides(dq));
    dK->set_output(true).set_uid(kDk).set_dim(bhsd_dims(dk)).set_stride(bhsd_strides(dk));
    dV->set_output(true).set_uid(kDv).set_dim(bhsd_dims(dv)).set_stride(bhsd_strides(dv));
    SP_RETURN_IF_ERROR(build(*ctx, *g));
    graph = g;
  }
  std::unordered_map<int64_t, void*> pack{{kQ, q.data},     {kK, k.data},     {kV, v.data},
                                          {kO, o.data},     {kDout, dout.data}, {kStats, lse.data},
                                          {kDq, dq.data},   {kDk, dk.data},   {kDv, dv.data}};
  return execute(*ctx, *graph, pack, stream);
}

// cuDNN 9's backward (measured on an H200, tests/test_gpu_long.cpp CudnnLongCall) gives
// a wrong dQ from the first row with an element offset of 2^31 or more in its view: a head
// slice of [S, 32, 128] tensors goes wrong from row 524288 on (offsets from 2^31), while the
// same rows of a compact slice come out right. Such calls (the single-GPU run of a 1M-token
// problem; a 655K-row zigzag chunk of a 2.6M-token problem on two GPUs) run here instead: per
// chunk of K/V heads, every view with offsets past 2^31 - 1 goes through a compact copy (O(S)
// bytes against the call's O(S^2) work). The forward was measured right on such views.
constexpr int64_t kCudnnMaxSpan = int64_t(1) << 31;  // elements a view may span (offsets < 2^31)

Status backward_in_head_chunks(DeviceContext* ctx, const TensorView& q, const TensorView& k,
                               const TensorView& v, const TensorView& o, const TensorView& dout,
                               const TensorView& lse, const AttentionParams& params,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               const cpu::AttentionDims& d, void* stream, bool deterministic) {
  const int64_t B = d.batch, ratio = d.heads / d.kv_heads, D = d.head_dim;
  // K/V heads per chunk: the fewest chunks whose compact copies stay within the limit, of
  // equal size (two chunks of 16 heads rather than 31 and 1).
  const int64_t per_kv_head = std::max<int64_t>(1, std::max(B * d.seq_q * ratio, B * d.seq_k) * D);
  const int64_t widest = std::min(d.kv_heads, kCudnnMaxSpan / per_kv_head);
  SP_CHECK_SUPPORTED(widest >= 1, "cuDNN's backward cannot address one head of this call (" +
                                      std::to_string(per_kv_head) +
                                      " elements, 2^31 at most): split the sequence over more ranks");
  const int64_t chunks = (d.kv_heads + widest - 1) / widest, chunk = (d.kv_heads + chunks - 1) / chunks;
  const auto s = static_cast<cudaStream_t>(stream);
  const size_t esize = dtype_size(q.dtype);
  const auto aligned = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  const size_t q_bytes = aligned(size_t(B * d.seq_q * chunk * ratio * D) * esize);
  const size_t k_bytes = aligned(size_t(B * d.seq_k * chunk * D) * esize);
  const size_t lse_bytes = aligned(size_t(B * chunk * ratio * d.seq_q) * sizeof(float));
  struct Operand {
    const TensorView* view;
    bool q_side, input;
    char* copy = nullptr;  // its compact copy's place, when it needs one
  };
  Operand ops[8] = {{&q, true, true},  {&o, true, true},  {&dout, true, true}, {&dq, true, false},
                    {&k, false, true}, {&v, false, true}, {&dk, false, false}, {&dv, false, false}};
  const auto slice = [&](const Operand& op, int64_t first, int64_t n) {  // K/V heads [first, first + n)
    return op.q_side ? op.view->narrow(2, first * ratio, (first + n) * ratio) : op.view->narrow(2, first, first + n);
  };
  // A span depends on shape and strides alone: the first chunk, the widest, says which
  // operands need copies. Their places follow the LSE copy's in one buffer (so no offset of
  // an operand's copy is 0).
  size_t offsets[8] = {}, bytes = lse_bytes;
  for (int i = 0; i < 8; ++i)
    if (slice(ops[i], 0, chunk).span_elements() > kCudnnMaxSpan) {
      offsets[i] = bytes;
      bytes += ops[i].q_side ? q_bytes : k_bytes;
    }
  SP_RETURN_IF_ERROR(ctx->compact.reserve(bytes));
  char* const base = static_cast<char*>(ctx->compact.data());
  float* lse_copy = reinterpret_cast<float*>(base);
  for (int i = 0; i < 8; ++i)
    if (offsets[i]) ops[i].copy = base + offsets[i];

  for (int64_t first = 0; first < d.kv_heads; first += chunk) {
    const int64_t n = std::min(chunk, d.kv_heads - first), nq = n * ratio;
    // The chunk's views: copies in place of the long ones (inputs copied in now, outputs
    // copied out after the call).
    TensorView views[8];
    std::vector<std::pair<TensorView, TensorView>> outputs;  // (copy, destination)
    for (int i = 0; i < 8; ++i) {
      const TensorView part = slice(ops[i], first, n);
      if (!ops[i].copy) {
        views[i] = part;
        continue;
      }
      views[i] = TensorView::contiguous(ops[i].copy, part.dtype,
                                        std::vector<int64_t>(part.shape.begin(), part.shape.begin() + 4), part.device);
      if (ops[i].input) SP_RETURN_IF_ERROR(flash_cast(part, views[i], stream));
      else outputs.emplace_back(views[i], part);
    }
    // The chunk's LSE rows, [B, nq, S_q] (a head slice of [B, H, S_q] is strided when B > 1).
    SP_CUDA_CHECK(cudaMemcpy2DAsync(lse_copy, size_t(nq * d.seq_q) * sizeof(float),
                                    static_cast<const float*>(lse.data) + first * ratio * d.seq_q,
                                    size_t(d.heads * d.seq_q) * sizeof(float), size_t(nq * d.seq_q) * sizeof(float),
                                    size_t(B), cudaMemcpyDeviceToDevice, s));
    const TensorView lsec =
        TensorView::contiguous(lse_copy, DType::kF32, std::vector<int64_t>{B, nq, d.seq_q}, lse.device);
    cpu::AttentionDims dc = d;
    dc.heads = nq;
    dc.kv_heads = n;
    SP_RETURN_IF_ERROR(backward_call(ctx, views[0], views[4], views[5], views[1], views[2], lsec, params, views[3],
                                     views[6], views[7], dc, stream, deterministic));
    for (const auto& [copy, destination] : outputs) SP_RETURN_IF_ERROR(flash_cast(copy, destination, stream));
  }
  return Status::Ok();
}

}  // namespace

Status cudnn_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& o, const TensorView& dout,
                                const TensorView& lse, const AttentionParams& params,
                                const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                void* stream, bool deterministic) {
  cpu::AttentionDims d;
  SP_RETURN_IF_ERROR(check_problem(q, k, v, params, &d));
  SP_RETURN_IF_ERROR(check_like("o", o, q));
  SP_RETURN_IF_ERROR(check_like("dout", dout, q));
  SP_RETURN_IF_ERROR(check_like("dq", dq, q));
  SP_RETURN_IF_ERROR(check_like("dk", dk, k));
  SP_RETURN_IF_ERROR(check_like("dv", dv, v));
  SP_RETURN_IF_ERROR(check_lse(lse, d));
  SP_ASSIGN_OR_RETURN(DeviceContext * ctx, context_for_current_device());
  for (const TensorView* t : {&q, &k, &v, &o, &dout, &dq, &dk, &dv})
    if (t->span_elements() > kCudnnMaxSpan)
      return backward_in_head_chunks(ctx, q, k, v, o, dout, lse, params, dq, dk, dv, d, stream, deterministic);
  return backward_call(ctx, q, k, v, o, dout, lse, params, dq, dk, dv, d, stream, deterministic);
}

Status cudnn_release_workspace() {
  SP_ASSIGN_OR_RETURN(DeviceContext* ctx, context_for_current_device());
  SP_CUDA_CHECK(cudaDeviceSynchronize());  // a call in flight may still use it
  ctx->compact = DeviceBuffer();
  return trim_stream_arenas();  // where the calls' workspaces were
}

}  // namespace seqpar
