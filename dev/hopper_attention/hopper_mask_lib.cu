// hopper_mask_lib.cu: C entry points for ab_masks.py (ctypes): builds the visible-tile lists of a
// mask given as data (window, document offsets, a dense block pattern), and runs the backend's
// variants (forward pp192 at D = 128, m192 at D = 64, or one named; backward by variant number, base,
// q80, short64 at D = 128, each with the lists of its own query and key tile) over them, or dense causal with no lists, on
// torch tensors, and says which backward the library's backend picks for a mask. Built by build.sh
// into build/libhopper_mask.so.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "cluster_lab.cuh"
#include "lab_tiles.cuh"
#include "variants.cuh"

namespace {
struct Plan {
  lab::DeviceTiles tiles;  // the forward's lists and the backward's of `rows`-row query tiles
  int rows;
  int keys = 128;          // the backward's keys per tile (64 for short64)
};
}  // namespace

// Tile lists for S_q = S_k = S at positions 0.. under: window (wl, wr; -1 unbounded), documents
// (n_offsets offsets from 0 to the total, or 0 for none), a block pattern (block > 0: n_blocks x
// n_blocks bytes, row = query block, nonzero = visible). Writes the visible score count and
// {forward entries, forward boundary entries, backward entries, backward boundary entries}.
// bwd_rows: the backward's query rows per tile (64 for base, 80 for q80; variants.cuh's
// bwd_query_rows).
static lab::PairMask pair_mask(int S, long long wl, long long wr, const long long* offsets, int n_offsets, int block,
                               const unsigned char* dense, int n_blocks) {
  lab::PairMask m;
  m.seq_q = m.seq_k = S;
  m.window_left = wl, m.window_right = wr;
  for (int i = 0; i < n_offsets; ++i) m.doc_offsets.push_back(offsets[i]);
  if (block > 0) {
    m.pattern_block = block;
    m.pattern_begin = {0};
    for (int qb = 0; qb < n_blocks; ++qb) {
      for (int kb = 0; kb < n_blocks; ++kb)
        if (dense[size_t(qb) * n_blocks + kb]) m.pattern_cols.push_back(kb);
      m.pattern_begin.push_back(int64_t(m.pattern_cols.size()));
    }
  }
  return m;
}

// The same with the forward's tiles given (fwd_bm query rows, fwd_bn keys; hopper_mask_fwd_tile).
extern "C" void* hopper_mask_plan_tiles(int S, int D, long long wl, long long wr, const long long* offsets,
                                        int n_offsets, int block, const unsigned char* dense, int n_blocks,
                                        double* visible, long long* stats, int bwd_rows, int fwd_bm, int fwd_bn) {
  (void)D;
  const lab::PairMask m = pair_mask(S, wl, wr, offsets, n_offsets, block, dense, n_blocks);
  Plan* p = new Plan;
  p->tiles = lab::upload_tiles(m, fwd_bm, fwd_bn, bwd_rows);
  p->rows = bwd_rows;
  *visible = p->tiles.visible;
  stats[0] = p->tiles.entries[0], stats[1] = p->tiles.boundary[0];
  stats[2] = p->tiles.entries[1], stats[3] = p->tiles.boundary[1];
  return p;
}

// The same with the backward's key tile given too (bwd_keys: 64 for short64, hopper_mask_bwd_keys).
extern "C" void* hopper_mask_plan_keys(int S, int D, long long wl, long long wr, const long long* offsets,
                                       int n_offsets, int block, const unsigned char* dense, int n_blocks,
                                       double* visible, long long* stats, int bwd_rows, int fwd_bm, int fwd_bn,
                                       int bwd_keys) {
  (void)D;
  const lab::PairMask m = pair_mask(S, wl, wr, offsets, n_offsets, block, dense, n_blocks);
  Plan* p = new Plan;
  p->tiles = lab::upload_tiles(m, fwd_bm, fwd_bn, bwd_rows, bwd_keys);
  p->rows = bwd_rows;
  p->keys = bwd_keys;
  *visible = p->tiles.visible;
  stats[0] = p->tiles.entries[0], stats[1] = p->tiles.boundary[0];
  stats[2] = p->tiles.entries[1], stats[3] = p->tiles.boundary[1];
  return p;
}

