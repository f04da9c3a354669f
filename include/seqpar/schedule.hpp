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
//            block of the same name (Combine), and sent results (partials, gradients) leave;
//   kConcat  joins the pieces of a span block (one block per shard of the span, same part) into
//            it, rows in shard order; the pieces are gone after (Ulysses' gathered sequence);
//            pieces received with Transfer::into_span are in it already;
//   kSplit   cuts a span result into one piece per shard (to send them home);
//   kPack    makes the query pack `block` from the Q block and the grad pack of the same name
//            (Ulysses' backward, where the forward kept Q).
// Blocks may hold a run of consecutive shards (span) and one head part of RankSchedule's
// head_parts (Ulysses: a rank computes the whole sequence for 1/u of the heads); a rank that
// holds a block with all heads holds each of its parts, and its own results may come home in
// parts, which together make the result.
// A compute must not read a block still arriving, nor write one in flight. The inputs a rank
// starts with are its own shard's Q, K/V and (backward) query pack; what it ends with are its
// own shard's (O, LSE) or dQ, dK/dV.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
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
  kGradPack,   // the query pack without Q: dO and the row stats (a rank's own is cut from its pack)
};
const char* block_kind_name(BlockKind kind);
// Results (O; dQ, dK/dV) are made by computes and go home; the rest are inputs.
inline bool is_result(BlockKind kind) {
  return kind == BlockKind::kOutput || kind == BlockKind::kDQ || kind == BlockKind::kDKV;
}

inline constexpr int kAllHeads = -1;

struct Block {
  BlockKind kind = BlockKind::kKV;
  int shard = 0;           // the first shard it holds rows of
  int span = 1;            // shards [shard, shard + span); rows in position order where they interleave in few pieces (SpanPositions, src/parallel/block_views.hpp), else shard after shard
  int part = kAllHeads;    // head part (RankSchedule::head_parts), or all heads
  bool operator==(const Block&) const = default;
  auto operator<=>(const Block&) const = default;
};

// A result sent to the rank whose shard it is arrives home for good, to be added (merged) into
// that rank's result: it travels rounded to the inputs' dtype, as a kernel's own part would be
// (row stats as they are), half the bytes of an fp32 accumulator. Results on their way to
// further ranks travel as accumulators.
inline bool goes_home(const Block& b, int to_rank) { return is_result(b.kind) && b.span == 1 && b.shard == to_rank; }

// How a received block joins the local block of the same name.
enum class Combine : uint8_t { kReplace, kAdd, kMerge };

struct Transfer {
  int peer = 0;
  Block block;
  Combine combine = Combine::kReplace;  // receives only
  // A result sent home may carry only rows [row_begin, row_end) of the block (the rows its
  // computes touched: ScheduleRequest::pair_rows); the rest add nothing. row_end < 0: all rows.
  int64_t row_begin = 0, row_end = -1;
  bool trimmed() const { return row_end >= 0; }
  // An input piece the receiver joins into this span block at its next kConcat of it: the span
  // block is made at the post (before the post's other buffers) and the piece arrives straight
  // in its rows, sent and received in the span's row pieces of its shard. Ulysses' backward
  // leaves no holes in a GPU stream arena so: the pieces' own buffers, given back once joined,
  // left a region the blocks made after did not tile (issue 35). Unset: a block of its own.
  std::optional<Block> into_span = std::nullopt;
};

enum class StepKind : uint8_t { kPost, kCompute, kWait, kConcat, kSplit, kPack };

// What a batch of transfers is, for the per-collective byte counts and the printed schedule:
// the data moved is always the batch's transfers (one grouped point-to-point batch, as NCCL
// runs its own all-to-all).
enum class Collective : uint8_t {
  kPointToPoint,         // ring and helper traffic
  kAllToAll,             // Ulysses: sequence shards <-> head parts
  kSwap,                 // Attention2D: K/V between (r,c) and (c,r), and dK/dV back
  kRowAllGather,         // Attention2D: Q (backward: the query pack) along a grid row
  kColumnAllGather,      // Attention2D: K/V along a grid column
  kRowReduceScatter,     // Attention2D: (O, LSE) merged (AttnFix), or dQ summed, along a row
  kColumnReduceScatter,  // Attention2D: dK/dV summed along a column
};
inline constexpr int kNumCollectives = 7;
const char* collective_name(Collective c);

