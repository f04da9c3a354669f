// Helpers of the trainer's CPU tests (test_train.cpp, test_train_linear.cpp): a small model, a
// random batch, the loss and summed gradient of one pass over P thread ranks, the fp64 gradient
// against finite differences, a short training run on P thread ranks, and the worst relative
// difference per parameter tensor.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "seqpar/trainer.hpp"

namespace seqpar {

inline ModelConfig tiny() {
  ModelConfig c;
  c.vocab = 32, c.hidden = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ffn = 48;
  return c;
}

// A batch of `batch` sequences of random tokens with every third target ignored.
inline void make_batch(int64_t batch, int64_t seq, int64_t vocab, std::vector<std::vector<int32_t>>* inputs,
                std::vector<std::vector<int32_t>>* targets) {
  std::mt19937_64 rng(77);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(vocab) - 1);
  inputs->assign(size_t(batch), std::vector<int32_t>(size_t(seq)));
  targets->assign(size_t(batch), std::vector<int32_t>(size_t(seq)));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s) {
      (*inputs)[size_t(b)][size_t(s)] = tok(rng);
      (*targets)[size_t(b)][size_t(s)] = s % 3 == 2 ? -1 : tok(rng);
    }
}

inline double counted_targets(const std::vector<std::vector<int32_t>>& targets) {
  double n = 0;
  for (const auto& t : targets)
    for (int32_t x : t) n += x >= 0;
  return n;
}

// Loss (mean) and the gradient summed over the ranks, for P ranks (linear layers split by `linear`;
// the MLP `tile_tokens` rows at a time, 0: all).
template <class T>
Status loss_and_grad(const ModelConfig& c, const std::vector<T>& params, int P, LayoutKind layout, Checkpointing policy,
                     const std::string& algo, int64_t seq, double* loss, std::vector<T>* grad,
                     LaspAlgorithm linear = LaspAlgorithm::kAuto, int64_t tile_tokens = 0) {
  std::vector<std::vector<int32_t>> inputs, targets;
  make_batch(2, seq, c.vocab, &inputs, &targets);
  const double count = counted_targets(targets);
  SP_ASSIGN_OR_RETURN(const Layout lay, Layout::create(layout, seq, P));
  // Each rank's gradient and loss, summed in rank order afterwards: the same bits every run.
  std::vector<std::vector<T>> grads(static_cast<size_t>(P));
  std::vector<double> losses(static_cast<size_t>(P), 0.0);
  const Status s = run_local_ranks(P, [&](Communicator& comm) -> Status {
    SP_ASSIGN_OR_RETURN(auto model, Transformer<T>::create(c, policy, PlanOptions(algo), lay, 2, comm, linear,
                                                                 /*offload_checkpoints=*/false, tile_tokens));
    std::vector<T> g(params.size(), T(0));
    StepLoss l;
    SP_RETURN_IF_ERROR(model->forward_backward(params.data(), g.data(), shard_batch(lay, comm.rank(), inputs, targets),
                                               1.0 / count, &l));
    grads[size_t(comm.rank())] = std::move(g);
    losses[size_t(comm.rank())] = l.loss_sum;
    return Status::Ok();
  });
  grad->assign(params.size(), T(0));
  double loss_sum = 0;
  for (int r = 0; r < P && s.ok(); ++r) {
    for (size_t i = 0; i < grad->size(); ++i) (*grad)[i] += grads[size_t(r)][i];
    loss_sum += losses[size_t(r)];
  }
  *loss = loss_sum / count;
  return s;
}

// The fp64 gradient over 2 ranks of `layout` against central differences (step 2e-6) at
// `samples` elements of every parameter tensor.
inline void expect_gradient_matches_finite_differences(const ModelConfig& c, std::vector<double> params,
                                                       LayoutKind layout, int64_t samples) {
  const int64_t seq = 24;
  double loss = 0;
  std::vector<double> grad, unused;
  ASSERT_TRUE(loss_and_grad(c, params, 2, layout, Checkpointing::kNone, "ring", seq, &loss, &grad).ok());
  for (const ParamInfo& p : parameter_table(c)) {
    for (int64_t k = 0; k < samples; ++k) {
      const size_t i = size_t(p.offset + (k * 7919) % p.numel);
      const double keep = params[i], h = 2e-6;
      double up = 0, down = 0;
      params[i] = keep + h;
      ASSERT_TRUE(loss_and_grad(c, params, 2, layout, Checkpointing::kNone, "ring", seq, &up, &unused).ok());
      params[i] = keep - h;
      ASSERT_TRUE(loss_and_grad(c, params, 2, layout, Checkpointing::kNone, "ring", seq, &down, &unused).ok());
      params[i] = keep;
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(grad[i], numeric, 1e-7 + 1e-5 * std::abs(numeric)) << p.name << " element " << i - size_t(p.offset);
    }
  }
}

// Relative Frobenius difference per parameter tensor.
template <class T>
double worst_tensor_error(const ModelConfig& c, const std::vector<T>& got, const std::vector<T>& want,
                          std::string* which) {
  double worst = 0;
  for (const ParamInfo& p : parameter_table(c)) {
    double d = 0, n = 0;
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i)
      d += std::pow(double(got[size_t(i)]) - want[size_t(i)], 2), n += std::pow(double(want[size_t(i)]), 2);
    const double e = std::sqrt(d) / std::max(std::sqrt(n), 1e-30);
    if (e > worst) worst = e, *which = p.name;
  }
  return worst;
}

inline TrainOptions small_run(int64_t steps) {
  TrainOptions o;
  o.model = tiny();
  o.model.vocab = kRecallVocab;
  o.seq = 64, o.batch = 4, o.steps = steps;
  o.optimizer.total_steps = steps;
  o.optimizer.warmup_steps = 3;
  return o;
}

// Runs `steps` steps on P thread ranks (resuming from `resume` when given, saving to `save`),
// returning rank 0's losses and final parameters.
inline Status train(const TrainOptions& o, int P, int64_t until, const std::string& resume, const std::string& save,
             std::vector<double>* losses, std::vector<float>* params) {
  std::mutex mu;
  return run_local_ranks(P, [&](Communicator& comm) -> Status {
    SP_ASSIGN_OR_RETURN(auto trainer, Trainer::create(o, comm));
    if (!resume.empty()) SP_RETURN_IF_ERROR(trainer->load(resume));
    while (trainer->steps_done() < until) {
      StepReport r;
      SP_RETURN_IF_ERROR(trainer->step(&r));
      std::lock_guard lock(mu);
      if (comm.rank() == 0) losses->push_back(r.loss);
    }
    if (!save.empty()) SP_RETURN_IF_ERROR(trainer->save(save));
    SP_ASSIGN_OR_RETURN(std::vector<float> all, trainer->gather_parameters());
    if (comm.rank() == 0) *params = std::move(all);
    return Status::Ok();
  });
}

inline double worst_param_error(const ModelConfig& c, const std::vector<float>& got, const std::vector<float>& want) {
  std::string which;
  return worst_tensor_error(c, got, want, &which);
}

}  // namespace seqpar