// The keys per tile of backward variant v (by number: 6 short64: 64; the others 128).
extern "C" int hopper_mask_bwd_keys(int v) { return hopper_attn::bwd_key_tile(v); }

// The forward's tiles of the backend's kernels: 128 x 192 at D = 128, 192 x 128 at D = 64.
extern "C" void* hopper_mask_plan_rows(int S, int D, long long wl, long long wr, const long long* offsets,
                                       int n_offsets, int block, const unsigned char* dense, int n_blocks,
                                       double* visible, long long* stats, int bwd_rows) {
  return hopper_mask_plan_tiles(S, D, wl, wr, offsets, n_offsets, block, dense, n_blocks, visible, stats, bwd_rows,
                                D == 128 ? 128 : 192, D == 128 ? 192 : 128);
}

// The forward tile (query rows *bm, keys *bn) whose lists forward variant `variant` takes at head
// dim D: lab_tiles.cuh's fwd_tile for the short-tile forward (persist64: 64 x 64), else the tiles
// hopper_mask_plan_rows plans (every other variant ab_masks.py runs on lists takes those).
extern "C" void hopper_mask_fwd_tile(const char* variant, int D, int* bm, int* bn) {
  *bm = D == 128 ? 128 : 192, *bn = D == 128 ? 192 : 128;
  if (std::string(variant) == "persist64") lab::fwd_tile(variant, D, bm, bn);
}

// The backward's lists of 64-row query tiles (base), as before.
extern "C" void* hopper_mask_plan(int S, int D, long long wl, long long wr, const long long* offsets, int n_offsets,
                                  int block, const unsigned char* dense, int n_blocks, double* visible,
                                  long long* stats) {
  return hopper_mask_plan_rows(S, D, wl, wr, offsets, n_offsets, block, dense, n_blocks, visible, stats,
                               hopper_attn::bwd::kBM);
}

// The tiles the library's backend plans for this mask at head dim D (backend_plan,
// hopper_tiles.hpp): the forward's query rows (D = 128: 128, persist192, or 64, persist64) *
// 10^6 + the backward's query rows (D = 128: 64 base or short64, 80 q80) * 1000 + its keys (128,
// or 64 short64), so ab_masks.py can say which variants the backend runs.
extern "C" int hopper_mask_backend_tiles(int S, int D, long long wl, long long wr, const long long* offsets,
                                         int n_offsets, int block, const unsigned char* dense, int n_blocks) {
  const lab::PairMask m = pair_mask(S, wl, wr, offsets, n_offsets, block, dense, n_blocks);
  const seqpar::hopper::TilePlan p = seqpar::hopper::backend_plan(m, D);
  return p.fwd.tile_rows * 1000000 + p.bwd.other_tile_rows * 1000 + p.bwd.tile_rows;
}

// The backend's choice of the forward's tile (short_tiles_pay, hopper_tiles.hpp) from both forward
// plans' entry counts (128 x 192 and 64 x 64): 1 where the short-tile forward (persist64) runs.
extern "C" int hopper_mask_short_pays(long long tall_entries, long long short_entries) {
  return seqpar::hopper::short_scores_pay(tall_entries * 128 * 192, short_entries * 64 * 64) ? 1 : 0;
}

// The query rows per tile of backward variant v (by number: 0 base, 5 q80), for the plan.
extern "C" int hopper_mask_bwd_rows(int v) { return hopper_attn::bwd_query_rows(v); }

extern "C" void hopper_mask_free(void* plan) {
  Plan* p = static_cast<Plan*>(plan);
  p->tiles.release();
  delete p;
}

