// variants.cuh: the kernel variants the lab builds and compares, by name (shared by the test
// driver hopper_fwd_test.cu and the ctypes library hopper_fwd_lib.cu, so both run the same
// instantiations). Names: basic (no overlap), overlap (intra-warpgroup overlap), pingpong
// (overlap + ping-pong between the consumer warpgroups), pingpong3 (same, 3 K/V stages),
// pp176 (pingpong with 176-key tiles), pp192 (192-key tiles, D = 128), m192 (D = 64:
// three consumer warpgroups, 192 query rows; with 176-key tiles it spills at 160 registers);
// persist192 / persist_m192: pp192 / m192 as a persistent kernel with a TMA store of O
// (hopper_fwd_persist.cuh), units from a global counter; persist192s / persist_m192s: the same
// with a static stride over the units; persist192r: dynamic, O stored from registers (no TMA store);
// persist176: the library's persistent kernel with 176-key tiles; persist64: the short-tile
// forward (the persistent kernel at kC = 1: 64 x 64 tiles, one consumer, two CTAs per SM); pp192u, m192u, persist192u,
// persist_m192u: the library's kernels with kUniform (warp-broadcast consumer index and stage
// counter: wgmma descriptors in uniform registers). From persist_lab.cuh (the
// library's kernel with options): persist192lab / persist_m192lab (no option: the control),
// ...p (the next unit's Q prefetched into L2), ...w (the main loop waits for the previous P V
// before the softmax, pinned), ...o (the softmax pinned before that wait), ...x (fused tile
// boundaries: the next tile's first Q K^T in one turn with the last P V, O from registers),
// ...xp, ...xw, ...xu (fused with p, w, or the uniform hints), persist_m192xt (fused, O through its own buffer and a TMA
// store), persist176x (fused, 176-key tiles).
// The kernels are the library's (src/kernels/hopper/, namespace seqpar::hopper; build.sh puts
// src/ on the include path); the backend runs persist192 or pp192 (D = 128), persist_m192 (D = 64)
// and backward base (D = 128) / q128 (D = 64).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/hopper/hopper_bwd_launch.cuh"
#include "kernels/hopper/hopper_bwd_short.cuh"
#include "kernels/hopper/hopper_fwd.cuh"
#include "kernels/hopper/hopper_fwd_persist.cuh"
#include "persist_lab.cuh"

namespace hopper_attn {
using namespace seqpar::hopper;

// The persistent variants' grid cap (0: none; the check driver sets a few CTAs, so that each
// walks several units of the small check problems: tile boundaries, zero-key tiles).
inline int g_grid_cap = 0;

// persist64 (the persistent kernel with one consumer, fwd_persist_kernel<128, 64, 1>: 64-row query
// tiles, 64-key tiles, two CTAs per SM; lists planned with 64 x 64 tiles, lab_tiles.cuh's
// fwd_tile): the CTAs per SM that fit, printed once to stderr when LAB_SHORT_OCCUPANCY is set (the
// run script's evidence that two fit).
inline cudaError_t launch_short64(const FwdArgs& a, cudaStream_t st) {
  static bool said = false;
  const cudaError_t e = launch_fwd_persist<128, 64, 1>(a, st, true, g_grid_cap);
  if (!said && std::getenv("LAB_SHORT_OCCUPANCY")) {
    said = true;
    int per_sm = 0;
    (void)cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fwd_persist_kernel<128, 64, 1, true>,
                                                        Cfg<1>::kThreads, PersistSmem<128, 64, 64>::bytes);
    std::fprintf(stderr, "persist64: %d CTAs per SM (launch: %s)\n", per_sm, cudaGetErrorString(e));
  }
  return e;
}

