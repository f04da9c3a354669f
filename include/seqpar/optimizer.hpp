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

// AdamW over the elements [begin, end) of the flat parameter buffer (all of it by default; a
// ZeRO rank's shard otherwise): the moments exist for those elements alone.
class AdamW {
 public:
  AdamW(const ModelConfig& config, const AdamWOptions& options, int64_t begin = 0, int64_t end = -1);
  // Clips by `norm` (the global norm of the whole gradient, summed over the ranks) and updates
  // the parameters [begin, end) from their gradients; both pointers point at element `begin`.
  Status update(float* params, const float* grads, double norm, int64_t step);
  // The global norm of a whole gradient (fixed summation order); not finite: an error.
  static StatusOr<double> norm_of(const float* grads, int64_t count);
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  // The moments of [begin, end) and the step count, for checkpoints.
  std::vector<float>& first_moment() { return m_; }
  std::vector<float>& second_moment() { return v_; }
  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }

 private:
  AdamWOptions o_;
  std::vector<ParamInfo> table_;
  int64_t begin_ = 0, end_ = 0;
  std::vector<float> m_, v_;
  int64_t t_ = 0;
};

}  // namespace seqpar
