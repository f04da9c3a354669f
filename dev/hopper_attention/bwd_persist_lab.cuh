// bwd_persist_lab.cuh: the D = 128 backward's q80 kernel (hopper_bwd_q80.cuh) as a PERSISTENT
// kernel (lab variants "q80p" and "q80p3", variants.cuh; README section "Persistent backward for
// tile lists"): one CTA per SM walks the units of bwd_q80_kernel's grid (key tile, K/V head,
// batch) in its launch order (listed_unit's with tile lists), CTA i unit i first, then the next
// unit of a global counter, as the forward's persistent kernel does (hopper_fwd_persist.cuh).
// What it saves per unit: the CTA launch and barrier set-up, and the wait for K and V: the
// loader fetches the next unit's K/V (and its first Q/dO stages) as soon as both consumers have
// issued their last GEMM that reads K/V, so the loads run under the consumers' last dK GEMM and
// their dK/dV stores. The math per tile is bwd_q80_kernel's, unchanged.
//
// Roles in the producer warpgroup (24 registers each): warp 2 schedules (the unit counter, the
// unit's tile written into one of two shared-memory slots), warp 0 loads, warp 1 drains dQ. Each
// slot has a full barrier (the scheduler) and an empty one (8 consumer warps, the drain warp and
// the loader, once they are done with the unit); a K/V empty barrier (both consumer warpgroups)
// lets the loader refill K/V. The Q/dO stage counter runs on across units (the slot holds the
// unit's first step). The drain arrives on its "empty" named barriers after every step and the
// consumers sync once more after their last unit, so the named barriers balance without anyone
// knowing which step is the CTA's last.
// ptxas (nvcc 13.0): 0 spills, no C7512, only after the scheduling left the loader's thread and
// listed_unit's 64-bit divisions became 32-bit ones (unit_of): any spill in the producer
// warpgroup made ptxas serialize the consumers' wgmmas.
#pragma once

#include <cstdint>

#include "kernels/hopper/hopper_bwd_launch.cuh"
#include "kernels/hopper/hopper_fwd_persist.cuh"  // persist_counter

