// bwd_lab.cuh: the lab's options of the Hopper backward kernel (issue 34, session q; README
// "Backward at D = 128: dQ one tile late, ..."): bwd_lab_kernel<kD, kOpt> is a copy of the
// library's base kernel (src/kernels/hopper/hopper_bwd.cuh: bwd_kernel<kD, false, 64>) with the
// kOpt options below, all measured correct and none faster than base at D = 128 on one H200, so
// they stay out of the library. launch_bwd_lab runs one through the library's host side
// (launch_bwd_with: the same preprocessing, zeroed dQ accumulator and conversion).
#pragma once

#include <cstdint>

#include "kernels/hopper/hopper_bwd_launch.cuh"
#include "kernels/hopper/hopper_bwd_steps.cuh"

namespace seqpar::hopper::bwd_lab {
using namespace seqpar::hopper;

// Named barriers beyond the library's (bwd::kBarDS 1, kBarDqEmpty 2-3, kBarDqFull 4-5).
// kLateDQ only (256 threads each: one consumer arrives, the other syncs):
constexpr int kBarDsFull = 6;    // + 2w + s: consumer w stored its dS^T half in buffer s
constexpr int kBarDsEmpty = 10;  // + 2w + s: consumer w's dQ has read buffer s
constexpr int kBarStagger = 14;  // once: consumer 0's first S^T is done, consumer 1 may start
// Options of bwd_lab_kernel (kOpt bits; the lab's variants "lateq" and "lateqs", D = 128 ideas
// of issue 34): kLateDQ, each consumer computes the dQ of query tile i during tile i + 1 (after
// that tile's dV and dK are issued), so the dS barrier between the consumers waits for data
// stored a tile earlier instead of pinning both to the same point of every tile; kStagger
// (with kLateDQ), consumer 1 starts once consumer 0's first S^T is done, so the two consumers'
// softmax passes fall under each other's GEMMs rather than together.
// kDqRed: each consumer adds its dQ part to the global fp32 accumulator straight from registers
// (red.global.add.v4.f32, 512 contiguous bytes per warp instruction, same accumulator layout)
// instead of through the 32 KB shared buffer, the drain warp's bulk reductions and their named
// barriers: 64 KB of shared-memory traffic less per tile (the dQ stores and the bulk engine's
// reads), where the SS wgmmas' operand reads already keep shared memory busy.
// kTrace (base only; the lab's "trace", a measuring aid): each consumer's first thread records
// the SM clock (32 bits) at 6 points of each of its first kTraceSteps query tiles, in shared
// memory, copied to BwdParams::trace at the end: 0 tile start, 1 S^T done, 2 at the dS barrier,
// 3 past it, 4 dV and dQ done, 5 dK done. (Written to global memory at each point, the
// addresses cost registers and ptxas spilled 12 bytes; this way 4 bytes, from stamps 2 and 3
// around the dS barrier, one local store and load per tile: a measuring aid, not a variant to time.)
constexpr int kLateDQ = 1, kStagger = 2, kDqRed = 4, kTrace = 8;
constexpr int kTraceSteps = 64, kTraceStamps = 8;  // stamps per step (6 used)

struct BwdLabParams : BwdParams {
  unsigned* trace;  // kOpt & kTrace: [CTA (x fastest)][consumer][kTraceSteps][kTraceStamps]
};

// The library's layout (64-row query tiles), with kTrace the stamps after the barriers.
template <int kD, bool kTrace>
struct LabSmem : BwdSmem<kD, bwd::kBM> {
  using B = BwdSmem<kD, bwd::kBM>;
  static constexpr int trace = (B::bar + 8 * B::kBars + 15) & ~15;  // 2 x kTraceSteps x kTraceStamps u32
  static constexpr int bytes = kTrace ? trace + 2 * kTraceSteps * kTraceStamps * 4 + 1024 : B::bytes;
};

// The library's bwd_kernel<kD, false, 64> (base) with the options above; kOpt = 0 is base.
template <int kD, int kOpt>
__global__ void __launch_bounds__(bwd::kThreads, 1)
    bwd_lab_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                   const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                   const BwdLabParams p) {
  static_assert(kD == 64 || kD == 128, "head dim 64 or 128");
  constexpr int kQRows = bwd::kBM;
  constexpr bool kLate = (kOpt & kLateDQ) != 0;

  static_assert(!(kOpt & kStagger) || kLate, "stagger needs late dQ");
  constexpr bool kRed = (kOpt & kDqRed) != 0;
  constexpr bool kTr = (kOpt & kTrace) != 0;
  static_assert(!kTr || !kLate, "trace: base only");
  using L = LabSmem<kD, (kOpt & kTrace) != 0>;
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

  // Blocks launch x fastest, so KV heads are the outer loop: the CTAs in flight at once are one
  // head's key tiles, which read the same Q, dO and dQ accumulator rows, from L2. Within a head,
  // heaviest key tiles first under the causal mask (the first ones); with tile lists the lists'
  // order, every head's outliers first (hopper_tiles.hpp, order_tiles; listed_unit). With x =
  // head instead, the CTAs in flight read 32 heads' Q and dO and added into 32 heads' dQ, and
  // the masked backward ran at HBM speed.
  const bool listed = p.tiles.begin != nullptr;
  int rank = blockIdx.x, kvh = blockIdx.y;
  if (listed) listed_unit(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, p.tiles.heavy, &rank, &kvh);
  const int n_block = listed ? __ldg(p.tiles.order + rank) : rank;
  const int b = blockIdx.z;
  const int G = p.heads / p.kv_heads;
  const int n0 = n_block * kBN;
  const int n_m_total = (p.seq_q + kQRows - 1) / kQRows;
  int m_lo = 0, e0 = 0;  // first query tile with a row that sees a key of this tile; list start
  if (listed) {
    e0 = __ldg(p.tiles.begin + n_block);
    m_lo = n_m_total - (__ldg(p.tiles.begin + n_block + 1) - e0);  // so that n_m = the list's length
  } else if (p.causal) {
    const int x = n0 - p.causal_offset;
    m_lo = x > 0 ? x / kQRows : 0;
  }
  const int n_m = n_m_total > m_lo ? n_m_total - m_lo : 0;
  const int n_iter = n_m * G;  // (query head of the group) x (query tile), head outer
  // The query tile of step it.
  auto q_tile = [&](int it) { return listed ? __ldg(p.tiles.entries + e0 + it % n_m) >> 2 : m_lo + it % n_m; };

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
    } else if (warp == 1 && n_iter > 0 && !kRed) {
      bwd_drain_dq<kD, L::kTileDQ / 2>(sDQ, p, n_iter, lane, [&](int it) {
        return (static_cast<int64_t>(b) * p.heads + kvh * G + it / n_m) * p.seq_q_pad + q_tile(it) * kQRows;
      });
    }
    return;
  }

  // ---------------- consumers ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
  const int w = wg - 1;  // keys w*64 .. w*64+63 of the tile; dQ columns w*kD/2 ..
  const int lane = tid % 32, warp = (tid % 128) / 32;
  const bool is_signaller = (tid % 128) == 0;
  auto stamp = [&](int it, int k) {
    if constexpr (kTr) {
      if (is_signaller && it < kTraceSteps) {
        uint32_t at;  // through an opaque move: computed once and kept across the loop, it spilled
        asm volatile("mov.b32 %0, %1;" : "=r"(at) : "r"(base + L::trace + w * (kTraceSteps * kTraceStamps * 4)));
        st_shared_u32(at + (it * kTraceStamps + k) * 4, static_cast<uint32_t>(clock()));
      }
    }
  };
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

  // dQ_w = dS K[:, w half] (128-row tiles: dS[w rows] K), both operands from shared memory (dS^T
  // buffer buf), over all 128 keys.
  auto issue_dq = [&](uint32_t buf) {
    const uint32_t tK = opaque(sK);
    fence_regs(dq);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      if constexpr (kDQN == 64)
        wgmma_ss_m64n64k16_tt(dq, desc_ds(buf, kk), desc_kmn(tK, kk), kk > 0 ? 1 : 0);
      else
        wgmma_ss_m64n32k16_tt(dq, desc_ds(buf, kk), desc_kmn(tK, kk), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
  // dQ part to shared memory in the accumulator's fragment order of a 64-row tile: column half
  // c (kD/2 columns; 64-row tiles: this consumer's, c = w), then warp, then jj (8 columns),
  // then lane: float4 (dq[4jj .. 4jj+3]) of lane l, warp wp at c * 64*kD*2 B + ((wp * kD/16 +
  // jj % (kD/16)) * 32 + l) * 16 B, each warp store 512 contiguous bytes. With 128-row tiles a
  // consumer's part is a whole 64-row tile (c = jj / (kD/16)), so both tile sizes leave one
  // accumulator layout for the conversion kernels. The drain warp adds it to the accumulator.
  auto handoff_dq = [&](int t) {  // t: the step (query head, query tile) whose dQ part this is
    constexpr int kJJ = kD / 16;  // float4 column groups per column half
    if constexpr (kRed) {
      const int64_t rows =
          (static_cast<int64_t>(b) * p.heads + kvh * G + t / n_m) * p.seq_q_pad + q_tile(t) * kQRows;
      // One base address, the jj offsets as immediates; the thread index read again here (kept
      // in a register across the loop, it was spilled).
      uint32_t t128;
      asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t128));
      t128 %= 128;
      float* g = p.dq_acc + rows * kD + w * (kQRows * kD / 2) + ((t128 / 32) * kJJ * 32 + t128 % 32) * 4;
#pragma unroll
      for (int jj = 0; jj < kDQN / 8; ++jj)
        red_add_v4_f32(g + (jj / kJJ) * (kBM * kD / 2) + (jj % kJJ) * 128, dq[4 * jj], dq[4 * jj + 1], dq[4 * jj + 2],
                       dq[4 * jj + 3]);
      return;
    }
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
    if constexpr ((kOpt & kStagger) != 0) {
      if (it == 0 && w == 1) named_bar_sync(kBarStagger, 256);
    }
    stamp(it, 0);
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

    wgmma_wait<1>();  // S^T done
    fence_regs(s);
    // stamp(it, 1);
    if constexpr ((kOpt & kStagger) != 0) {
      if (it == 0 && w == 0) named_bar_arrive(kBarStagger, 256);
    }
    // P^T = exp2(S^T * scale * log2(e) - LSE2). Accumulator layout: s[4j + e] is key
    // key_r0 + 8 * (e >> 1), query q0 + 8j + 2 * (lane % 4) + (e & 1).
    const int flags = listed ? __ldg(p.tiles.entries + e0 + it % n_m) & 3 : 0;
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
    if constexpr (kLate) {  // the other consumer's dQ of tile it - 2 has read this buffer
      if (it >= 2) named_bar_sync(kBarDsEmpty + 2 * (1 - w) + st, 256);
    }
    {
      const uint32_t buf = tdS;
#pragma unroll
      for (int kk = 0; kk < kQRows / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = w * 64 + warp * 16 + lane / 4 + 8 * (r & 1);
          // (late dQ: the row's swizzle through an opaque move, else ptxas hoisted the 16
          // swizzled offsets out of the loop and spilled 16 bytes)
          const int row7 = kLate ? static_cast<int>(opaque(static_cast<uint32_t>(row & 7))) : (row & 7);
          const int chunk = (2 * (kk % 4) + (r >> 1)) ^ row7;
          st_shared_u32(buf + (kk / 4) * (kBN * 128) + row * 128 + chunk * 16 + 4 * (lane % 4), dsf[kk][r]);
        }
    }
    fence_proxy_async();
    if constexpr (kLate) {
      named_bar_arrive(kBarDsFull + 2 * w + st, 256);
      // dK += dS^T Q (dS^T from registers), then dQ of the previous tile from its dS^T buffer,
      // whose other half was stored a tile ago.
      fence_regs(dk);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kQRows / 16; ++kk) wgmma_pv<kD>(dk, dsf[kk], desc_qmn(tQ, kk));
      wgmma_commit();
      // At it = 0 there is no previous tile: the dQ GEMM still runs (on whatever the other
      // buffer holds) and its result is dropped, so that every iteration issues and waits for
      // the same wgmma groups (with the GEMM in a branch, ptxas serialized the wgmmas, C7512).
      if (it > 0) named_bar_sync(kBarDsFull + 2 * (1 - w) + (st ^ 1), 256);
      issue_dq(opaque(sdS + (st ^ 1) * L::kTileDS));
      wgmma_wait<1>();  // dV and dK done; dQ may still run
      fence_regs(dv);
      fence_regs(dk);
      fence_regs(pf);
      fence_regs(dsf);
      if (is_signaller) {
        mbar_arrive(bars.do_empty(st));
        mbar_arrive(bars.q_empty(st));
      }
      wgmma_wait<0>();
      fence_regs(dq);
      if (it > 0) {
        // Tile it - 1's buffer is written again at tile it + 1.
        if (it + 1 < n_iter) named_bar_arrive(kBarDsEmpty + 2 * w + (st ^ 1), 256);
        handoff_dq(it - 1);
      }
      continue;
    }
    stamp(it, 2);
    named_bar_sync(kBarDS, 256);
    stamp(it, 3);

    // dQ_w = dS K[:, w half] (128-row tiles: dS[w rows] K), both operands from shared memory,
    // over all 128 keys; then
    // dK += dS^T Q (dS^T from registers).
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
#pragma unroll
    for (int kk = 0; kk < kQRows / 16; ++kk) wgmma_pv<kD>(dk, dsf[kk], desc_qmn(tQ, kk));
    wgmma_commit();

    wgmma_wait<1>();  // dV and dQ are done; dK may still run
    fence_regs(dv);
    fence_regs(pf);
    fence_regs(dq);
    stamp(it, 4);
    if (is_signaller) mbar_arrive(bars.do_empty(st));
    handoff_dq(it);

    wgmma_wait<0>();
    fence_regs(dk);
    fence_regs(dsf);
    stamp(it, 5);
    if (is_signaller) mbar_arrive(bars.q_empty(st));
  }
  if constexpr (kLate) {  // the last tile's dQ
    if (n_iter > 0) {
      named_bar_sync(kBarDsFull + 2 * (1 - w) + ((n_iter - 1) & 1), 256);
      issue_dq(opaque(sdS + ((n_iter - 1) & 1) * L::kTileDS));
      wgmma_wait<0>();
      fence_regs(dq);
      handoff_dq(n_iter - 1);
    }
  }
  if constexpr (kTr) {  // the stamps to global memory; steps not run stay as the caller left them
    if (is_signaller) {
      const int64_t cta = blockIdx.x + static_cast<int64_t>(gridDim.x) * (blockIdx.y + gridDim.y * blockIdx.z);
      const int n = n_iter < kTraceSteps ? n_iter : kTraceSteps;
      for (int i = 0; i < n * kTraceStamps; ++i)
        p.trace[(cta * 2 + w) * kTraceSteps * kTraceStamps + i] =
            ld_shared_u32(base + L::trace + (w * kTraceSteps * kTraceStamps + i) * 4);
    }
  }

  bwd_store_dkv<kD>(dk, dv, p, key_r0, kvh, b, lane);  // the epilogue
}


// The whole backward with bwd_lab_kernel<kD, kOpt> (the library's prologue and conversion;
// the dQ accumulator zeroed, which kDqRed needs). trace: for kOpt & kTrace.
template <int kD, int kOpt>
cudaError_t launch_bwd_lab(const BwdArgs& a, cudaStream_t stream, unsigned* trace = nullptr) {
  BwdLabParams p{};
  p.trace = trace;
  return launch_bwd_with<kD, kPrologueBest, bwd::kBM>(a, stream, bwd_lab_kernel<kD, kOpt>,
                                                      LabSmem<kD, (kOpt & kTrace) != 0>::bytes, p);
}

}  // namespace seqpar::hopper::bwd_lab
