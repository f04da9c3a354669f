// One rank's forward and backward through the model of model.hpp on its shard of the sequence:
// the layers of src/model/layers.hpp, attention through the distributed algorithms
// (distributed_attention.hpp, any --algo, on CPU ranks), RoPE at the layout's global positions,
// and the fused LM head + cross-entropy. Activation checkpointing policies:
//   none       every layer keeps its activations;
//   full       a layer keeps its input alone and re-runs its forward (attention and its
//              communication included) in the backward;
//   attention  DistFlashAttn's rematerialisation-aware policy: a layer keeps its input and the
//              attention's output O and LSE, so the backward re-runs the projections and the MLP
//              but never the attention forward or its communication.
//   sequence   BurstEngine's sequence-level selective checkpointing: a layer keeps its input and
//              O and LSE of the second half of its shard; the backward re-runs the attention for
//              the first half alone (a quarter of the causal attention's work, half its traffic).
//              Needs the striped layout and a sequence that is a multiple of twice the ranks.
// T is float (training) or double (the fp64 version the tests compare with).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "seqpar/distributed_attention.hpp"
#include "seqpar/lasp.hpp"
#include "seqpar/model.hpp"

namespace seqpar {

enum class Checkpointing : uint8_t { kNone, kFull, kAttention, kSequence };
StatusOr<Checkpointing> parse_checkpointing(const std::string& name);  // none | full | attention | sequence
const char* checkpointing_name(Checkpointing policy);

// This rank's rows of a batch of `batch` sequences: [batch, seq] inputs and targets (a negative
// target is not counted), and the global position of each local row.
struct ShardBatch {
  int64_t batch = 1;
  int64_t seq = 0;
  std::vector<int32_t> inputs, targets;
  std::vector<int64_t> positions;
  // Packed documents: per sequence, its documents' global start offsets followed by the
  // sequence's length (MaskSpec::documents' form); a query attends within its document alone.
  // Empty: every sequence is one causal document.
  std::vector<std::vector<int64_t>> documents;
  // RoPE's position of each row, [batch, seq] (packing restarts it in every document); empty:
  // `positions` for every sequence.
  std::vector<int64_t> rope_positions;
};

struct StepLoss {
  double loss_sum = 0;   // sum over this rank's counted targets
  int64_t counted = 0;   // this rank's counted targets
  int64_t activation_bytes_peak = 0;  // activations and recomputation buffers, at most
  // With step profiling on: milliseconds by kind of work (attention, products, lm_head, ...),
  // then "between_ops" (the pass's span less its ops) and "pass" (that span).
  std::vector<std::pair<std::string, double>> work_ms;
};

// Where the model's weights and gradients live, unit by unit (weight_units: the embedding, each
// layer, the final norm with the untied head): a flat buffer (every rank holds all), or ZeRO-3's
// shards, gathered for the unit that computes and reduce-scattered when its gradient is done.
// Pointers are to the pass's dtypes: T for Transformer<T>; on a GPU, bf16 weights and fp32
// gradients.
class WeightStore {
 public:
  virtual ~WeightStore() = default;
  // The weights of flat elements [begin, end), valid until release(begin, end).
  virtual StatusOr<const void*> weights(int64_t begin, int64_t end) = 0;
  virtual Status release(int64_t begin, int64_t end) = 0;
  // Where the gradient of [begin, end) is added, until gradient_done(begin, end).
  virtual StatusOr<void*> gradient(int64_t begin, int64_t end) = 0;
  virtual Status gradient_done(int64_t begin, int64_t end) = 0;
};

// A store's unit as a pass's element types.
template <class T>
StatusOr<const T*> unit_weights(WeightStore& store, int64_t begin, int64_t end) {
  SP_ASSIGN_OR_RETURN(const void* p, store.weights(begin, end));
  return static_cast<const T*>(p);
}
template <class T>
StatusOr<T*> unit_gradient(WeightStore& store, int64_t begin, int64_t end) {
  SP_ASSIGN_OR_RETURN(void* p, store.gradient(begin, end));
  return static_cast<T*>(p);
}

// The units of the flat buffer, in order: [begin, end) of the embedding, of each layer, and of
// the final norm (with lm_head.weight when untied).
std::vector<std::pair<int64_t, int64_t>> weight_units(const ModelConfig& config);

template <class T>
class Transformer {
 public:
  // Plans the attention (options.algorithm over `layout`, causal, `batch` sequences a step) for
  // this rank; linear-attention layers split over the ranks by `linear` (seqpar/lasp.hpp); with
  // `offload_checkpoints` what the policy keeps goes through host copies between a layer's
  // forward and backward (the GPU trainer's path, run here by the same code); with `tile_tokens`
  // > 0 the MLP runs that many rows at a time, recomputing its inner activations in the backward
  // (the GPU trainer's --tile-tokens); `offload_keep_layers`: the last layers whose checkpoints
  // stay on the device when offloading (at least 1). The communicator must outlive the model.
  static StatusOr<std::unique_ptr<Transformer>> create(const ModelConfig& config, Checkpointing policy,
                                                       const PlanOptions& options, const Layout& layout,
                                                       int64_t batch, Communicator& comm,
                                                       LaspAlgorithm linear = LaspAlgorithm::kAuto,
                                                       bool offload_checkpoints = false,
                                                       int64_t tile_tokens = 0, int64_t offload_keep_layers = 1);
  ~Transformer();

  // Forward and backward of this rank's shard: adds scale * d(sum of its losses)/d(params) into
  // grads (both flat, parameter_table's layout). Every rank of the communicator calls it with
  // its shard of the same batch (the attention talks). scale: 1 / the global count of counted
  // targets, so the ranks' gradients sum to the gradient of the mean loss.
  Status forward_backward(const T* params, T* grads, const ShardBatch& batch, double scale, StepLoss* loss);
  // The same over a weight store (every rank calls it the same way: ZeRO-3 gathers together).
  Status forward_backward(WeightStore& store, const ShardBatch& batch, double scale, StepLoss* loss);
  // The loss alone (no activations kept).
  Status forward(const T* params, const ShardBatch& batch, StepLoss* loss);

  const AttentionPlan& attention_plan() const;
  // Plans the attention over another layout of the same length and ranks (the documents layout of
  // the next batch's packed documents); later passes take shards of that layout.
  Status use_layout(const Layout& layout);
  // Times each pass's work by kind into StepLoss::work_ms (host clock), from the next pass on.
  void profile_steps(bool on);

  struct Impl;

 private:
  explicit Transformer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

extern template class Transformer<float>;
extern template class Transformer<double>;

}  // namespace seqpar
