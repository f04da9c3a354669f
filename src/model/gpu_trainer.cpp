// The GPU trainer (include/seqpar/gpu_trainer.hpp): one rank's layer loop on the device, in the
// order of the CPU model's (src/model/transformer.cpp), with the layers' CUDA halves and the GPU
// executor for attention. Activations are device buffers a policy keeps or drops per layer.
#include "seqpar/gpu_trainer.hpp"

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <map>

#include "core/cuda_check.hpp"
#include "model/checkpoint_file.hpp"
#include "model/layers_cuda.hpp"
#include "seqpar/gpu.hpp"
#include "seqpar/session.hpp"

namespace seqpar {
namespace {

namespace cu = model::cuda;
using Half = model::cuda::bf16_t;  // bf16 storage

// Device buffers kept for reuse while a trainer steps: a step asks for the same sizes in every
// layer and every step, so after the first step nothing is allocated or freed (cudaFree waits for
// the whole device). Reuse needs no synchronisation: every user is on the trainer's one stream.
class BufferPool {
 public:
  StatusOr<DeviceBuffer> take(size_t bytes) {
    auto it = free_.lower_bound(bytes);
    if (it != free_.end() && it->first <= bytes + bytes / 8) {  // at most an eighth to spare
      DeviceBuffer b = std::move(it->second);
      free_.erase(it);
      return b;
    }
    return DeviceBuffer::allocate(bytes);
  }
  void give(DeviceBuffer b) {
    if (b.data()) free_.emplace(b.bytes(), std::move(b));
  }

 private:
  std::multimap<size_t, DeviceBuffer> free_;
};
// The pool of the trainer stepping on this thread (a rank is a thread); none: plain allocations.
thread_local BufferPool* current_pool = nullptr;

// A typed device array, returned to the pool it came from when it goes.
template <class T>
struct Buf {
  DeviceBuffer b;
  int64_t n = 0;
  BufferPool* pool = nullptr;

  Buf() = default;
  Buf(Buf&& other) noexcept : b(std::move(other.b)), n(other.n), pool(other.pool) { other.pool = nullptr; }
  Buf& operator=(Buf&& other) noexcept {
    if (this != &other) {
      release();
      b = std::move(other.b), n = other.n, pool = other.pool;
      other.pool = nullptr;
    }
    return *this;
  }
  ~Buf() { release(); }
  void release() {
    if (pool) pool->give(std::move(b));
    b = DeviceBuffer();
    pool = nullptr;
  }
  T* p() const { return static_cast<T*>(b.data()); }
  static StatusOr<Buf> make(int64_t count) {
    Buf x;
    x.n = count;
    const size_t bytes = size_t(std::max<int64_t>(1, count)) * sizeof(T);
    if (current_pool) {
      SP_ASSIGN_OR_RETURN(x.b, current_pool->take(bytes));
      x.pool = current_pool;
    } else {
      SP_ASSIGN_OR_RETURN(x.b, DeviceBuffer::allocate(bytes));
    }
    return x;
  }
};

// A layer's activations on the device (what the backward reads).
struct Acts {
  Buf<float> x_in, rstd1, lse, x_mid, rstd2;
  Buf<Half> h1, q, k, v, o, h2, g, u;
  Buf<Half> o_late;      // sequence policy: O of the shard's second half
  Buf<float> lse_late;   // and its LSE
};

// `height` rows of `width` bytes from src (rows `spitch` apart) to dst (`dpitch` apart).
Status copy_rows(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height, cudaStream_t s) {
  if (width == 0 || height == 0) return Status::Ok();
  SP_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDeviceToDevice, s));
  return Status::Ok();
}

}  // namespace

struct GpuTrainer::Impl {
  BufferPool pool;  // first: destroyed after every buffer that returns to it
  TrainOptions o;
  Communicator& comm;
  std::unique_ptr<TrainingData> data;
  std::unique_ptr<Session> session;  // the attention's backend, plans and workspace
  const AttentionPlan* plan = nullptr;
  const AttentionPlan* early_plan = nullptr;  // sequence policy: the sequence's first half
  cudaStream_t s = nullptr;
  int device = 0;
  std::vector<ParamInfo> table;
  int64_t count = 0, steps = 0, adam_steps = 0;
  Buf<float> master, grads, m, v;
  Buf<Half> w16;
  Buf<int64_t> positions;
  std::vector<std::vector<int32_t>> last_inputs, last_targets;
  // The model's shape this step.
  int64_t B = 0, S = 0, rows = 0, hid = 0, H = 0, Hkv = 0, D = 0, F = 0;

