// The LM head fused with cross-entropy (llm.c's fused classifier is the idea): logits are made
// `chunk` rows at a time into one [chunk, vocab] buffer and reduced to a logsumexp per row and the
// target's logit; in training each chunk's logits are then turned into scale * (softmax - onehot)
// in place and multiplied back before the next chunk is made. The [rows, vocab] logits never
// exist, and no chunk's logits are made twice.
#include <algorithm>
#include <cmath>
#include <vector>

#include "model/layers.hpp"

namespace seqpar::model {

template <class T>
void lm_head_loss(const T* x, const T* w, const int32_t* targets, int64_t rows, int64_t dim, int64_t vocab,
                  int64_t chunk, double* loss_sum, int64_t* counted, double scale, T* dx, T* dw) {
  std::vector<T> logits(size_t(std::min(chunk, rows) * vocab));
  std::vector<double> row_loss(size_t(rows), 0.0);  // summed in row order below: the same bits every run
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    gemm<T>(false, true, n, vocab, dim, T(1), x + r0 * dim, w, T(0), logits.data());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      T* row = logits.data() + i * vocab;
      double m = -INFINITY;
      for (int64_t v = 0; v < vocab; ++v) m = std::max(m, double(row[v]));
      double z = 0;
      for (int64_t v = 0; v < vocab; ++v) z += std::exp(double(row[v]) - m);
      const double l = m + std::log(z);
      const int32_t t = targets[r0 + i];
      if (t >= 0) row_loss[size_t(r0 + i)] = l - double(row[t]);
      if (!dx) continue;
      if (t < 0) {
        std::fill(row, row + vocab, T(0));
        continue;
      }
      for (int64_t v = 0; v < vocab; ++v) row[v] = T(scale * std::exp(double(row[v]) - l));
      row[t] -= T(scale);
    }
    if (!dx) continue;
    gemm<T>(false, false, n, dim, vocab, T(1), logits.data(), w, T(0), dx + r0 * dim);
    gemm<T>(true, false, vocab, dim, n, T(1), logits.data(), x + r0 * dim, T(1), dw);
  }
  double sum = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r)
    if (targets[r] >= 0) sum += row_loss[size_t(r)], ++count;
  *loss_sum = sum;
  *counted = count;
}

template void lm_head_loss<float>(const float*, const float*, const int32_t*, int64_t, int64_t, int64_t, int64_t,
                                  double*, int64_t*, double, float*, float*);
template void lm_head_loss<double>(const double*, const double*, const int32_t*, int64_t, int64_t, int64_t, int64_t,
                                   double*, int64_t*, double, double*, double*);

}  // namespace seqpar::model
