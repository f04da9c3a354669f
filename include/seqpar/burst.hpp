// BurstAttention (../shared/papers/000_*): exact attention with the sequence split over P ranks.
// Its forward is the ring forward (K/V travel; see ring.hpp). Its backward keeps K, V, dK, dV
// at home and circulates the query side instead: Q, dO, D = rowsum(dO * O) and LSE travel one
// step ahead (P - 1 hops), while the accumulating dQ travels one round behind and takes one
// more hop home (P hops). This is the corrected schedule of the report: the printed
// Algorithm 4 sends dQ before adding the step's contribution and loses dQ updates (a test keeps
// that regression). With MHA this moves about half the bytes of the ring backward; with GQA the
// ring's K/V rotation can move less: choose_gpu_backward picks by the bytes.
//
// Local shapes on rank r as in ring.hpp. The CPU path computes in fp32 or fp64.
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
//   plus one dQ accumulator send per shard (P sends): sum_j B S_j H D e_acc     (0 for P = 1)
int64_t burst_backward_expected_bytes(const Layout& layout, int rank, int64_t batch,
                                      int64_t heads, int64_t head_dim, DType dtype,
                                      DType accumulator_dtype,
                                      BurstPack pack = BurstPack::kDeltaLse);

enum class BackwardSchedule { kRing, kBurst };
const char* backward_schedule_name(BackwardSchedule schedule);
// Bytes rank `rank` sends on GPU ranks (K/V and the packs in `dtype`, accumulators in fp32).
// With two ranks nothing accumulates in transit: after the pack, each rank returns what it
// computed for its peer (if the peer's pair sees anything): the one dense call's part over that
// call's rows in `dtype` or, when several calls (or our own kernels, `own_kernels`) summed it,
// fp32 over every peer row: dQ (Burst, query heads) or dK and dV (ring, K/V heads).
TrafficBytes gpu_expected_bytes(const Layout& layout, int rank, BackwardSchedule schedule,
                                const AttentionParams& params, int64_t batch, int64_t heads,
                                int64_t kv_heads, int64_t head_dim, DType dtype, bool own_kernels);
// The GPU schedule whose backward moves fewer bytes on the busiest rank (ties go to Burst).
BackwardSchedule choose_gpu_backward(const Layout& layout, const AttentionParams& params, int64_t batch,
                                     int64_t heads, int64_t kv_heads, int64_t head_dim, DType dtype,
                                     bool own_kernels);

}  // namespace seqpar
