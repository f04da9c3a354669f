// AdamW's options: decoupled weight decay over the flat parameter buffer, gradient clipping by
// the global norm, and the learning-rate schedule (linear warmup, then cosine down to a floor).
// The update itself is the trainer's, on either device (src/model/adamw.cpp and adamw.cu).
#pragma once

#include <cstdint>

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

}  // namespace seqpar
