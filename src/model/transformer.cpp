// The model on the CPU (include/seqpar/transformer.hpp): the host half of the one layer pass
// (model/layer_pass.hpp) over the CPU layers of model/layers.hpp, T everywhere (fp32 training,
// the fp64 oracle), the attention through a Session on host tensors.
#include "seqpar/transformer.hpp"

#include "model/layer_pass.hpp"
#include "model/layers.hpp"
#include "model/step_profile.hpp"
#include "model/training_memory.hpp"

namespace seqpar {

StatusOr<Checkpointing> parse_checkpointing(const std::string& name) {
  if (name == "none") return Checkpointing::kNone;
  if (name == "full") return Checkpointing::kFull;
  if (name == "attention") return Checkpointing::kAttention;
  if (name == "sequence") return Checkpointing::kSequence;
  return SP_STATUS(StatusCode::kInvalidArgument,
                   "unknown checkpointing policy '" + name + "' (available: none, full, attention, sequence)");
}

const char* checkpointing_name(Checkpointing policy) {
  switch (policy) {
    case Checkpointing::kNone: return "none";
    case Checkpointing::kFull: return "full";
    case Checkpointing::kAttention: return "attention";
    case Checkpointing::kSequence: return "sequence";
  }
  return "?";
}

namespace model {
namespace {

// The CPU half of LayerPass: host arrays, every element T, each call done when it returns.
template <class T>
class HostLayers : public ProfiledDevice {
 public:
  using Weight = T;
  using Act = T;
  using Acc = T;
  struct Tokens {
    const int32_t* inputs;
    const int32_t* targets;
  };
  struct LossParts {
    double sum = 0;
  };
  template <class X>
  static constexpr DType dtype() {
    return sizeof(X) == 8 ? DType::kF64 : DType::kF32;
  }

  HostLayers(TrainingMemory& memory, Session& session)
      : ProfiledDevice(nullptr), memory_(memory), session_(session) {}  // host clock
  TrainingMemory& memory() { return memory_; }
  Session& session() { return session_; }
  void* stream() const { return nullptr; }
  Device device() const { return Device{}; }
  StatusOr<Tokens> tokens(const ShardBatch& b) const { return Tokens{b.inputs.data(), b.targets.data()}; }
  StatusOr<const int64_t*> positions(const ShardBatch& b) const {
    return b.rope_positions.empty() ? b.positions.data() : b.rope_positions.data();
  }