namespace bwd_persist_lab {
using namespace seqpar::hopper;

// BwdQ80Smem (226 KB) + kv_empty, slot_full[2], slot_empty[2] and two 32-byte unit slots.
struct PSmem {
  using L = BwdQ80Smem;
  static constexpr int pbar = L::bar + 8 * L::kBars;
  static constexpr int slots = pbar + 8 * 5;
  static constexpr int bytes = slots + 2 * 32 + 1024;
  static_assert(L::bar % 8 == 0 && bytes <= 227 * 1024, "shared memory");
};
// A unit's slot: the key tile's first key, K/V head, batch, first list entry, first query tile,
// query tiles per head, steps (-1: no more units), its first step on the Q/dO ring. The
// consumers copy it into registers at the unit's start (as bwd_q80_kernel holds its BwdUnit);
// the loader and the drain read fields where they use them.
enum : int { kUN0 = 0, kUKvh = 4, kUB = 8, kUE0 = 12, kUMlo = 16, kUNm = 20, kUIter = 24, kUG0 = 28 };
// The producer warpgroup keeps bwd_q80_kernel's 24 registers: the launch gives 168 per thread, and
// what the producers free (128 x (168 - 24)) is exactly what the consumers take (256 x (240 - 168)),
// so more for the producers would leave setmaxnreg.inc waiting forever.

// Unit u of the grid (n_tiles key tiles, K/V heads, batch) in launch order (x fastest): what
// BwdUnit<kQ>::of gives block (x, y, z).
template <int kQRows>
__device__ __forceinline__ BwdUnit<kQRows> unit_of(const BwdParams& p, bool listed, int u, int n_tiles) {
  BwdUnit<kQRows> w{};
  const int per_b = n_tiles * p.kv_heads;
  w.b = u / per_b;
  const int lin = u - w.b * per_b;  // x + n_tiles * y of the one-CTA-per-unit grid
  int rank = lin % n_tiles;
  w.kvh = lin / n_tiles;
  if (listed) {  // listed_unit (hopper_args.hpp) in 32 bits: its 64-bit divisions spilled here
    const int front = p.tiles.heavy * p.kv_heads;
    if (lin < front) {
      rank = lin / p.kv_heads, w.kvh = lin % p.kv_heads;
    } else {
      const int r = lin - front, rest = n_tiles - p.tiles.heavy;
      w.kvh = r / rest, rank = p.tiles.heavy + r % rest;
    }
  }
  w.n_block = listed ? __ldg(p.tiles.order + rank) : rank;
  w.G = p.heads / p.kv_heads;
  w.n0 = w.n_block * bwd::kBN;
  const int n_m_total = (p.seq_q + kQRows - 1) / kQRows;
  if (listed) {
    w.e0 = __ldg(p.tiles.begin + w.n_block);
    w.m_lo = n_m_total - (__ldg(p.tiles.begin + w.n_block + 1) - w.e0);
  } else if (p.causal) {
    const int xq = w.n0 - p.causal_offset;
    w.m_lo = xq > 0 ? xq / kQRows : 0;
  }
  w.n_m = n_m_total > w.m_lo ? n_m_total - w.m_lo : 0;
  w.n_iter = w.n_m * w.G;
  w.listed = listed;
  return w;
}

// A slot field (no "memory" clobber: the slot does not change while a unit runs, and a clobber on
// every read would pin every shared-memory access around it).
__device__ __forceinline__ int lds(uint32_t addr) {
  int v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}

template <bool kListed>
__global__ void __launch_bounds__(bwd::kThreads, 1)
    bwd_q80p_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                    const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                    const BwdParams p, int* next_unit) {
#ifdef SEQPAR_HOPPER_STUB
  __trap();
#else
  using L = BwdQ80Smem;
  using namespace bwd;
  constexpr int kD = 128, kQ = kQ80;
  constexpr int kMaskRows = 16;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = base + L::k, sV = base + L::v, sQ = base + L::q, sdO = base + L::dO, sdS = base + L::ds;
  const uint32_t sDQ = base + L::dq, sLSE = base + L::lse, sDP = base + L::dpsum, sBar = base + L::bar;
  const BwdBars bars{sBar};
  // kv_empty, slot_full[2], slot_empty[2], then the two slots (PSmem).
  const uint32_t kv_empty = base + PSmem::pbar, slot_full0 = kv_empty + 8, slot_empty0 = kv_empty + 24;
  const uint32_t slot0 = base + PSmem::slots;

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  if (tid == 0) {
    mbar_init(kv_empty, 2);
    for (int s = 0; s < 2; ++s) {
      mbar_init(slot_full0 + 8 * s, 1);
      mbar_init(slot_empty0 + 8 * s, 10);  // 8 consumer warps, the drain warp, the loader
    }
    bars.init();  // its fences cover the barriers above
  }
  __syncthreads();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    const int warp = tid / 32, lane = tid % 32;
    if (warp == 2 && lane == 0) {
      // ---------------- scheduler: the CTA's units into the slots ----------------
      const int n_tiles = (p.seq_k + kBN - 1) / kBN;
      const int units = n_tiles * p.kv_heads * p.batch;
      int u = blockIdx.x;
      for (int j = 0;; ++j) {
        const int s = j & 1;
        const uint32_t sl = slot0 + 32 * s;
        mbar_wait(slot_empty0 + 8 * s, ((j >> 1) & 1) ^ 1);  // the readers of unit j - 2 are done
        if (u >= units) {
          st_shared_u32(sl + kUIter, static_cast<uint32_t>(-1));
          mbar_arrive(slot_full0 + 8 * s);
          break;
        }
        {
          // The unit's first step on the Q/dO ring: the previous unit's (in the other slot) plus its steps.
          const uint32_t prev = slot0 + 32 * (s ^ 1);
          const int g0 = j == 0 ? 0 : lds(prev + kUG0) + lds(prev + kUIter);
          const BwdUnit<kQ> w = unit_of<kQ>(p, kListed, u, n_tiles);
          st_shared_u32(sl + kUN0, static_cast<uint32_t>(w.n0));
          st_shared_u32(sl + kUKvh, static_cast<uint32_t>(w.kvh));
          st_shared_u32(sl + kUB, static_cast<uint32_t>(w.b));
          st_shared_u32(sl + kUE0, static_cast<uint32_t>(w.e0));
          st_shared_u32(sl + kUMlo, static_cast<uint32_t>(w.m_lo));
          st_shared_u32(sl + kUNm, static_cast<uint32_t>(w.n_m));
          st_shared_u32(sl + kUIter, static_cast<uint32_t>(w.n_iter));
          st_shared_u32(sl + kUG0, static_cast<uint32_t>(g0));
        }
        mbar_arrive(slot_full0 + 8 * s);
        u = next_unit ? int(gridDim.x) + atomicAdd(next_unit, 1) : u + int(gridDim.x);
      }
    } else if (warp == 0 && lane == 0) {
      // ---------------- loader: per unit K/V, then Q, dO, LSE2, D per step ----------------
      // (The scheduling is warp 2's: in this thread's 24 registers with the loads it spilled, and
      // those spills serialized the consumers' wgmmas, ptxas C7512.)
      for (int j = 0;; ++j) {
        const int s = j & 1;
        const uint32_t sl = slot0 + 32 * s;
        mbar_wait(slot_full0 + 8 * s, (j >> 1) & 1);
        if (lds(sl + kUIter) < 0) break;
        if (j > 0) mbar_wait(kv_empty, (j - 1) & 1);  // both consumers are done with the last K/V
        mbar_expect_tx(bars.kv_full(), 2 * L::kTileK);
#pragma unroll
        for (int cb = 0; cb < 2; ++cb)
          tma_load_4d(sK + cb * kBN * 128, &tm_k, bars.kv_full(), cb * 64, lds(sl + kUKvh), lds(sl + kUN0),
                      lds(sl + kUB));
#pragma unroll
        for (int cb = 0; cb < 2; ++cb)
          tma_load_4d(sV + cb * kBN * 128, &tm_v, bars.kv_full(), cb * 64, lds(sl + kUKvh), lds(sl + kUN0),
                      lds(sl + kUB));
        for (int it = 0; it < lds(sl + kUIter); ++it) {
          const int n_m = lds(sl + kUNm), i_m = it % n_m;
          const int m = kListed ? __ldg(p.tiles.entries + lds(sl + kUE0) + i_m) >> 2 : lds(sl + kUMlo) + i_m;
          const int h = lds(sl + kUKvh) * (p.heads / p.kv_heads) + it / n_m, b = lds(sl + kUB);
          const int gi = lds(sl + kUG0) + it, st = gi & 1;
          const uint32_t ph = (gi >> 1) & 1;
          const int64_t row_stat = (static_cast<int64_t>(b) * p.heads + h) * p.seq_q_pad + m * kQ;
          mbar_wait(bars.q_empty(st), ph ^ 1);
          mbar_expect_tx(bars.q_full(st), L::kTileQ + L::kStat);
#pragma unroll
          for (int cb = 0; cb < 2; ++cb)
            tma_load_4d(sQ + st * L::kTileQ + cb * kQ * 128, &tm_q, bars.q_full(st), cb * 64, h, m * kQ, b);
          bulk_load(sLSE + st * L::kStat, p.lse2 + row_stat, L::kStat, bars.q_full(st));
          mbar_wait(bars.do_empty(st), ph ^ 1);
          mbar_expect_tx(bars.do_full(st), L::kTileQ + L::kStat);
#pragma unroll
          for (int cb = 0; cb < 2; ++cb)
            tma_load_4d(sdO + st * L::kTileQ + cb * kQ * 128, &tm_do, bars.do_full(st), cb * 64, h, m * kQ, b);
          bulk_load(sDP + st * L::kStat, p.dpsum + row_stat, L::kStat, bars.do_full(st));
        }
        mbar_arrive(slot_empty0 + 8 * s);
      }
    } else if (warp == 1) {
      // ---------------- the dQ drain (bwd_drain_dq, over every unit's steps) ----------------
      named_bar_arrive(kBarDqEmpty + 0, 160);
      named_bar_arrive(kBarDqEmpty + 1, 160);
      for (int j = 0;; ++j) {
        const int s = j & 1;
        const uint32_t sl = slot0 + 32 * s;
        mbar_wait(slot_full0 + 8 * s, (j >> 1) & 1);
        const int n_iter = lds(sl + kUIter);
        if (n_iter < 0) break;
        for (int it = 0; it < n_iter; ++it) {
          const int n_m = lds(sl + kUNm), i_m = it % n_m;
          const int m = kListed ? __ldg(p.tiles.entries + lds(sl + kUE0) + i_m) >> 2 : lds(sl + kUMlo) + i_m;
          const int64_t row = (static_cast<int64_t>(lds(sl + kUB)) * p.heads +
                               lds(sl + kUKvh) * (p.heads / p.kv_heads) + it / n_m) * p.seq_q_pad + m * kQ;
          float* gtile = p.dq_acc + row * kD;
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            named_bar_sync(kBarDqFull + c, 160);
            if (lane == 0) {
              bulk_reduce_add_f32(gtile + c * (L::kHalfDQ / 4), sDQ + c * L::kHalfDQ, L::kHalfDQ);
              bulk_commit();
            }
          }
          if (lane == 0) bulk_wait_read<1>();
          __syncwarp();
          named_bar_arrive(kBarDqEmpty + 0, 160);  // every step: the consumers sync once more at the end
          if (lane == 0) bulk_wait_read<0>();
          __syncwarp();
          named_bar_arrive(kBarDqEmpty + 1, 160);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(slot_empty0 + 8 * s);
      }
      if (lane == 0) bulk_wait<0>();
    }
    return;
  }

  // ---------------- consumers (bwd_q80_kernel's, per unit) ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
  const int w = wg - 1;
  const int lane = tid % 32, warp = (tid % 128) / 32;
  const bool is_signaller = (tid % 128) == 0;
  int g = 0;  // steps on the Q/dO ring so far
  for (int j = 0;; ++j) {
    const uint32_t sl = slot0 + 32 * (j & 1);
    mbar_wait(slot_full0 + 8 * (j & 1), (j >> 1) & 1);
    if (ld_shared_s32(sl + kUIter) < 0) break;
    // The unit as bwd_q80_kernel holds it (this form compiles without C7512; reading the fields
    // where they are used serialized the wgmmas).
    BwdUnit<kQ> u{};
    u.listed = kListed;
    u.n0 = ld_shared_s32(sl + kUN0);
    u.kvh = ld_shared_s32(sl + kUKvh);
    u.b = ld_shared_s32(sl + kUB);
    u.e0 = ld_shared_s32(sl + kUE0);
    u.m_lo = ld_shared_s32(sl + kUMlo);
    u.n_m = ld_shared_s32(sl + kUNm);
    u.n_iter = ld_shared_s32(sl + kUIter);
    const int key_r0 = u.n0 + w * 64 + warp * 16 + lane / 4;

    float dv[kD / 2], dk[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) dv[i] = dk[i] = 0.f;
    float s[kQ / 2], dp[kQ / 2], dq[kQ / 2];
    uint32_t pf[kQ / 16][4], dsf[kQ / 16][4];

    auto desc_kw = [&](uint32_t tile, int kk) {
      return make_desc(tile + w * 64 * 128, 16, 1024) + (((kk / 4) * kBN * 128 + (kk % 4) * 32) >> 4);
    };
    auto desc_qk = [&](uint32_t tile, int kk) {
      return make_desc(tile, 16, 1024) + (((kk / 4) * kQ * 128 + (kk % 4) * 32) >> 4);
    };
    auto desc_qmn = [&](uint32_t tile, int kk) { return make_desc(tile, kQ * 128, 1024) + ((kk * 16 * 128) >> 4); };
    auto desc_kt = [&](uint32_t tk, int kk) {
      return make_desc(tk + w * kBN * 128, kBN * 128, 1024) + ((kk * 16 * 128) >> 4);
    };
    auto opaque = [](uint32_t x) {
      uint32_t r;
      asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(x));
      return r;
    };

    mbar_wait(bars.kv_full(), j & 1);
    if (u.n_iter == 0 && is_signaller) mbar_arrive(kv_empty);

    for (int it = 0; it < u.n_iter; ++it) {
      const int m = u.q_tile(p, it);
      const int q0 = m * kQ;
      const int st = (g + it) & 1;
      const uint32_t ph = ((g + it) >> 1) & 1;
      const uint32_t tQ = opaque(sQ + st * L::kTileQ), tdO = opaque(sdO + st * L::kTileQ);
      const uint32_t tK = opaque(sK), tV = opaque(sV), tdS = opaque(sdS + st * L::kTileDS);

      mbar_wait(bars.q_full(st), ph);
      fence_regs(s);
      fence_regs(dp);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) wgmma_ss_m64n80k16(s, desc_kw(tK, kk), desc_qk(tQ, kk), kk > 0 ? 1 : 0);
      wgmma_commit();
      mbar_wait(bars.do_full(st), ph);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) wgmma_ss_m64n80k16(dp, desc_kw(tV, kk), desc_qk(tdO, kk), kk > 0 ? 1 : 0);
      wgmma_commit();

      auto stat = [&](uint32_t at, int jx) {
        return ld_shared_f2(at + st * L::kStat + (8 * jx + 2 * (lane % 4)) * 4);
      };

      wgmma_wait<1>();
      fence_regs(s);
      const int flags = kListed ? u.entry(p, it) & 3 : 0;
      const bool need_mask =
          kListed ? flags != 0 : u.n0 + kBN > p.seq_k || (p.causal && u.n0 + kBN - 1 > q0 + p.causal_offset);
