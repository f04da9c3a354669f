// The training loop (include/seqpar/trainer.hpp) and its checkpoint files: a small binary file,
// "SEQPARCK" + version, the step, the data position, then parameters and both moments (fp32).
#include "seqpar/trainer.hpp"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace seqpar {

struct Trainer::Impl {
  TrainOptions o;
  Communicator& comm;
  std::unique_ptr<TrainingData> data;
  std::unique_ptr<Transformer<float>> model;
  std::unique_ptr<AdamW> adamw;
  std::vector<float> params, grads;
  int64_t steps = 0;

  Impl(const TrainOptions& options, Communicator& c) : o(options), comm(c) {}
};

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

StatusOr<std::unique_ptr<Trainer>> Trainer::create(const TrainOptions& options, Communicator& comm) {
  SP_RETURN_IF_ERROR(options.model.validate());
  SP_RETURN_IF_ERROR(validate_adamw(options.optimizer));
  SP_CHECK_ARG(options.batch >= 1 && options.steps >= 1, "the batch and the steps must be positive");
  auto impl = std::make_unique<Impl>(options, comm);
  SP_ASSIGN_OR_RETURN(impl->data, make_training_data(options.data, options.seq, options.seed));
  SP_CHECK_ARG(impl->data->vocab() <= options.model.vocab,
               impl->data->describe() + " has tokens up to " + std::to_string(impl->data->vocab() - 1) +
                   ", beyond the model's vocabulary of " + std::to_string(options.model.vocab) + " (raise --vocab)");
  SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(options.layout, options.seq, comm.size()));
  SP_ASSIGN_OR_RETURN(impl->model, Transformer<float>::create(options.model, options.checkpointing,
                                                              PlanOptions(options.algorithm, Topology{options.ranks_per_node}),
                                                              layout, options.batch, comm));
  const int64_t n = parameter_count(options.model);
  impl->params.resize(size_t(n));
  impl->grads.resize(size_t(n));
  init_parameters(options.model, options.seed, impl->params.data());
  impl->adamw = std::make_unique<AdamW>(options.model, options.optimizer);
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

Status Trainer::step(StepReport* report) {
  Impl& I = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<int32_t>> inputs(size_t(I.o.batch)), targets(size_t(I.o.batch));
  for (int64_t b = 0; b < I.o.batch; ++b) I.data->next(&inputs[size_t(b)], &targets[size_t(b)]);
  const Layout& layout = I.model->attention_plan().layout;
  const ShardBatch shard = shard_batch(layout, I.comm.rank(), inputs, targets);
  double counted = 0;  // global count of counted targets: the loss is their mean
  for (const auto& t : targets)
    for (int32_t x : t) counted += x >= 0;
  SP_CHECK_ARG(counted > 0, "the batch has no target to learn");
  const int64_t sent_before = I.comm.counters().sent(Phase::kForward) + I.comm.counters().sent(Phase::kBackward);
  std::fill(I.grads.begin(), I.grads.end(), 0.0f);
  StepLoss loss;
  SP_RETURN_IF_ERROR(I.model->forward_backward(I.params.data(), I.grads.data(), shard, 1.0 / counted, &loss));
  const int64_t sent = I.comm.counters().sent(Phase::kForward) + I.comm.counters().sent(Phase::kBackward) - sent_before;
  {
    const PhaseScope other(I.comm, Phase::kOther);
    double loss_sum = loss.loss_sum;
    SP_RETURN_IF_ERROR(I.comm.all_reduce(&loss_sum, 1, DType::kF64, ReduceOp::kSum));
    SP_CHECK_ARG(std::isfinite(loss_sum), "the loss is not finite at step " + std::to_string(I.steps) +
                                              " (lower the learning rate); the parameters were not updated");
    SP_RETURN_IF_ERROR(I.comm.all_reduce(I.grads.data(), I.grads.size(), DType::kF32, ReduceOp::kSum));
    report->loss = loss_sum / counted;
  }
  SP_ASSIGN_OR_RETURN(report->grad_norm, I.adamw->step(I.params.data(), I.grads.data(), I.steps));
  report->step = I.steps;
  report->lr = learning_rate(I.o.optimizer, I.steps);
  report->tokens = I.o.batch * I.o.seq;
  report->activation_bytes = loss.activation_bytes_peak;
  report->bytes_sent = sent;
  ++I.steps;
  report->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::Ok();
}

int64_t Trainer::steps_done() const { return impl_->steps; }
const std::vector<float>& Trainer::parameters() const { return impl_->params; }
const Transformer<float>& Trainer::model() const { return *impl_->model; }

namespace {
constexpr char kMagic[8] = {'S', 'E', 'Q', 'P', 'A', 'R', 'C', 'K'};
constexpr uint32_t kVersion = 1;
}  // namespace

Status Trainer::save(const std::string& path) const {
  const Impl& I = *impl_;
  SP_RETURN_IF_ERROR(I.comm.barrier());
  if (I.comm.rank() == 0) {
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary);
      SP_CHECK_ARG(out.good(), "cannot write the checkpoint " + tmp);
      const int64_t n = int64_t(I.params.size()), steps = I.steps, adam_t = I.adamw->steps_taken();
      const uint64_t data_at = I.data->position();
      out.write(kMagic, 8);
      out.write(reinterpret_cast<const char*>(&kVersion), sizeof(kVersion));
      for (int64_t v : {n, steps, adam_t}) out.write(reinterpret_cast<const char*>(&v), sizeof(v));
      out.write(reinterpret_cast<const char*>(&data_at), sizeof(data_at));
      const std::vector<float>* saved[] = {&I.params, &I.adamw->first_moment(), &I.adamw->second_moment()};
      for (const std::vector<float>* v : saved)
        out.write(reinterpret_cast<const char*>(v->data()), std::streamsize(v->size() * sizeof(float)));
      SP_CHECK_ARG(out.good(), "writing the checkpoint " + tmp + " failed");
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);  // the last good checkpoint stays whole until then
    SP_CHECK_ARG(!ec, "cannot move the checkpoint into place at " + path + ": " + ec.message());
  }
  return I.comm.barrier();
}

Status Trainer::load(const std::string& path) {
  Impl& I = *impl_;
  std::ifstream in(path, std::ios::binary);
  SP_CHECK_ARG(in.good(), "cannot read the checkpoint " + path);
  char magic[8];
  uint32_t version = 0;
  int64_t n = 0, steps = 0, adam_t = 0;
  uint64_t data_at = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&version), sizeof(version));
  SP_CHECK_ARG(in.good() && std::memcmp(magic, kMagic, 8) == 0 && version == kVersion,
               path + " is not a seqpar checkpoint (version " + std::to_string(kVersion) + ")");
  for (int64_t* v : {&n, &steps, &adam_t}) in.read(reinterpret_cast<char*>(v), sizeof(*v));
  in.read(reinterpret_cast<char*>(&data_at), sizeof(data_at));
  SP_CHECK_ARG(n == int64_t(I.params.size()), path + " holds " + std::to_string(n) + " parameters; this model has " +
                                                  std::to_string(I.params.size()));
  for (std::vector<float>* v : {&I.params, &I.adamw->first_moment(), &I.adamw->second_moment()})
    in.read(reinterpret_cast<char*>(v->data()), std::streamsize(v->size() * sizeof(float)));
  SP_CHECK_ARG(in.good(), path + " is truncated");
  I.steps = steps;
  I.adamw->set_steps_taken(adam_t);
  I.data->seek(data_at);
  return Status::Ok();
}

}  // namespace seqpar
