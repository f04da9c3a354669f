// The arguments of the Hopper (sm_90a) attention kernels (hopper_fwd.cuh, hopper_bwd.cuh), as
// plain structs without CUDA types, so host C++ (the backend, hopper_backend.cpp) fills them and
// the kernels' translation unit (hopper_kernels.cu) launches them. Zero-initialise, then fill:
// strides left 0 mean contiguous [B, S, H, D] (and [B, H, S] for row statistics).
#pragma once

#include <cstddef>
#include <cstdint>

namespace seqpar::hopper {

// Element strides of a [B, S, H, D] tensor whose last dim is contiguous; all 0: contiguous.
struct RowStrides {
  int64_t b = 0, s = 0, h = 0;
};
// Element strides of a [B, H, S] row-statistics tensor whose last dim is contiguous; 0: contiguous.
struct StatStrides {
  int64_t b = 0, h = 0;
};

// A mask as visible-tile lists (hopper_tiles.hpp builds them; every pointer is device memory).
// One side's tiles (the forward: query tiles; the backward: key tiles) each list the other
// side's tiles that hold a visible pair; begin == nullptr means no lists (the full or causal path).
// Entry flags (entry = other side's tile << 2 | flags).
inline constexpr int kTileRangeMask = 1;    // some element lies outside its row's interval
inline constexpr int kTilePatternMask = 2;  // the pattern does not allow every block pair in it
struct TileMask {
  const int32_t* begin;    // [tiles + 1]: tile t's entries are entries[begin[t] .. begin[t + 1])
  const int32_t* entries;  // other side's tile << 2 | flags (1: range mask, 2: pattern mask)
  const int32_t* order;    // [tiles]: the order (order_tiles) one head's CTAs take the tiles
                           // in (listed_unit maps a CTA to a rank in it and a head)
  int heavy;               // outliers leading `order`: taken by every head before the rest
  const int32_t* ranges;   // [this side's rows][2]: first and last other-side row it sees
                           // under band and documents (first > last: none)
  const uint32_t* bits;    // pattern bitmap [this side's blocks][bits_words]: bit c = block c of
                           // the other side visible; nullptr: no pattern
  int bits_words;
  int block_shift;         // pattern block = 1 << block_shift positions
  int pos0, other_pos0;    // positions of row 0 of this side and of the other side
  int query_rows;          // rows of the lists' query tiles (the forward's tiles, the backward's
                           // entries): backward() runs the kernel of that tile (D = 128: 64 or 80)
  int key_rows;            // keys of the lists' key tiles (the forward's entries, the backward's
                           // tiles): at D = 128 a backward's 64-key tiles run the short kernel
};

#ifdef __CUDACC__
#define SEQPAR_HOPPER_HD __host__ __device__
#else
#define SEQPAR_HOPPER_HD
#endif
// Which tile (rank in TileMask::order) and head the listed CTA (x, y) of a grid (tiles, heads)
// takes. Blocks launch in the order of lin = x + tiles * y: first the `heavy` leading tiles of
// every head, heads inner (no head's long list is left for the last wave), then each head's
// other tiles, heads outer (the CTAs in flight share one head's rows in L2).
SEQPAR_HOPPER_HD inline void listed_unit(int x, int y, int tiles, int heads, int heavy, int* rank, int* head) {
  const int64_t lin = x + int64_t(tiles) * y, front = int64_t(heavy) * heads;
  if (lin < front) {
    *rank = int(lin / heads), *head = int(lin % heads);
  } else {
    const int64_t r = lin - front, rest = tiles - heavy;
    *head = int(r / rest), *rank = heavy + int(r % rest);
  }
}

// Unit r of a grid whose heads go in chunks of `chunk` heads in step, `per_head` units each: chunk
// r / (per_head chunk), inside it unit *x = r2 / chunk of head *head = chunk's first + r2 % chunk,
// so the chunk's heads take their first (heaviest) units before any of them its later ones (the
// persistent forward's kOrder, fwd_unit; the cluster forward's pairs, FwdParams::head_chunk).
SEQPAR_HOPPER_HD inline void chunked_unit(int r, int per_head, int chunk, int* x, int* head) {
  const int per_chunk = per_head * chunk;
  const int c = r / per_chunk, r2 = r - c * per_chunk;
  *x = r2 / chunk;
  *head = c * chunk + (r2 - *x * chunk);
}
// The backward's grid with one chunk of all heads: CTA lin = x + tiles * y takes rank lin / heads of
// head lin % heads, so every head's first tiles (the heaviest, in the dense causal order) start
// before any head's later ones (BwdParams::heads_inner).
SEQPAR_HOPPER_HD inline void heads_inner_unit(int x, int y, int tiles, int heads, int* rank, int* head) {
  const int64_t lin = x + int64_t(tiles) * y;
  *rank = int(lin / heads), *head = int(lin % heads);
}

struct FwdArgs {
  const void* q;  // [B, S_q, H, D] bf16
  const void* k;  // [B, S_k, H_kv, D] bf16
  const void* v;
  void* o;        // [B, S_q, H, D] bf16, or fp32 with o_f32
  float* lse;     // [B, H, S_q]
  int batch, heads, kv_heads, seq_q, seq_k, head_dim;
  // causal: key j visible from query i iff j <= i + causal_offset (0: top-left aligned; a shard
  // pair whose rows start at positions q0 and k0 has offset q0 - k0; negative offsets leave the
  // first rows with no key: O = 0, LSE = -inf).
  int causal, causal_offset;
  float scale;    // 0: 1/sqrt(D)
  int o_f32;      // O is fp32 (else bf16)
  RowStrides q_st, k_st, v_st, o_st;
  StatStrides lse_st;
  TileMask tiles;  // the forward's lists (per query tile); with them causal is ignored
};

struct BwdArgs {
  const void* q;     // [B, S_q, H, D] bf16
  const void* k;     // [B, S_k, H_kv, D] bf16
  const void* v;
  const void* o;     // [B, S_q, H, D] bf16, for D = rowsum(dO * O); unused when delta is given
  const void* dout;  // [B, S_q, H, D] bf16
  const float* lse;  // [B, H, S_q]: the final LSE
  const float* delta;  // [B, H, S_q] or nullptr (then computed from o and dout)
  void* dq;          // [B, S_q, H, D] bf16, or fp32 with dq_f32
  void* dk;          // [B, S_k, H_kv, D] bf16, or fp32 with dkv_f32
  void* dv;
  void* workspace;   // bwd_workspace_bytes(...)
  int batch, heads, kv_heads, seq_q, seq_k, head_dim;
  int causal, causal_offset, accumulate;  // accumulate: add to dq, dk, dv (else write them)
  float scale;       // 0: 1/sqrt(D)
  int variant;       // the lab's dispatch_bwd (variants.cuh); backward() does not read it
  int main_only;     // timing aid: 1, launch only the main kernel (the workspace must hold a
                     // previous call's LSE2 and D; dQ is then neither zeroed nor converted);
                     // 2, everything but the main kernel (zeroing, preprocessing, conversion)
  int dq_f32, dkv_f32;      // dq; dk and dv: fp32 (else bf16)
  int dq_fresh, dkv_fresh;  // with accumulate: write dq (dk and dv) all the same, reading nothing
  RowStrides q_st, k_st, v_st, o_st, dout_st, dq_st, dk_st, dv_st;  // o, dout: multiples of 8 elements
  StatStrides lse_st, delta_st;
  TileMask tiles;  // the backward's lists (per key tile); with them causal is ignored
};

// The forward kernel forward() runs for `a` (hopper_kernels.cu), by mask, head dim and key count;
// plain C++ so that the CPU tests check the routing. Measured (dev/hopper_attention/README.md):
// - tile lists: the persistent kernel with lists (one H100, "Persistent forward"; 32K: 256
//   documents 1.37x, BigBird 1.15x, 16 documents 1.07x the one-CTA-per-tile kernel); at D = 128
//   lists of 64 x 64 tiles (plan_tiles chose them: short_tiles_pay) on the short-tile kernel, two
//   CTAs per SM (one H200, "Forward on 64 x 64 tiles for short lists": 1.09-3.5x where chosen);
// - D = 128 dense: the persistent kernel in 2-CTA clusters with K/V by multicast from 8K keys, to
//   64K under the full mask and to 128K under the causal one (one H200, "Persistent forward in
//   2-CTA clusters", calls 3-4: full 1.029-1.062x the kernel it replaces, causal 1.029-1.045x
//   from 16K; session w, "Session w: the cluster forward at 8K and 128K causal": causal 8K
//   1.038x (32:32) and 1.052x (32:8) the persistent kernel, 128K 1.064x and 1.069x; at 128K full
//   0.996x pp192, so pp192 stays there); outside those ranges the persistent kernel up to 24K
//   keys and under the causal mask, pp192 above (the persistent kernel 0.98-0.99x pp192 at
//   32K-64K full, "The persistent forward on one H200");
// - D = 64: the persistent kernel, with chunks of 4 query heads in step under the causal mask up
//   to 16K keys ("D = 64 forward: unit order and tile shape"); its cluster form was 0.99-1.01x.
enum class FwdKernel { kPersistLists, kShortLists, kPersist, kPersistHeadChunks, kPingPong192, kCluster };
inline constexpr int kClusterMinKeys = 8192, kClusterMaxKeysFull = 65536, kClusterMaxKeysCausal = 131072;
// The cluster kernel's query heads in step (FwdParams::head_chunk): pair j of 8 heads before pair
// j + 1 under the causal mask up to 16K keys, else each head's tile pairs in turn (one H200,
// session w, dev/hopper_attention/README.md "Session w: the cluster forward's heads in step": at 8K
// causal chunks of 8 ran 1.060x (32:32) and 1.045x (32:8) the head-by-head order, chunks of 4
// 1.044x / 1.034x, all 32 heads 1.039x / 1.057x; 16K causal 1.000 for every chunk; 8K full 1.003 at
// 8, 0.977 at 32). The launcher takes 1 where 8 does not divide the heads.
inline constexpr int kHeadChunkMaxKeys = 16384;
inline int forward_head_chunk(const FwdArgs& a) {
  return a.tiles.begin == nullptr && a.causal && a.seq_k <= kHeadChunkMaxKeys ? 8 : 1;
}
inline FwdKernel forward_kernel(const FwdArgs& a) {
  if (a.tiles.begin) return a.tiles.query_rows == 64 ? FwdKernel::kShortLists : FwdKernel::kPersistLists;
  if (a.head_dim == 64)
    return a.causal && a.seq_k <= 16384 ? FwdKernel::kPersistHeadChunks : FwdKernel::kPersist;
  if (a.seq_k >= kClusterMinKeys && a.seq_k <= (a.causal ? kClusterMaxKeysCausal : kClusterMaxKeysFull))
    return FwdKernel::kCluster;
  return a.causal || a.seq_k <= 24576 ? FwdKernel::kPersist : FwdKernel::kPingPong192;
}

// The backward kernel backward() runs for `a` (hopper_kernels.cu), by head dim and the lists'
// tiles (plan_tiles chose them per mask: short_bwd_pays, tall_tiles_pay); plain C++ so that the
// CPU tests check the routing. Measured (dev/hopper_attention/README.md):
// - D = 128 dense and lists of 80-row query tiles: q80 ("Backward at D = 128: 80-row query
//   tiles", one H200: 1.09-1.17x base, full and causal, 8K-32K; "Masked backward at D = 128 on
//   q80": 1.06-1.14x base where its lists compute at most 2% more query rows);
// - D = 128 lists of 64-key tiles: short64, one consumer warpgroup, two CTAs per SM ("Backward on
//   64-key tiles for short lists": 1.06-1.07x base on 256 documents at 32K);
// - D = 128 lists of 128 x 64 tiles: base; D = 64: q128, 128-row query tiles.
enum class BwdKernel { kQ80, kBase, kShort64, kQ128, kNone };
// Whether the dense backward's grid takes the key tiles heaviest first with the K/V heads inner
// (BwdParams::heads_inner; else each head's tiles in turn, which keeps one head's rows in L2):
// under the causal mask up to 16K keys (one H200, session w, "Session w: the dense backward's key
// tiles with the K/V heads inner", with heads inner / without, 32:32 and 32:8: D = 128 (q80) 8K
// 1.022 and 1.158 (512 CTAs of 4 query heads, where each head's heaviest tiles no longer wait
// behind the other heads'), 16K 1.023 and 0.996, 32K 0.92 and 1.00; D = 64 (q128) 8K 1.041 and
// 1.208, 16K 1.002 and 1.011; full 0.98-1.03 at 8K and 16K, 0.81 at 32K D = 128).
inline constexpr int kHeadsInnerMaxKeys = 16384;
inline bool backward_heads_inner(const BwdArgs& a) {
  return a.tiles.begin == nullptr && a.causal && a.seq_k <= kHeadsInnerMaxKeys;
}
inline BwdKernel backward_kernel(const BwdArgs& a) {
  const bool lists = a.tiles.begin != nullptr;
  if (a.head_dim == 128) {
    if (!lists || a.tiles.query_rows == 80) return BwdKernel::kQ80;
    if (a.tiles.query_rows != 64) return BwdKernel::kNone;
    return a.tiles.key_rows == 64 ? BwdKernel::kShort64 : a.tiles.key_rows == 128 ? BwdKernel::kBase : BwdKernel::kNone;
  }
  if (a.head_dim == 64) return !lists || a.tiles.query_rows == 128 ? BwdKernel::kQ128 : BwdKernel::kNone;
  return BwdKernel::kNone;
}

// Host entry points (hopper_kernels.cu): the variants the backend runs (forward: 192-key tiles
// at D = 128, 192 query rows at D = 64; backward: "q80", "base" and "short64" at D = 128, "q128"
// at D = 64).
// They return the cudaError_t of the launches (0 on success) and launch nothing on a device they
// cannot run on.
int forward(const FwdArgs& a, void* stream);
// Whether forward(a) can write O where a.o points: the short-tile kernel stores O by TMA only
// (bf16, 16-byte aligned base, strides of whole 16 bytes); the others take any O the backend
// can store into. Where not, the backend runs it into a bf16 part and casts or merges that.
bool forward_writes_o(const FwdArgs& a);
int backward(const BwdArgs& a, void* stream);
size_t backward_workspace_bytes(int batch, int heads, int seq_q, int head_dim);
// The tiles of the variants above, for plan_tiles (hopper_tiles.hpp; hopper_kernels.cu checks
// them against the kernels' constants): the forward's query and key tile rows at this head dim,
// and the backward's, whose lists a second kernel may take with bwd_bm_tall-row query tiles
// (D = 128: base takes 64, q80 80; 0: no second kernel; plan_tiles picks per mask); and the
// short-tile forward's query and key tile rows (D = 128: 64 x 64; 0: none at this head dim); and
// the short-tile backward's keys per tile (D = 128: 64, with bwd_bm query rows; 0: none).
struct TileShape {
  int fwd_bm, fwd_bn, bwd_bm, bwd_bn, bwd_bm_tall, fwd_short_bm, fwd_short_bn, bwd_short_bn;
};
constexpr TileShape tile_shape(int head_dim) {
  return head_dim == 64 ? TileShape{192, 128, 128, 128, 0, 0, 0, 0} : TileShape{128, 192, 64, 128, 80, 64, 64, 64};
}
// Empty when device `device` can run the kernels (compute capability 9.0 and sm_90a code in
// this build); else why not. Queried once per device.
const char* device_refusal(int device);
// The message of a cudaError_t.
const char* error_string(int error);

}  // namespace seqpar::hopper
