// The Hopper attention BACKWARD kernel: FlashAttention-3-style, for sm_90a (H100/H200), bf16,
// head dim 128 (and 64), full or causal mask (top-left + offset, as the forward), or any mask as
// visible-tile lists (hopper_tiles.hpp: each key tile's list of query tiles), GQA. Follows
// include/seqpar/backend.hpp: given the final LSE [B, H, S_q] (natural log of the scaled scores,
// -inf for rows that see no key) and D = rowsum(dO * O) [B, H, S_q] (or O, from which a small
// preprocessing kernel computes D), it writes dQ [B, S_q, H, D], dK and dV [B, S_k, H_kv, D],
// bf16 or fp32 (dq_f32, dkv_f32), any row strides; `accumulate` makes it add to them instead (the
// backend's "backward adds": each element read, added in fp32 and rounded once).
//
// Design (dev/hopper_attention/README.md has the reasoning, the A/B runs and the numbers):
// - One CTA per (128-key tile, KV head, batch). It loops over the query heads of its GQA group
//   and, for each, over the 64-row query tiles that can see its keys (causal: from the diagonal
//   down), so dK and dV of the group are summed in registers and written once, unshared.
// - 3 warpgroups. WG0 is the producer (setmaxnreg 24): warp 0 loads K and V once and then
//   Q, dO (TMA, 128-byte swizzle) and the tile's LSE*log2(e) and D (1-D bulk copies) into a
//   2-stage ring; warp 1 drains the dQ partials (below). WG1 and WG2 are the consumers
//   (setmaxnreg 240), each owning 64 of the 128 keys.
// - Per query tile, in each consumer (all GEMMs are wgmma, accumulators in registers):
//     S^T  = K_w Q^T      m64n64, A = K (smem, K-major), B = Q (smem, K-major)
//     dP^T = V_w dO^T     m64n64, likewise
//     P^T  = exp2(S^T * scale*log2e - LSE2[q]),  dS^T = P^T * (dP^T - D[q])
//     dV  += P^T dO       m64nD, A = P^T from registers (the S^T accumulator layout is the A
//                         fragment layout), B = dO (smem, MN-major)
//     dS^T -> smem (bf16, swizzled by hand), barrier between the two consumers
//     dQ_w  = dS K[:, w]  m64n(D/2), A = dS (smem, M-major), B = K (smem, MN-major): each
//                         consumer computes half of dQ's columns over all 128 keys
//     dK  += dS^T Q       m64nD, A = dS^T from registers, B = Q (smem, MN-major)
//   Computing S^T rather than S (keys as the M dimension, FA3's SdP_swapAB) is what lets P^T and
//   dS^T feed the dK/dV GEMMs straight from registers.
// - dQ: each consumer writes its fp32 dQ half to shared memory in its fragment order and the
//   producer's warp 1 adds it to a zeroed fp32 accumulator in global memory with one bulk
//   reduction (cp.reduce.async.bulk .add.f32, 16 KB); a final kernel turns the accumulator into
//   dQ (times the softmax scale; added to dQ with accumulate). Named barriers hand the shared
//   buffer back and forth. With a per-tile state (dq_state; the lab's "sfirst", measured slower
//   on dense problems, so the library leaves it off) the first CTA to reach a dQ tile stores it
//   instead, and the accumulator needs no zeroing.
// - Masking: P = 0 for keys past S_k and above the causal diagonal, only in the tiles that
//   cross either; with tile lists the CTA walks its key tile's listed query tiles only and
//   masks element by element (hopper_mask.cuh) only those flagged as boundary tiles; rows past
//   S_q and rows with no key get LSE2 = +inf and D = 0 from the preprocessing kernel, so their P
//   and dS are exactly 0 (no NaN from -inf - -inf).
// - The constants, BwdParams and the shared-memory layout are in hopper_bwd_params.cuh; the
//   preprocessing and dQ conversion kernels and the host launcher (launch_bwd) in
//   hopper_bwd_launch.cuh.
// - Variants: kDefer = false, "base" (the above; the faster one, measured on H200, and the one
//   the backend runs at D = 128 on tile lists; dense D = 128 runs the 80-row kernel,
//   hopper_bwd_q80.cuh), and kDefer = true, "defer" (below; the lab's dispatch_bwd
//   picks by name). kQRows = 128, "q128" (D = 64 only; FlashAttention-3's hdim-64 tile): 128-row
//   query tiles, so each tile's fixed costs (barriers, waits, the exp and dS passes' overheads,
//   the dQ hand-off) are paid once per twice the GEMM work. Each consumer then computes
//   S^T, dP^T as m64n128 (its 64 keys x 128 queries), dV and dK over 8 k-steps, and dQ for 64 of
//   the 128 query rows (all 64 columns, over all 128 keys) instead of half the columns.
//   Options tried on this kernel and measured slower (dQ one tile late, staggered consumers, dQ by
//   red.global): dev/hopper_attention/README.md, "Backward at D = 128: dQ one tile late, ...".
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/hopper/hopper_bwd_params.cuh"
#include "kernels/hopper/hopper_bwd_steps.cuh"
#include "kernels/hopper/hopper_fwd.cuh"  // the PTX helpers, convert_p, wgmma_pv
#include "kernels/hopper/hopper_mask.cuh"
#include "kernels/hopper/hopper_ptx.cuh"
#include "kernels/hopper/wgmma_bwd_ops.cuh"
#include "kernels/hopper/wgmma_ops.cuh"