  Impl(const TrainOptions& options, Communicator& c) : o(options), comm(c) {}
  ~Impl() {
    if (s && !device_abandoned()) (void)forget_stream_arenas(s), (void)cudaStreamDestroy(s);
  }

  // Offsets of layer l's tensors (parameter_table order: n1, q, k, v, o, n2, gate, up, down).
  int64_t at(int64_t l, int which) const { return table[size_t(1 + l * 9 + which)].offset; }
  int64_t embed_at() const { return table.front().offset; }
  int64_t final_at() const { return table[size_t(1 + o.model.layers * 9)].offset; }
  int64_t head_at() const { return o.model.tied ? embed_at() : table.back().offset; }
  const Half* w(int64_t offset) const { return w16.p() + offset; }
  float* dw(int64_t offset) const { return grads.p() + offset; }

  TensorView view(Half* p, std::initializer_list<int64_t> shape) const {
    return TensorView::contiguous(p, DType::kBF16, shape, Device{DeviceKind::kCuda, device});
  }
  TensorView view(float* p, std::initializer_list<int64_t> shape) const {
    return TensorView::contiguous(p, DType::kF32, shape, Device{DeviceKind::kCuda, device});
  }

  enum class Attn { kRun, kKept, kFirstHalf };

  // Sequence policy (BurstEngine's): the attention of the shard's first half alone (under the
  // striped layout, the sequence's first half, which sees no key beyond it) into a.o and a.lse,
  // the second half from a.o_late and a.lse_late.
  Status first_half_attention(Acts& a) {
    const int64_t half = S / 2, late = S - half;
    const size_t q_row = size_t(H * D) * 2, kv_row = size_t(Hkv * D) * 2;
    SP_ASSIGN_OR_RETURN(Buf<Half> q, Buf<Half>::make(B * half * H * D));
    SP_ASSIGN_OR_RETURN(Buf<Half> k, Buf<Half>::make(B * half * Hkv * D));
    SP_ASSIGN_OR_RETURN(Buf<Half> v, Buf<Half>::make(B * half * Hkv * D));
    SP_ASSIGN_OR_RETURN(Buf<Half> oh, Buf<Half>::make(B * half * H * D));
    SP_ASSIGN_OR_RETURN(Buf<float> lh, Buf<float>::make(B * H * half));
    SP_RETURN_IF_ERROR(copy_rows(q.p(), half * q_row, a.q.p(), S * q_row, half * q_row, size_t(B), s));
    SP_RETURN_IF_ERROR(copy_rows(k.p(), half * kv_row, a.k.p(), S * kv_row, half * kv_row, size_t(B), s));
    SP_RETURN_IF_ERROR(copy_rows(v.p(), half * kv_row, a.v.p(), S * kv_row, half * kv_row, size_t(B), s));
    const ShardTensors t{view(q.p(), {B, half, H, D}), view(k.p(), {B, half, Hkv, D}), view(v.p(), {B, half, Hkv, D}),
                         view(oh.p(), {B, half, H, D}), view(lh.p(), {B, H, half}),    {}, {}, {}, {}};
    SP_RETURN_IF_ERROR(session->run(*early_plan, Pass::kForward, t, {s}));
    SP_ASSIGN_OR_RETURN(a.o, Buf<Half>::make(rows * H * D));
    SP_ASSIGN_OR_RETURN(a.lse, Buf<float>::make(B * H * S));
    char* o = reinterpret_cast<char*>(a.o.p());
    SP_RETURN_IF_ERROR(copy_rows(o, S * q_row, oh.p(), half * q_row, half * q_row, size_t(B), s));
    SP_RETURN_IF_ERROR(copy_rows(o + half * q_row, S * q_row, a.o_late.p(), late * q_row, late * q_row, size_t(B), s));
    char* l = reinterpret_cast<char*>(a.lse.p());
    SP_RETURN_IF_ERROR(copy_rows(l, S * 4, lh.p(), half * 4, half * 4, size_t(B * H), s));
    SP_RETURN_IF_ERROR(copy_rows(l + half * 4, S * 4, a.lse_late.p(), late * 4, late * 4, size_t(B * H), s));
    a.o_late = {}, a.lse_late = {};  // back to the pool: reuse comes later on this stream
    return Status::Ok();
  }
  Status layer_forward(int64_t l, Acts& a, Buf<float>& x_out, Attn attention) {
    void* st = s;
    SP_ASSIGN_OR_RETURN(a.h1, Buf<Half>::make(rows * hid));
    SP_ASSIGN_OR_RETURN(a.rstd1, Buf<float>::make(rows));
    SP_RETURN_IF_ERROR(cu::rmsnorm_forward(a.x_in.p(), w(at(l, 0)), a.h1.p(), a.rstd1.p(), rows, hid, o.model.norm_eps, st));
    SP_ASSIGN_OR_RETURN(a.q, Buf<Half>::make(rows * H * D));
    SP_ASSIGN_OR_RETURN(a.k, Buf<Half>::make(rows * Hkv * D));
    SP_ASSIGN_OR_RETURN(a.v, Buf<Half>::make(rows * Hkv * D));
    SP_RETURN_IF_ERROR(cu::linear_forward(a.h1.p(), w(at(l, 1)), a.q.p(), rows, hid, H * D, st));
    SP_RETURN_IF_ERROR(cu::linear_forward(a.h1.p(), w(at(l, 2)), a.k.p(), rows, hid, Hkv * D, st));
    SP_RETURN_IF_ERROR(cu::linear_forward(a.h1.p(), w(at(l, 3)), a.v.p(), rows, hid, Hkv * D, st));
    SP_RETURN_IF_ERROR(cu::rope_apply(a.q.p(), positions.p(), B, S, H, D, o.model.rope_theta, false, st));
    SP_RETURN_IF_ERROR(cu::rope_apply(a.k.p(), positions.p(), B, S, Hkv, D, o.model.rope_theta, false, st));
    if (attention == Attn::kFirstHalf) SP_RETURN_IF_ERROR(first_half_attention(a));
    if (attention == Attn::kRun) {
      SP_ASSIGN_OR_RETURN(a.o, Buf<Half>::make(rows * H * D));
      SP_ASSIGN_OR_RETURN(a.lse, Buf<float>::make(B * H * S));
      const ShardTensors t{view(a.q.p(), {B, S, H, D}), view(a.k.p(), {B, S, Hkv, D}), view(a.v.p(), {B, S, Hkv, D}),
                           view(a.o.p(), {B, S, H, D}), view(a.lse.p(), {B, H, S}),    {}, {}, {}, {}};
      SP_RETURN_IF_ERROR(session->run(*plan, Pass::kForward, t, {s}));
    }
    SP_ASSIGN_OR_RETURN(a.x_mid, Buf<float>::make(rows * hid));
    SP_CUDA_CHECK(cudaMemcpyAsync(a.x_mid.p(), a.x_in.p(), size_t(rows * hid) * 4, cudaMemcpyDeviceToDevice, s));
    SP_RETURN_IF_ERROR(cu::linear_forward_add(a.o.p(), w(at(l, 4)), a.x_mid.p(), rows, H * D, hid, st));
    SP_ASSIGN_OR_RETURN(a.h2, Buf<Half>::make(rows * hid));
    SP_ASSIGN_OR_RETURN(a.rstd2, Buf<float>::make(rows));
    SP_RETURN_IF_ERROR(cu::rmsnorm_forward(a.x_mid.p(), w(at(l, 5)), a.h2.p(), a.rstd2.p(), rows, hid, o.model.norm_eps, st));
    SP_ASSIGN_OR_RETURN(a.g, Buf<Half>::make(rows * F));
    SP_ASSIGN_OR_RETURN(a.u, Buf<Half>::make(rows * F));
    SP_RETURN_IF_ERROR(cu::linear_forward(a.h2.p(), w(at(l, 6)), a.g.p(), rows, hid, F, st));
    SP_RETURN_IF_ERROR(cu::linear_forward(a.h2.p(), w(at(l, 7)), a.u.p(), rows, hid, F, st));
    SP_ASSIGN_OR_RETURN(Buf<Half> act, Buf<Half>::make(rows * F));
    SP_RETURN_IF_ERROR(cu::swiglu_forward(a.g.p(), a.u.p(), act.p(), rows * F, st));
    SP_CUDA_CHECK(cudaMemcpyAsync(x_out.p(), a.x_mid.p(), size_t(rows * hid) * 4, cudaMemcpyDeviceToDevice, s));
    SP_RETURN_IF_ERROR(cu::linear_forward_add(act.p(), w(at(l, 8)), x_out.p(), rows, F, hid, st));
    return Status::Ok();
  }

