// Splits the attention between one query shard and one key shard (rows at global positions,
// from a layout) into dense calls that a fused kernel without position support (cuDNN) can
// run: each call is a range of query rows, a range of key rows, and either no mask or a
// top-left causal mask inside those ranges (key j' visible to query i' iff j' <= i').
//
// Masks it plans: full, and causal-like bands (no left window, right bound R >= 0: key p_k
// visible to query p_q iff p_k <= p_q + R), without documents or a block pattern, over strictly
// increasing positions. Anything else, or a pattern no few calls can write, has dense = false:
// run that pair with a kernel that takes positions (ours), over the arithmetic runs of the
// positions.
#pragma once

#include <cstdint>
#include <vector>

#include "seqpar/mask.hpp"

namespace seqpar {

struct BlockCall {
  int64_t q_begin = 0, q_end = 0;  // query rows [q_begin, q_end) of the shard
  int64_t k_begin = 0, k_end = 0;  // key rows [k_begin, k_end)
  bool causal = false;             // top-left causal inside the ranges; else no mask
};

struct BlockPlan {
  bool dense = true;  // false: use a positions-aware kernel for this pair
  std::vector<BlockCall> calls;  // empty with dense = true: nothing visible
};

BlockPlan plan_block_pair(const std::vector<int64_t>& q_positions,
                          const std::vector<int64_t>& k_positions, const MaskSpec& mask);

// The same (query, key) pairs in calls of at most `max_rows` query and key rows each
// (max_rows <= 0: the plan as it is). A causal call is tiled on one grid for its queries and
// keys: tiles on the diagonal stay causal, tiles below it are full, tiles above are dropped.
BlockPlan limit_call_rows(BlockPlan plan, int64_t max_rows);

// Maximal arithmetic runs of a position list: rows [begin, end) sit at offset + stride * i.
struct PositionRunSpan {
  int64_t begin = 0, end = 0;
  int64_t offset = 0, stride = 1;
};
std::vector<PositionRunSpan> arithmetic_runs(const std::vector<int64_t>& positions);

}  // namespace seqpar