struct Step {
  StepKind kind = StepKind::kCompute;
  int batch = -1;                       // kPost, kWait
  std::vector<Transfer> sends, recvs;   // kPost
  Collective collective = Collective::kPointToPoint;  // kPost
  int q_shard = -1, kv_shard = -1;      // kCompute: the first shards of the query and key blocks,
  int q_span = 1, kv_span = 1;          //   their spans,
  int part = kAllHeads;                 //   and the head part computed
  Block block;                          // kConcat, kSplit: the span block; kPack: the query pack
  int round = 0;                        // which round of the algorithm (for printing)
  // The blocks a compute reads (forward: Q; backward: the query pack) and writes.
  Block q_block(BlockKind kind) const { return {kind, q_shard, q_span, part}; }
  Block kv_block(BlockKind kind) const { return {kind, kv_shard, kv_span, part}; }
};

enum class Pass : uint8_t { kForward = 0, kBackward = 1 };

struct RankSchedule {
  std::vector<Step> forward, backward;
  int head_parts = 1;  // blocks with a part hold 1/head_parts of the heads (head_part_range)
  // Input blocks the forward keeps for the backward (held at the forward's end, there at the
  // backward's start): made with ScheduleRequest::keep_forward_state.
  std::vector<Block> kept = {};
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
  // pair_rows[a][b], for visible pairs: the local rows of shard a's queries that see some key of
  // shard b (q_begin, q_end) and of shard b's keys that some query of a sees (k_begin, k_end),
  // as hulls of the shards' increasing position runs (a zigzag shard's two chunks): a pair's
  // dQ and dK/dV touch no row outside them. Empty: not worked out (no result is trimmed).
  struct PairRows {
    int64_t q_begin = 0, q_end = 0, k_begin = 0, k_end = 0;
  };
  std::vector<std::vector<PairRows>> pair_rows;
  std::vector<int64_t> shard_rows;  // each shard's rows (with pair_rows)
  int64_t heads = 1, kv_heads = 1;
  // Ulysses x ring: the Ulysses degree (0: the algorithm chooses) and the ring-family algorithm
  // run along the ring dimension.
  int ulysses = 0;
  std::string ring_algorithm = "ring";
  // Algorithms that can (Ulysses, Attention2D) keep forward blocks for the backward instead of
  // moving them again (RankSchedule::kept); the executors then need a ForwardState between the passes.
  bool keep_forward_state = false;
  // Ulysses' all-to-alls receive their pieces straight into the span blocks they join
  // (Transfer::into_span; receives_into_spans says where).
  bool receive_into_spans = false;
};

// The query heads [first, last) of head part `part` of `parts`, and the K/V heads its queries
// read (with GQA a K/V head may belong to several parts: each holds a copy). Parts need heads
// divisible by parts, and K/V heads a multiple or a divisor of parts (head_parts_refusal).
struct HeadRange {
  int64_t first = 0, last = 0;
  int64_t count() const { return last - first; }
};
HeadRange head_part_range(int part, int parts, int64_t heads);
HeadRange kv_part_range(int part, int parts, int64_t heads, int64_t kv_heads);
// Empty when heads split into `parts` parts, else why not.
std::string head_parts_refusal(int parts, int64_t heads, int64_t kv_heads);
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
  // Results are held in the inputs' dtype where holds_rounded says so (a backend that writes
  // parts, inputs not fp32: block_bytes_for); else every result is an accumulator.
  bool results_rounded = false;
  // The executor runs the schedule once per head group (heads / groups, K/V heads / groups):
  // a head part of a group that copies K/V heads copies them once per group.
  int head_groups = 1;
  int64_t of(BlockKind kind, int64_t rows) const;
  // One head group's head part `part` of `head_parts` (its heads, and the K/V heads they read).
  BlockBytes head_part(int part, int head_parts) const;
  // A block of the layout's shards: its rows, and with a head part 1/parts of each group's heads.
  int64_t of(const Block& block, const Layout& layout, int head_parts) const;
  // As a block sent to rank `to_rank` travels (goes_home: results in the inputs' dtype).
  BlockBytes on_wire(const Block& block, int to_rank) const {
    BlockBytes b = *this;
    if (goes_home(block, to_rank)) b.accumulator = input;
    return b;
  }
};
// Whether Ulysses receives straight into its spans (ScheduleRequest::receive_into_spans): where
// the accumulators are wider than the inputs (devices, bf16/fp16), whose dQ and dK/dV then hold
// more at the compute than a span does beside the send buffers at the all-to-all, so the walked
// peak does not rise, and a GPU stream arena keeps no holes. With accumulators of the inputs'
// dtype (the host) the all-to-all would hold more than the compute (up to 7% over the walk).
inline bool receives_into_spans(const BlockBytes& b) { return dtype_size(b.accumulator) > dtype_size(b.input); }
// The one-shard pieces a span block joins from or splits into (same kind and head part).
std::vector<Block> span_pieces(const Block& block);
// Rows of a block: its span's shards' rows.
int64_t block_rows(const Block& block, const Layout& layout);