  Status embedding_forward(const int32_t* tokens, const T* table, T* x, int64_t rows, int64_t dim) {
    const auto timed = time(Work::kEmbedding);
    model::embedding_forward(tokens, table, x, rows, dim);
    return Status::Ok();
  }
  Status embedding_backward(const int32_t* tokens, const T* dx, T* dtable, int64_t rows, int64_t dim) {
    const auto timed = time(Work::kEmbedding);
    model::embedding_backward(tokens, dx, dtable, rows, dim);
    return Status::Ok();
  }
  Status rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t dim, double eps) {
    const auto timed = time(Work::kNorms);
    model::rmsnorm_forward(x, w, y, rstd, rows, dim, eps);
    return Status::Ok();
  }
  Status rmsnorm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t rows, int64_t dim) {
    const auto timed = time(Work::kNorms);
    model::rmsnorm_backward(x, w, rstd, dy, dx, dw, rows, dim);
    return Status::Ok();
  }
  Status linear_forward(const T* x, const T* w, T* y, int64_t rows, int64_t in, int64_t out) {
    const auto timed = time(Work::kProducts);
    model::linear_forward(x, w, y, rows, in, out);
    return Status::Ok();
  }
  Status linear_forward_add(const T* x, const T* w, T* y, int64_t rows, int64_t in, int64_t out) {
    const auto timed = time(Work::kProducts);
    model::linear_forward_add(x, w, y, rows, in, out);
    return Status::Ok();
  }
  Status linear_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t rows, int64_t in, int64_t out,
                         bool accumulate_dx) {
    const auto timed = time(Work::kProducts);
    model::linear_backward(x, w, dy, dx, dw, rows, in, out, accumulate_dx);
    return Status::Ok();
  }
  Status linear_backward_act(const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t rows, int64_t in,
                             int64_t out) {
    return linear_backward(x, w, dy, dx, dw, rows, in, out, false);
  }
  Status rope_apply(T* x, const int64_t* positions, int64_t B, int64_t S, int64_t H, int64_t D, double theta,
                    bool inverse) {
    const auto timed = time(Work::kRope);
    model::rope_apply(x, positions, B, S, H, D, theta, inverse);
    return Status::Ok();
  }
  Status swiglu_forward(const T* g, const T* u, T* a, int64_t n) {
    const auto timed = time(Work::kSwiglu);
    model::swiglu_forward(g, u, a, n);
    return Status::Ok();
  }
  Status swiglu_backward(const T* g, const T* u, const T* da, T* dg, T* du, int64_t n) {
    const auto timed = time(Work::kSwiglu);
    model::swiglu_backward(g, u, da, dg, du, n);
    return Status::Ok();
  }
  // The loss, and with dx and dw (else null) its gradient in the same pass.
  Status lm_head(const T* x, const T* w, const int32_t* targets, int64_t rows, int64_t dim, int64_t vocab,
                 int64_t chunk, LossParts* parts, double scale, T* dx, T* dw) {
    const auto timed = time(Work::kLmHead);
    int64_t counted = 0;
    model::lm_head_loss(x, w, targets, rows, dim, vocab, chunk, &parts->sum, &counted, scale, dx, dw);
    return Status::Ok();
  }
  Status linear_mixer_forward(Communicator& comm, const Layout& layout, LaspAlgorithm algorithm,
                              const LinearAttentionParams& params, const LinearMixerShape& shape,
                              const LinearMixerSlots<const T*>& w, const T* x, const LinearMixerActs<T>& acts, T* y,
                              LaspContext* ctx, LinearMixerRun run) {
    const auto timed = time(Work::kLinearMixer);
    return model::linear_mixer_forward(comm, layout, algorithm, params, shape, w, x, acts, y, ctx, run);
  }
  Status linear_mixer_backward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                               const LinearMixerShape& shape, const LinearMixerSlots<const T*>& w, const T* x,
                               const LinearMixerActs<T>& acts, const T* dy, T* dx, const LinearMixerSlots<T*>& dw,
                               LaspContext* ctx) {
    const auto timed = time(Work::kLinearMixer);
    return model::linear_mixer_backward(comm, layout, params, shape, w, x, acts, dy, dx, dw, ctx);
  }
  StatusOr<double> loss_sum(const LossParts& parts) const { return parts.sum; }
  // The products' dy: the accumulator itself (one dtype here).
  StatusOr<const T*> as_act(const T* x, int64_t, Array<T>&) const { return x; }
  int64_t activation_peak(int64_t counted) const { return counted; }

 private:
  TrainingMemory& memory_;
  Session& session_;
};

}  // namespace
}  // namespace model

template <class T>
struct Transformer<T>::Impl {
  std::unique_ptr<model::TrainingMemory> memory = model::make_host_training_memory();
  Session session;
  model::HostLayers<T> layers;
  std::unique_ptr<model::LayerPass<model::HostLayers<T>>> pass;
  explicit Impl(Communicator& comm, const PlanOptions& options)
      : session(comm, SessionOptions{options}), layers(*memory, session) {}
};

namespace {

// Every rank holds the whole buffer: weights and gradients are views into it.
template <class T>
class FlatWeights final : public WeightStore {
 public:
  FlatWeights(const T* params, T* grads) : params_(params), grads_(grads) {}
  StatusOr<const void*> weights(int64_t begin, int64_t) override { return static_cast<const void*>(params_ + begin); }
  Status release(int64_t, int64_t) override { return Status::Ok(); }
  StatusOr<void*> gradient(int64_t begin, int64_t) override {
    SP_CHECK_ARG(grads_ != nullptr, "internal: a gradient asked for in a forward-only pass");
    return static_cast<void*>(grads_ + begin);
  }
  Status gradient_done(int64_t, int64_t) override { return Status::Ok(); }

 private:
  const T* params_;
  T* grads_;
};

}  // namespace

std::vector<std::pair<int64_t, int64_t>> weight_units(const ModelConfig& config) {
  const std::vector<ParamInfo> t = parameter_table(config);
  const ParameterOffsets at = parameter_offsets(config);
  std::vector<std::pair<int64_t, int64_t>> units;
  units.push_back({t[0].offset, t[0].offset + t[0].numel});
  for (const LayerOffsets& l : at.layers)  // norm1 .. down_proj, whatever the mixer
    units.push_back({l.norm1, l.down + config.hidden * config.ffn});
  units.push_back({at.final_norm, t.back().offset + t.back().numel});
  return units;
}

