// Rotary position embedding, Hugging Face's rotate-half form, at global positions: the pair
// (x_i, x_{i+D/2}) of each head turns by the angle p * theta^(-2i/D), p the row's position in
// the whole sequence (from the layout, so a shard rotates exactly as the unsplit sequence).
// Angles in double: p reaches millions, and p * inv_freq must not lose its fraction.
#include <cmath>

#include "model/layers.hpp"

namespace seqpar::model {

template <class T>
void rope_apply(T* x, const int64_t* positions, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                double theta, bool inverse) {
  const int64_t half = head_dim / 2;
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < seq; ++s) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(positions[s]) * std::pow(theta, -2.0 * double(i) / double(head_dim));
      const double c = std::cos(angle), sn = inverse ? -std::sin(angle) : std::sin(angle);
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t h = 0; h < heads; ++h) {
          T* row = x + ((b * seq + s) * heads + h) * head_dim;
          const double x1 = double(row[i]), x2 = double(row[i + half]);
          row[i] = T(x1 * c - x2 * sn);
          row[i + half] = T(x2 * c + x1 * sn);
        }
    }
  }
}

template void rope_apply<float>(float*, const int64_t*, int64_t, int64_t, int64_t, int64_t, double, bool);
template void rope_apply<double>(double*, const int64_t*, int64_t, int64_t, int64_t, int64_t, double, bool);

}  // namespace seqpar::model