// q, o [B, S, H, D] bf16; k, v [B, S, Hkv, D] bf16; lse [B, H, S] fp32; contiguous. plan null:
// dense, causal or full. Returns the cudaError_t.
extern "C" int hopper_mask_fwd(void* plan, int causal, const void* q, const void* k, const void* v, void* o,
                               float* lse, int B, int H, int Hkv, int S, int D, void* stream) {
  hopper_attn::FwdArgs a{};
  a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
  a.batch = B, a.heads = H, a.kv_heads = Hkv, a.seq_q = a.seq_k = S, a.head_dim = D;
  a.causal = causal;
  if (plan) a.tiles = static_cast<Plan*>(plan)->tiles.fwd;
  return int(hopper_attn::dispatch(D == 128 ? "pp192" : "m192", a, static_cast<cudaStream_t>(stream)));
}

// The same with the forward variant named (cluster_lab.cuh's names, then variants.cuh's: pp192,
// persist192 (the backend's kernel for tile lists at D = 128), persist192u (its kernel for dense
// causal up to 16K keys and beyond 64K), cluster192 (its kernel for dense causal at 16K-64K keys
// since session t; dense only), ...).
extern "C" int hopper_mask_fwd_variant(void* plan, int causal, const char* variant, const void* q, const void* k,
                                       const void* v, void* o, float* lse, int B, int H, int Hkv, int S, int D,
                                       void* stream) {
  hopper_attn::FwdArgs a{};
  a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
  a.batch = B, a.heads = H, a.kv_heads = Hkv, a.seq_q = a.seq_k = S, a.head_dim = D;
  a.causal = causal;
  if (plan) a.tiles = static_cast<Plan*>(plan)->tiles.fwd;
  cudaError_t e = cudaSuccess;
  if (cluster_lab::cluster_dispatch(variant, a, static_cast<cudaStream_t>(stream), 0, &e)) return int(e);
  return int(hopper_attn::dispatch(variant, a, static_cast<cudaStream_t>(stream)));
}

extern "C" size_t hopper_mask_bwd_workspace(int B, int H, int S, int D) {
  return hopper_attn::lab_workspace_bytes(B, H, S, D);  // every variant's (q80 pads rows to 640)
}

// The whole backward (dQ accumulator zeroing, preprocessing, main kernel, dQ conversion) of
// variant `variant` (variants.cuh's number; the plan's lists must have its query rows, else
// cudaErrorInvalidValue); dq, dk, dv bf16, written.
extern "C" int hopper_mask_bwd_variant(void* plan, int causal, const void* q, const void* k, const void* v,
                                       const void* o, const void* dout, const float* lse, void* dq, void* dk, void* dv,
                                       void* workspace, int B, int H, int Hkv, int S, int D, int variant,
                                       void* stream) {
  hopper_attn::BwdArgs a{};
  a.q = q, a.k = k, a.v = v, a.o = o, a.dout = dout, a.lse = lse;
  a.dq = dq, a.dk = dk, a.dv = dv, a.workspace = workspace;
  a.batch = B, a.heads = H, a.kv_heads = Hkv, a.seq_q = a.seq_k = S, a.head_dim = D;
  a.causal = causal;
  a.variant = variant;
  if (plan) {
    if (static_cast<Plan*>(plan)->rows != hopper_attn::bwd_query_rows(variant) ||
        static_cast<Plan*>(plan)->keys != hopper_attn::bwd_key_tile(variant))
      return int(cudaErrorInvalidValue);
    a.tiles = static_cast<Plan*>(plan)->tiles.bwd;
  }
  return int(hopper_attn::dispatch_bwd(a, static_cast<cudaStream_t>(stream)));
}

// The backward as before: base (variant 0).
extern "C" int hopper_mask_bwd(void* plan, int causal, const void* q, const void* k, const void* v, const void* o,
                               const void* dout, const float* lse, void* dq, void* dk, void* dv, void* workspace,
                               int B, int H, int Hkv, int S, int D, void* stream) {
  return hopper_mask_bwd_variant(plan, causal, q, k, v, o, dout, lse, dq, dk, dv, workspace, B, H, Hkv, S, D, 0,
                                 stream);
}
