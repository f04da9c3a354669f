// Linear layers and the matrix product under them: BLAS (OpenBLAS) sgemm/dgemm.
#include <cblas.h>

#include "model/layers.hpp"

namespace seqpar::model {

void set_blas_threads(int threads) {
#ifdef OPENBLAS_VERSION
  openblas_set_num_threads(threads);
#else
  (void)threads;  // another CBLAS: its own defaults
#endif
}

template <>
void gemm<float>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B,
                 float beta, float* C) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K),
              alpha, A, int(ta ? M : K), B, int(tb ? K : N), beta, C, int(N));
}
template <>
void gemm<double>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, const double* B,
                  double beta, double* C) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K),
              alpha, A, int(ta ? M : K), B, int(tb ? K : N), beta, C, int(N));
}

template <class T>
void linear_forward(const T* x, const T* w, T* y, int64_t rows, int64_t in, int64_t out) {
  gemm<T>(false, true, rows, out, in, T(1), x, w, T(0), y);
}

template <class T>
void linear_forward_add(const T* x, const T* w, T* y, int64_t rows, int64_t in, int64_t out) {
  gemm<T>(false, true, rows, out, in, T(1), x, w, T(1), y);
}

template <class T>
void linear_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t rows, int64_t in, int64_t out,
                     bool accumulate_dx) {
  if (dx) gemm<T>(false, false, rows, in, out, T(1), dy, w, accumulate_dx ? T(1) : T(0), dx);
  gemm<T>(true, false, out, in, rows, T(1), dy, x, T(1), dw);
}

template void linear_forward<float>(const float*, const float*, float*, int64_t, int64_t, int64_t);
template void linear_forward<double>(const double*, const double*, double*, int64_t, int64_t, int64_t);
template void linear_forward_add<float>(const float*, const float*, float*, int64_t, int64_t, int64_t);
template void linear_forward_add<double>(const double*, const double*, double*, int64_t, int64_t, int64_t);
template void linear_backward<float>(const float*, const float*, const float*, float*, float*, int64_t, int64_t,
                                     int64_t, bool);
template void linear_backward<double>(const double*, const double*, const double*, double*, double*, int64_t, int64_t,
                                      int64_t, bool);

}  // namespace seqpar::model
