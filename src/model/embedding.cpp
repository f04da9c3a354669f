// Token embedding: a row gather forward, a scatter-add backward (serial over rows: two rows may
// share a token).
#include <algorithm>

#include "model/layers.hpp"

namespace seqpar::model {

template <class T>
void embedding_forward(const int32_t* tokens, const T* table, T* x, int64_t rows, int64_t dim) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) std::copy(table + int64_t(tokens[r]) * dim, table + (int64_t(tokens[r]) + 1) * dim, x + r * dim);
}

template <class T>
void embedding_backward(const int32_t* tokens, const T* dx, T* dtable, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    T* to = dtable + int64_t(tokens[r]) * dim;
    const T* from = dx + r * dim;
    for (int64_t d = 0; d < dim; ++d) to[d] += from[d];
  }
}

template void embedding_forward<float>(const int32_t*, const float*, float*, int64_t, int64_t);
template void embedding_forward<double>(const int32_t*, const double*, double*, int64_t, int64_t);
template void embedding_backward<float>(const int32_t*, const float*, float*, int64_t, int64_t);
template void embedding_backward<double>(const int32_t*, const double*, double*, int64_t, int64_t);

}  // namespace seqpar::model
