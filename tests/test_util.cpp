// Test helpers: random tensors and error measures.
#include "test_util.hpp"

#include <cmath>
#include <limits>
#include <random>

namespace seqpar::testing {

HostTensor random_tensor(DType dtype, const std::vector<int64_t>& shape, uint64_t seed) {
  HostTensor f64(DType::kF64, shape);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  for (int64_t i = 0; i < f64.numel(); ++i) f64.data<double>()[i] = dist(rng);
  return cast(f64, dtype);
}

HostTensor cast(const HostTensor& t, DType dtype) {
  std::vector<int64_t> shape(t.view().shape.begin(), t.view().shape.begin() + t.view().ndim);
  HostTensor out(dtype, shape);
  convert(t.view().data, t.view().dtype, out.view().data, dtype, t.numel());
  return out;
}

double max_abs_diff(const HostTensor& a, const HostTensor& b) {
  if (a.numel() != b.numel()) return std::numeric_limits<double>::infinity();
  const HostTensor x = cast(a, DType::kF64), y = cast(b, DType::kF64);
  double worst = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double u = x.data<double>()[i], v = y.data<double>()[i];
    if (u == v) continue;  // covers -inf == -inf
    const double d = std::abs(u - v);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, d);
  }
  return worst;
}

double max_abs(const HostTensor& t) {
  const HostTensor x = cast(t, DType::kF64);
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i)
    if (std::isfinite(x.data<double>()[i])) m = std::max(m, std::abs(x.data<double>()[i]));
  return m;
}

}  // namespace seqpar::testing
