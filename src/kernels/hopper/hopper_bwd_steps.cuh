// The steps every backward main kernel shares (hopper_bwd.cuh's bwd_kernel, hopper_bwd_q80.cuh's
// bwd_q80_kernel): the CTA's unit of work (BwdUnit), the load ring's mbarriers (BwdBars), the
// producer warp's loads (bwd_load_tiles), the dQ drain without store-first (bwd_drain_dq) and the
// dK/dV epilogue (bwd_store_dkv).
#pragma once

#include <cstdint>

#include "kernels/hopper/hopper_bwd_params.cuh"
#include "kernels/hopper/hopper_ptx.cuh"

namespace seqpar::hopper {

// A CTA's unit: key tile n_block (keys n0 ..) of K/V head kvh of batch b, and the n_m query tiles
// of kQRows rows that see it; step it < n_iter is query head kvh * G + it / n_m (head outer), query
// tile q_tile(it). Dense: x = key tile (heaviest causal tiles first), y = K/V head, z = batch, the
// query tiles from the causal diagonal down; blocks launch x fastest, so the CTAs in flight are
// one head's key tiles, which read the same Q, dO and dQ accumulator rows from L2. Tile lists: the lists' order, every head's outliers
// first (hopper_tiles.hpp, order_tiles; listed_unit), and the key tile's listed query tiles only
// (entry(it): tile << 2 | flags). With x = head instead, the CTAs in flight read 32 heads' Q and
// dO and added into 32 heads' dQ, and the masked backward ran at HBM speed. With p.heads_inner
// (heads_inner_unit): block lin = x + tiles * y takes rank lin / heads of head lin % heads, so every
// head's heaviest tiles start first (a grid of few waves under the causal mask otherwise ends
// with the last heads' heavy tiles alone: 8K causal GQA 32:8 is 512 CTAs of 4 query heads).
template <int kQRows>
struct BwdUnit {
  bool listed;
  int n_block, kvh, b, G, n0, m_lo, e0, n_m, n_iter;
  // p: the kernel's parameters (the lists' entries are read from there, not held in a register).
  __device__ __forceinline__ int entry(const BwdParams& p, int it) const {
    return __ldg(p.tiles.entries + e0 + it % n_m);
  }
  __device__ __forceinline__ int q_tile(const BwdParams& p, int it) const {
    return listed ? entry(p, it) >> 2 : m_lo + it % n_m;
  }

