// The training loop (include/seqpar/trainer.hpp); its checkpoints in the one file format of
// model/checkpoint_file.hpp.
#include "seqpar/trainer.hpp"

#include "model/checkpoint_file.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <cmath>

namespace seqpar {
namespace {

// ZeRO-3's weights: a rank keeps its slice [lo, hi) of the flat parameters and gradients. A
// unit's weights are all-gathered when it computes (each rank sends its part of the unit, padded
// to the largest part) and dropped after; a unit's gradient is made whole on every rank, then
// reduce-scattered so that each rank adds the sums of its part to its slice.
class ShardedWeights final : public WeightStore<float> {
 public:
  ShardedWeights(Communicator& world, int64_t slice, float* params, float* grads)
      : world_(world), slice_(slice), params_(params), grads_(grads) {}

  StatusOr<const float*> weights(int64_t begin, int64_t end) override {
    const int64_t piece = largest_part(begin, end);
    std::vector<float> send(size_t(piece), 0.0f), recv(size_t(piece * world_.size()));
    const auto [lo, hi] = part(world_.rank(), begin, end);
    std::copy(params_ + (lo - mine()), params_ + (hi - mine()), send.begin());
    SP_RETURN_IF_ERROR(world_.all_gather(send.data(), recv.data(), size_t(piece) * sizeof(float)));
    std::vector<float>& unit = gathered_[begin];
    unit.assign(size_t(end - begin), 0.0f);
    for (int r = 0; r < world_.size(); ++r) {
      const auto [a, b] = part(r, begin, end);
      std::copy(recv.begin() + r * piece, recv.begin() + r * piece + (b - a), unit.begin() + (a - begin));
    }
    return unit.data();
  }
  Status release(int64_t begin, int64_t) override {
    gathered_.erase(begin);
    return Status::Ok();
  }
  StatusOr<float*> gradient(int64_t begin, int64_t end) override {
    std::vector<float>& unit = gradients_[begin];
    unit.assign(size_t(end - begin), 0.0f);
    return unit.data();
  }
  Status gradient_done(int64_t begin, int64_t end) override {
    const int64_t piece = largest_part(begin, end);
    std::vector<float> send(size_t(piece * world_.size()), 0.0f), recv(static_cast<size_t>(piece));
    const std::vector<float>& unit = gradients_.at(begin);
    for (int r = 0; r < world_.size(); ++r) {
      const auto [a, b] = part(r, begin, end);
      std::copy(unit.begin() + (a - begin), unit.begin() + (b - begin), send.begin() + r * piece);
    }
    SP_RETURN_IF_ERROR(world_.reduce_scatter(send.data(), recv.data(), size_t(piece), DType::kF32, ReduceOp::kSum));
    const auto [lo, hi] = part(world_.rank(), begin, end);
    for (int64_t i = lo; i < hi; ++i) grads_[i - mine()] += recv[size_t(i - lo)];
    gradients_.erase(begin);
    return Status::Ok();
  }

 private:
  int64_t mine() const { return world_.rank() * slice_; }
  // Rank r's part of [begin, end): its slice there (possibly empty).
  std::pair<int64_t, int64_t> part(int r, int64_t begin, int64_t end) const {
    const int64_t a = std::clamp(r * slice_, begin, end), b = std::clamp((r + 1) * slice_, begin, end);
    return {a, b};
  }
  int64_t largest_part(int64_t begin, int64_t end) const {
    int64_t m = 1;
    for (int r = 0; r < world_.size(); ++r) m = std::max(m, part(r, begin, end).second - part(r, begin, end).first);
    return m;
  }

  Communicator& world_;
  int64_t slice_;
  float* params_;  // this rank's slice
  float* grads_;
  std::map<int64_t, std::vector<float>> gathered_, gradients_;
};

}  // namespace

struct Trainer::Impl {
  TrainOptions o;
  Communicator& world;
  std::unique_ptr<Communicator> group;  // this rank's sequence-parallel group
  std::unique_ptr<TrainingData> data;
  std::unique_ptr<Transformer<float>> model;
  std::unique_ptr<AdamW> adamw;
  // Parameters and gradients: padded to W equal slices (ZeRO's reduce-scatter and all-gather);
  // under ZeRO-3 this rank's slice alone.
  std::vector<float> params, grads;
  int64_t count = 0, slice = 0;
  int64_t steps = 0;
  std::vector<std::vector<int32_t>> last_inputs, last_targets;  // the last step's global batch