// Bytes a rank sends in one pass, in all and per link class, from walking its steps.
struct WalkedBytes {
  int64_t total = 0;
  int64_t by_link[kNumLinkClasses] = {0, 0};
  int64_t by_collective[kNumCollectives] = {};
};
// Bytes of a transfer sent to `to_rank` as it travels (trimmed rows, goes_home's dtype).
int64_t transfer_bytes(const Transfer& t, int to_rank, const Layout& layout, const BlockBytes& bytes,
                       int head_parts = 1);
WalkedBytes walk_bytes(const std::vector<Step>& steps, int rank, const Layout& layout,
                       const BlockBytes& bytes, const Topology& topology, int head_parts = 1);

// Checks every rank's pass together: sends matched by receives (same block, same order per
// pair of ranks), no rank waits forever, computes read only blocks present and write none in
// flight, every visible (query shard, key shard) pair computed exactly once, and every
// result (O; dQ, dK/dV) back home complete. Ok, or the first violation found.
Status validate_schedules(const std::vector<RankSchedule>& schedules, const ScheduleRequest& request,
                          Pass pass);

// One rank's steps, one per line ("r2 post#3 send KV[1]->3 (intra) recv KV[0]<-1", ...).
std::string describe_steps(const std::vector<Step>& steps, const Topology& topology, int rank);

// "KV[3]", "KV[4+2]" (a span of 2 shards from 4), "Q[3]/h1" (head part 1).
std::string block_name(const Block& b);

// Block lifetimes, as the executors keep blocks (src/parallel/block_lifetimes.cpp).
// last_input_uses: for each input block of another shard a rank holds in a pass, the index of
// the step after which it is no longer read or sent (the executors free it there).
// Blocks in `kept` (the forward's RankSchedule::kept) are never dropped.
std::map<Block, size_t> last_input_uses(const std::vector<Step>& steps, Pass pass, int rank,
                                        const std::vector<Block>& kept = {});
// result_uses: how each result block a rank holds in a pass is made, which decides how the GPU
// executor holds it: in the inputs' dtype where at most two parts reach it and it goes nowhere
// but home (two parts summed in fp32 and rounded once come out as through an fp32
// accumulator), else as an fp32 accumulator.
struct ResultUse {
  int parts = 0;            // computes into it, and receives of it
  bool travels_on = false;  // sent to a rank it does not belong to (as an accumulator)
  bool regrouped = false;   // joined from or split into span pieces
};
std::map<Block, ResultUse> result_uses(const std::vector<Step>& steps, Pass pass);
// Whether `rank` holds result b so (where BlockBytes::results_rounded): at most two parts, never
// sent on or regrouped, and not its own whole-heads result that head parts are added into.
bool holds_rounded(const Block& b, const ResultUse& use, int rank, int head_parts);
// A rank's own whole-heads result: held rounded, it is the caller's output tensors themselves.
inline bool is_own_result(const Block& b, int rank) { return is_result(b.kind) && b == Block{b.kind, rank}; }
// The most bytes of blocks a rank holds at once in a pass besides the caller's tensors:
// received inputs (spans received straight into, from their post), results (its own included, unless held in the caller's tensors), result
// parts arriving to be combined (buffers of their own from the post to the wait, beside the
// result a compute makes meanwhile) and the rounded copies of accumulators sent home, each
// block sized for the layout's
// longest shard as the GPU executor allocates them (results_rounded: as it holds them). Head
// groups divide it.
int64_t peak_block_bytes(const std::vector<Step>& steps, Pass pass, int rank, const Layout& layout,
                         const BlockBytes& bytes, int head_parts = 1);

// The attention work of a rank's pass, in shard pairs of all heads: each compute's visible
// (query shard, key shard) pairs, times the share of the heads it computes (for balance
// reports and auto's choice; Ulysses computes P pairs a rank at 1/P of the heads each).
double compute_work(const std::vector<Step>& steps, const ScheduleRequest& request, int head_parts);

}  // namespace seqpar