inline cudaError_t dispatch(const std::string& v, const FwdArgs& a, cudaStream_t st) {
  if (a.head_dim == 128) {
    if (v == "basic") return launch_fwd<128, 128, 2, false, false>(a, st);
    if (v == "overlap") return launch_fwd<128, 128, 2, true, false>(a, st);
    if (v == "pingpong") return launch_fwd<128, 128, 2, true, true>(a, st);
    if (v == "pingpong3") return launch_fwd<128, 128, 3, true, true>(a, st);
    if (v == "pp176") return launch_fwd<128, 176, 2, true, true>(a, st);
    if (v == "pp192") return launch_fwd<128, 192, 2, true, true>(a, st);
    if (v == "pp192u") return launch_fwd<128, 192, 2, true, true, 2, true>(a, st);
    if (v == "persist192") return launch_fwd_persist<128, 192, 2>(a, st, true, g_grid_cap);
    if (v == "persist192s") return launch_fwd_persist<128, 192, 2>(a, st, false, g_grid_cap);
    if (v == "persist192r") return launch_fwd_persist<128, 192, 2, false>(a, st, true, g_grid_cap);
    if (v == "persist176") return launch_fwd_persist<128, 176, 2>(a, st, true, g_grid_cap);
    if (v == "persist192u") return launch_fwd_persist<128, 192, 2, true, true>(a, st, true, g_grid_cap);
    if (v == "persist64") return launch_short64(a, st);
    // persist_lab.cuh's kernel and options:
    if (v == "persist192lab") return persist_lab::launch_fwd_persist_x<128, 192, 2, true, 0>(a, st, true, g_grid_cap);
    if (v == "persist192p") return persist_lab::launch_fwd_persist_x<128, 192, 2, true, persist_lab::kPrefetchQ>(a, st, true, g_grid_cap);
    if (v == "persist192w") return persist_lab::launch_fwd_persist_x<128, 192, 2, true, persist_lab::kWaitFirst>(a, st, true, g_grid_cap);
    if (v == "persist192o")
      return persist_lab::launch_fwd_persist_x<128, 192, 2, true, persist_lab::kOverlapSoftmax>(a, st, true, g_grid_cap);
    if (v == "persist192x") return persist_lab::launch_fwd_persist_x<128, 192, 2, false, persist_lab::kFuseTiles>(a, st, true, g_grid_cap);
    if (v == "persist192xp")
      return persist_lab::launch_fwd_persist_x<128, 192, 2, false, persist_lab::kFuseTiles | persist_lab::kPrefetchQ>(a, st, true, g_grid_cap);
    if (v == "persist192xw")
      return persist_lab::launch_fwd_persist_x<128, 192, 2, false, persist_lab::kFuseTiles | persist_lab::kWaitFirst>(a, st, true, g_grid_cap);
    if (v == "persist192xu")
      return persist_lab::launch_fwd_persist_x<128, 192, 2, false, persist_lab::kFuseTiles | persist_lab::kUniformHints>(a, st, true, g_grid_cap);
    if (v == "persist176x") return persist_lab::launch_fwd_persist_x<128, 176, 2, false, persist_lab::kFuseTiles>(a, st, true, g_grid_cap);
  } else if (a.head_dim == 64) {
    if (v == "basic") return launch_fwd<64, 128, 2, false, false>(a, st);
    if (v == "pingpong") return launch_fwd<64, 128, 2, true, true>(a, st);
    if (v == "pingpong3") return launch_fwd<64, 128, 3, true, true>(a, st);
    if (v == "pp176") return launch_fwd<64, 176, 2, true, true>(a, st);
    if (v == "m192") return launch_fwd<64, 128, 2, true, true, 3>(a, st);
    if (v == "m192u") return launch_fwd<64, 128, 2, true, true, 3, true>(a, st);
    if (v == "persist_m192") return launch_fwd_persist<64, 128, 3>(a, st, true, g_grid_cap);
    if (v == "persist_m192s") return launch_fwd_persist<64, 128, 3>(a, st, false, g_grid_cap);
    if (v == "persist_m192r") return launch_fwd_persist<64, 128, 3, false>(a, st, true, g_grid_cap);
    if (v == "persist_m192u") return launch_fwd_persist<64, 128, 3, true, true>(a, st, true, g_grid_cap);
    if (v == "persist_m192lab") return persist_lab::launch_fwd_persist_x<64, 128, 3, true, 0>(a, st, true, g_grid_cap);
    if (v == "persist_m192p") return persist_lab::launch_fwd_persist_x<64, 128, 3, true, persist_lab::kPrefetchQ>(a, st, true, g_grid_cap);
    if (v == "persist_m192w") return persist_lab::launch_fwd_persist_x<64, 128, 3, true, persist_lab::kWaitFirst>(a, st, true, g_grid_cap);
    if (v == "persist_m192o")
      return persist_lab::launch_fwd_persist_x<64, 128, 3, true, persist_lab::kOverlapSoftmax>(a, st, true, g_grid_cap);
    if (v == "persist_m192x") return persist_lab::launch_fwd_persist_x<64, 128, 3, false, persist_lab::kFuseTiles>(a, st, true, g_grid_cap);
    if (v == "persist_m192xp")
      return persist_lab::launch_fwd_persist_x<64, 128, 3, false, persist_lab::kFuseTiles | persist_lab::kPrefetchQ>(a, st, true, g_grid_cap);
    if (v == "persist_m192xt") return persist_lab::launch_fwd_persist_x<64, 128, 3, true, persist_lab::kFuseTiles>(a, st, true, g_grid_cap);
    if (v == "persist_m192xu")
      return persist_lab::launch_fwd_persist_x<64, 128, 3, false, persist_lab::kFuseTiles | persist_lab::kUniformHints>(a, st, true, g_grid_cap);
    if (v == "persist_m192xw")
      return persist_lab::launch_fwd_persist_x<64, 128, 3, false, persist_lab::kFuseTiles | persist_lab::kWaitFirst>(a, st, true, g_grid_cap);
  }
  std::fprintf(stderr, "no variant %s at D = %d\n", v.c_str(), a.head_dim);
  return cudaErrorInvalidValue;
}

