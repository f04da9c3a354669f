// The training loop (include/seqpar/trainer.hpp), once for both devices: its arrays live in a
// TrainingMemory (host, or the GPU on the trainer's stream), the model's pass is the device's
// (model_pass.hpp), and the gradient reductions, ZeRO's slices, AdamW and checkpoints (in the one
// file format of model/checkpoint_file.hpp) are written here alone.
#include "seqpar/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "model/checkpoint_file.hpp"
#include "model/fault_injection.hpp"
#include "model/step_progress.hpp"
#include "model/model_pass.hpp"
#include "model/sharded_weights.hpp"
#include "model/training_memory.hpp"

namespace seqpar {
namespace {

using model::Array;
using model::Buffer;
using model::TrainingMemory;

// Every rank holds the whole buffer: weights (the compute copy) and gradients are views into it.
class FlatWeights final : public WeightStore {
 public:
  FlatWeights(const void* compute, size_t element_bytes, float* grads)
      : compute_(static_cast<const char*>(compute)), element_bytes_(element_bytes), grads_(grads) {}
  StatusOr<const void*> weights(int64_t begin, int64_t) override {
    return static_cast<const void*>(compute_ + size_t(begin) * element_bytes_);
  }
  Status release(int64_t, int64_t) override { return Status::Ok(); }
  StatusOr<void*> gradient(int64_t begin, int64_t) override { return static_cast<void*>(grads_ + begin); }
  Status gradient_done(int64_t, int64_t) override { return Status::Ok(); }

 private:
  const char* compute_;
  size_t element_bytes_;
  float* grads_;
};

}  // namespace

struct Trainer::Impl {
  TrainOptions o;
  Communicator& world;
  // This rank's sequence-parallel group: the world itself with one group (no second NCCL
  // communicator), else a split of it.
  std::unique_ptr<Communicator> split_group;
  Communicator* group = nullptr;
  std::unique_ptr<TrainingData> data;
  std::unique_ptr<TrainingMemory> memory;
  std::unique_ptr<model::ModelPass> pass;
  std::vector<ParamInfo> table;
  // Parameters (fp32 master), their compute copy (none where the compute dtype is fp32: the
  // parameters themselves) and gradients: padded to W equal slices (ZeRO's reduce-scatter and
  // all-gather); under ZeRO-3 this rank's slice alone. AdamW's moments cover the optimizer's
  // range: everything without ZeRO, this rank's slice with it.
  Array<float> params, grads, m, v;
  std::unique_ptr<Buffer> compute;
  // ZeRO-3's store, kept from step to step: it guesses each pass's order of units from the last.
  std::unique_ptr<model::ShardedWeights> sharded;
  int64_t count = 0, slice = 0;
  int64_t steps = 0, optimizer_steps = 0;
  std::vector<std::vector<int32_t>> last_inputs, last_targets;  // the last step's global batch

  Impl(const TrainOptions& options, Communicator& c) : o(options), world(c) {}
  int64_t slice_begin() const { return std::min(count, world.rank() * slice); }
  int64_t slice_end() const { return std::min(count, (world.rank() + 1) * slice); }
  bool zero3() const { return o.zero_stage == 3; }
  int64_t local() const { return zero3() ? slice : slice * world.size(); }  // elements of params and grads
  // Where flat element i sits in params and grads (this rank's slice under ZeRO-3).
  int64_t at(int64_t i) const { return zero3() ? i - world.rank() * slice : i; }
  int64_t optimizer_begin() const { return o.zero_stage == 0 ? 0 : slice_begin(); }
  int64_t optimizer_end() const { return o.zero_stage == 0 ? count : slice_end(); }
  size_t compute_bytes() const { return dtype_size(memory->compute_dtype()); }
  void* compute_data() const { return compute ? compute->data() : static_cast<void*>(params.p()); }

