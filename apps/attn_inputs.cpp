// The tool's reproducible inputs (attn_inputs.hpp).
#include "attn_inputs.hpp"

namespace seqpar::app {
namespace {

// Uniform in [-1, 1) from a hash of (seed, tensor, global index) (splitmix64's finaliser).
double hashed_uniform(uint64_t seed, uint64_t tensor, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + tensor * 0xD1B54A32D192ED03ull + index;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

}  // namespace

HostTensor make_input(const Job& job, TensorId id, int64_t heads, const std::vector<int64_t>* positions) {
  const int64_t B = job.opt.batch, S = job.opt.seq, D = job.opt.head_dim;
  const int64_t n = positions ? static_cast<int64_t>(positions->size()) : S;
  HostTensor out(job.dtype, {B, n, heads, D});
  const size_t es = dtype_size(job.dtype);
#pragma omp parallel
  {
    std::vector<double> row(static_cast<size_t>(D));  // one head's row, converted into place
#pragma omp for collapse(2)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = positions ? (*positions)[i] : i;
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t d = 0; d < D; ++d) row[d] = hashed_uniform(job.opt.seed, id, ((b * S + t) * heads + h) * D + d);
          convert(row.data(), DType::kF64, static_cast<char*>(out.view().data) + ((b * n + i) * heads + h) * D * es,
                  job.dtype, D);
        }
      }
  }
  return out;
}

Inputs local_inputs(const Job& job, const Layout& layout, int rank) {
  const std::vector<int64_t>* rows = &layout.positions(rank);
  return {make_input(job, kQ, job.opt.heads, rows), make_input(job, kK, job.kv_heads, rows),
          make_input(job, kV, job.kv_heads, rows), make_input(job, kDout, job.opt.heads, rows)};
}

}  // namespace seqpar::app
