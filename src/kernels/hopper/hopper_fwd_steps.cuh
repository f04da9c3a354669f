// The steps the forward kernels share (fwd_kernel, hopper_fwd.cuh; fwd_persist_kernel,
// hopper_fwd_persist.cuh; fwd_cluster_kernel, hopper_fwd_cluster.cuh): the producer's Q and K/V
// stage loads (fwd_load_q, fwd_load_kv), the consumers' ping-pong turns (PingPong) and their GEMM
// steps on one key block (FwdConsumer), and the epilogue's pieces for the persistent kernels: a
// tile without keys (fwd_store_empty), the rows' LSE (fwd_store_lse) and O through shared memory
// and a TMA store (fwd_store_o_tma).
// Each kernel keeps its own loop over the key blocks, with its releases and masks, in its own
// file: the same loop as one shared function (releases and masks passed in) compiled to other
// SASS (operand orders, block layout), and these kernels' code must not change by sharing it.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/hopper/hopper_fwd_math.cuh"
#include "kernels/hopper/hopper_fwd_params.cuh"
#include "kernels/hopper/hopper_ptx.cuh"

namespace seqpar::hopper {

// global <- shared through a 4-D tensor map (bulk group; out-of-bounds elements are not written).
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
               : "memory");
}

// ---- the producer ------------------------------------------------------------------------

// The tile's Q (kBM rows from m0 of head h, batch b) into sQ, completing on q_full.
template <int kD, int kBM>
__device__ __forceinline__ void fwd_load_q(uint32_t sQ, const CUtensorMap* tm_q, uint32_t q_full, int h, int m0,
                                           int b) {
  mbar_expect_tx(q_full, kBM * kD * 2);
#pragma unroll
  for (int cb = 0; cb < kD / 64; ++cb) tma_load_4d(sQ + cb * kBM * 128, tm_q, q_full, cb * 64, h, m0, b);
}

// One K/V stage: once the consumers released stage st (phase ph), K then V of kBN keys into it,
// each expecting a whole tile's bytes. load(dst, map, bar, column, head, batch) issues one box:
// FwdTmaLoad the whole tile of key block n_block, or (clusters) this CTA's half, multicast. The
// box's row is computed in load, after the wait (computed before it, the producer's code changed).
template <int kBN>
struct FwdTmaLoad {
  int n_block;
  __device__ __forceinline__ void operator()(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                             int c3) const {
    tma_load_4d(dst, map, bar, c0, c1, n_block * kBN, c3);
  }
};
template <int kD, int kBN, int kStages, class Load>
__device__ __forceinline__ void fwd_load_kv(const FwdBars<kStages>& bars, uint32_t sK, uint32_t sV,
                                            const CUtensorMap* tm_k, const CUtensorMap* tm_v, int st, uint32_t ph,
                                            int kvh, int b, Load load) {
  constexpr int kTileKV = kBN * kD * 2;
  mbar_wait(bars.k_empty(st), ph ^ 1);
  mbar_expect_tx(bars.k_full(st), kTileKV);
#pragma unroll
  for (int cb = 0; cb < kD / 64; ++cb) load(sK + st * kTileKV + cb * kBN * 128, tm_k, bars.k_full(st), cb * 64, kvh, b);
  mbar_wait(bars.v_empty(st), ph ^ 1);
  mbar_expect_tx(bars.v_full(st), kTileKV);
#pragma unroll
  for (int cb = 0; cb < kD / 64; ++cb) load(sV + st * kTileKV + cb * kBN * 128, tm_v, bars.v_full(st), cb * 64, kvh, b);
}

// ---- the consumers -----------------------------------------------------------------------

// Ping-pong turn-taking (round robin over the kC consumers): consumer c issues GEMMs only
// after bar (1 + c) completes, which consumer c - 1's arrival after its own issue provides.
// Each consumer passes the same number of turns, so the counts balance. kOn = false: no turns.
template <int kC, bool kOn = true>
struct PingPong {
  int c;
  __device__ __forceinline__ void sync() const {
    if constexpr (kOn) named_bar_sync(1 + c, 256);
  }
  __device__ __forceinline__ void arrive() const {
    if constexpr (kOn) named_bar_arrive(1 + (c + 1) % kC, 256);
  }
  __device__ __forceinline__ void start() const {
    if constexpr (kOn) {
      if (c == kC - 1) named_bar_arrive(1, 256);  // consumer 0 takes the first turn
    }
  }
  __device__ __forceinline__ void finish() const {
    if constexpr (kOn) {
      if (c == 0) named_bar_sync(1, 256);  // absorbs the last consumer's last arrival
    }
  }
};