  // The compute copy of params [from, from + n) (flat elements), where there is one.
  Status refresh_compute(int64_t from, int64_t n) {
    if (!compute) return Status::Ok();
    return memory->to_compute(params.p() + at(from), static_cast<char*>(compute->data()) + size_t(at(from)) * compute_bytes(), n);
  }
  // Every rank's slice of `mine` (`slice` elements of an array of this memory) gathered whole on
  // the host.
  StatusOr<std::vector<float>> gather_slices(const float* mine) {
    SP_ASSIGN_OR_RETURN(const Array<float> all, memory->make<float>(slice * world.size()));
    SP_RETURN_IF_ERROR(model::all_gather(world, *memory, mine, all.p(), size_t(slice) * sizeof(float)));
    std::vector<float> host(static_cast<size_t>(count));
    SP_RETURN_IF_ERROR(memory->to_host(host.data(), all.p(), host.size() * sizeof(float)));
    return host;
  }
  // The gradient's squared norm over the world: whole on every rank (ZeRO 0 and 1), or each
  // rank's slice at [at(lo), at(hi)) summed over the ranks.
  StatusOr<double> squared_norm(bool whole) {
    if (whole) return memory->sum_of_squares(grads.p(), count);
    SP_ASSIGN_OR_RETURN(double sq, memory->sum_of_squares(grads.p() + at(slice_begin()), slice_end() - slice_begin()));
    SP_RETURN_IF_ERROR(world.all_reduce(&sq, 1, DType::kF64, ReduceOp::kSum));
    return sq;
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
  SP_CHECK_ARG(options.lm_head_chunk >= 0, "the LM head's chunk must not be negative (0: all rows at once)");
  SP_CHECK_ARG(options.tile_tokens >= -1, "the MLP's tile must be rows, 0 (all rows at once) or -1 (the default: 8192 under a checkpointing policy)");
  SP_CHECK_ARG(!options.offload_checkpoints || options.checkpointing != Checkpointing::kNone,
               "offloading checkpoints needs a checkpointing policy that keeps some (full, attention or sequence), "
               "not none");
  SP_CHECK_ARG(options.offload_keep_layers >= 1, "the layers whose checkpoints stay on the device when offloading "
                                                 "must be at least 1 (the last), got " +
                                                     std::to_string(options.offload_keep_layers));
  auto impl = std::make_unique<Impl>(options, comm);
  Impl& I = *impl;
  if (options.device == DeviceKind::kCuda) {
    SP_ASSIGN_OR_RETURN(I.memory, model::make_cuda_training_memory());
  } else {
    I.memory = model::make_host_training_memory();
  }
  const int T = W / G;
  if (G == 1) {
    I.group = &comm;
  } else {
    SP_ASSIGN_OR_RETURN(I.split_group, comm.split(comm.rank() / T, comm.rank()));
    I.group = I.split_group.get();
  }
  SP_ASSIGN_OR_RETURN(I.data, open_training_data(options));
  if (options.layout == LayoutKind::kDocuments) {
    // Each step's layout is made from its sequence's documents (Trainer::step), so a group takes
    // one sequence a step; until the first step, one document.
    SP_CHECK_ARG(options.pack_eod >= 0, "the documents layout balances packed documents: it needs --pack EOD");
    SP_CHECK_ARG(options.batch == 1, "the documents layout is made from one sequence's documents: --batch 1 (more "
                                     "sequences a step: more --data-parallel groups)");
    SP_CHECK_SUPPORTED(options.checkpointing != Checkpointing::kSequence,
                       "sequence-level checkpointing needs the striped layout, not documents");
  }
  SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(options.layout, options.seq, T, {}));
  SP_ASSIGN_OR_RETURN(I.pass, model::make_model_pass(options, layout, *I.group, *I.memory));
  I.table = parameter_table(options.model);
  I.count = parameter_count(options.model);
  I.slice = (I.count + W - 1) / W;
  SP_ASSIGN_OR_RETURN(I.params, I.memory->make_zeroed<float>(I.local()));
  SP_ASSIGN_OR_RETURN(I.grads, I.memory->make_zeroed<float>(I.local()));
  if (I.memory->compute_dtype() != DType::kF32) {
    SP_ASSIGN_OR_RETURN(I.compute, I.memory->allocate(size_t(I.local()) * I.compute_bytes()));
  }
  if (I.zero3())
    I.sharded = std::make_unique<model::ShardedWeights>(comm, *I.memory, I.slice, I.compute_data(), I.grads.p(),
                                                        options.zero_overlap);
  const int64_t moments = options.zero_stage == 0 ? I.count : I.slice;  // padded: gathered whole for checkpoints
  SP_ASSIGN_OR_RETURN(I.m, I.memory->make_zeroed<float>(moments));
  SP_ASSIGN_OR_RETURN(I.v, I.memory->make_zeroed<float>(moments));
  std::vector<float> init(size_t(I.count));
  init_parameters(options.model, options.seed, init.data());
  auto trainer = std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
  SP_RETURN_IF_ERROR(trainer->set_parameters(init));
  return trainer;
}

Status Trainer::step(StepReport* report) {
  Impl& I = *impl_;
  TrainingMemory& mem = *I.memory;
  const auto t0 = std::chrono::steady_clock::now();
  model::set_fault_context(I.steps, I.world.rank());
  model::set_step_progress(I.steps, I.world.rank() == 0 ? I.o.progress_s : -1);
  const int T = I.group->size(), G = I.world.size() / T, g = I.world.rank() / T;
  // The global batch: G groups of o.batch sequences; this group trains on its own.
  std::vector<std::vector<int32_t>> inputs, targets;
  std::vector<std::vector<int64_t>> documents;  // packing: each of this group's sequences'
  I.last_inputs.assign(size_t(G * I.o.batch), {});
  I.last_targets.assign(size_t(G * I.o.batch), {});
  double counted = 0;  // counted targets in the global batch: the loss is their mean
  for (int64_t s = 0; s < G * I.o.batch; ++s) {
    std::vector<int32_t>&in = I.last_inputs[size_t(s)], &tg = I.last_targets[size_t(s)];
    I.data->next(&in, &tg);
    std::vector<int64_t> offsets;
    if (I.o.pack_eod >= 0) offsets = pack_documents(in, &tg, I.o.pack_eod);
    for (int32_t x : tg) counted += x >= 0;
    if (s / I.o.batch == g) inputs.push_back(in), targets.push_back(tg), documents.push_back(std::move(offsets));
  }
  SP_CHECK_ARG(counted > 0, "the batch has no target to learn");
  if (I.o.layout == LayoutKind::kDocuments) {  // this step's documents balanced over the group's ranks
    SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(LayoutKind::kDocuments, I.o.seq, T, documents.front()));
    SP_RETURN_IF_ERROR(I.pass->use_layout(layout));
  }
  ShardBatch shard = shard_batch(I.pass->attention_plan().layout, I.group->rank(), inputs, targets);
  if (I.o.pack_eod >= 0) add_documents(&shard, std::move(documents), I.o.pack_global_positions);
  const CommCounters& cc = I.group->counters();
  const int64_t sent_before = cc.sent(Phase::kForward) + cc.sent(Phase::kBackward);
  SP_RETURN_IF_ERROR(mem.zero(I.grads.p(), size_t(I.local()) * sizeof(float)));
  StepLoss loss;
  if (I.zero3()) {
    const Status pass = I.pass->forward_backward(*I.sharded, shard, 1.0 / counted, &loss);
    const Status settled = I.sharded->end_pass();
    SP_RETURN_IF_ERROR(pass);
    SP_RETURN_IF_ERROR(settled);
  } else {
    FlatWeights store(I.compute_data(), I.compute_bytes(), I.grads.p());
    SP_RETURN_IF_ERROR(I.pass->forward_backward(store, shard, 1.0 / counted, &loss));
  }
  model::set_step_progress(I.steps, -1);  // the pass is done: nothing after it reports as this step
  report->bytes_sent = cc.sent(Phase::kForward) + cc.sent(Phase::kBackward) - sent_before;
  const PhaseScope other(I.world, Phase::kOther);
  double loss_sum = loss.loss_sum;
  // A test hook of the fault suite: SEQPAR_FAULT_NAN_STEP=k makes step k's loss NaN on rank 0.
  if (const char* k = std::getenv("SEQPAR_FAULT_NAN_STEP"); k && I.world.rank() == 0 && std::atoll(k) == I.steps)
    loss_sum = std::nan("");
  SP_RETURN_IF_ERROR(I.world.all_reduce(&loss_sum, 1, DType::kF64, ReduceOp::kSum));
  if (!std::isfinite(loss_sum))  // a runtime failure, not a bad argument (the tool exits with 1)
    return SP_STATUS(StatusCode::kInternal, "the loss is not finite at step " + std::to_string(I.steps) +
                                                " (lower the learning rate); the parameters were not updated");
  report->loss = loss_sum / counted;
  const int64_t lo = I.slice_begin(), hi = I.slice_end();
  double sq = 0;
  if (I.o.zero_stage < 2) {  // every rank gets the whole sum
    SP_RETURN_IF_ERROR(model::all_reduce(I.world, mem, I.grads.p(), I.local()));
    SP_ASSIGN_OR_RETURN(sq, I.squared_norm(true));
  } else {
    if (I.o.zero_stage == 2) {  // each rank gets the sums of its slice alone
      SP_ASSIGN_OR_RETURN(const Array<float> mine, mem.make<float>(I.slice));
      SP_RETURN_IF_ERROR(model::reduce_scatter(I.world, mem, I.grads.p(), mine.p(), I.slice));
      SP_RETURN_IF_ERROR(mem.copy(I.grads.p() + lo, mine.p(), size_t(hi - lo) * sizeof(float)));
    }  // ZeRO-3: the store reduce-scattered every unit's gradient into the slice
    SP_ASSIGN_OR_RETURN(sq, I.squared_norm(false));
  }
  const double norm = std::sqrt(sq);
  SP_ASSIGN_OR_RETURN(const model::AdamWStep a, model::adamw_step(I.o.optimizer, norm, I.steps, I.optimizer_steps + 1));
  const int64_t from = I.optimizer_begin(), to = I.optimizer_end();
  model::fault_point("optimizer");
  // ZeRO 1 and 2 refresh the compute copy after the gather; the others as they update.
  const bool refresh_in_update = I.compute && (I.o.zero_stage == 0 || I.zero3());
  for (const ParamInfo& p : I.table) {
    const int64_t b = std::max(p.offset, from), e = std::min(p.offset + p.numel, to);
    if (b >= e) continue;
    void* compute = refresh_in_update ? static_cast<char*>(I.compute->data()) + size_t(I.at(b)) * I.compute_bytes() : nullptr;
    SP_RETURN_IF_ERROR(mem.adamw(a, p.decays ? I.o.optimizer.weight_decay : 0.0, I.params.p() + I.at(b), compute,
                                 I.grads.p() + I.at(b), I.m.p() + (b - from), I.v.p() + (b - from), e - b));
  }
  ++I.optimizer_steps;
  if (I.o.zero_stage == 1 || I.o.zero_stage == 2) {  // every rank's updated slice, everywhere
    SP_ASSIGN_OR_RETURN(const Array<float> mine, mem.make<float>(I.slice));
    SP_RETURN_IF_ERROR(mem.copy(mine.p(), I.params.p() + I.world.rank() * I.slice, size_t(I.slice) * sizeof(float)));
    SP_RETURN_IF_ERROR(model::all_gather(I.world, mem, mine.p(), I.params.p(), size_t(I.slice) * sizeof(float)));
    SP_RETURN_IF_ERROR(I.refresh_compute(0, I.count));
  }
  SP_RETURN_IF_ERROR(mem.synchronize());
  report->grad_norm = norm;
  report->step = I.steps;
  report->lr = a.lr;
  report->tokens = G * I.o.batch * I.o.seq;
  report->activation_bytes = loss.activation_bytes_peak;
  report->work_ms = std::move(loss.work_ms);
  ++I.steps;
  report->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::Ok();
}

