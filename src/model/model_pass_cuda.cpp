// The model on a GPU: the CUDA half of the one layer pass (model/layer_pass.hpp), over the
// layers' CUDA halves (layers_cuda.hpp) on the training memory's stream. Mixed precision as the
// GPU engine keeps it: bf16 weights and products' inputs (Act); the residual stream, row
// statistics and gradients in fp32 (Acc). The attention goes through a Session on device tensors,
// a linear layer's token mixer through linear_attention_layer_cuda.hpp (LASP on device tensors).
#include <cuda_runtime.h>

#include "model/layer_pass.hpp"
#include "model/layers_cuda.hpp"
#include "model/linear_attention_layer_cuda.hpp"
#include "model/model_pass.hpp"
#include "model/step_profile.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar::model {
namespace {

namespace cu = cuda;
using Half = cuda::bf16_t;  // bf16 storage

class CudaLayers : public ProfiledDevice {
 public:
  using Weight = Half;
  using Act = Half;
  using Acc = float;
  struct Tokens {
    Array<int32_t> in, tg;
    const int32_t* inputs = nullptr;
    const int32_t* targets = nullptr;
  };
  struct LossParts {
    Array<float> row_loss;  // lse - logit[target] per counted row, 0 elsewhere
  };
  template <class X>
  static constexpr DType dtype() {
    return std::is_same_v<X, float> ? DType::kF32 : DType::kBF16;
  }

  CudaLayers(TrainingMemory& memory, Session& session, int device)
      : ProfiledDevice(memory.stream()), memory_(memory), session_(session), s_(memory.stream()), device_(device),
        mixer_(memory, Device{DeviceKind::kCuda, device}) {}
  TrainingMemory& memory() { return memory_; }
  Session& session() { return session_; }
  void* stream() const { return s_; }
  Device device() const { return Device{DeviceKind::kCuda, device_}; }
  Status set_positions(const std::vector<int64_t>& positions) {
    SP_ASSIGN_OR_RETURN(positions_, memory_.make<int64_t>(int64_t(positions.size())));
    return memory_.from_host(positions_.p(), positions.data(), positions.size() * sizeof(int64_t));
  }
  // The shard's positions (uploaded once), or this batch's per-row ones (packed documents).
  StatusOr<const int64_t*> positions(const ShardBatch& b) {
    if (b.rope_positions.empty()) return static_cast<const int64_t*>(positions_.p());
    SP_ASSIGN_OR_RETURN(row_positions_, memory_.make<int64_t>(int64_t(b.rope_positions.size())));
    SP_RETURN_IF_ERROR(memory_.from_host(row_positions_.p(), b.rope_positions.data(), b.rope_positions.size() * 8));
    return static_cast<const int64_t*>(row_positions_.p());
  }
  StatusOr<Tokens> tokens(const ShardBatch& b) {
    Tokens t;
    const int64_t rows = int64_t(b.inputs.size());
    SP_ASSIGN_OR_RETURN(t.in, memory_.make<int32_t>(rows));
    SP_ASSIGN_OR_RETURN(t.tg, memory_.make<int32_t>(rows));
    SP_RETURN_IF_ERROR(memory_.from_host(t.in.p(), b.inputs.data(), size_t(rows) * 4));
    SP_RETURN_IF_ERROR(memory_.from_host(t.tg.p(), b.targets.data(), size_t(rows) * 4));
    t.inputs = t.in.p(), t.targets = t.tg.p();
    return t;
  }