// Backward variants: 0 "base", 1 "defer" (kDefer in hopper_bwd.cuh), with the library's prologue
// and dQ conversion (kPrologueBest in hopper_bwd_launch.cuh: the memset and the row-order
// conversion); the base kernel with another prologue (issue 34 item 1): 2 "memset" (the
// fragment-order conversion: the first version), 3 "sfirst" (row-order conversion, and the first
// CTA to reach a dQ tile stores it, so the accumulator is not zeroed); 4 "q128" (D = 64 only:
// base with 128-row query tiles, kQRows in hopper_bwd.cuh); 5 "q80" (D = 128: 80-row query
// tiles, dQ computed transposed, hopper_bwd_q80.cuh, the library's since 2026-11-29; tile lists
// too, of 80-row query tiles). Session q's options of base (lateq, lateqs, dqred, lateqr, all
// slower, and the clock-stamp aid trace; variants 5-9 until 2026-11-29, when q80 was 10) are in
// git: `git show 0b41e36:dev/hopper_attention/bwd_lab.cuh`.
// Session t's "q80p" (q80 as a persistent kernel, 0.76-1.03x q80: README section "Persistent
// backward for tile lists") was variants 6 and 7: `git show 15d7393:dev/hopper_attention/bwd_persist_lab.cuh`.
// 6 "short64" (D = 128: 64-key tiles, one consumer, two CTAs per SM, hopper_bwd_short.cuh; session
// u; tile lists of 64-row query tiles per 64-key tile; LAB_SHORT_OCCUPANCY=1 prints its CTAs per SM).
// Session v's 7 "short64g", 8 "baseg", 9 "q80g" (short64, base and q80 as head groups alternating
// over two streams, so one group's fixed part ran beside another's main kernel: no gain, README
// "The backward's fixed part beside the main kernel") are in git:
// `git show ce20904:dev/hopper_attention/bwd_groups_lab.cuh`.
// 7 "q80h", 8 "q128h" and 9 "baseh" (session w): q80, q128 and base with the grid's key tiles
// (dense, or in the lists' order) taken with the K/V heads inner (BwdParams::heads_inner; the
// plain variants follow the library's rule, backward_heads_inner).
inline const char* const kBwdVariants[] = {"base",  "defer",   "memset", "sfirst", "q128",
                                           "q80",   "short64", "q80h",   "q128h",  "baseh"};