int64_t Trainer::steps_done() const { return impl_->steps; }

Status Trainer::set_parameters(const std::vector<float>& params) {
  Impl& I = *impl_;
  SP_CHECK_ARG(int64_t(params.size()) == I.count, "the model has " + std::to_string(I.count) + " parameters, not " +
                                                      std::to_string(params.size()));
  const int64_t from = I.zero3() ? I.slice_begin() : 0, to = I.zero3() ? I.slice_end() : I.count;
  SP_RETURN_IF_ERROR(I.memory->from_host(I.params.p() + I.at(from), params.data() + from, size_t(to - from) * sizeof(float)));
  SP_RETURN_IF_ERROR(I.refresh_compute(from, to - from));
  return I.memory->synchronize();
}

StatusOr<std::vector<float>> Trainer::last_gradient() const {
  Impl& I = *impl_;
  SP_CHECK_SUPPORTED(I.o.zero_stage < 2, "under ZeRO 2 and 3 no rank holds the whole gradient");
  std::vector<float> host(static_cast<size_t>(I.count));
  SP_RETURN_IF_ERROR(I.memory->to_host(host.data(), I.grads.p(), host.size() * sizeof(float)));
  return host;
}
const std::vector<std::vector<int32_t>>& Trainer::last_inputs() const { return impl_->last_inputs; }
const std::vector<std::vector<int32_t>>& Trainer::last_targets() const { return impl_->last_targets; }
const AttentionPlan& Trainer::attention_plan() const { return impl_->pass->attention_plan(); }
int64_t Trainer::peak_device_bytes() const { return impl_->memory->peak_bytes(); }

