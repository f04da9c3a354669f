// AdamW's options and schedule (include/seqpar/optimizer.hpp) and the CPU half of its update
// (model/layers.hpp; adamw.cu is the CUDA half): moments in fp32, the arithmetic in double per element.
#include <algorithm>
#include <cmath>

#include "model/layers.hpp"
#include "seqpar/optimizer.hpp"

namespace seqpar {

Status validate_adamw(const AdamWOptions& o) {
  SP_CHECK_ARG(o.lr > 0 && std::isfinite(o.lr), "the learning rate must be positive");
  SP_CHECK_ARG(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "AdamW's betas must be in [0, 1)");
  SP_CHECK_ARG(o.eps > 0, "AdamW's eps must be positive");
  SP_CHECK_ARG(o.weight_decay >= 0, "the weight decay must not be negative");
  SP_CHECK_ARG(o.warmup_steps >= 0 && o.total_steps >= 1, "warmup must be >= 0 steps and the run >= 1 step");
  SP_CHECK_ARG(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1, "the final learning-rate ratio must be in [0, 1]");
  return Status::Ok();
}

double learning_rate(const AdamWOptions& o, int64_t step) {
  if (step < o.warmup_steps) return o.lr * double(step + 1) / double(o.warmup_steps);
  const double span = double(std::max<int64_t>(1, o.total_steps - o.warmup_steps));
  const double progress = std::min(1.0, double(step - o.warmup_steps) / span);
  const double floor = o.min_lr_ratio * o.lr;
  return floor + 0.5 * (o.lr - floor) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace seqpar

namespace seqpar::model {

StatusOr<AdamWStep> adamw_step(const AdamWOptions& o, double norm, int64_t step, int64_t t) {
  if (!std::isfinite(norm))  // a runtime failure, not a bad argument
    return SP_STATUS(StatusCode::kInternal, "the gradient is not finite at step " + std::to_string(step) + " (norm " +
                                                std::to_string(norm) + "); the parameters were not updated");
  AdamWStep a;
  a.lr = learning_rate(o, step), a.beta1 = o.beta1, a.beta2 = o.beta2, a.eps = o.eps;
  a.clip = o.clip_norm > 0 && norm > o.clip_norm ? o.clip_norm / norm : 1.0;
  a.c1 = 1.0 - std::pow(o.beta1, double(t)), a.c2 = 1.0 - std::pow(o.beta2, double(t));
  return a;
}

void adamw_update(const AdamWStep& a, double decay, float* params, const float* grads, float* m, float* v, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const double g = double(grads[i]) * a.clip;
    const double mi = a.beta1 * m[i] + (1 - a.beta1) * g;
    const double vi = a.beta2 * v[i] + (1 - a.beta2) * g * g;
    m[i] = float(mi), v[i] = float(vi);
    const double update = (mi / a.c1) / (std::sqrt(vi / a.c2) + a.eps) + decay * double(params[i]);
    params[i] = float(double(params[i]) - a.lr * update);
  }
}

}  // namespace seqpar::model
