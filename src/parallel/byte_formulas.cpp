// The papers' closed-form byte counts of ring attention and BurstAttention (ring.hpp,
// burst.hpp). The executors' bytes are walked from the schedules (schedule.hpp); these are
// what the tests hold those walks to.
#include <algorithm>

#include "parallel/ring_common.hpp"
#include "seqpar/burst.hpp"

namespace seqpar {

using parallel::wrap;

TrafficBytes ring_expected_bytes(const Layout& layout, int rank, int64_t batch, int64_t kv_heads,
                                 int64_t head_dim, DType kv_dtype, DType accumulator_dtype) {
  const int P = layout.ranks();
  const int64_t per_token = batch * kv_heads * head_dim;
  TrafficBytes bytes;
  for (int step = 0; step < P - 1; ++step) {
    const int64_t rows = layout.local_len(wrap(rank - step, P));
    bytes.forward += 2 * rows * per_token * dtype_size(kv_dtype);
  }
  bytes.backward = bytes.forward;
  if (P > 1)
    for (int shard = 0; shard < P; ++shard)
      bytes.backward += 2 * layout.local_len(shard) * per_token * dtype_size(accumulator_dtype);
  return bytes;
}

int64_t burst_backward_expected_bytes(const Layout& layout, int rank, int64_t batch,
                                      int64_t heads, int64_t head_dim, DType dtype,
                                      DType accumulator_dtype, BurstPack pack) {
  const int P = layout.ranks();
  int64_t bytes = 0;
  for (int step = 0; step < P - 1; ++step) {
    const int64_t rows = layout.local_len(wrap(rank - step, P));
    const int64_t tensor = batch * rows * heads * head_dim, row_stat = batch * heads * rows;
    bytes += pack == BurstPack::kDeltaLse
                 ? (2 * tensor + 2 * row_stat) * dtype_size(dtype)
                 : 3 * tensor * dtype_size(dtype) + row_stat * dtype_size(DType::kF32);
  }
  if (P > 1)
    for (int shard = 0; shard < P; ++shard)
      bytes += batch * layout.local_len(shard) * heads * head_dim * dtype_size(accumulator_dtype);
  return bytes;
}

}  // namespace seqpar