StatusOr<std::vector<float>> Trainer::gather_parameters() const {
  Impl& I = *impl_;
  if (I.zero3()) return I.gather_slices(I.params.p());
  std::vector<float> host(static_cast<size_t>(I.count));
  SP_RETURN_IF_ERROR(I.memory->to_host(host.data(), I.params.p(), host.size() * sizeof(float)));
  return host;
}

Status Trainer::save(const std::string& path) const {
  Impl& I = *impl_;
  model::TrainingState state;
  if (I.o.zero_stage == 0) {
    for (auto [from, to] : {std::pair{&I.m, &state.first_moment}, {&I.v, &state.second_moment}}) {
      to->resize(size_t(I.count));
      SP_RETURN_IF_ERROR(I.memory->to_host(to->data(), from->p(), to->size() * sizeof(float)));
    }
  } else {  // the moments live in slices: the file holds them whole
    SP_ASSIGN_OR_RETURN(state.first_moment, I.gather_slices(I.m.p()));
    SP_ASSIGN_OR_RETURN(state.second_moment, I.gather_slices(I.v.p()));
  }
  SP_ASSIGN_OR_RETURN(state.params, gather_parameters());
  state.steps = I.steps, state.optimizer_steps = I.optimizer_steps, state.data_position = I.data->position();
  // Rank 0 writes; every rank learns whether it could (no rank waits out a timeout for it).
  Status written = I.world.rank() == 0 ? model::write_checkpoint(path, state) : Status::Ok();
  double failed = written.ok() ? 0.0 : 1.0;
  const PhaseScope other(I.world, Phase::kOther);
  SP_RETURN_IF_ERROR(I.world.all_reduce(&failed, 1, DType::kF64, ReduceOp::kSum));
  if (!written.ok()) return written;
  SP_CHECK_ARG(failed == 0, "rank 0 could not write the checkpoint " + path);
  return Status::Ok();
}