#pragma unroll
      for (int jx = 0; jx < kQ / 8; ++jx) {
        const float2 lj = stat(sLSE, jx);
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[4 * jx + e] = fast_exp2(fmaf(s[4 * jx + e], p.scale_log2, -((e & 1) ? lj.y : lj.x)));
      }
      if (need_mask && kListed) {
#pragma unroll
        for (int h = 0; h < kQ / kMaskRows; ++h)
          apply_tile_mask_t<kMaskRows, true>(*reinterpret_cast<float(*)[kMaskRows / 2]>(s + (kMaskRows / 2) * h),
                                             p.tiles, q0 + kMaskRows * h, key_r0, p.seq_k, lane, flags);
      } else if (need_mask) {
#pragma unroll
        for (int jx = 0; jx < kQ / 8; ++jx)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key_r0 + 8 * (e >> 1);
            const int q = q0 + 8 * jx + 2 * (lane % 4) + (e & 1);
            if (key >= p.seq_k || (p.causal && key > q + p.causal_offset)) s[4 * jx + e] = 0.f;
          }
      }

      wgmma_wait<0>();
      fence_regs(dp);
#pragma unroll
      for (int jx = 0; jx < kQ / 8; ++jx) {
        const float2 dj = stat(sDP, jx);
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[4 * jx + e] = s[4 * jx + e] * (dp[4 * jx + e] - ((e & 1) ? dj.y : dj.x));
      }
      convert_p<kQ>(s, pf);
      convert_p<kQ>(dp, dsf);

      fence_regs(dv);
      fence_regs(pf);
      fence_regs(dsf);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kQ / 16; ++kk) wgmma_pv<kD>(dv, pf[kk], desc_qmn(tdO, kk));
      wgmma_commit();

      {
        const int r = lane / 8, jr = lane % 8;
        const uint32_t row_addr =
            tdS + w * (kQ * 128) + (8 * (r >> 1) + jr) * 128 + (((2 * warp + (r & 1)) ^ jr) * 16);
#pragma unroll
        for (int kk = 0; kk < kQ / 16; ++kk) stmatrix_x4_trans(row_addr + kk * 16 * 128, dsf[kk]);
      }
      fence_proxy_async();
      named_bar_sync(kBarDS, 256);

      fence_regs(dq);
      fence_regs(dk);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk)
        wgmma_ss_m64n80k16_ta(dq, desc_kt(tK, kk), desc_qk(tdS, kk), kk > 0 ? 1 : 0);
      wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < kQ / 16; ++kk) wgmma_pv<kD>(dk, dsf[kk], desc_qmn(tQ, kk));
      wgmma_commit();

      wgmma_wait<1>();  // dV and dQ^T are done; dK may still run
      fence_regs(dv);
      fence_regs(pf);
      fence_regs(dq);
      if (is_signaller) {
        mbar_arrive(bars.do_empty(st));
        if (it == u.n_iter - 1) mbar_arrive(kv_empty);  // this unit's last read of K and V is done
      }
      named_bar_sync(kBarDqEmpty + w, 160);
      const uint32_t buf = sDQ + w * L::kHalfDQ;