  // dx: the gradient at the layer's output in, at its input out (fp32).
  Status layer_backward(int64_t l, Acts& a, Buf<float>& dx) {
    void* st = s;
    SP_ASSIGN_OR_RETURN(Buf<Half> dx16, Buf<Half>::make(rows * hid));
    SP_ASSIGN_OR_RETURN(Buf<Half> act, Buf<Half>::make(rows * F));
    SP_ASSIGN_OR_RETURN(Buf<float> dact, Buf<float>::make(rows * F));
    SP_ASSIGN_OR_RETURN(Buf<Half> dg, Buf<Half>::make(rows * F));
    SP_ASSIGN_OR_RETURN(Buf<Half> du, Buf<Half>::make(rows * F));
    SP_ASSIGN_OR_RETURN(Buf<float> dh, Buf<float>::make(rows * hid));
    // MLP: x_out = x_mid + down(silu(g) * u).
    SP_RETURN_IF_ERROR(cu::swiglu_forward(a.g.p(), a.u.p(), act.p(), rows * F, st));
    SP_RETURN_IF_ERROR(cu::to_bf16(dx.p(), dx16.p(), rows * hid, st));
    SP_RETURN_IF_ERROR(cu::linear_backward(act.p(), w(at(l, 8)), dx16.p(), dact.p(), dw(at(l, 8)), rows, F, hid, false, st));
    SP_RETURN_IF_ERROR(cu::swiglu_backward(a.g.p(), a.u.p(), dact.p(), dg.p(), du.p(), rows * F, st));
    SP_RETURN_IF_ERROR(cu::linear_backward(a.h2.p(), w(at(l, 6)), dg.p(), dh.p(), dw(at(l, 6)), rows, hid, F, false, st));
    SP_RETURN_IF_ERROR(cu::linear_backward(a.h2.p(), w(at(l, 7)), du.p(), dh.p(), dw(at(l, 7)), rows, hid, F, true, st));
    SP_RETURN_IF_ERROR(cu::rmsnorm_backward(a.x_mid.p(), w(at(l, 5)), a.rstd2.p(), dh.p(), dx.p(), dw(at(l, 5)), rows, hid, st));
    // Attention: x_mid = x_in + o_proj(attention(q, k, v)).
    SP_ASSIGN_OR_RETURN(Buf<float> dout32, Buf<float>::make(rows * H * D));
    SP_ASSIGN_OR_RETURN(Buf<Half> dout, Buf<Half>::make(rows * H * D));
    SP_ASSIGN_OR_RETURN(Buf<Half> dq, Buf<Half>::make(rows * H * D));
    SP_ASSIGN_OR_RETURN(Buf<Half> dk, Buf<Half>::make(rows * Hkv * D));
    SP_ASSIGN_OR_RETURN(Buf<Half> dv, Buf<Half>::make(rows * Hkv * D));
    SP_RETURN_IF_ERROR(cu::to_bf16(dx.p(), dx16.p(), rows * hid, st));
    SP_RETURN_IF_ERROR(cu::linear_backward(a.o.p(), w(at(l, 4)), dx16.p(), dout32.p(), dw(at(l, 4)), rows, H * D, hid, false, st));
    SP_RETURN_IF_ERROR(cu::to_bf16(dout32.p(), dout.p(), rows * H * D, st));
    const ShardTensors t{view(a.q.p(), {B, S, H, D}),   view(a.k.p(), {B, S, Hkv, D}), view(a.v.p(), {B, S, Hkv, D}),
                         view(a.o.p(), {B, S, H, D}),   view(a.lse.p(), {B, H, S}),    view(dout.p(), {B, S, H, D}),
                         view(dq.p(), {B, S, H, D}),    view(dk.p(), {B, S, Hkv, D}),  view(dv.p(), {B, S, Hkv, D})};
    SP_RETURN_IF_ERROR(session->run(*plan, Pass::kBackward, t, {s}));
    SP_RETURN_IF_ERROR(cu::rope_apply(dq.p(), positions.p(), B, S, H, D, o.model.rope_theta, true, st));
    SP_RETURN_IF_ERROR(cu::rope_apply(dk.p(), positions.p(), B, S, Hkv, D, o.model.rope_theta, true, st));
    SP_RETURN_IF_ERROR(cu::linear_backward(a.h1.p(), w(at(l, 1)), dq.p(), dh.p(), dw(at(l, 1)), rows, hid, H * D, false, st));
    SP_RETURN_IF_ERROR(cu::linear_backward(a.h1.p(), w(at(l, 2)), dk.p(), dh.p(), dw(at(l, 2)), rows, hid, Hkv * D, true, st));
    SP_RETURN_IF_ERROR(cu::linear_backward(a.h1.p(), w(at(l, 3)), dv.p(), dh.p(), dw(at(l, 3)), rows, hid, Hkv * D, true, st));
    SP_RETURN_IF_ERROR(cu::rmsnorm_backward(a.x_in.p(), w(at(l, 0)), a.rstd1.p(), dh.p(), dx.p(), dw(at(l, 0)), rows, hid, st));
    return Status::Ok();
  }

