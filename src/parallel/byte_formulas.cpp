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
  // dK/dV of each shard: the accumulators of P - 1 shards travel on; this rank, the last visitor
  // of shard rank + 1's, sends that one home rounded to the K/V dtype (goes_home). (The ring
  // runs towards rank + 1, as under the full mask; a mask may turn it round, and then the shard
  // sent home is rank - 1's.)
  if (P > 1)
    for (int shard = 0; shard < P; ++shard)
      bytes.backward += 2 * layout.local_len(shard) * per_token *
                        dtype_size(shard == wrap(rank + 1, P) ? kv_dtype : accumulator_dtype);
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
  if (P > 1)  // dQ hops as the ring's dK/dV: the one sent home in the inputs' dtype
    for (int shard = 0; shard < P; ++shard)
      bytes += batch * layout.local_len(shard) * heads * head_dim *
               dtype_size(shard == wrap(rank + 1, P) ? dtype : accumulator_dtype);
  return bytes;
}

}  // namespace seqpar