// A consumer's accumulators over one query tile, as references to the kernel's own arrays (with
// the arrays inside one struct, the kernels' SASS changed): O, the block's scores S and its P
// fragments, the running max m, sum l and the last rescale factor of the thread's two rows.
template <int kD, int kBN>
struct FwdAcc {
  float (&o)[kD / 2];
  float (&s)[kBN / 2];
  uint32_t (&pf)[kBN / 16][4];
  float (&m)[2], (&l)[2], (&resc)[2];
};

// One consumer's GEMMs on its 64 rows of Q (qa) and the K/V rings (sK, sV; barriers `bars`).
template <int kD, int kBN, int kBM, int kStages, int kC, bool kPingPong = true>
struct FwdConsumer {
  static constexpr int kTileKV = kBN * kD * 2;
  using Acc = FwdAcc<kD, kBN>;
  uint32_t qa, sK, sV;
  FwdBars<kStages> bars;
  PingPong<kC, kPingPong> pp;

  __device__ __forceinline__ uint64_t desc_q(int kk) const {
    return make_desc(qa + (kk / 4) * kBM * 128 + (kk % 4) * 32, 16, 1024);
  }
  __device__ __forceinline__ uint64_t desc_k(int st, int kk) const {
    return make_desc(sK + st * kTileKV + (kk / 4) * kBN * 128 + (kk % 4) * 32, 16, 1024);
  }
  __device__ __forceinline__ uint64_t desc_v(int st, int kk) const {
    return make_desc(sV + st * kTileKV + kk * 16 * 128, kBN * 128, 1024);
  }
  __device__ __forceinline__ void issue_s(Acc& a, int st) const {
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) wgmma_qk<kBN>(a.s, desc_q(kk), desc_k(st, kk), kk > 0 ? 1 : 0);
  }
  __device__ __forceinline__ void issue_pv(Acc& a, int st) const {
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) wgmma_pv<kD>(a.o, a.pf[kk], desc_v(st, kk));
  }
  // S = Q K^T of stage st alone, waited for.
  __device__ __forceinline__ void gemm_s(Acc& a, int st, uint32_t ph) const {
    mbar_wait(bars.k_full(st), ph);
    pp.sync();
    fence_regs(a.s);
    wgmma_fence();
    issue_s(a, st);
    wgmma_commit();
    pp.arrive();
    wgmma_wait<0>();
    fence_regs(a.s);
  }
  // The P V in flight is done: O and the P fragments are free again.
  __device__ __forceinline__ void pv_done(Acc& a) const {
    wgmma_wait<0>();
    fence_regs(a.o);
    fence_regs(a.pf);
  }
  // S = Q K^T of stage st (phase ph) and O += P V of the previous block's stage pst (phase pph)
  // in flight together; returns when S is done (the P V may still run: pv_done).
  __device__ __forceinline__ void gemm_s_pv(Acc& a, int st, uint32_t ph, int pst, uint32_t pph) const {
    mbar_wait(bars.k_full(st), ph);
    mbar_wait(bars.v_full(pst), pph);
    pp.sync();
    fence_regs(a.s);
    fence_regs(a.o);
    fence_regs(a.pf);
    wgmma_fence();
    issue_s(a, st);
    wgmma_commit();
    issue_pv(a, pst);
    wgmma_commit();
    pp.arrive();
    wgmma_wait<1>();  // S of this block is done; P V of the previous may still run
    fence_regs(a.s);
  }
  // O += P V of stage st alone (a tile's last block), waited for.
  __device__ __forceinline__ void gemm_pv(Acc& a, int st, uint32_t ph) const {
    mbar_wait(bars.v_full(st), ph);
    pp.sync();
    fence_regs(a.o);
    fence_regs(a.pf);
    wgmma_fence();
    issue_pv(a, st);
    wgmma_commit();
    pp.arrive();
    pv_done(a);
  }
};