  Status keep_for_policy(Acts& a) {
    if (o.checkpointing == Checkpointing::kNone) return Status::Ok();
    Acts kept;
    kept.x_in = std::move(a.x_in);
    if (o.checkpointing == Checkpointing::kAttention) kept.o = std::move(a.o), kept.lse = std::move(a.lse);
    if (o.checkpointing == Checkpointing::kSequence) {  // the second half of O and LSE
      const int64_t half = S / 2, late = S - half;
      const size_t q_row = size_t(H * D) * 2;
      SP_ASSIGN_OR_RETURN(kept.o_late, Buf<Half>::make(B * late * H * D));
      SP_ASSIGN_OR_RETURN(kept.lse_late, Buf<float>::make(B * H * late));
      SP_RETURN_IF_ERROR(copy_rows(kept.o_late.p(), late * q_row, reinterpret_cast<char*>(a.o.p()) + half * q_row,
                                   S * q_row, late * q_row, size_t(B), s));
      SP_RETURN_IF_ERROR(copy_rows(kept.lse_late.p(), late * 4, reinterpret_cast<char*>(a.lse.p()) + half * 4, S * 4,
                                   late * 4, size_t(B * H), s));
    }
    a = std::move(kept);
    return Status::Ok();
  }

  Status forward_backward(const std::vector<int32_t>& inputs, const std::vector<int32_t>& targets, double scale,
                          double* loss_sum) {
    void* st = s;
    SP_ASSIGN_OR_RETURN(Buf<int32_t> tok, Buf<int32_t>::make(rows));
    SP_ASSIGN_OR_RETURN(Buf<int32_t> tgt, Buf<int32_t>::make(rows));
    SP_RETURN_IF_ERROR(copy_bytes(tok.p(), inputs.data(), size_t(rows) * 4));
    SP_RETURN_IF_ERROR(copy_bytes(tgt.p(), targets.data(), size_t(rows) * 4));
    std::vector<Acts> kept(size_t(o.model.layers));
    SP_ASSIGN_OR_RETURN(Buf<float> x, Buf<float>::make(rows * hid));
    SP_RETURN_IF_ERROR(cu::embedding_forward(tok.p(), w(embed_at()), x.p(), rows, hid, st));
    for (int64_t l = 0; l < o.model.layers; ++l) {
      Acts& a = kept[size_t(l)];
      a.x_in = std::move(x);
      SP_ASSIGN_OR_RETURN(x, Buf<float>::make(rows * hid));
      SP_RETURN_IF_ERROR(layer_forward(l, a, x, Attn::kRun));
      SP_RETURN_IF_ERROR(keep_for_policy(a));
    }
    SP_ASSIGN_OR_RETURN(Buf<Half> hf, Buf<Half>::make(rows * hid));
    SP_ASSIGN_OR_RETURN(Buf<float> rstd_f, Buf<float>::make(rows));
    SP_ASSIGN_OR_RETURN(Buf<float> lse, Buf<float>::make(rows));
    SP_ASSIGN_OR_RETURN(Buf<float> row_loss, Buf<float>::make(rows));
    SP_RETURN_IF_ERROR(cu::rmsnorm_forward(x.p(), w(final_at()), hf.p(), rstd_f.p(), rows, hid, o.model.norm_eps, st));
    const int64_t chunk = o.lm_head_chunk > 0 ? o.lm_head_chunk : rows;
    SP_RETURN_IF_ERROR(cu::lm_head_loss_forward(hf.p(), w(head_at()), tgt.p(), rows, hid, o.model.vocab, chunk, lse.p(),
                                                row_loss.p(), st));
    {
      SP_ASSIGN_OR_RETURN(Buf<float> dhf, Buf<float>::make(rows * hid));
      SP_ASSIGN_OR_RETURN(Buf<float> dx, Buf<float>::make(rows * hid));
      SP_CUDA_CHECK(cudaMemsetAsync(dx.p(), 0, size_t(rows * hid) * 4, s));
      SP_RETURN_IF_ERROR(cu::lm_head_loss_backward(hf.p(), w(head_at()), tgt.p(), lse.p(), rows, hid, o.model.vocab, chunk,
                                                   scale, dhf.p(), dw(head_at()), st));
      SP_RETURN_IF_ERROR(cu::rmsnorm_backward(x.p(), w(final_at()), rstd_f.p(), dhf.p(), dx.p(), dw(final_at()), rows, hid, st));
      for (int64_t l = o.model.layers - 1; l >= 0; --l) {
        Acts& a = kept[size_t(l)];
        if (o.checkpointing != Checkpointing::kNone)  // recompute what the policy dropped
          SP_RETURN_IF_ERROR(layer_forward(l, a, x,
                                           o.checkpointing == Checkpointing::kAttention  ? Attn::kKept
                                           : o.checkpointing == Checkpointing::kSequence ? Attn::kFirstHalf
                                                                                         : Attn::kRun));
        SP_RETURN_IF_ERROR(layer_backward(l, a, dx));
        a = {};
      }
      SP_RETURN_IF_ERROR(cu::embedding_backward(tok.p(), dx.p(), dw(embed_at()), rows, hid, st));
      SP_RETURN_IF_ERROR(stream_synchronize(s));
    }
    std::vector<float> losses(static_cast<size_t>(rows));
    SP_RETURN_IF_ERROR(copy_bytes(losses.data(), row_loss.p(), size_t(rows) * 4));
    *loss_sum = 0;
    for (float l : losses) *loss_sum += l;
    return Status::Ok();
  }
};