#pragma unroll
      for (int jj = 0; jj < kQ / 8; ++jj)
        st_shared_v4(buf + ((warp * (kQ / 8) + jj) * 32 + lane) * 16, dq[4 * jj], dq[4 * jj + 1], dq[4 * jj + 2],
                     dq[4 * jj + 3]);
      fence_proxy_async();
      named_bar_arrive(kBarDqFull + w, 160);

      wgmma_wait<0>();
      fence_regs(dk);
      fence_regs(dsf);
      if (is_signaller) mbar_arrive(bars.q_empty(st));
    }

    bwd_store_dkv<kD>(dk, dv, p, key_r0, u.kvh, u.b, lane);  // the unit's epilogue
    g += u.n_iter;
    __syncwarp();
    if (lane == 0) mbar_arrive(slot_empty0 + 8 * (j & 1));  // this warp is done with the slot
  }
  named_bar_sync(kBarDqEmpty + w, 160);  // the drain's arrival after its last step
#endif
}

// The whole backward with the persistent main kernel: launch_bwd_with's memset, preprocessing and
// 80-row dQ conversion around it. Grid: one CTA per SM (max_grid > 0 caps it: the lab's checks
// run 3 CTAs, so that each walks many units of the small check problems).
inline cudaError_t launch_bwd_q80p(const BwdArgs& a, cudaStream_t stream, int max_grid = 0) {
  if (a.head_dim != 128) return cudaErrorInvalidValue;
  constexpr int kD = 128, kQRows = bwd::kQ80;
  const int pad = bwd_seq_pad(a.seq_q, kQRows), n_mtiles = pad / kQRows;
  float* dq_acc = static_cast<float*>(a.workspace);
  float* lse2 = dq_acc + static_cast<size_t>(a.batch) * a.heads * pad * kD;
  float* dpsum = lse2 + static_cast<size_t>(a.batch) * a.heads * pad;
  CUtensorMap tq, tk, tv, tdo;
  if (make_tmap(&tq, a.q, a.batch, a.seq_q, a.heads, kD, kQRows, a.q_st) != CUDA_SUCCESS ||
      make_tmap(&tk, a.k, a.batch, a.seq_k, a.kv_heads, kD, bwd::kBN, a.k_st) != CUDA_SUCCESS ||
      make_tmap(&tv, a.v, a.batch, a.seq_k, a.kv_heads, kD, bwd::kBN, a.v_st) != CUDA_SUCCESS ||
      make_tmap(&tdo, a.dout, a.batch, a.seq_q, a.heads, kD, kQRows, a.dout_st) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  cudaError_t e = cudaSuccess;
  if ((e = cudaMemsetAsync(dq_acc, 0, static_cast<size_t>(a.batch) * a.heads * pad * kD * 4, stream)) != cudaSuccess)
    return e;
  const int64_t threads = static_cast<int64_t>(pad) * a.heads * (kD / 8);
  bwd_preprocess_kernel<kD><<<dim3(static_cast<unsigned>((threads + 255) / 256), a.batch), 256, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(a.o), static_cast<const __nv_bfloat16*>(a.dout), a.lse, a.delta, lse2, dpsum,
      a.heads, a.seq_q, pad, stat_strides(a.lse_st, a.heads, a.seq_q), stat_strides(a.delta_st, a.heads, a.seq_q));
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  BwdParams p{};
  p.dq_acc = dq_acc;
  p.lse2 = lse2;
  p.dpsum = dpsum;
  p.dk = a.dk;
  p.dv = a.dv;
  p.out_f32 = a.dkv_f32;
  const RowStrides kst = row_strides(a.dk_st, a.seq_k, a.kv_heads, kD), vst = row_strides(a.dv_st, a.seq_k, a.kv_heads, kD);
  p.dk_sb = kst.b, p.dk_ss = kst.s, p.dk_sh = kst.h, p.dv_sb = vst.b, p.dv_ss = vst.s, p.dv_sh = vst.h;
  p.batch = a.batch;
  p.heads = a.heads;
  p.kv_heads = a.kv_heads;
  p.seq_q = a.seq_q;
  p.seq_k = a.seq_k;
  p.seq_q_pad = pad;
  p.causal = a.causal;
  p.causal_offset = a.causal_offset;
  p.accumulate = a.accumulate && !a.dkv_fresh;
  p.scale = a.scale != 0.f ? a.scale : 1.f / sqrtf(float(kD));
  p.scale_log2 = p.scale * 1.4426950408889634f;
  p.tiles = a.tiles;
  auto kernel = a.tiles.begin != nullptr ? bwd_q80p_kernel<true> : bwd_q80p_kernel<false>;
  constexpr int smem = PSmem::bytes;
  if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) != cudaSuccess) return e;
  int device = 0, sms = 0;
  if ((e = cudaGetDevice(&device)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess)
    return e;
  const int64_t units = int64_t((a.seq_k + bwd::kBN - 1) / bwd::kBN) * a.kv_heads * a.batch;
  if (units > 0) {
    int grid = int(std::min<int64_t>(units, sms));
    if (max_grid > 0) grid = std::min(grid, max_grid);
    int* counter = nullptr;
    if (grid < units) {
      if ((e = persist_counter(stream, &counter)) != cudaSuccess ||
          (e = cudaMemsetAsync(counter, 0, sizeof(int), stream)) != cudaSuccess)
        return e;
    }
    kernel<<<grid, bwd::kThreads, smem, stream>>>(tq, tk, tv, tdo, p, counter);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  const RowStrides dq_st = row_strides(a.dq_st, a.seq_q, a.heads, kD);
  const int64_t vec = a.dq_f32 ? 4 : 8;
  const bool aligned16 = reinterpret_cast<uintptr_t>(a.dq) % 16 == 0 && dq_st.b % vec == 0 && dq_st.s % vec == 0 &&
                         dq_st.h % vec == 0;
  const int accumulate_dq = a.accumulate && !a.dq_fresh;
  const int64_t octets = static_cast<int64_t>(a.batch) * a.heads * n_mtiles * (bwd::kQ80 / 8);
  bwd_convert_dq_q80_kernel<<<static_cast<unsigned>((octets + 7) / 8), 256, 0, stream>>>(
      dq_acc, a.dq, dq_st, a.dq_f32, aligned16, a.heads, a.seq_q, n_mtiles, octets, p.scale, accumulate_dq);
  return cudaGetLastError();
}

}  // namespace bwd_persist_lab