template <class T>
StatusOr<std::unique_ptr<Transformer<T>>> Transformer<T>::create(const ModelConfig& config, Checkpointing policy,
                                                                 const PlanOptions& options, const Layout& layout,
                                                                 int64_t batch, Communicator& comm,
                                                                 LaspAlgorithm linear, bool offload_checkpoints,
                                                                 int64_t tile_tokens, int64_t offload_keep_layers) {
  SP_RETURN_IF_ERROR(config.validate());
  SP_CHECK_ARG(tile_tokens >= 0, "the MLP's tile must not be negative (0: all rows at once)");
  SP_CHECK_ARG(layout.ranks() == comm.size(), "the layout is for " + std::to_string(layout.ranks()) +
                                                  " ranks, the communicator has " + std::to_string(comm.size()));
  auto impl = std::make_unique<Impl>(comm, options);
  const int64_t S = layout.local_len(comm.rank());
  SP_ASSIGN_OR_RETURN(const AttentionPlan* plan, model::plan_causal(impl->layers, config, layout, batch, S));
  const AttentionPlan* early = nullptr;
  SP_CHECK_SUPPORTED(!config.has_linear_layers() || layout.kind() == LayoutKind::kContiguous,
                     "linear-attention layers run LASP, which needs the contiguous layout (--layout contiguous)");
  SP_CHECK_SUPPORTED(!config.has_linear_layers() || policy != Checkpointing::kSequence,
                     "sequence-level checkpointing is for softmax layers on the striped layout; linear-attention "
                     "layers need the contiguous one (take full or attention: both keep LASP's states)");
  if (policy == Checkpointing::kSequence) {
    // BurstEngine's sequence-level checkpointing: under the striped layout a shard's first half
    // holds exactly the sequence's first half, which attends to nothing beyond it, so the
    // recompute is the same algorithm over the first N/2 tokens.
    const int P = layout.ranks();
    SP_CHECK_SUPPORTED(layout.kind() == LayoutKind::kStriped && layout.seq_len() % (2 * P) == 0,
                       "sequence-level checkpointing needs the striped layout with the sequence a multiple of twice "
                       "the ranks (" + std::to_string(2 * P) + ")");
    SP_ASSIGN_OR_RETURN(const Layout half, Layout::create(LayoutKind::kStriped, layout.seq_len() / 2, P));
    SP_ASSIGN_OR_RETURN(early, model::plan_causal(impl->layers, config, half, batch, S / 2));
  }
  impl->pass = std::make_unique<model::LayerPass<model::HostLayers<T>>>(config, policy, impl->layers, *plan, early,
                                                                         1024, linear, offload_checkpoints,
                                                                         tile_tokens, offload_keep_layers);
  return std::unique_ptr<Transformer>(new Transformer(std::move(impl)));
}

template <class T>
Transformer<T>::Transformer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
template <class T>
Transformer<T>::~Transformer() = default;

template <class T>
Status Transformer<T>::forward_backward(const T* params, T* grads, const ShardBatch& batch, double scale,
                                        StepLoss* loss) {
  SP_CHECK_ARG(grads != nullptr, "forward_backward needs a gradient buffer");
  FlatWeights<T> store(params, grads);
  return impl_->pass->run(store, true, batch, scale, loss);
}

template <class T>
Status Transformer<T>::forward_backward(WeightStore& store, const ShardBatch& batch, double scale, StepLoss* loss) {
  return impl_->pass->run(store, true, batch, scale, loss);
}

template <class T>
Status Transformer<T>::forward(const T* params, const ShardBatch& batch, StepLoss* loss) {
  FlatWeights<T> store(params, nullptr);
  return impl_->pass->run(store, false, batch, 0.0, loss);
}

template <class T>
void Transformer<T>::profile_steps(bool on) {
  impl_->layers.enable_profile(on);
}

template <class T>
const AttentionPlan& Transformer<T>::attention_plan() const {
  return impl_->pass->attention_plan();
}

template <class T>
Status Transformer<T>::use_layout(const Layout& layout) {
  return impl_->pass->use_layout(layout);
}

template class Transformer<float>;
template class Transformer<double>;

}  // namespace seqpar
