// RMSNorm (Llama's): y = w * x * rstd, rstd = 1 / sqrt(mean(x^2) + eps), statistics in double.
//   backward: with g = dy * w and xhat = x * rstd,  dx = rstd * (g - xhat * mean(g * xhat)),
//             dw = sum over rows of dy * xhat.
#include <omp.h>

#include <cmath>
#include <vector>

#include "model/layers.hpp"

namespace seqpar::model {

template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t dim, double eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    double ss = 0;
    for (int64_t d = 0; d < dim; ++d) ss += double(xr[d]) * double(xr[d]);
    const T s = T(1.0 / std::sqrt(ss / double(dim) + eps));
    rstd[r] = s;
    for (int64_t d = 0; d < dim; ++d) y[r * dim + d] = w[d] * (xr[d] * s);
  }
}

template <class T>
void rmsnorm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t rows, int64_t dim) {
  // dw's partial sums per thread, added in thread order: the same bits on every run.
  std::vector<std::vector<double>> partial(size_t(omp_get_max_threads()), std::vector<double>(size_t(dim), 0.0));
#pragma omp parallel
  {
    std::vector<double>& dw_local = partial[size_t(omp_get_thread_num())];
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * dim;
      const T* gr = dy + r * dim;
      const double s = double(rstd[r]);
      double dot = 0;
      for (int64_t d = 0; d < dim; ++d) dot += double(gr[d]) * double(w[d]) * double(xr[d]) * s;
      const double mean = dot / double(dim);
      for (int64_t d = 0; d < dim; ++d) {
        const double xhat = double(xr[d]) * s;
        dx[r * dim + d] += T(s * (double(gr[d]) * double(w[d]) - xhat * mean));
        dw_local[d] += double(gr[d]) * xhat;
      }
    }
  }
  for (int64_t d = 0; d < dim; ++d) {
    double sum = 0;
    for (const auto& part : partial) sum += part[d];
    dw[d] += T(sum);
  }
}

template void rmsnorm_forward<float>(const float*, const float*, float*, float*, int64_t, int64_t, double);
template void rmsnorm_forward<double>(const double*, const double*, double*, double*, int64_t, int64_t, double);
template void rmsnorm_backward<float>(const float*, const float*, const float*, const float*, float*, float*, int64_t,
                                      int64_t);
template void rmsnorm_backward<double>(const double*, const double*, const double*, const double*, double*, double*,
                                       int64_t, int64_t);

}  // namespace seqpar::model
