// BurstAttention (../shared/papers/000_*): exact attention with the sequence split over P ranks.
// Its forward is the ring forward (K/V travel; see ring.hpp). Its backward keeps K, V, dK, dV
// at home and circulates the query side instead: Q, dO, D = rowsum(dO * O) and LSE travel one
// step ahead (P - 1 hops), while the accumulating dQ travels one round behind and takes one
// more hop home (P hops). This is the corrected schedule of the report: the printed
// Algorithm 4 sends dQ before adding the step's contribution and loses dQ updates (a test keeps
// that regression). With MHA this moves about half the bytes of the ring backward; with GQA the
// ring's K/V rotation can move less: auto (distributed_attention.hpp) picks by the walked
// bytes. The schedule is src/parallel/algorithms/burst.cpp; this is its closed-form byte count.
#pragma once

#include <string>

#include "seqpar/ring.hpp"

namespace seqpar {

// What travels with Q and dO. CPU ranks send D = rowsum(dO * O) and LSE in the compute
// dtype; GPU ranks send O (bf16) and LSE (fp32), since cuDNN's backward recomputes D from O
// and cannot take D.
enum class BurstPack { kDeltaLse, kOutputLse };

// Bytes rank `rank` sends in the Burst backward, from the schedule's definition:
//   sum over its P-1 sends of the query shard it holds:
//     kDeltaLse:  (2 B S_j H D + 2 B H S_j) e
//     kOutputLse: 3 B S_j H D e + 4 B H S_j
//   plus one dQ send per shard (P sends): B S_j H D e_acc for the P - 1 accumulators that
//   travel on, B S_j H D e for shard rank + 1's, sent home rounded (goes_home)  (0 for P = 1)
int64_t burst_backward_expected_bytes(const Layout& layout, int rank, int64_t batch,
                                      int64_t heads, int64_t head_dim, DType dtype,
                                      DType accumulator_dtype,
                                      BurstPack pack = BurstPack::kDeltaLse);

}  // namespace seqpar