  Status embedding_forward(const int32_t* tokens, const Half* table, float* x, int64_t rows, int64_t dim) {
    const auto timed = time(Work::kEmbedding);
    return cu::embedding_forward(tokens, table, x, rows, dim, s_);
  }
  // host_tokens: the batch's (the rows are grouped by token on the host: no atomics).
  Status embedding_backward(const int32_t* host_tokens, const float* dx, float* dtable, int64_t rows, int64_t dim) {
    const auto timed = time(Work::kEmbedding);
    return cu::embedding_backward(host_tokens, dx, dtable, rows, dim, s_);
  }
  Status rmsnorm_forward(const float* x, const Half* w, Half* y, float* rstd, int64_t rows, int64_t dim, double eps) {
    const auto timed = time(Work::kNorms);
    return cu::rmsnorm_forward(x, w, y, rstd, rows, dim, eps, s_);
  }
  Status rmsnorm_backward(const float* x, const Half* w, const float* rstd, const float* dy, float* dx, float* dw,
                          int64_t rows, int64_t dim) {
    const auto timed = time(Work::kNorms);
    return cu::rmsnorm_backward(x, w, rstd, dy, dx, dw, rows, dim, s_);
  }
  Status linear_forward(const Half* x, const Half* w, Half* y, int64_t rows, int64_t in, int64_t out) {
    const auto timed = time(Work::kProducts);
    return cu::linear_forward(x, w, y, rows, in, out, s_);
  }
  Status linear_forward_add(const Half* x, const Half* w, float* y, int64_t rows, int64_t in, int64_t out) {
    const auto timed = time(Work::kProducts);
    return cu::linear_forward_add(x, w, y, rows, in, out, s_);
  }
  Status linear_backward(const Half* x, const Half* w, const Half* dy, float* dx, float* dw, int64_t rows, int64_t in,
                         int64_t out, bool accumulate_dx) {
    const auto timed = time(Work::kProducts);
    return cu::linear_backward(x, w, dy, dx, dw, rows, in, out, accumulate_dx, s_);
  }
  Status linear_backward_act(const Half* x, const Half* w, const Half* dy, Half* dx, float* dw, int64_t rows,
                             int64_t in, int64_t out) {
    const auto timed = time(Work::kProducts);
    return cu::linear_backward(x, w, dy, dx, dw, rows, in, out, s_);
  }
  Status rope_apply(Half* x, const int64_t* positions, int64_t B, int64_t S, int64_t H, int64_t D, double theta,
                    bool inverse) {
    const auto timed = time(Work::kRope);
    return cu::rope_apply(x, positions, B, S, H, D, theta, inverse, s_);
  }
  Status swiglu_forward(const Half* g, const Half* u, Half* a, int64_t n) {
    const auto timed = time(Work::kSwiglu);
    return cu::swiglu_forward(g, u, a, n, s_);
  }
  Status swiglu_backward(const Half* g, const Half* u, const Half* da, Half* dg, Half* du, int64_t n) {
    const auto timed = time(Work::kSwiglu);
    return cu::swiglu_backward(g, u, da, dg, du, n, s_);
  }
  // The loss, and with dx and dw (else null) its gradient in the same pass.
  Status lm_head(const Half* x, const Half* w, const int32_t* targets, int64_t rows, int64_t dim, int64_t vocab,
                 int64_t chunk, LossParts* parts, double scale, float* dx, float* dw) {
    const auto timed = time(Work::kLmHead);
    SP_ASSIGN_OR_RETURN(parts->row_loss, memory_.make<float>(rows));
    return cu::lm_head_loss(x, w, targets, rows, dim, vocab, chunk, parts->row_loss.p(), scale, dx, dw, s_);
  }
  // The rows' losses summed on the host in row order (waits for the pass).
  StatusOr<double> loss_sum(const LossParts& parts) {
    std::vector<float> losses(static_cast<size_t>(parts.row_loss.n));
    SP_RETURN_IF_ERROR(memory_.to_host(losses.data(), parts.row_loss.p(), losses.size() * sizeof(float)));
    double sum = 0;
    for (float l : losses) sum += l;
    return sum;
  }
  Status linear_mixer_forward(Communicator& comm, const Layout& layout, LaspAlgorithm algorithm,
                              const LinearAttentionParams& params, const LinearMixerShape& shape,
                              const LinearMixerSlots<const Half*>& w, const Half* x,
                              const LinearMixerActs<Half, float>& acts, float* y, LaspContext* ctx,
                              LinearMixerRun run) {
    const auto timed = time(Work::kLinearMixer);
    return mixer_.forward(comm, layout, algorithm, params, shape, w, x, acts, y, ctx, run);
  }
  Status linear_mixer_backward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                               const LinearMixerShape& shape, const LinearMixerSlots<const Half*>& w, const Half* x,
                               const LinearMixerActs<Half, float>& acts, const Half* dy, float* dx,
                               const LinearMixerSlots<float*>& dw, LaspContext* ctx) {
    const auto timed = time(Work::kLinearMixer);
    return mixer_.backward(comm, layout, params, shape, w, x, acts, dy, dx, dw, ctx);
  }
  // The products' dy in bf16, rounded from the fp32 accumulator into `scratch`.
  StatusOr<const Half*> as_act(const float* x, int64_t n, Array<Half>& scratch) {
    const auto timed = time(Work::kCasts);
    if (scratch.n < n) {
      SP_ASSIGN_OR_RETURN(scratch, memory_.make<Half>(n));
    }
    SP_RETURN_IF_ERROR(cu::to_bf16(x, scratch.p(), n, s_));
    return static_cast<const Half*>(scratch.p());
  }
  // The device's peak: every buffer of ours, not just the activations.
  int64_t activation_peak(int64_t) const { return memory_.peak_bytes(); }