  Impl(const TrainOptions& options, Communicator& c) : o(options), world(c) {}
  int64_t slice_begin() const { return std::min(count, world.rank() * slice); }
  int64_t slice_end() const { return std::min(count, (world.rank() + 1) * slice); }

  // Every rank's slice of `mine` (its part of a [count] array) gathered into `all`.
  Status gather_slices(const float* mine, std::vector<float>* all) {
    std::vector<float> send(size_t(slice), 0.0f), recv(size_t(slice * world.size()));
    std::copy(mine, mine + (slice_end() - slice_begin()), send.begin());
    SP_RETURN_IF_ERROR(world.all_gather(send.data(), recv.data(), size_t(slice) * sizeof(float)));
    recv.resize(size_t(count));
    *all = std::move(recv);
    return Status::Ok();
  }
};

StatusOr<std::unique_ptr<TrainingData>> open_training_data(const TrainOptions& options) {
  SP_RETURN_IF_ERROR(options.model.validate());
  SP_RETURN_IF_ERROR(validate_adamw(options.optimizer));
  SP_CHECK_ARG(options.batch >= 1 && options.steps >= 1, "the batch and the steps must be positive");
  SP_ASSIGN_OR_RETURN(std::unique_ptr<TrainingData> data, make_training_data(options.data, options.seq, options.seed));
  SP_CHECK_ARG(data->vocab() <= options.model.vocab,
               data->describe() + " has tokens up to " + std::to_string(data->vocab() - 1) +
                   ", beyond the model's vocabulary of " + std::to_string(options.model.vocab) + " (raise --vocab)");
  return data;
}

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

StatusOr<std::unique_ptr<Trainer>> Trainer::create(const TrainOptions& options, Communicator& comm) {
  const int W = comm.size(), G = options.data_parallel;
  SP_CHECK_ARG(G >= 1 && W % G == 0, "the " + std::to_string(W) + " ranks cannot form " + std::to_string(G) +
                                         " equal data-parallel groups");
  SP_CHECK_ARG(options.zero_stage >= 0 && options.zero_stage <= 3,
               "ZeRO stage " + std::to_string(options.zero_stage) + " does not exist (0, 1, 2 or 3)");
  auto impl = std::make_unique<Impl>(options, comm);
  const int T = W / G;
  SP_ASSIGN_OR_RETURN(impl->group, comm.split(comm.rank() / T, comm.rank()));
  SP_ASSIGN_OR_RETURN(impl->data, open_training_data(options));
  SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(options.layout, options.seq, T));
  SP_ASSIGN_OR_RETURN(impl->model, Transformer<float>::create(options.model, options.checkpointing,
                                                              options.plan_options(),
                                                              layout, options.batch, *impl->group));
  impl->count = parameter_count(options.model);
  impl->slice = (impl->count + W - 1) / W;
  impl->params.assign(size_t(impl->slice * W), 0.0f);
  init_parameters(options.model, options.seed, impl->params.data());
  if (options.zero_stage == 3) {  // keep this rank's slice alone
    std::vector<float> mine(impl->params.begin() + impl->slice_begin(), impl->params.begin() + impl->slice_end());
    mine.resize(size_t(impl->slice), 0.0f);
    impl->params = std::move(mine);
  }
  impl->grads.assign(impl->params.size(), 0.0f);
  impl->adamw = options.zero_stage == 0
                    ? std::make_unique<AdamW>(options.model, options.optimizer)
                    : std::make_unique<AdamW>(options.model, options.optimizer, impl->slice_begin(), impl->slice_end());
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

Status Trainer::step(StepReport* report) {
  Impl& I = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  const int T = I.group->size(), G = I.world.size() / T, g = I.world.rank() / T;
  // The global batch: G groups of o.batch sequences; this group trains on its own.
  std::vector<std::vector<int32_t>> inputs, targets;
  I.last_inputs.assign(size_t(G * I.o.batch), {});
  I.last_targets.assign(size_t(G * I.o.batch), {});
  double counted = 0;  // counted targets in the global batch: the loss is their mean
  for (int64_t s = 0; s < G * I.o.batch; ++s) {
    std::vector<int32_t>&in = I.last_inputs[size_t(s)], &tg = I.last_targets[size_t(s)];
    I.data->next(&in, &tg);
    for (int32_t x : tg) counted += x >= 0;
    if (s / I.o.batch == g) inputs.push_back(in), targets.push_back(tg);
  }
  SP_CHECK_ARG(counted > 0, "the batch has no target to learn");
  const ShardBatch shard = shard_batch(I.model->attention_plan().layout, I.group->rank(), inputs, targets);
  const CommCounters& cc = I.group->counters();
  const int64_t sent_before = cc.sent(Phase::kForward) + cc.sent(Phase::kBackward);
  std::fill(I.grads.begin(), I.grads.end(), 0.0f);
  StepLoss loss;
  if (I.o.zero_stage == 3) {
    ShardedWeights store(I.world, I.slice, I.params.data(), I.grads.data());
    SP_RETURN_IF_ERROR(I.model->forward_backward(store, shard, 1.0 / counted, &loss));
  } else {
    SP_RETURN_IF_ERROR(I.model->forward_backward(I.params.data(), I.grads.data(), shard, 1.0 / counted, &loss));
  }
  report->bytes_sent = cc.sent(Phase::kForward) + cc.sent(Phase::kBackward) - sent_before;
  const PhaseScope other(I.world, Phase::kOther);
  double loss_sum = loss.loss_sum;
  SP_RETURN_IF_ERROR(I.world.all_reduce(&loss_sum, 1, DType::kF64, ReduceOp::kSum));
  SP_CHECK_ARG(std::isfinite(loss_sum), "the loss is not finite at step " + std::to_string(I.steps) +
                                            " (lower the learning rate); the parameters were not updated");
  report->loss = loss_sum / counted;
  const int64_t lo = I.slice_begin(), hi = I.slice_end();
  // Where this rank's slice sits in its arrays: the whole buffer, or (ZeRO-3) the slice itself.
  const int64_t at = I.o.zero_stage == 3 ? 0 : lo;
  if (I.o.zero_stage == 3) {  // the store reduce-scattered every unit's gradient into the slice
    double sq = 0;
    for (int64_t i = 0; i < hi - lo; ++i) sq += double(I.grads[size_t(i)]) * double(I.grads[size_t(i)]);
    SP_RETURN_IF_ERROR(I.world.all_reduce(&sq, 1, DType::kF64, ReduceOp::kSum));
    report->grad_norm = std::sqrt(sq);
  } else if (I.o.zero_stage < 2) {
    SP_RETURN_IF_ERROR(I.world.all_reduce(I.grads.data(), I.grads.size(), DType::kF32, ReduceOp::kSum));
    SP_ASSIGN_OR_RETURN(report->grad_norm, AdamW::norm_of(I.grads.data(), I.count));
  } else {  // each rank gets the sums of its slice alone
    std::vector<float> mine(size_t(I.slice));
    SP_RETURN_IF_ERROR(I.world.reduce_scatter(I.grads.data(), mine.data(), size_t(I.slice), DType::kF32, ReduceOp::kSum));
    std::copy(mine.begin(), mine.begin() + (hi - lo), I.grads.begin() + lo);
    double sq = 0;
    for (int64_t i = lo; i < hi; ++i) sq += double(I.grads[size_t(i)]) * double(I.grads[size_t(i)]);
    SP_RETURN_IF_ERROR(I.world.all_reduce(&sq, 1, DType::kF64, ReduceOp::kSum));
    report->grad_norm = std::sqrt(sq);
  }
  const int64_t from = I.o.zero_stage == 0 ? 0 : at;  // AdamW's range starts here
  SP_RETURN_IF_ERROR(I.adamw->update(I.params.data() + from, I.grads.data() + from, report->grad_norm, I.steps));
  if (I.o.zero_stage == 1 || I.o.zero_stage == 2) {  // every rank's updated slice, everywhere
    std::vector<float> all;
    SP_RETURN_IF_ERROR(I.gather_slices(I.params.data() + lo, &all));
    std::copy(all.begin(), all.end(), I.params.begin());
  }
  report->step = I.steps;
  report->lr = learning_rate(I.o.optimizer, I.steps);
  report->tokens = G * I.o.batch * I.o.seq;
  report->activation_bytes = loss.activation_bytes_peak;
  ++I.steps;
  report->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::Ok();
}

int64_t Trainer::steps_done() const { return impl_->steps; }
Status Trainer::set_parameters(const std::vector<float>& params) {
  Impl& I = *impl_;
  SP_CHECK_ARG(int64_t(params.size()) == I.count, "the model has " + std::to_string(I.count) + " parameters, not " +
                                                      std::to_string(params.size()));
  if (I.o.zero_stage == 3) std::copy(params.begin() + I.slice_begin(), params.begin() + I.slice_end(), I.params.begin());
  else std::copy(params.begin(), params.end(), I.params.begin());
  return Status::Ok();
}

StatusOr<std::vector<float>> Trainer::last_gradient() const {
  SP_CHECK_SUPPORTED(impl_->o.zero_stage < 2, "under ZeRO 2 and 3 no rank holds the whole gradient");
  return std::vector<float>(impl_->grads.begin(), impl_->grads.begin() + impl_->count);
}
const std::vector<std::vector<int32_t>>& Trainer::last_inputs() const { return impl_->last_inputs; }
const std::vector<std::vector<int32_t>>& Trainer::last_targets() const { return impl_->last_targets; }

StatusOr<std::vector<float>> Trainer::gather_parameters() const {
  Impl& I = *impl_;
  if (I.o.zero_stage != 3) return std::vector<float>(I.params.begin(), I.params.begin() + I.count);
  std::vector<float> all;
  SP_RETURN_IF_ERROR(I.gather_slices(I.params.data(), &all));
  return all;
}
const Transformer<float>& Trainer::model() const { return *impl_->model; }

Status Trainer::save(const std::string& path) const {
  Impl& I = *impl_;
  model::TrainingState state;
  state.first_moment = I.adamw->first_moment(), state.second_moment = I.adamw->second_moment();
  if (I.o.zero_stage > 0) {  // the moments live in slices: the file holds them whole
    SP_RETURN_IF_ERROR(I.gather_slices(I.adamw->first_moment().data(), &state.first_moment));
    SP_RETURN_IF_ERROR(I.gather_slices(I.adamw->second_moment().data(), &state.second_moment));
  }
  SP_ASSIGN_OR_RETURN(state.params, gather_parameters());
  state.steps = I.steps, state.optimizer_steps = I.adamw->steps_taken(), state.data_position = I.data->position();
  SP_RETURN_IF_ERROR(I.world.barrier());
  if (I.world.rank() == 0) SP_RETURN_IF_ERROR(model::write_checkpoint(path, state));
  return I.world.barrier();
}

Status Trainer::load(const std::string& path) {
  Impl& I = *impl_;
  SP_ASSIGN_OR_RETURN(const model::TrainingState state, model::read_checkpoint(path, I.count));
  SP_RETURN_IF_ERROR(set_parameters(state.params));
  const int64_t lo = I.adamw->begin(), hi = I.adamw->end();  // this rank's moments
  std::copy(state.first_moment.begin() + lo, state.first_moment.begin() + hi, I.adamw->first_moment().begin());
  std::copy(state.second_moment.begin() + lo, state.second_moment.begin() + hi, I.adamw->second_moment().begin());
  I.steps = state.steps;
  I.adamw->set_steps_taken(state.optimizer_steps);
  I.data->seek(state.data_position);
  return Status::Ok();
}

}  // namespace seqpar
