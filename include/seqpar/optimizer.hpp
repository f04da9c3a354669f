// AdamW with decoupled weight decay over the flat parameter buffer, gradient clipping by the
// global norm, and the learning-rate schedule (linear warmup, then cosine down to a floor).
#pragma once

#include <cstdint>
#include <vector>

#include "seqpar/model.hpp"

namespace seqpar {

struct AdamWOptions {
  double lr = 3e-3;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;  // matrices only (ParamInfo::decays)
  double clip_norm = 1.0;     // <= 0: no clipping
  int64_t warmup_steps = 10;
  int64_t total_steps = 100;  // the cosine reaches min_lr_ratio * lr here
  double min_lr_ratio = 0.1;
};
Status validate_adamw(const AdamWOptions& options);

// The rate of 0-based step `step`: lr * (step + 1) / warmup during the warmup, then cosine.
double learning_rate(const AdamWOptions& options, int64_t step);

class AdamW {
 public:
  AdamW(const ModelConfig& config, const AdamWOptions& options);
  // Clips grads (already summed over the ranks) to clip_norm by their global norm, then updates
  // params. Returns the norm before clipping. NaN or inf gradients update nothing.
  StatusOr<double> step(float* params, float* grads, int64_t step);
  // The moments and the step count, for checkpoints.
  std::vector<float>& first_moment() { return m_; }
  std::vector<float>& second_moment() { return v_; }
  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }

 private:
  AdamWOptions o_;
  std::vector<ParamInfo> table_;
  std::vector<float> m_, v_;
  int64_t t_ = 0;
};

}  // namespace seqpar