inline constexpr int kNumBwdVariants = 10;
inline constexpr int kBwdQ80HeadsInner = 7, kBwdQ128HeadsInner = 8, kBwdBaseHeadsInner = 9;
inline constexpr int kBwdQ80 = 5;
inline constexpr int kBwdShort64 = 6;
inline int bwd_variant(const std::string& name) {
  for (int i = 0; i < kNumBwdVariants; ++i)
    if (name == kBwdVariants[i]) return i;
  return -1;
}
// Whether variant v runs at head dim D, and its query rows per tile (the backward's tile lists
// are made with them).
inline bool bwd_variant_runs(int v, int D) {
  return v == 4 || v == kBwdQ128HeadsInner ? D == 64 : v >= kBwdQ80 ? D == 128 : true;
}
inline int bwd_query_rows(int v) {
  return v == 4 || v == kBwdQ128HeadsInner ? 128 : v == kBwdQ80 || v == kBwdQ80HeadsInner ? bwd::kQ80 : bwd::kBM;
}
// Keys per tile of variant v (the backward's lists are made per key tile of this many keys).
inline int bwd_key_tile(int v) { return v == kBwdShort64 ? bwds::kBN : bwd::kBN; }
// Whether variant v takes visible-tile lists (the masked cases): all (q80 since 2026-11-29, with
// lists of 80-row query tiles).
inline bool bwd_variant_lists(int v) { return v >= 0 && v < kNumBwdVariants; }
// The lab's workspace: enough for every variant (q80 pads the rows to 640, the others to 128).
inline size_t lab_workspace_bytes(int B, int H, int Sq, int D) { return bwd_workspace_bytes(B, H, Sq, D, bwd::kQ80); }

template <int kD>
cudaError_t dispatch_bwd_d(const BwdArgs& a, cudaStream_t stream) {
  switch (a.variant) {
    case 0: return launch_bwd<kD, false>(a, stream);
    case 1: return launch_bwd<kD, true>(a, stream);
    case 2: return launch_bwd<kD, false, 0>(a, stream);
    case 3: return launch_bwd<kD, false, kRowConvert | kStoreFirst>(a, stream);
    case 4:
      if constexpr (kD == 64) return launch_bwd<kD, false, kPrologueBest, 128>(a, stream);
      break;
    case kBwdQ80:
      if constexpr (kD == 128) return launch_bwd_q80(a, stream);
      break;
    case kBwdQ80HeadsInner:
      if constexpr (kD == 128) return launch_bwd_q80(a, stream, 1);
      break;
    case kBwdQ128HeadsInner:
      if constexpr (kD == 64) return launch_bwd<kD, false, kPrologueBest, 128>(a, stream, 1);
      break;
    case kBwdBaseHeadsInner:
      return launch_bwd<kD, false>(a, stream, 1);
    case kBwdShort64:
      if constexpr (kD == 128) {
        static bool said = false;
        int per_sm = 0;
        int* occupancy = said ? nullptr : &per_sm;
        const cudaError_t e = a.tiles.begin ? launch_bwd_short<true>(a, stream, occupancy)
                                            : launch_bwd_short<false>(a, stream, occupancy);
        if (!said && std::getenv("LAB_SHORT_OCCUPANCY")) {
          said = true;
          std::fprintf(stderr, "short64 (backward): %d CTAs per SM (launch: %s)\n", per_sm, cudaGetErrorString(e));
        }
        said = true;
        return e;
      }
      break;
  }
  return cudaErrorInvalidValue;
}

inline cudaError_t dispatch_bwd(const BwdArgs& a, cudaStream_t stream) {
  if (a.head_dim == 128) return dispatch_bwd_d<128>(a, stream);
  if (a.head_dim == 64) return dispatch_bwd_d<64>(a, stream);
  return cudaErrorInvalidValue;
}

}  // namespace hopper_attn
