// Ring attention over any communicator: exact softmax attention with the sequence split over
// P ranks by a Layout.
//   forward:  K/V travel around the ring (P-1 hops); each rank folds every K/V shard into its
//             running (O, LSE) with the continuing forward kernel.
//   backward: K/V travel again (P-1 hops) together with the dK/dV accumulators of the shard
//             being visited, which take one more hop (P in all) to come home.
// Each step's exchange is started before the step's compute and waited on after it, so the
// transfer overlaps the compute wherever the communicator progresses in the background.
// Block pairs the mask empties are skipped (the K/V still pass through).
//
// Local shapes on rank r (S_r = layout.local_len(r)):
//   q, o, dout, dq: [B, S_r, H, D]   k, v, dk, dv: [B, S_r, H_kv, D]   lse: [B, H, S_r]
// The CPU path computes in fp32 or fp64; lse, o, dq, dk, dv have the dtype of q.
// params.mask is in global positions; params.q_positions/k_positions must be null (the layout
// supplies them).
#pragma once

#include <cstdint>

#include "seqpar/attention.hpp"
#include "seqpar/comm.hpp"
#include "seqpar/layout.hpp"

namespace seqpar {

struct RingStats {
  int pairs_computed = 0;  // (query shard, K/V shard) pairs that ran the kernel
  int pairs_skipped = 0;   // pairs the mask left empty
};

Status ring_attention_forward(Communicator& comm, const Layout& layout,
                              const AttentionParams& params, const TensorView& q,
                              const TensorView& k, const TensorView& v, const TensorView& o,
                              const TensorView& lse, RingStats* stats = nullptr);

// Writes (overwrites) dq, dk, dv; o and lse are the forward's results.
Status ring_attention_backward(Communicator& comm, const Layout& layout,
                               const AttentionParams& params, const TensorView& q,
                               const TensorView& k, const TensorView& v, const TensorView& o,
                               const TensorView& lse, const TensorView& dout,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               RingStats* stats = nullptr);

// Bytes rank `rank` sends, from the algorithm's definition (not from running it):
//   forward  = sum over its P-1 sends of the K and V shard it holds: 2 B S_j H_kv D e
//   backward = the same K/V sends plus one dK/dV accumulator send per shard (P sends):
//              sum_j 2 B S_j H_kv D e_acc
// With S divisible by P this is 2 (P-1) B (S/P) H_kv D e forward and
// 2 (P-1) B (S/P) H_kv D e + 2 P B (S/P) H_kv D e_acc backward (0 for P = 1).
struct TrafficBytes {
  int64_t forward = 0;
  int64_t backward = 0;
};
TrafficBytes ring_expected_bytes(const Layout& layout, int rank, int64_t batch, int64_t kv_heads,
                                 int64_t head_dim, DType kv_dtype, DType accumulator_dtype);

}  // namespace seqpar