GpuTrainer::GpuTrainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuTrainer::~GpuTrainer() = default;

StatusOr<std::unique_ptr<GpuTrainer>> GpuTrainer::create(const TrainOptions& options, Communicator& comm) {
  SP_CHECK_SUPPORTED(cuda_device_count() > 0, "GPU training needs a CUDA GPU; none is visible");
  SP_CHECK_SUPPORTED(options.data_parallel == 1 && options.zero_stage == 0,
                     "GPU training has no data-parallel groups or ZeRO yet (the CPU trainer has both)");
  SP_CHECK_ARG(options.lm_head_chunk >= 0, "the LM head's chunk must not be negative (0: all rows at once)");
  auto impl = std::make_unique<Impl>(options, comm);
  Impl& I = *impl;
  SP_CUDA_CHECK(cudaGetDevice(&I.device));
  reset_device_memory_peak(I.device);
  SP_CUDA_CHECK(cudaStreamCreateWithFlags(&I.s, cudaStreamNonBlocking));
  SP_ASSIGN_OR_RETURN(I.data, open_training_data(options));
  SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(options.layout, options.seq, comm.size()));
  const ModelConfig& c = options.model;
  I.B = options.batch, I.S = layout.local_len(comm.rank()), I.rows = I.B * I.S;
  I.hid = c.hidden, I.H = c.heads, I.Hkv = c.kv_heads, I.D = c.head_dim(), I.F = c.ffn;
  AttentionParams params;
  params.mask = MaskSpec::causal();
  const TensorView q_like = I.view(static_cast<Half*>(nullptr), {I.B, I.S, I.H, I.D});
  const TensorView k_like = I.view(static_cast<Half*>(nullptr), {I.B, I.S, I.Hkv, I.D});
  I.session = std::make_unique<Session>(comm, SessionOptions{options.plan_options()});
  SP_ASSIGN_OR_RETURN(I.plan, I.session->plan(layout, params, q_like, k_like));
  if (options.checkpointing == Checkpointing::kSequence) {  // as the CPU model (transformer.cpp)
    const int P = layout.ranks();
    SP_CHECK_SUPPORTED(layout.kind() == LayoutKind::kStriped && layout.seq_len() % (2 * P) == 0,
                       "sequence-level checkpointing needs the striped layout with the sequence a multiple of twice "
                       "the ranks (" + std::to_string(2 * P) + ")");
    SP_ASSIGN_OR_RETURN(const Layout early, Layout::create(LayoutKind::kStriped, layout.seq_len() / 2, P));
    const TensorView qh = I.view(static_cast<Half*>(nullptr), {I.B, I.S / 2, I.H, I.D});
    const TensorView kh = I.view(static_cast<Half*>(nullptr), {I.B, I.S / 2, I.Hkv, I.D});
    SP_ASSIGN_OR_RETURN(I.early_plan, I.session->plan(early, params, qh, kh));
  }
  I.table = parameter_table(c);
  I.count = parameter_count(c);
  std::vector<float> init(size_t(I.count));
  init_parameters(c, options.seed, init.data());
  SP_ASSIGN_OR_RETURN(I.master, Buf<float>::make(I.count));
  SP_ASSIGN_OR_RETURN(I.grads, Buf<float>::make(I.count));
  SP_ASSIGN_OR_RETURN(I.m, Buf<float>::make(I.count));
  SP_ASSIGN_OR_RETURN(I.v, Buf<float>::make(I.count));
  SP_ASSIGN_OR_RETURN(I.w16, Buf<Half>::make(I.count));
  SP_CUDA_CHECK(cudaMemset(I.m.p(), 0, size_t(I.count) * 4));
  SP_CUDA_CHECK(cudaMemset(I.v.p(), 0, size_t(I.count) * 4));
  SP_ASSIGN_OR_RETURN(I.positions, Buf<int64_t>::make(I.S));
  SP_RETURN_IF_ERROR(copy_bytes(I.positions.p(), layout.positions(comm.rank()).data(), size_t(I.S) * 8));
  auto trainer = std::unique_ptr<GpuTrainer>(new GpuTrainer(std::move(impl)));
  SP_RETURN_IF_ERROR(trainer->set_parameters(init));
  return trainer;
}

