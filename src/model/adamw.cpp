// AdamW, clipping and the schedule (include/seqpar/optimizer.hpp). Moments in fp32, the update's
// arithmetic in double per element; the norm summed in a fixed order (the same bits every run).
#include <cmath>

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

AdamW::AdamW(const ModelConfig& config, const AdamWOptions& options)
    : o_(options), table_(parameter_table(config)) {
  const size_t n = size_t(parameter_count(config));
  m_.assign(n, 0.0f);
  v_.assign(n, 0.0f);
}

StatusOr<double> AdamW::step(float* params, float* grads, int64_t step) {
  double sq = 0;
  for (size_t i = 0; i < m_.size(); ++i) sq += double(grads[i]) * double(grads[i]);
  const double norm = std::sqrt(sq);
  SP_CHECK_ARG(std::isfinite(norm), "the gradient is not finite (norm " + std::to_string(norm) + ")");
  const double clip = o_.clip_norm > 0 && norm > o_.clip_norm ? o_.clip_norm / norm : 1.0;
  ++t_;
  const double lr = learning_rate(o_, step);
  const double c1 = 1.0 - std::pow(o_.beta1, double(t_)), c2 = 1.0 - std::pow(o_.beta2, double(t_));
  for (const ParamInfo& p : table_) {
    const double decay = p.decays ? o_.weight_decay : 0.0;
#pragma omp parallel for schedule(static)
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
      const double g = double(grads[i]) * clip;
      const double m = o_.beta1 * m_[size_t(i)] + (1 - o_.beta1) * g;
      const double v = o_.beta2 * v_[size_t(i)] + (1 - o_.beta2) * g * g;
      m_[size_t(i)] = float(m), v_[size_t(i)] = float(v);
      const double update = (m / c1) / (std::sqrt(v / c2) + o_.eps) + decay * double(params[i]);
      params[i] = float(double(params[i]) - lr * update);
    }
  }
  return norm;
}

}  // namespace seqpar