Status Trainer::load(const std::string& path) {
  Impl& I = *impl_;
  SP_ASSIGN_OR_RETURN(const model::TrainingState state, model::read_checkpoint(path, I.count));
  SP_RETURN_IF_ERROR(set_parameters(state.params));
  const int64_t lo = I.optimizer_begin(), hi = I.optimizer_end();  // this rank's moments
  SP_RETURN_IF_ERROR(I.memory->from_host(I.m.p(), state.first_moment.data() + lo, size_t(hi - lo) * sizeof(float)));
  SP_RETURN_IF_ERROR(I.memory->from_host(I.v.p(), state.second_moment.data() + lo, size_t(hi - lo) * sizeof(float)));
  I.steps = state.steps;
  I.optimizer_steps = state.optimizer_steps;
  I.data->seek(state.data_position);
  return Status::Ok();
}

namespace model {
namespace {

// The CPU pass: the fp32 model of transformer.cpp.
class CpuModelPass final : public ModelPass {
 public:
  explicit CpuModelPass(std::unique_ptr<Transformer<float>> model) : model_(std::move(model)) {}
  Status forward_backward(WeightStore& store, const ShardBatch& batch, double scale, StepLoss* loss) override {
    return model_->forward_backward(store, batch, scale, loss);
  }
  const AttentionPlan& attention_plan() const override { return model_->attention_plan(); }
  Status use_layout(const Layout& layout) override { return model_->use_layout(layout); }

 private:
  std::unique_ptr<Transformer<float>> model_;
};

}  // namespace

StatusOr<std::unique_ptr<ModelPass>> make_model_pass(const TrainOptions& o, const Layout& layout, Communicator& group,
                                                     TrainingMemory& memory) {
  if (o.device == DeviceKind::kCuda) return make_cuda_model_pass(o, layout, group, memory);
  SP_ASSIGN_OR_RETURN(std::unique_ptr<Transformer<float>> model,
                      Transformer<float>::create(o.model, o.checkpointing, o.plan_options(), layout, o.batch, group,
                                                 o.linear_sp, o.offload_checkpoints, o.tile_rows(),
                                                 o.offload_keep_layers));
  model->profile_steps(o.profile);
  return std::unique_ptr<ModelPass>(std::make_unique<CpuModelPass>(std::move(model)));
}

}  // namespace model
}  // namespace seqpar