  __device__ __forceinline__ static BwdUnit of(const BwdParams& p, bool listed) {
    BwdUnit u{};
    int rank = blockIdx.x;
    u.kvh = blockIdx.y;
    if (p.heads_inner)
      heads_inner_unit(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, &rank, &u.kvh);
    else if (listed)
      listed_unit(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, p.tiles.heavy, &rank, &u.kvh);
    u.n_block = listed ? __ldg(p.tiles.order + rank) : rank;
    u.b = blockIdx.z;
    u.G = p.heads / p.kv_heads;
    u.n0 = u.n_block * bwd::kBN;
    const int n_m_total = (p.seq_q + kQRows - 1) / kQRows;
    if (listed) {  // the first listed query tile and the list's start, so that n_m = its length
      u.e0 = __ldg(p.tiles.begin + u.n_block);
      u.m_lo = n_m_total - (__ldg(p.tiles.begin + u.n_block + 1) - u.e0);
    } else if (p.causal) {  // the first query tile with a row that sees a key of this tile
      const int x = u.n0 - p.causal_offset;
      u.m_lo = x > 0 ? x / kQRows : 0;
    }
    u.n_m = n_m_total > u.m_lo ? n_m_total - u.m_lo : 0;
    u.n_iter = u.n_m * u.G;
    u.listed = listed;
    return u;
  }
};

// The mbarriers at `bar` (BwdSmem::kBars of them): K and V loaded (once); per stage s, Q with its
// LSE2 values and dO with its D values loaded (full) and released by both consumers (empty).
struct BwdBars {
  uint32_t bar;
  __device__ __forceinline__ uint32_t kv_full() const { return bar; }
  __device__ __forceinline__ uint32_t q_full(int s) const { return bar + 8u * (1 + s); }
  __device__ __forceinline__ uint32_t q_empty(int s) const { return bar + 8u * (3 + s); }
  __device__ __forceinline__ uint32_t do_full(int s) const { return bar + 8u * (5 + s); }
  __device__ __forceinline__ uint32_t do_empty(int s) const { return bar + 8u * (7 + s); }
  // By one thread, before the CTA's __syncthreads.
  __device__ __forceinline__ void init() const {
    mbar_init(kv_full(), 1);
    for (int s = 0; s < 2; ++s) {
      mbar_init(q_full(s), 1);
      mbar_init(do_full(s), 1);
      mbar_init(q_empty(s), 2);  // one arrival per consumer warpgroup
      mbar_init(do_empty(s), 2);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
};

// The producer's loads, by one thread: K and V of key tile n0 (kCB 64-column blocks of 128 keys,
// TMA) once, then per step it < n_iter (query head kvh * G + it / n_m, query tile q_tile(it) of
// kQRows rows) Q and dO (TMA) and the tile's LSE2 and D values (bulk copies, kStat bytes each)
// into stage it % 2, each stage's buffers reused once both consumers released them. L: the
// kernel's shared-memory layout (kTileK, kTileQ, kStat).
template <int kCB, int kQRows, class L, class QTile>
__device__ __forceinline__ void bwd_load_tiles(const BwdBars& bars, const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                               const CUtensorMap* tm_v, const CUtensorMap* tm_do, uint32_t sK,
                                               uint32_t sV, uint32_t sQ, uint32_t sdO, uint32_t sLSE, uint32_t sDP,
                                               const BwdParams& p, int n_iter, int n_m, int G, int kvh, int n0, int b,
                                               QTile q_tile) {
  mbar_expect_tx(bars.kv_full(), 2 * L::kTileK);
#pragma unroll
  for (int cb = 0; cb < kCB; ++cb) tma_load_4d(sK + cb * bwd::kBN * 128, tm_k, bars.kv_full(), cb * 64, kvh, n0, b);
#pragma unroll
  for (int cb = 0; cb < kCB; ++cb) tma_load_4d(sV + cb * bwd::kBN * 128, tm_v, bars.kv_full(), cb * 64, kvh, n0, b);
  for (int it = 0; it < n_iter; ++it) {
    const int h = kvh * G + it / n_m, m = q_tile(it);
    const int st = it & 1;
    const uint32_t ph = (it >> 1) & 1;
    const int64_t row_stat = (static_cast<int64_t>(b) * p.heads + h) * p.seq_q_pad + m * kQRows;
    mbar_wait(bars.q_empty(st), ph ^ 1);
    mbar_expect_tx(bars.q_full(st), L::kTileQ + L::kStat);
#pragma unroll
    for (int cb = 0; cb < kCB; ++cb)
      tma_load_4d(sQ + st * L::kTileQ + cb * kQRows * 128, tm_q, bars.q_full(st), cb * 64, h, m * kQRows, b);
    bulk_load(sLSE + st * L::kStat, p.lse2 + row_stat, L::kStat, bars.q_full(st));
    mbar_wait(bars.do_empty(st), ph ^ 1);
    mbar_expect_tx(bars.do_full(st), L::kTileQ + L::kStat);
#pragma unroll
    for (int cb = 0; cb < kCB; ++cb)
      tma_load_4d(sdO + st * L::kTileQ + cb * kQRows * 128, tm_do, bars.do_full(st), cb * 64, h, m * kQRows, b);
    bulk_load(sDP + st * L::kStat, p.dpsum + row_stat, L::kStat, bars.do_full(st));
  }
}

// The drain warp (all 32 lanes; the accumulator zeroed beforehand): per step it < n_iter, consumer
// w's dQ part (kHalfBytes at sDQ + w * kHalfBytes, once its kBarDqFull + w barrier says so) added
// to the fp32 accumulator at row rows_of(it) with one bulk reduction, and the buffer handed back
// (kBarDqEmpty + w) once the bulk engine has read it. The first "empty" is given up front, and
// none after the last step, so every named barrier's arrivals balance.
template <int kD, int kHalfBytes, class RowsOf>
__device__ __forceinline__ void bwd_drain_dq(uint32_t sDQ, const BwdParams& p, int n_iter, int lane, RowsOf rows_of) {
  named_bar_arrive(bwd::kBarDqEmpty + 0, 160);
  named_bar_arrive(bwd::kBarDqEmpty + 1, 160);
  for (int it = 0; it < n_iter; ++it) {
    float* gtile = p.dq_acc + rows_of(it) * kD;
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      named_bar_sync(bwd::kBarDqFull + w, 160);
      if (lane == 0) {
        bulk_reduce_add_f32(gtile + w * (kHalfBytes / 4), sDQ + w * kHalfBytes, kHalfBytes);
        bulk_commit();
      }
    }
    if (lane == 0) bulk_wait_read<1>();
    __syncwarp();
    if (it + 1 < n_iter) named_bar_arrive(bwd::kBarDqEmpty + 0, 160);
    if (lane == 0) bulk_wait_read<0>();
    __syncwarp();
    if (it + 1 < n_iter) named_bar_arrive(bwd::kBarDqEmpty + 1, 160);
  }
  if (lane == 0) bulk_wait<0>();
}

// dK (times the scale) and dV of this thread's keys key_r0 and key_r0 + 8 (those below S_k), from
// the m64nD accumulator layout (dk[4j + 2x + e]: key key_r0 + 8x, column 8j + 2 (lane % 4) + e),
// stored or added (add_out).
template <int kD>
__device__ __forceinline__ void bwd_store_dkv(const float (&dk)[kD / 2], const float (&dv)[kD / 2], const BwdParams& p,
                                              int key_r0, int kvh, int b, int lane) {
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const int key = key_r0 + 8 * x;
    if (key >= p.seq_k) continue;
    const int64_t koff = b * p.dk_sb + key * p.dk_ss + kvh * p.dk_sh;
    const int64_t voff = b * p.dv_sb + key * p.dv_ss + kvh * p.dv_sh;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      const int col = 8 * j + 2 * (lane % 4);
      float2 gk = make_float2(dk[4 * j + 2 * x] * p.scale, dk[4 * j + 2 * x + 1] * p.scale);
      float2 gv = make_float2(dv[4 * j + 2 * x], dv[4 * j + 2 * x + 1]);
      add_out(p.dk, koff + col, gk, p.out_f32, p.accumulate);
      add_out(p.dv, voff + col, gv, p.out_f32, p.accumulate);
    }
  }
}

}  // namespace seqpar::hopper