namespace seqpar::hopper {

// S^T or dP^T (64 keys x kQRows queries) += one k-step, both operands from shared memory.
template <int kQRows>
__device__ __forceinline__ void wgmma_st(float (&acc)[kQRows / 2], uint64_t da, uint64_t db, int scale_d) {
  if constexpr (kQRows == 128)
    wgmma_ss_m64n128k16(acc, da, db, scale_d);
  else
    wgmma_ss_m64n64k16(acc, da, db, scale_d);
}

// ---- the kernel --------------------------------------------------------------------------

// kDefer: leave the dK GEMM of query tile i in flight into tile i + 1 (waited for together with
// the next S^T), so the tensor cores have it queued while this warpgroup issues the next tile;
// Q's stage is then released one tile later. dK then reads dS^T back from shared memory (SS)
// rather than from registers: with dS^T pinned in registers across tiles, ptxas ran out of
// registers and serialized the wgmmas (C7512).
// kQRows: query rows per tile, 64 (base, defer) or 128 ("q128", D = 64 without kDefer).
template <int kD, bool kDefer, int kQRows = bwd::kBM>
__global__ void __launch_bounds__(bwd::kThreads, 1)
    bwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
               const BwdParams p) {
  static_assert(kD == 64 || kD == 128, "head dim 64 or 128");
  static_assert(kQRows == 64 || (kQRows == 128 && kD == 64 && !kDefer), "128-row query tiles: D = 64, no defer");
#ifdef SEQPAR_HOPPER_STUB
  __trap();  // a device pass without sm_90a features: never launched (device_refusal)
#else
  using L = BwdSmem<kD, kQRows>;
  using namespace bwd;
  constexpr int kCB = kD / 64;   // 64-column (128-byte) blocks per row
  // dQ per consumer: with 64-row tiles, all rows and half the columns; with 128, its 64 rows
  // (queries w*64 ..) and all columns.
  constexpr int kDQN = kQRows == 64 ? kD / 2 : kD;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = base + L::k, sV = base + L::v, sQ = base + L::q, sdO = base + L::dO, sdS = base + L::ds;
  const uint32_t sDQ = base + L::dq, sLSE = base + L::lse, sDP = base + L::dpsum, sBar = base + L::bar;
  const BwdBars bars{sBar};

  // The CTA's key tile, K/V head and query tiles (BwdUnit: K/V heads the outer loop).
  const bool listed = p.tiles.begin != nullptr;
  const BwdUnit<kQRows> u = BwdUnit<kQRows>::of(p, listed);
  const int kvh = u.kvh, b = u.b, G = u.G, n0 = u.n0, n_m = u.n_m, n_iter = u.n_iter;
  auto q_tile = [&](int it) { return u.q_tile(p, it); };  // the query tile of step it

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  if (tid == 0) bars.init();
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer warpgroup ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    const int warp = tid / 32, lane = tid % 32;
    if (warp == 0 && lane == 0 && n_iter > 0) {
      bwd_load_tiles<kCB, kQRows, L>(bars, &tm_q, &tm_k, &tm_v, &tm_do, sK, sV, sQ, sdO, sLSE, sDP, p, n_iter, n_m, G, kvh,
                               n0, b, q_tile);
    } else if (warp == 1 && n_iter > 0) {
      // dQ drain: after consumer w filled its half, add it to the global accumulator; hand the
      // buffer back once the bulk engine has read it. The first "empty" is given up front, and
      // none after the last tile, so every named barrier's arrivals balance.
      named_bar_arrive(kBarDqEmpty + 0, 160);
      named_bar_arrive(kBarDqEmpty + 1, 160);
      // With dq_state (kStoreFirst; the accumulator is not zeroed): the first CTA to reach a dQ
      // tile (a compare-and-swap 0 -> 1 on its state) stores it, and marks it stored (2) once the
      // store is complete; the others wait for the mark, then add. Off the critical path: the
      // swap for tile it + 1 is issued while tile it's copies run, and the mark of tile it is set
      // after tile it + 1's copies are issued. A CTA sets its pending mark before it waits on
      // another's, so no two CTAs wait on each other.
      // The accumulator's tile rows (seq_q_pad is a multiple of 128: either tile size indexes it).
      auto rows_of = [&](int it) {
        return (static_cast<int64_t>(b) * p.heads + kvh * G + it / n_m) * p.seq_q_pad + q_tile(it) * kQRows;
      };
      auto tile_of = [&](int it) { return rows_of(it) / kBM; };  // a 64-row tile's state
      const bool store_first = kQRows == kBM && p.dq_state != nullptr;
      int64_t pending = -1;  // lane 0: a tile this CTA stored first, not yet marked
      bool first = store_first && lane == 0 && atomicCAS(p.dq_state + tile_of(0), 0, 1) == 0;
      for (int it = 0; it < n_iter; ++it) {
        const int64_t tile = tile_of(it);
        float* gtile = p.dq_acc + rows_of(it) * kD;
        if (store_first && lane == 0 && !first && ld_acquire_gpu(p.dq_state + tile) != 2) {
          if (pending >= 0) {
            bulk_wait<0>();
            fence_proxy_async_global();
            __threadfence();
            st_release_gpu(p.dq_state + pending, 2);
            pending = -1;
          }
          while (ld_acquire_gpu(p.dq_state + tile) != 2) __nanosleep(32);
        }
        if (store_first && lane == 0 && !first) fence_proxy_async_global();
        __syncwarp();
#pragma unroll
        for (int w = 0; w < 2; ++w) {
          named_bar_sync(kBarDqFull + w, 160);
          if (lane == 0) {
            if (first)
              bulk_store(gtile + w * (kQRows * kD / 2), sDQ + w * (L::kTileDQ / 2), L::kTileDQ / 2);
            else
              bulk_reduce_add_f32(gtile + w * (kQRows * kD / 2), sDQ + w * (L::kTileDQ / 2), L::kTileDQ / 2);
            bulk_commit();
          }
        }
        bool first_next = false;
        if (store_first && lane == 0) {
          if (pending >= 0) {  // the previous tile's store is complete once only these 2 groups run
            bulk_wait<2>();
            fence_proxy_async_global();
            __threadfence();
            st_release_gpu(p.dq_state + pending, 2);
          }
          pending = first ? tile : -1;
          if (it + 1 < n_iter) first_next = atomicCAS(p.dq_state + tile_of(it + 1), 0, 1) == 0;
        }
        if (lane == 0) bulk_wait_read<1>();
        __syncwarp();
        if (it + 1 < n_iter) named_bar_arrive(kBarDqEmpty + 0, 160);
        if (lane == 0) bulk_wait_read<0>();
        __syncwarp();
        if (it + 1 < n_iter) named_bar_arrive(kBarDqEmpty + 1, 160);
        first = first_next;
      }
      if (lane == 0) bulk_wait<0>();
      if (pending >= 0) {  // lane 0
        fence_proxy_async_global();
        __threadfence();
        st_release_gpu(p.dq_state + pending, 2);
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
  const int w = wg - 1;  // keys w*64 .. w*64+63 of the tile; dQ columns w*kD/2 ..
  const int lane = tid % 32, warp = (tid % 128) / 32;
  const bool is_signaller = (tid % 128) == 0;
  const int key_r0 = n0 + w * 64 + warp * 16 + lane / 4;  // this thread's keys: key_r0, key_r0 + 8

  float dv[kD / 2], dk[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dv[i] = dk[i] = 0.f;
  float s[kQRows / 2], dp[kQRows / 2], dq[kDQN / 2];
  uint32_t pf[kQRows / 16][4], dsf[kQRows / 16][4];

  // Descriptors. K-major operands (S^T, dP^T): 64-column blocks of [rows][128 B], SBO 1024, the
  // k-step inside a swizzle atom by +32 B. MN-major operands (dV, dK, dQ): rows are the K dim,
  // a k-step is 16 rows (+2048 B), LBO = the stride between 64-column blocks, SBO 1024.
  // Each is a base descriptor plus (byte offset >> 4) in its low word (shared addresses stay
  // below 2^18, so the 14-bit address field never carries). The bases go through an opaque move
  // every iteration so the compiler does not hoist some 24 loop-invariant 64-bit descriptors out
  // of the loop and spill them (it did: 48 bytes of spills at D = 128).
  auto desc_kw = [&](uint32_t tile, int kk) {  // K or V rows w*64.., as A (K-major)
    return make_desc(tile + w * 64 * 128, 16, 1024) + (((kk / 4) * kBN * 128 + (kk % 4) * 32) >> 4);
  };
  auto desc_qk = [&](uint32_t tile, int kk) {  // Q or dO tile as B, K-major (N = queries)
    return make_desc(tile, 16, 1024) + (((kk / 4) * kQRows * 128 + (kk % 4) * 32) >> 4);
  };
  auto desc_qmn = [&](uint32_t tile, int kk) {  // Q or dO tile as B, MN-major (K = queries, N = d)
    return make_desc(tile, kQRows * 128, 1024) + ((kk * 16 * 128) >> 4);
  };
  auto desc_ds = [&](uint32_t buf, int kk) {  // dS^T [keys][queries] as A = dS, M-major: the 64
    // queries of block w with 128-row tiles (this consumer's dQ rows), of the one block with 64
    return make_desc(buf + (kQRows == 128 ? w * kBN * 128 : 0), kBN * 128, 1024) + ((kk * 16 * 128) >> 4);
  };
  auto desc_kmn = [&](uint32_t tk, int kk) {  // K as B of dQ, MN-major: this consumer's kDQN columns
    // 64-row tiles: D = 128, column block w; D = 64, one block, the consumer's 32 columns start
    // 64 B into a row. 128-row tiles: all 64 columns.
    const uint32_t col = kQRows == 128 ? 0u : kD == 128 ? w * kBN * 128 : w * 64;
    return make_desc(tk + col, kBN * 128, 1024) + ((kk * 16 * 128) >> 4);
  };
  auto opaque = [](uint32_t x) {
    uint32_t r;
    asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(x));
    return r;
  };

  // dQ part to shared memory in the accumulator's fragment order of a 64-row tile: column half
  // c (kD/2 columns; 64-row tiles: this consumer's, c = w), then warp, then jj (8 columns),
  // then lane: float4 (dq[4jj .. 4jj+3]) of lane l, warp wp at c * 64*kD*2 B + ((wp * kD/16 +
  // jj % (kD/16)) * 32 + l) * 16 B, each warp store 512 contiguous bytes. With 128-row tiles a
  // consumer's part is a whole 64-row tile (c = jj / (kD/16)), so both tile sizes leave one
  // accumulator layout for the conversion kernels. The drain warp adds it to the accumulator.
  auto handoff_dq = [&](int t) {  // t: the step (query head, query tile) whose dQ part this is
    constexpr int kJJ = kD / 16;  // float4 column groups per column half
    named_bar_sync(kBarDqEmpty + w, 160);
    const uint32_t buf = sDQ + w * (L::kTileDQ / 2);
#pragma unroll
    for (int jj = 0; jj < kDQN / 8; ++jj)
      st_shared_v4(buf + (jj / kJJ) * (kBM * kD * 2) + ((warp * kJJ + jj % kJJ) * 32 + lane) * 16, dq[4 * jj],
                   dq[4 * jj + 1], dq[4 * jj + 2], dq[4 * jj + 3]);
    fence_proxy_async();
    named_bar_arrive(kBarDqFull + w, 160);
  };

  if (n_iter > 0) mbar_wait(bars.kv_full(), 0);

  for (int it = 0; it < n_iter; ++it) {
    const int m = q_tile(it);
    const int q0 = m * kQRows;
    const int st = it & 1;
    const uint32_t ph = (it >> 1) & 1;
    const uint32_t tQ = opaque(sQ + st * L::kTileQ), tdO = opaque(sdO + st * L::kTileQ);
    const uint32_t tK = opaque(sK), tV = opaque(sV), tdS = opaque(sdS + st * L::kTileDS);

    // S^T and dP^T, both in flight.
    mbar_wait(bars.q_full(st), ph);
    fence_regs(s);
    fence_regs(dp);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) wgmma_st<kQRows>(s, desc_kw(tK, kk), desc_qk(tQ, kk), kk > 0 ? 1 : 0);
    wgmma_commit();
    mbar_wait(bars.do_full(st), ph);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) wgmma_st<kQRows>(dp, desc_kw(tV, kk), desc_qk(tdO, kk), kk > 0 ? 1 : 0);
    wgmma_commit();

    // Row statistics of this thread's kQRows/4 query columns: 8 * j + 2 * (lane % 4) + {0, 1}.
    // 64-row tiles read them while S^T runs; 128-row tiles at use (held across the wait, their
    // 32 registers made ptxas spill).
    constexpr bool kPreload = kQRows == 64;
    auto stat = [&](uint32_t at, int j) { return ld_shared_f2(at + st * L::kStat + (8 * j + 2 * (lane % 4)) * 4); };
    float2 lse[kPreload ? kQRows / 8 : 1];
    if constexpr (kPreload) {
#pragma unroll
      for (int j = 0; j < kQRows / 8; ++j) lse[j] = stat(sLSE, j);
    }

    wgmma_wait<1>();  // S^T done (and, with kDefer, the previous tile's dK)
    fence_regs(s);
    if constexpr (kDefer) {
      fence_regs(dk);
      if (it > 0 && is_signaller) mbar_arrive(bars.q_empty(st ^ 1));
    }
    // P^T = exp2(S^T * scale * log2(e) - LSE2). Accumulator layout: s[4j + e] is key
    // key_r0 + 8 * (e >> 1), query q0 + 8j + 2 * (lane % 4) + (e & 1).
    const int flags = listed ? u.entry(p, it) & 3 : 0;
    const bool need_mask =
        listed ? flags != 0 : n0 + kBN > p.seq_k || (p.causal && n0 + kBN - 1 > q0 + p.causal_offset);
#pragma unroll
    for (int j = 0; j < kQRows / 8; ++j) {
      const float2 lj = kPreload ? lse[j] : stat(sLSE, j);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float l2 = (e & 1) ? lj.y : lj.x;
        s[4 * j + e] = fast_exp2(fmaf(s[4 * j + e], p.scale_log2, -l2));
      }
    }
    if (need_mask && listed) {
      // In 64-query halves (s[32h ..] is the m64n64 layout of queries q0 + 64h ..): over all
      // 128 queries of a q128 tile at once, ptxas spilled 40 bytes.
#pragma unroll
      for (int h = 0; h < kQRows / 64; ++h)
        apply_tile_mask_t<64, true>(*reinterpret_cast<float(*)[32]>(s + 32 * h), p.tiles, q0 + 64 * h, key_r0,
                                    p.seq_k, lane, flags);
    } else if (need_mask) {
#pragma unroll
      for (int j = 0; j < kQRows / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key_r0 + 8 * (e >> 1);
          const int q = q0 + 8 * j + 2 * (lane % 4) + (e & 1);
          if (key >= p.seq_k || (p.causal && key > q + p.causal_offset)) s[4 * j + e] = 0.f;
        }
    }
    float2 dsum[kPreload ? kQRows / 8 : 1];
    if constexpr (kPreload) {
#pragma unroll
      for (int j = 0; j < kQRows / 8; ++j) dsum[j] = stat(sDP, j);
    }

    wgmma_wait<0>();
    fence_regs(dp);
    // dS^T = P^T * (dP^T - D)
#pragma unroll
    for (int j = 0; j < kQRows / 8; ++j) {
      const float2 dj = kPreload ? dsum[j] : stat(sDP, j);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float dd = (e & 1) ? dj.y : dj.x;
        dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - dd);
      }
    }
    convert_p<kQRows>(s, pf);
    convert_p<kQRows>(dp, dsf);

    // dV += P^T dO (P^T from registers).
    fence_regs(dv);
    fence_regs(pf);
    fence_regs(dsf);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kQRows / 16; ++kk) wgmma_pv<kD>(dv, pf[kk], desc_qmn(tdO, kk));
    wgmma_commit();

    // dS^T to shared memory (buffer it % 2), rows = keys, 128 B = 64 queries per row (128-row
    // tiles: two such blocks of [128 keys][64 queries]), 128-byte swizzled as TMA would (16-byte
    // chunk c of row r at c ^ (r % 8)). dsf[kk][r] holds key row (warp*16 + lane/4 + 8*(r&1))
    // and queries 8*(2kk + (r>>1)) + 2*(lane%4) + {0, 1}.
    {
      const uint32_t buf = tdS;
#pragma unroll
      for (int kk = 0; kk < kQRows / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = w * 64 + warp * 16 + lane / 4 + 8 * (r & 1);
          const int chunk = (2 * (kk % 4) + (r >> 1)) ^ (row & 7);
          st_shared_u32(buf + (kk / 4) * (kBN * 128) + row * 128 + chunk * 16 + 4 * (lane % 4), dsf[kk][r]);
        }
    }
    fence_proxy_async();
    named_bar_sync(kBarDS, 256);

    // dQ_w = dS K[:, w half] (128-row tiles: dS[w rows] K), both operands from shared memory,
    // over all 128 keys; then
    // dK += dS^T Q (base: dS^T from registers; defer: from its shared-memory tile).
    fence_regs(dq);
    fence_regs(dk);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      if constexpr (kDQN == 64)
        wgmma_ss_m64n64k16_tt(dq, desc_ds(tdS, kk), desc_kmn(tK, kk), kk > 0 ? 1 : 0);
      else
        wgmma_ss_m64n32k16_tt(dq, desc_ds(tdS, kk), desc_kmn(tK, kk), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    if constexpr (kDefer) {
      // A = dS^T read back from shared memory (this consumer's 64 key rows; queries are the
      // contiguous K dimension here), so no registers stay pinned while dK runs into the next tile.
#pragma unroll
      for (int kk = 0; kk < kQRows / 16; ++kk) {
        const uint64_t da = make_desc(tdS + w * 64 * 128, 16, 1024) + ((kk * 32) >> 4);
        if constexpr (kD == 128)
          wgmma_ss_m64n128k16_tb(dk, da, desc_qmn(tQ, kk));
        else
          wgmma_ss_m64n64k16_tb(dk, da, desc_qmn(tQ, kk));
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kQRows / 16; ++kk) wgmma_pv<kD>(dk, dsf[kk], desc_qmn(tQ, kk));
    }
    wgmma_commit();

    wgmma_wait<1>();  // dV and dQ are done; dK may still run
    fence_regs(dv);
    fence_regs(pf);
    fence_regs(dq);
    if (is_signaller) mbar_arrive(bars.do_empty(st));
    handoff_dq(it);

    if constexpr (!kDefer) {
      wgmma_wait<0>();
      fence_regs(dk);
      fence_regs(dsf);
      if (is_signaller) mbar_arrive(bars.q_empty(st));
    }
  }
  if constexpr (kDefer) {
    wgmma_wait<0>();
    fence_regs(dk);
  }
  bwd_store_dkv<kD>(dk, dv, p, key_r0, kvh, b, lane);  // the epilogue
#endif  // SEQPAR_HOPPER_STUB
}

}  // namespace seqpar::hopper
