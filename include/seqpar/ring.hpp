// Ring attention's closed-form byte count (what the tests hold the walked schedule to). The ring itself, like every algorithm, is a schedule: src/parallel/algorithms/ring.cpp
// (algorithm.hpp, distributed_attention.hpp).
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

// Bytes rank `rank` sends, from the algorithm's definition (not from running it):
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
TrafficBytes ring_expected_bytes(const Layout& layout, int rank, int64_t batch, int64_t kv_heads,
                                 int64_t head_dim, DType kv_dtype, DType accumulator_dtype);

}  // namespace seqpar