Status GpuTrainer::set_parameters(const std::vector<float>& params) {
  Impl& I = *impl_;
  SP_CHECK_ARG(int64_t(params.size()) == I.count, "the model has " + std::to_string(I.count) + " parameters, not " +
                                                      std::to_string(params.size()));
  SP_RETURN_IF_ERROR(copy_bytes(I.master.p(), params.data(), size_t(I.count) * 4));
  SP_RETURN_IF_ERROR(cu::to_bf16(I.master.p(), I.w16.p(), I.count, I.s));
  return stream_synchronize(I.s);
}

Status GpuTrainer::step(StepReport* report) {
  Impl& I = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  struct PoolScope {  // this step's buffers come from (and go back to) the trainer's pool
    explicit PoolScope(BufferPool* p) { current_pool = p; }
    ~PoolScope() { current_pool = nullptr; }
  } pool_scope(&I.pool);
  I.last_inputs.assign(size_t(I.o.batch), {});
  I.last_targets.assign(size_t(I.o.batch), {});
  double counted = 0;
  for (int64_t b = 0; b < I.o.batch; ++b) {
    I.data->next(&I.last_inputs[size_t(b)], &I.last_targets[size_t(b)]);
    for (int32_t t : I.last_targets[size_t(b)]) counted += t >= 0;
  }
  SP_CHECK_ARG(counted > 0, "the batch has no target to learn");
  const ShardBatch shard = shard_batch(I.plan->layout, I.comm.rank(), I.last_inputs, I.last_targets);
  const int64_t sent_before = I.comm.counters().sent(Phase::kForward) + I.comm.counters().sent(Phase::kBackward);
  SP_CUDA_CHECK(cudaMemsetAsync(I.grads.p(), 0, size_t(I.count) * 4, I.s));
  double loss_sum = 0;
  SP_RETURN_IF_ERROR(I.forward_backward(shard.inputs, shard.targets, 1.0 / counted, &loss_sum));
  report->bytes_sent = I.comm.counters().sent(Phase::kForward) + I.comm.counters().sent(Phase::kBackward) - sent_before;
  const PhaseScope other(I.comm, Phase::kOther);
  SP_RETURN_IF_ERROR(I.comm.all_reduce(&loss_sum, 1, DType::kF64, ReduceOp::kSum));
  SP_CHECK_ARG(std::isfinite(loss_sum), "the loss is not finite at step " + std::to_string(I.steps) +
                                            " (lower the learning rate); the parameters were not updated");
  report->loss = loss_sum / counted;
  if (I.comm.size() > 1 && I.comm.moves_device_buffers()) {
    // On the device, ordered on the trainer's stream: NCCL's all-reduce without a host wait,
    // or the ring between thread ranks sharing the GPU.
    SP_RETURN_IF_ERROR(
        I.comm.all_reduce(I.grads.p(), size_t(I.count), DType::kF32, ReduceOp::kSum, StreamOrder::on(I.s)));
  } else if (I.comm.size() > 1) {  // a host-only communicator: through host memory
    std::vector<float> host(size_t(I.count));
    SP_RETURN_IF_ERROR(stream_synchronize(I.s));
    SP_RETURN_IF_ERROR(copy_bytes(host.data(), I.grads.p(), host.size() * 4));
    SP_RETURN_IF_ERROR(I.comm.all_reduce(host.data(), host.size(), DType::kF32, ReduceOp::kSum));
    SP_RETURN_IF_ERROR(copy_bytes(I.grads.p(), host.data(), host.size() * 4));
  }
  SP_ASSIGN_OR_RETURN(Buf<double> sq, Buf<double>::make(1));
  SP_CUDA_CHECK(cudaMemsetAsync(sq.p(), 0, 8, I.s));
  SP_RETURN_IF_ERROR(cu::sum_of_squares(I.grads.p(), I.count, sq.p(), I.s));
  SP_RETURN_IF_ERROR(stream_synchronize(I.s));
  double sum_sq = 0;
  SP_RETURN_IF_ERROR(copy_bytes(&sum_sq, sq.p(), 8));
  const double norm = std::sqrt(sum_sq);
  SP_CHECK_ARG(std::isfinite(norm), "the gradient is not finite at step " + std::to_string(I.steps));
  const AdamWOptions& a = I.o.optimizer;
  const double clip = a.clip_norm > 0 && norm > a.clip_norm ? a.clip_norm / norm : 1.0;
  ++I.adam_steps;
  const double lr = learning_rate(a, I.steps);
  const double c1 = 1.0 - std::pow(a.beta1, double(I.adam_steps)), c2 = 1.0 - std::pow(a.beta2, double(I.adam_steps));
  for (const ParamInfo& p : I.table)
    SP_RETURN_IF_ERROR(cu::adamw_update(I.master.p() + p.offset, I.w16.p() + p.offset, I.grads.p() + p.offset,
                                        I.m.p() + p.offset, I.v.p() + p.offset, p.numel, lr, a.beta1, a.beta2, a.eps,
                                        p.decays ? a.weight_decay : 0.0, clip, c1, c2, I.s));
  SP_RETURN_IF_ERROR(stream_synchronize(I.s));
  report->grad_norm = norm;
  report->step = I.steps;
  report->lr = lr;
  report->tokens = I.o.batch * I.o.seq;
  report->activation_bytes = device_memory_stats(I.device).peak;
  ++I.steps;
  report->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::Ok();
}

