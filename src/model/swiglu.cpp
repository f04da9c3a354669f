// SwiGLU's gate: a = silu(g) * u, silu(g) = g * sigmoid(g).
//   da -> du = da * silu(g),  dg = da * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))).
#include <cmath>

#include "model/layers.hpp"

namespace seqpar::model {

template <class T>
void swiglu_forward(const T* g, const T* u, T* a, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T sig = T(1) / (T(1) + std::exp(-g[i]));
    a[i] = g[i] * sig * u[i];
  }
}

template <class T>
void swiglu_backward(const T* g, const T* u, const T* da, T* dg, T* du, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T sig = T(1) / (T(1) + std::exp(-g[i]));
    du[i] = da[i] * g[i] * sig;
    dg[i] = da[i] * u[i] * sig * (T(1) + g[i] * (T(1) - sig));
  }
}

template void swiglu_forward<float>(const float*, const float*, float*, int64_t);
template void swiglu_forward<double>(const double*, const double*, double*, int64_t);
template void swiglu_backward<float>(const float*, const float*, const float*, float*, float*, int64_t);
template void swiglu_backward<double>(const double*, const double*, const double*, double*, double*, int64_t);

}  // namespace seqpar::model
