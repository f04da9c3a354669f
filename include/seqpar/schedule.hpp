// A distributed attention algorithm as data: for each rank, the ordered steps of its forward
// and of its backward pass. Steps name blocks (which tensor of whose shard), peers and link
// classes, never memory: one executor per device kind runs any schedule, the byte counts come
// from walking it, and tests inspect it (every visible pair computed exactly once, every
// result back home, sends matched by receives, no deadlock).
//
// Semantics, per rank and pass:
//   kPost    starts a batch of sends and receives (ids are the batch's number);
//   kCompute runs the local attention of q_shard's queries against kv_shard's keys. Forward:
//            the result merges into the running (O, LSE) of q_shard, the rank's output when
//            q_shard is its own, else a partial it will send home. Backward: dQ of q_shard and
//            dK/dV of kv_shard accumulate (into this rank's results or into blocks that travel);
//   kWait    completes a batch; received blocks then replace, add to or merge into the local
//            block of the same name (Combine), and sent results (partials, gradients) leave.
// A compute must not read a block still arriving, nor write one in flight. The inputs a rank
// starts with are its own shard's Q, K/V and (backward) query pack; what it ends with are its
// own shard's (O, LSE) or dQ, dK/dV.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "seqpar/dtype.hpp"
#include "seqpar/layout.hpp"
#include "seqpar/mask.hpp"
#include "seqpar/status.hpp"

namespace seqpar {

// What a block holds, for the shard (rank of origin) it belongs to.
enum class BlockKind : uint8_t {
  kKV,         // K and V                        2 x [B, S_s, H_kv, D]
  kQuery,      // Q (sent to a helper)           [B, S_s, H, D]
  kOutput,     // running (O, LSE) of the queries [B, S_s, H, D] + [B, H, S_s]
  kQueryPack,  // Q, dO and the row stats: D and LSE, or O and LSE where the backend cannot take D
  kDQ,         // dQ accumulator                 [B, S_s, H, D]
  kDKV,        // dK and dV accumulators         2 x [B, S_s, H_kv, D]
};
const char* block_kind_name(BlockKind kind);
// Results (O; dQ, dK/dV) are made by computes and go home; the rest are inputs.
inline bool is_result(BlockKind kind) {
  return kind == BlockKind::kOutput || kind == BlockKind::kDQ || kind == BlockKind::kDKV;
}

struct Block {
  BlockKind kind = BlockKind::kKV;
  int shard = 0;
  bool operator==(const Block&) const = default;
  auto operator<=>(const Block&) const = default;
};

// How a received block joins the local block of the same name.
enum class Combine : uint8_t { kReplace, kAdd, kMerge };

struct Transfer {
  int peer = 0;
  Block block;
  Combine combine = Combine::kReplace;  // receives only
};

enum class StepKind : uint8_t { kPost, kCompute, kWait };

struct Step {
  StepKind kind = StepKind::kCompute;
  int batch = -1;                       // kPost, kWait
  std::vector<Transfer> sends, recvs;   // kPost
  int q_shard = -1, kv_shard = -1;      // kCompute
  int round = 0;                        // which round of the algorithm (for printing)
};

enum class Pass : uint8_t { kForward = 0, kBackward = 1 };

struct RankSchedule {
  std::vector<Step> forward, backward;
  const std::vector<Step>& pass(Pass p) const { return p == Pass::kForward ? forward : backward; }
};

// Ranks grouped into nodes of ranks_per_node consecutive ranks (0: all in one node).
struct Topology {
  int ranks_per_node = 0;
  int node_of(int rank) const { return ranks_per_node > 0 ? rank / ranks_per_node : 0; }
};
enum class LinkClass : uint8_t { kIntra = 0, kInter = 1 };
inline constexpr int kNumLinkClasses = 2;
const char* link_class_name(LinkClass link);

// What a schedule is made from: the ranks' shards and what each shard's queries see.
struct ScheduleRequest {
  int ranks = 1;
  Topology topology;
  // visible[a][b]: some query of shard a sees some key of shard b under the mask.
  std::vector<std::vector<bool>> visible;
  int64_t heads = 1, kv_heads = 1;
};
// visible[][] from the layout's positions and the mask (exact; MaskSpec::sees_any).
ScheduleRequest make_schedule_request(const Layout& layout, const MaskSpec& mask, int64_t heads,
                                      int64_t kv_heads, Topology topology = {});

// Bytes of one block of a shard: how the executor lays the block out on the wire.
struct BlockBytes {
  int64_t batch = 1, heads = 1, kv_heads = 1, head_dim = 1;
  DType input = DType::kF32;        // Q, K, V, dO, O travel in this dtype
  DType accumulator = DType::kF32;  // running O, dQ, dK, dV
  DType stats = DType::kF32;        // LSE and D
  bool pack_has_delta = true;       // the query pack carries D (else O)
  int64_t of(BlockKind kind, int64_t rows) const;
};

// Bytes a rank sends in one pass, in all and per link class, from walking its steps.
struct WalkedBytes {
  int64_t total = 0;
  int64_t by_link[kNumLinkClasses] = {0, 0};
};
WalkedBytes walk_bytes(const std::vector<Step>& steps, int rank, const Layout& layout,
                       const BlockBytes& bytes, const Topology& topology);

// Checks every rank's pass together: sends matched by receives (same block, same order per
// pair of ranks), no rank waits forever, computes read only blocks present and write none in
// flight, every visible (query shard, key shard) pair computed exactly once, and every
// result (O; dQ, dK/dV) back home complete. Ok, or the first violation found.
Status validate_schedules(const std::vector<RankSchedule>& schedules, const ScheduleRequest& request,
                          Pass pass);

// One rank's steps, one per line ("r2 post#3 send KV[1]->3 (intra) recv KV[0]<-1", ...).
std::string describe_steps(const std::vector<Step>& steps, const Topology& topology, int rank);

// Block lifetimes, as the executors keep blocks (src/parallel/block_lifetimes.cpp).
// last_input_uses: for each input block of another shard a rank holds in a pass, the index of
// the step after which it is no longer read or sent (the executors free it there).
std::map<Block, size_t> last_input_uses(const std::vector<Step>& steps, Pass pass, int rank);
// The most bytes of blocks a rank holds at once in a pass besides the caller's tensors:
// received inputs, results (its own included) and arriving parts, each block sized for the
// layout's longest shard as the GPU executor allocates them. Head groups divide it.
int64_t peak_block_bytes(const std::vector<Step>& steps, Pass pass, int rank, const Layout& layout,
                         const BlockBytes& bytes);

// Computes per step of the pass (for balance reports): the number of kCompute steps.
int count_computes(const std::vector<Step>& steps);

}  // namespace seqpar