int64_t GpuTrainer::steps_done() const { return impl_->steps; }

StatusOr<std::vector<float>> GpuTrainer::gather_parameters() const {
  std::vector<float> host(size_t(impl_->count));
  SP_RETURN_IF_ERROR(stream_synchronize(impl_->s));
  SP_RETURN_IF_ERROR(copy_bytes(host.data(), impl_->master.p(), host.size() * 4));
  return host;
}

StatusOr<std::vector<float>> GpuTrainer::last_gradient() const {
  std::vector<float> host(size_t(impl_->count));
  SP_RETURN_IF_ERROR(stream_synchronize(impl_->s));
  SP_RETURN_IF_ERROR(copy_bytes(host.data(), impl_->grads.p(), host.size() * 4));
  return host;
}

const std::vector<std::vector<int32_t>>& GpuTrainer::last_inputs() const { return impl_->last_inputs; }
const std::vector<std::vector<int32_t>>& GpuTrainer::last_targets() const { return impl_->last_targets; }
const AttentionPlan& GpuTrainer::attention_plan() const { return *impl_->plan; }
int64_t GpuTrainer::peak_device_bytes() const { return device_memory_stats(impl_->device).peak; }

// Every rank holds the whole state (no ZeRO on the GPU yet): rank 0 writes it.
Status GpuTrainer::save(const std::string& path) const {
  Impl& I = *impl_;
  model::TrainingState state;
  SP_ASSIGN_OR_RETURN(state.params, gather_parameters());
  for (auto [from, to] : {std::pair{&I.m, &state.first_moment}, {&I.v, &state.second_moment}}) {
    to->resize(size_t(I.count));
    SP_RETURN_IF_ERROR(copy_bytes(to->data(), from->p(), size_t(I.count) * 4));
  }
  state.steps = I.steps, state.optimizer_steps = I.adam_steps, state.data_position = I.data->position();
  SP_RETURN_IF_ERROR(I.comm.barrier());
  if (I.comm.rank() == 0) SP_RETURN_IF_ERROR(model::write_checkpoint(path, state));
  return I.comm.barrier();
}

Status GpuTrainer::load(const std::string& path) {
  Impl& I = *impl_;
  SP_ASSIGN_OR_RETURN(const model::TrainingState state, model::read_checkpoint(path, I.count));
  SP_RETURN_IF_ERROR(set_parameters(state.params));
  SP_RETURN_IF_ERROR(copy_bytes(I.m.p(), state.first_moment.data(), size_t(I.count) * 4));
  SP_RETURN_IF_ERROR(copy_bytes(I.v.p(), state.second_moment.data(), size_t(I.count) * 4));
  I.steps = state.steps, I.adam_steps = state.optimizer_steps;
  I.data->seek(state.data_position);
  return Status::Ok();
}

}  // namespace seqpar
