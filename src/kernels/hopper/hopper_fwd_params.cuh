// The Hopper attention forward's shared definitions: the kernels' flat parameters (FwdParams) and
// how the host fills them and the tensor maps (fwd_params, fwd_tmaps), the CTA shape (Cfg), the
// shared-memory layout (Smem) and its K/V ring's mbarriers (FwdBars), and the key blocks a query
// tile sees (causal_blocks). Used by every forward kernel: fwd_kernel (hopper_fwd.cuh), the
// persistent one (hopper_fwd_persist.cuh), the 2-CTA cluster one (hopper_fwd_cluster.cuh).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/hopper/hopper_mask.cuh"  // TileMask
#include "kernels/hopper/hopper_ptx.cuh"

namespace seqpar::hopper {

// Flat, zero-initialisable parameters (FwdParams p{}; then fill).
struct FwdParams {
  void* o;            // [B, S_q, H, D]: bf16, or fp32 with o_f32; element strides o_sb, o_ss, o_sh
  float* lse;         // [B, H, S_q]; element strides lse_sb, lse_sh
  int batch, heads, kv_heads, seq_q, seq_k;
  int causal;         // 0: full; 1: key j visible from query i iff j <= i + causal_offset
  int causal_offset;  // 0 is top-left aligned causal; negative offsets leave rows with no key
  float scale_log2;   // softmax scale * log2(e): scores are exponentiated with exp2
  int o_f32;
  int64_t o_sb, o_ss, o_sh, lse_sb, lse_sh;
  TileMask tiles;     // tiles.begin != nullptr: walk the visible-tile lists (causal unused)
  int head_chunk;     // the cluster kernel's pairs: query heads in step (0 or 1: each head's pairs
                      // in turn; C: pair j of C heads, then pair j + 1; divides heads)
};

// The parameters of a forward at head dim d, O's element strides `ost` (row_strides of a.o_st).
inline FwdParams fwd_params(const FwdArgs& a, int d, const RowStrides& ost) {
  FwdParams p{};
  p.o = a.o;
  p.lse = a.lse;
  p.o_f32 = a.o_f32;
  const StatStrides lst = stat_strides(a.lse_st, a.heads, a.seq_q);
  p.o_sb = ost.b, p.o_ss = ost.s, p.o_sh = ost.h, p.lse_sb = lst.b, p.lse_sh = lst.h;
  p.batch = a.batch;
  p.heads = a.heads;
  p.kv_heads = a.kv_heads;
  p.seq_q = a.seq_q;
  p.seq_k = a.seq_k;
  p.causal = a.causal;
  p.causal_offset = a.causal_offset;
  const float scale = a.scale != 0.f ? a.scale : 1.f / sqrtf(float(d));
  p.scale_log2 = scale * 1.4426950408889634f;
  p.tiles = a.tiles;
  return p;
}

// The tensor maps of Q (boxes of q_rows rows), K and V (kv_rows rows: a whole key tile, or half of
// one where two CTAs multicast it), each box 64 columns wide; false if one cannot be encoded.
inline bool fwd_tmaps(const FwdArgs& a, int d, int q_rows, int kv_rows, CUtensorMap* tq, CUtensorMap* tk,
                      CUtensorMap* tv) {
  return make_tmap(tq, a.q, a.batch, a.seq_q, a.heads, d, q_rows, a.q_st) == CUDA_SUCCESS &&
         make_tmap(tk, a.k, a.batch, a.seq_k, a.kv_heads, d, kv_rows, a.k_st) == CUDA_SUCCESS &&
         make_tmap(tv, a.v, a.batch, a.seq_k, a.kv_heads, d, kv_rows, a.v_st) == CUDA_SUCCESS;
}

// kC consumer warpgroups of 64 query rows each: 2 (128 rows; FA3's choice at D = 128) or 3
// (192 rows; FA3's at D = 64, where each key tile carries half the GEMM work per score and a
// taller tile amortises its loads and barrier turns), or 1 (64 rows: the short-tile forward,
// fwd_persist_kernel at kC = 1, two CTAs per SM). Registers after setmaxnreg: the producer keeps 24, the
// consumers share the rest of the 64K (2 x 240 or 3 x 160), or at kC = 1 of half of it, 32K per
// CTA of 256 threads launched at 128 registers (24 + 232 = 2 x 128).
template <int kC>
struct Cfg {
  static constexpr int kBM = 64 * kC;
  static constexpr int kThreads = 128 * (1 + kC);
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kC == 1 ? 232 : kC == 2 ? 240 : 160;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kC <= 65536, "register file");
};

template <int kD, int kBN, int kStages, int kBM>
struct Smem {
  // Every tile is stored as kD/64 column blocks of [rows][64 bf16 = 128 bytes], each block
  // 128-byte swizzled by TMA: the canonical layout wgmma's descriptors describe. All offsets
  // are multiples of 1024 (the swizzle pattern's period), so descriptors need no base offset.
  static constexpr int kTileQ = kBM * kD * 2;
  static constexpr int kTileKV = kBN * kD * 2;
  static constexpr int q = 0;
  static constexpr int k = q + kTileQ;
  static constexpr int v = k + kStages * kTileKV;
  static constexpr int bar = v + kStages * kTileKV;
  static constexpr int kBars = 1 + 4 * kStages;  // q_full, k_full[], k_empty[], v_full[], v_empty[]
  static constexpr int bytes = bar + 8 * kBars + 1024;  // + slack to align the base to 1024
};

// The mbarriers at `bar`: Smem's kBars (Q loaded; per K/V stage loaded and released), then the
// persistent kernels' q_empty (the consumers are done with Q, so the next tile's may load).
template <int kStages>
struct FwdBars {
  uint32_t bar;
  __device__ __forceinline__ uint32_t q_full() const { return bar; }
  __device__ __forceinline__ uint32_t k_full(int s) const { return bar + 8u * (1 + s); }
  __device__ __forceinline__ uint32_t k_empty(int s) const { return bar + 8u * (1 + kStages + s); }
  __device__ __forceinline__ uint32_t v_full(int s) const { return bar + 8u * (1 + 2 * kStages + s); }
  __device__ __forceinline__ uint32_t v_empty(int s) const { return bar + 8u * (1 + 3 * kStages + s); }
  __device__ __forceinline__ uint32_t q_empty() const { return bar + 8u * (1 + 4 * kStages); }
  // By one thread: the full barriers wait for their producer's one arrival (and the bytes), the
  // empty ones for `releases` consumer arrivals; q_empty exists where q_releases > 0.
  __device__ __forceinline__ void init(int q_releases, int releases) const {
    mbar_init(q_full(), 1);
    if (q_releases > 0) mbar_init(q_empty(), q_releases);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), releases);
      mbar_init(v_empty(s), releases);
    }
  }
};
// After the barriers' init, before the CTA (or cluster) barrier that publishes them.
__device__ __forceinline__ void fence_bar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Of the first n key blocks, those the query tile of kBM rows from m0 sees under the causal mask:
// up to its last row's last visible key; none where that row sees no key (a negative offset).
template <int kBM, int kBN>
__device__ __forceinline__ int causal_blocks(int n, int m0, const FwdParams& p) {
  const int last_key = min(m0 + kBM, p.seq_q) - 1 + p.causal_offset;
  return last_key < 0 ? 0 : min(n, last_key / kBN + 1);
}

}  // namespace seqpar::hopper