 private:
  TrainingMemory& memory_;
  Session& session_;
  void* s_;
  int device_;
  cu::LinearMixer mixer_;         // the linear-attention layers' token mixer
  Array<int64_t> positions_;      // this rank's global positions (RoPE)
  Array<int64_t> row_positions_;  // this batch's per-row positions (packed documents)
};

class CudaModelPass final : public ModelPass {
 public:
  CudaModelPass(Communicator& group, const TrainOptions& o, TrainingMemory& memory, int device)
      : session_(group, session_options(o)), layers_(memory, session_, device) {}

  Status init(const TrainOptions& o, const Layout& layout, Communicator& group) {
    const ModelConfig& c = o.model;
    rank_ = group.rank();
    const int64_t S = layout.local_len(rank_);
    SP_ASSIGN_OR_RETURN(const AttentionPlan* plan, plan_causal(layers_, c, layout, o.batch, S));
    const AttentionPlan* early = nullptr;
    if (o.checkpointing == Checkpointing::kSequence) {  // as the CPU model (transformer.cpp)
      const int P = layout.ranks();
      SP_CHECK_SUPPORTED(layout.kind() == LayoutKind::kStriped && layout.seq_len() % (2 * P) == 0,
                         "sequence-level checkpointing needs the striped layout with the sequence a multiple of twice "
                         "the ranks (" + std::to_string(2 * P) + ")");
      SP_ASSIGN_OR_RETURN(const Layout half, Layout::create(LayoutKind::kStriped, layout.seq_len() / 2, P));
      SP_ASSIGN_OR_RETURN(early, plan_causal(layers_, c, half, o.batch, S / 2));
    }
    SP_RETURN_IF_ERROR(layers_.set_positions(layout.positions(rank_)));
    layers_.enable_profile(o.profile);
    pass_ = std::make_unique<LayerPass<CudaLayers>>(c, o.checkpointing, layers_, *plan, early, o.lm_head_chunk,
                                                    o.linear_sp, o.offload_checkpoints, o.tile_rows(),
                                                    o.offload_keep_layers);
    return Status::Ok();
  }
  Status forward_backward(WeightStore& store, const ShardBatch& batch, double scale, StepLoss* loss) override {
    return pass_->run(store, true, batch, scale, loss);
  }
  const AttentionPlan& attention_plan() const override { return pass_->attention_plan(); }
  // The layer pass's new plan (LayerPass::use_layout), then the new shard's RoPE positions.
  Status use_layout(const Layout& layout) override {
    SP_RETURN_IF_ERROR(pass_->use_layout(layout));
    return layers_.set_positions(layout.positions(rank_));
  }

 private:
  static SessionOptions session_options(const TrainOptions& o) {
    SessionOptions s;
    s.plan = o.plan_options();
    s.deterministic = o.deterministic;
    return s;
  }

  Session session_;  // the attention's backend, plans and workspace
  CudaLayers layers_;
  int rank_ = 0;
  std::unique_ptr<LayerPass<CudaLayers>> pass_;
};

}  // namespace

StatusOr<std::unique_ptr<ModelPass>> make_cuda_model_pass(const TrainOptions& options, const Layout& layout,
                                                          Communicator& group, TrainingMemory& memory) {
  SP_CHECK_ARG(memory.device() == DeviceKind::kCuda, "internal: the GPU pass needs device training memory");
  SP_CHECK_SUPPORTED(!options.model.has_linear_layers() || layout.kind() == LayoutKind::kContiguous,
                     "linear-attention layers run LASP, which needs the contiguous layout (--layout contiguous)");
  SP_CHECK_SUPPORTED(!options.model.has_linear_layers() || options.checkpointing != Checkpointing::kSequence,
                     "sequence-level checkpointing is for softmax layers on the striped layout; linear-attention "
                     "layers need the contiguous one (take full or attention: both keep LASP's states)");
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return SP_STATUS(StatusCode::kInternal, "cudaGetDevice failed");
  auto pass = std::make_unique<CudaModelPass>(group, options, memory, device);
  SP_RETURN_IF_ERROR(pass->init(options, layout, group));
  return std::unique_ptr<ModelPass>(std::move(pass));
}

}  // namespace seqpar::model
