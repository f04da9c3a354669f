// The forward's math on one key block, the same in every forward kernel (and convert_p / wgmma_pv
// in the backward's): the element mask of the dense masks (apply_mask) and where a block needs it
// (fwd_mask_block), the online softmax, O's rescale, P to wgmma A fragments, and the two GEMMs'
// wgmma shapes.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/hopper/hopper_fwd_params.cuh"
#include "kernels/hopper/hopper_mask.cuh"
#include "kernels/hopper/hopper_ptx.cuh"
#include "kernels/hopper/wgmma_ops.cuh"

namespace seqpar::hopper {

// Sets to -inf the scores this thread holds that are past S_k or above the causal diagonal.
// Accumulator layout (wgmma m64nN, per warp 16 rows): s[4j + e] is row lane/4 + 8*(e>>1),
// column 8j + 2*(lane%4) + (e&1).
template <int kBN>
__device__ __forceinline__ void apply_mask(float (&s)[kBN / 2], int key0, int row0, int lane, const FwdParams& p) {
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + 8 * j + 2 * (lane % 4) + (e & 1);
      const int row = row0 + 8 * (e >> 1);
      if (key >= p.seq_k || (p.causal && key > row + p.causal_offset)) s[4 * j + e] = -INFINITY;
    }
}

// Where one consumer's scores of a tile need masking. Dense masks: the blocks past S_k or crossing
// the causal diagonal of one of its 64 rows (tile_row_lo ..), walked from the last key block to
// the first; tile lists: the entries flagged as boundary tiles (hopper_mask.cuh), from entry e0.
struct FwdMaskBlock {
  bool listed;
  int e0, n_blocks, tile_row_lo, row0, lane;
  // Masks the scores of step it. kPattern: the pattern's element mask too (else the entry must
  // not need it: pattern()).
  template <int kBN, bool kPattern>
  __device__ __forceinline__ void apply(float (&s)[kBN / 2], const FwdParams& p, int it) const {
    if (listed) {
      const int e = __ldg(p.tiles.entries + e0 + it);
      if (e & 3) apply_tile_mask<kBN, kPattern>(s, p.tiles, (e >> 2) * kBN, row0, p.seq_q, lane, e & 3);
    } else {
      const int n_block = n_blocks - 1 - it;
      const int key_hi = n_block * kBN + kBN - 1;
      if (key_hi >= p.seq_k || (p.causal && key_hi > tile_row_lo + p.causal_offset))
        apply_mask<kBN>(s, n_block * kBN, row0, lane, p);
    }
  }
  __device__ __forceinline__ bool pattern(const FwdParams& p, int it) const {
    return listed && (__ldg(p.tiles.entries + e0 + it) & kTilePatternMask);
  }
};

// Online softmax on one block of scores: updates the running max m (log2 units) and the
// per-thread partial sum l, turns s into unnormalised probabilities, and returns the factor
// each of the thread's two rows of O must be rescaled by. A row that has seen no key yet keeps
// m = -inf and uses 0 as its reference, so exp2 never sees (-inf) - (-inf).
template <int kBN>
__device__ __forceinline__ void online_softmax(float (&s)[kBN / 2], float (&m)[2], float (&l)[2], float (&resc)[2],
                                               float scale_log2) {
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * x], s[4 * j + 2 * x + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
    const float m_new = fmaxf(m[x], mx * scale_log2);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    resc[x] = fast_exp2(m[x] - m_use);
    m[x] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float v = fast_exp2(fmaf(s[4 * j + 2 * x + e], scale_log2, -m_use));
        s[4 * j + 2 * x + e] = v;
        sum += v;
      }
    l[x] = l[x] * resc[x] + sum;
  }
}

template <int kD>
__device__ __forceinline__ void rescale_o(float (&o)[kD / 2], const float (&resc)[2]) {
#pragma unroll
  for (int j = 0; j < kD / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[4 * j + e] *= resc[e >> 1];
}

// P (fp32 probabilities in the S accumulator layout) to wgmma A fragments, one per 16 keys:
// registers {row r cols k..k+1, row r+8 cols k..k+1, row r cols k+8.., row r+8 cols k+8..}.
template <int kBN>
__device__ __forceinline__ void convert_p(const float (&s)[kBN / 2], uint32_t (&pf)[kBN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) pf[kk][r] = pack_bf16(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

template <int kBN>
__device__ __forceinline__ void wgmma_qk(float (&s)[kBN / 2], uint64_t da, uint64_t db, int scale_d) {
  if constexpr (kBN == 192)
    wgmma_ss_m64n192k16(s, da, db, scale_d);
  else if constexpr (kBN == 176)
    wgmma_ss_m64n176k16(s, da, db, scale_d);
  else if constexpr (kBN == 64)
    wgmma_ss_m64n64k16(s, da, db, scale_d);
  else
    wgmma_ss_m64n128k16(s, da, db, scale_d);
}

template <int kD>
__device__ __forceinline__ void wgmma_pv(float (&o)[kD / 2], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (kD == 128)
    wgmma_rs_m64n128k16_tb(o, a, db);
  else
    wgmma_rs_m64n64k16_tb(o, a, db);
}

// A row's sum over the quad of threads that hold its columns.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffff, v, 1);
  v += __shfl_xor_sync(0xffffffff, v, 2);
  return v;
}
// A row's LSE (natural log) from its running max m (log2 units) and its sum l; -inf for no key.
__device__ __forceinline__ float row_lse(float m, float l) {
  return l > 0.f ? (m + __log2f(l)) * 0.6931471805599453f : -INFINITY;
}

}  // namespace seqpar::hopper
