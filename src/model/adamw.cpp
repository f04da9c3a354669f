// AdamW, clipping and the schedule (include/seqpar/optimizer.hpp). Moments in fp32, the update's
// arithmetic in double per element; the norm summed in a fixed order (the same bits every run).
#include <algorithm>
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

AdamW::AdamW(const ModelConfig& config, const AdamWOptions& options, int64_t begin, int64_t end)
    : o_(options), table_(parameter_table(config)), begin_(begin), end_(end < 0 ? parameter_count(config) : end) {
  end_ = std::max(begin_, std::min(end_, parameter_count(config)));
  m_.assign(size_t(end_ - begin_), 0.0f);
  v_.assign(size_t(end_ - begin_), 0.0f);
}

StatusOr<double> AdamW::norm_of(const float* grads, int64_t count) {
  double sq = 0;
  for (int64_t i = 0; i < count; ++i) sq += double(grads[i]) * double(grads[i]);
  const double norm = std::sqrt(sq);
  SP_CHECK_ARG(std::isfinite(norm), "the gradient is not finite (norm " + std::to_string(norm) + ")");
  return norm;
}

Status AdamW::update(float* params, const float* grads, double norm, int64_t step) {
  SP_CHECK_ARG(std::isfinite(norm), "the gradient is not finite (norm " + std::to_string(norm) + ")");
  const double clip = o_.clip_norm > 0 && norm > o_.clip_norm ? o_.clip_norm / norm : 1.0;
  ++t_;
  const double lr = learning_rate(o_, step);
  const double c1 = 1.0 - std::pow(o_.beta1, double(t_)), c2 = 1.0 - std::pow(o_.beta2, double(t_));
  for (const ParamInfo& p : table_) {
    const int64_t lo = std::max(p.offset, begin_), hi = std::min(p.offset + p.numel, end_);
    const double decay = p.decays ? o_.weight_decay : 0.0;
#pragma omp parallel for schedule(static)
    for (int64_t i = lo; i < hi; ++i) {
      const size_t k = size_t(i - begin_);
      const double g = double(grads[k]) * clip;
      const double m = o_.beta1 * m_[k] + (1 - o_.beta1) * g;
      const double v = o_.beta2 * v_[k] + (1 - o_.beta2) * g * g;
      m_[k] = float(m), v_[k] = float(v);
      const double update = (m / c1) / (std::sqrt(v / c2) + o_.eps) + decay * double(params[k]);
      params[k] = float(double(params[k]) - lr * update);
    }
  }
  return Status::Ok();
}

}  // namespace seqpar
