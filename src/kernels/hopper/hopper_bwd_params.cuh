// The Hopper attention backward's shared definitions: its tile constants and named barriers
// (namespace bwd), the main kernel's flat parameter struct (BwdParams), its shared-memory layout
// (BwdSmem) and the dK/dV/dQ element store (add_out). Used by the kernel (hopper_bwd.cuh), the
// host side (hopper_bwd_launch.cuh) and the lab (dev/hopper_attention/variants.cuh).
#pragma once

#include <cstdint>

#include "kernels/hopper/hopper_mask.cuh"  // TileMask
#include "kernels/hopper/hopper_ptx.cuh"   // pack_bf16

namespace seqpar::hopper {

namespace bwd {
constexpr int kBM = 64;    // query rows per tile of base / defer, and per dQ accumulator tile
constexpr int kSeqPad = 128;  // the workspace's rows are padded to this (64- and 128-row tiles)
constexpr int kQ80 = 80;         // query rows per tile of the D = 128 dense kernel (hopper_bwd_q80.cuh)
constexpr int kSeqPadQ80 = 640;  // its workspace rows are padded to this (80 and 128 divide it)
constexpr int kBN = 128;   // keys per CTA: 64 per consumer warpgroup
constexpr int kThreads = 384;
constexpr int kProducerRegs = 24, kConsumerRegs = 240;
// Named barriers (0 is __syncthreads).
constexpr int kBarDS = 1;        // both consumers stored dS (256 threads)
constexpr int kBarDqEmpty = 2;   // + w: consumer w may write its dQ buffer (128 + 32 threads)
constexpr int kBarDqFull = 4;    // + w: consumer w's dQ buffer is written (128 + 32 threads)
}  // namespace bwd

struct BwdParams {
  float* dq_acc;        // [B, H, S_q_pad / 64, 64 * D] fp32; each 64-row tile in fragment order
                        // (see the kernel's dQ store); zeroed unless dq_state is given
  int* dq_state;        // [B, H, S_q_pad / 64], zeroed, or null (only with 64-row query tiles):
                        // per dQ tile 0 untouched, 1 being stored by its first contributor, 2
                        // stored (later ones add)
  const float* lse2;    // [B, H, S_q_pad]: LSE * log2(e); +inf for no-key rows and padding
  const float* dpsum;   // [B, H, S_q_pad]: D; 0 on padding
  void* dk;             // [B, S_k, H_kv, D]: bf16, or fp32 with out_f32; element strides dk_s*
  void* dv;             // likewise, dv_s*
  int batch, heads, kv_heads, seq_q, seq_k, seq_q_pad;
  int causal, causal_offset;  // key j visible from query i iff j <= i + causal_offset
  int accumulate;             // add to dk, dv instead of overwriting them
  float scale, scale_log2;
  int out_f32;  // dk, dv in fp32
  int64_t dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
  TileMask tiles;  // tiles.begin != nullptr: per key tile, the listed query tiles (causal unused)
  int heads_inner;  // the grid's blocks take the key tiles (dense: heaviest first; lists: their
                    // order) with the K/V heads inner (else each head's in turn; BwdUnit)
};

template <int kD, int kQRows>
struct BwdSmem {
  static constexpr int kTileQ = kQRows * kD * 2;      // Q or dO tile, bf16
  static constexpr int kTileK = bwd::kBN * kD * 2;    // K or V tile, bf16
  static constexpr int kTileDS = bwd::kBN * kQRows * 2;  // dS^T [128 keys][kQRows queries] bf16,
                                                         // in blocks of 64 queries (128-byte rows)
  static constexpr int kTileDQ = kQRows * kD * 4;     // dQ tile fp32 (two consumer halves)
  static constexpr int kStat = kQRows * 4;            // one stage's LSE2 or D values
  static constexpr int k = 0;
  static constexpr int v = k + kTileK;
  static constexpr int q = v + kTileK;
  static constexpr int dO = q + 2 * kTileQ;
  static constexpr int ds = dO + 2 * kTileQ;
  static constexpr int dq = ds + 2 * kTileDS;
  static constexpr int lse = dq + kTileDQ;            // 2 stages x kQRows floats
  static constexpr int dpsum = lse + 2 * kStat;
  static constexpr int bar = dpsum + 2 * kStat;
  static constexpr int kBars = 9;  // kv_full, q_full[2], q_empty[2], do_full[2], do_empty[2]
  static constexpr int bytes = bar + 8 * kBars + 1024;  // + slack to align the base to 1024
};

// ---- output stores -------------------------------------------------------------------------

// out[off], out[off + 1] (+)= g: bf16 or fp32 (out_f32); with accumulate the old value is read,
// added in fp32 and rounded once.
__device__ __forceinline__ void add_out(void* out, int64_t off, float2 g, int out_f32, int accumulate) {
  if (out_f32) {
    float2* dst = reinterpret_cast<float2*>(static_cast<float*>(out) + off);
    if (accumulate) {
      const float2 old = *dst;
      g.x += old.x;
      g.y += old.y;
    }
    *dst = g;
  } else {
    uint32_t* dst = reinterpret_cast<uint32_t*>(static_cast<__nv_bfloat16*>(out) + off);
    if (accumulate) {
      const __nv_bfloat162 old = *reinterpret_cast<const __nv_bfloat162*>(dst);
      g.x += __low2float(old);
      g.y += __high2float(old);
    }
    *dst = pack_bf16(g.x, g.y);
  }
}

}  // namespace seqpar::hopper
