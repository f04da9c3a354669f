// The papers' closed-form byte counts of ring attention and BurstAttention, what the tests hold
// the walked schedules to (the executors' bytes are walked from the schedules, schedule.hpp; the
// algorithms themselves are src/parallel/algorithms/ring.cpp and burst.cpp).
//
// BurstAttention (../shared/papers/000_*): its forward is the ring forward (K/V travel). Its
// backward keeps K, V, dK, dV at home and circulates the query side instead: Q, dO, D =
// rowsum(dO * O) and LSE travel one step ahead (P - 1 hops), while the accumulating dQ travels one
// round behind and takes one more hop home (P hops). This is the corrected schedule of the
// report: the printed Algorithm 4 sends dQ before adding the step's contribution and loses dQ
// updates (test_ring.cpp keeps that regression).
#pragma once

#include <cstdint>

#include "seqpar/dtype.hpp"
#include "seqpar/layout.hpp"

namespace seqpar::testing {

inline int wrap_rank(int r, int p) { return ((r % p) + p) % p; }

// Bytes rank `rank` sends in ring attention, from the algorithm's definition (not from running it):
//   forward  = sum over its P-1 sends of the K and V shard it holds: 2 B S_j H_kv D e
//   backward = the same K/V sends plus one dK/dV send per shard (P sends): the accumulators
//              of the P - 1 shards whose dK/dV travel on, 2 B S_j H_kv D e_acc each, and shard
//              rank + 1's, which this rank sends home rounded (goes_home), 2 B S_j H_kv D e
// With S divisible by P this is 2 (P-1) B (S/P) H_kv D e forward and
// 2 P B (S/P) H_kv D e + 2 (P-1) B (S/P) H_kv D e_acc backward (0 for P = 1).
struct TrafficBytes {
  int64_t forward = 0;
  int64_t backward = 0;
};
inline TrafficBytes ring_expected_bytes(const Layout& layout, int rank, int64_t batch, int64_t kv_heads,
                                        int64_t head_dim, DType kv_dtype, DType accumulator_dtype) {
  const int P = layout.ranks();
  const int64_t per_token = batch * kv_heads * head_dim;
  TrafficBytes bytes;
  for (int step = 0; step < P - 1; ++step)
    bytes.forward += 2 * layout.local_len(wrap_rank(rank - step, P)) * per_token * int64_t(dtype_size(kv_dtype));
  bytes.backward = bytes.forward;
  // dK/dV of each shard: the accumulators of P - 1 shards travel on; this rank, the last visitor
  // of shard rank + 1's, sends that one home rounded to the K/V dtype (goes_home). (The ring runs
  // towards rank + 1, as under the full mask; a mask may turn it round, and then the shard sent
  // home is rank - 1's.)
  if (P > 1)
    for (int shard = 0; shard < P; ++shard)
      bytes.backward += 2 * layout.local_len(shard) * per_token *
                        int64_t(dtype_size(shard == wrap_rank(rank + 1, P) ? kv_dtype : accumulator_dtype));
  return bytes;
}

// What travels with Q and dO in the Burst backward: D = rowsum(dO * O) and LSE in the compute
// dtype (a backend that takes D), or O (bf16) and LSE (fp32) for one that recomputes D from O.
enum class BurstPack { kDeltaLse, kOutputLse };

// Bytes rank `rank` sends in the Burst backward, from the schedule's definition:
//   sum over its P-1 sends of the query shard it holds:
//     kDeltaLse:  (2 B S_j H D + 2 B H S_j) e
//     kOutputLse: 3 B S_j H D e + 4 B H S_j
//   plus one dQ send per shard (P sends): B S_j H D e_acc for the P - 1 accumulators that
//   travel on, B S_j H D e for shard rank + 1's, sent home rounded (goes_home)  (0 for P = 1)
inline int64_t burst_backward_expected_bytes(const Layout& layout, int rank, int64_t batch, int64_t heads,
                                             int64_t head_dim, DType dtype, DType accumulator_dtype,
                                             BurstPack pack = BurstPack::kDeltaLse) {
  const int P = layout.ranks();
  int64_t bytes = 0;
  for (int step = 0; step < P - 1; ++step) {
    const int64_t rows = layout.local_len(wrap_rank(rank - step, P));
    const int64_t tensor = batch * rows * heads * head_dim, row_stat = batch * heads * rows;
    bytes += pack == BurstPack::kDeltaLse ? (2 * tensor + 2 * row_stat) * int64_t(dtype_size(dtype))
                                          : 3 * tensor * int64_t(dtype_size(dtype)) + row_stat * 4;
  }
  if (P > 1)  // dQ hops as the ring's dK/dV: the one sent home in the inputs' dtype
    for (int shard = 0; shard < P; ++shard)
      bytes += batch * layout.local_len(shard) * heads * head_dim *
               int64_t(dtype_size(shard == wrap_rank(rank + 1, P) ? dtype : accumulator_dtype));
  return bytes;
}

}  // namespace seqpar::testing