// ---- the persistent kernels' epilogue ----------------------------------------------------

// A tile with no visible key: O = 0, LSE = -inf, plain stores (no V stage to stage O in).
template <int kD>
__device__ __forceinline__ void fwd_store_empty(const FwdParams& p, int row0, int lane, int h, int b) {
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const int row = row0 + 8 * x;
    if (row < p.seq_q) {
      const int64_t orow = b * p.o_sb + row * p.o_ss + h * p.o_sh;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j)
        *reinterpret_cast<uint32_t*>(static_cast<__nv_bfloat16*>(p.o) + orow + 8 * j + 2 * (lane % 4)) = 0u;
      if (lane % 4 == 0) p.lse[b * p.lse_sb + h * p.lse_sh + row] = -INFINITY;
    }
  }
}

// The rows' LSE (plain stores, one float per row) and 1 / l for O (0 for a row without keys).
__device__ __forceinline__ void fwd_store_lse(const float (&m)[2], const float (&l)[2], float (&inv)[2],
                                              const FwdParams& p, int row0, int lane, int h, int b) {
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const float lx = quad_sum(l[x]);
    inv[x] = lx > 0.f ? 1.f / lx : 0.f;
    const int row = row0 + 8 * x;
    if (row < p.seq_q && lane % 4 == 0) p.lse[b * p.lse_sb + h * p.lse_sh + row] = row_lse(m[x], lx);
  }
}

// Named barriers of the O store (1 .. kC are the ping-pong turns): all consumers' last P V done
// (kFwdBarAllPv), one consumer warpgroup's staging rows (kFwdBarStage + c).
constexpr int kFwdBarAllPv = 4, kFwdBarStage = 5;

// O / l to bf16 into consumer c's staging rows (kD / 64 boxes of [64 rows][128 bytes], 128-byte
// swizzled; 4-byte stores without bank conflicts), then one TMA store per box (rows past S_q are
// clipped by the tensor map). kOInV: the rows are in the V stage of the tile's last P V (v_stage,
// once every consumer's last P V has read it), and release_v() frees that stage when the store
// has read them; else in O's own buffer (o_buf), once this consumer's previous store read it.
template <int kD, int kC, bool kOInV, class ReleaseV>
__device__ __forceinline__ void fwd_store_o_tma(const float (&o)[kD / 2], const float (&inv)[2], uint32_t v_stage,
                                                uint32_t o_buf, const CUtensorMap* tm_o, int c, int warp, int lane,
                                                bool is_signaller, int h, int tile_row_lo, int b, const FwdParams& p,
                                                ReleaseV release_v) {
  constexpr int kCB = kD / 64;
  uint32_t so;
  if constexpr (kOInV) {
    named_bar_sync(kFwdBarAllPv, 128 * kC);  // every consumer's last P V has read this V stage
    so = v_stage + c * kCB * 64 * 128;
  } else {
    if (is_signaller) bulk_wait_read<0>();  // our previous store has read the buffer
    named_bar_sync(kFwdBarStage + c, 128);
    so = o_buf + c * kCB * 64 * 128;
  }
  {
    const int r = warp * 16 + lane / 4;  // local row (+ 8 x); r % 8 == lane / 4
#pragma unroll
    for (int x = 0; x < 2; ++x)
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        const uint32_t addr =
            so + (j / 8) * 64 * 128 + (r + 8 * x) * 128 + (((j % 8) ^ (lane / 4)) << 4) + 4 * (lane % 4);
        st_shared_u32(addr, pack_bf16(o[4 * j + 2 * x] * inv[x], o[4 * j + 2 * x + 1] * inv[x]));
      }
  }
  fence_proxy_async();
  named_bar_sync(kFwdBarStage + c, 128);
  if (is_signaller) {
    if (tile_row_lo < p.seq_q) {
#pragma unroll
      for (int cb = 0; cb < kCB; ++cb) tma_store_4d(tm_o, so + cb * 64 * 128, cb * 64, h, tile_row_lo, b);
    }
    bulk_commit();
    if constexpr (kOInV) {
      bulk_wait_read<0>();  // the staging rows are read: the V stage may be reloaded
      release_v();
    }
  }
}

}  // namespace seqpar::hopper
