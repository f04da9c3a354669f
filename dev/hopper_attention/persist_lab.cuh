// persist_lab.cuh: the lab's experimental persistent forward (README "Fused tile boundary"): the
// library's fwd_persist_kernel (src/kernels/hopper/hopper_fwd_persist.cuh) with options, as
// fwd_persist_x_kernel / launch_fwd_persist_x<kD, kBN, kC, kTmaO, kOpt>. Measured slower than the
// library's kernel (results/fused_run*_h200.log), so it stays here. Options (kOpt bits):
// - kFuseTiles, kPrefetchQ: below;
// - kWaitFirst: in the main loop, wait for the previous P V (wgmma.wait_group 0) before the
//   softmax, pinned (the order ptxas picked for the library's kernel on its own: SASS of nvcc 13.0);
// - kOverlapSoftmax: the softmax pinned before that wait (FA3's intra-warpgroup overlap as written
//   in the source: the scores' exponentials run while the previous P V is in flight). Neither
//   pin holds in the SASS: ptxas places the wait before the softmax in both (nvdisasm 13.5 of
//   nvcc 13.0 output), so these two are the control, not an A/B;
// - kUniformHints: the consumer index, the K/V stage counter and the tile's key-block count go
//   through warp broadcasts (__shfl_sync from lane 0), so that ptxas keeps the wgmma descriptors
//   in uniform registers (the library's kUniform). Without them the fused kernel's main loop
//   computed every descriptor per thread (0 uniform instructions and 56 R2UR in its GEMM issue
//   at D = 128, against 116 and 16 in the library's kernel).
#pragma once

#include "kernels/hopper/hopper_fwd_persist.cuh"

namespace seqpar::hopper::persist_lab {

// Options of the persistent kernel (its kOpt template parameter, bits; README "Fused tile boundary"):
// - kFuseTiles: at a tile boundary each consumer issues the next tile's first S = Q K^T in the
//   same ping-pong turn as this tile's last P V, then runs the next tile's first softmax and
//   this tile's epilogue while the other consumers' GEMMs run (one turn per boundary instead
//   of two, and no consumer waits for another's last P V). Its O leaves from registers, or
//   through its own shared buffer (D = 64): staging O in a V stage would need every
//   consumer's last P V done first.
// - kPrefetchQ: the producer asks L2 for the next unit's Q (a bulk tensor prefetch) as soon as
//   it knows the unit, before it waits for the consumers to free the Q buffer, so the Q load
//   that follows comes from L2.
enum : int { kFuseTiles = 1, kPrefetchQ = 2, kWaitFirst = 4, kOverlapSoftmax = 8, kUniformHints = 16 };

// Shared memory of the persistent kernel: fwd_kernel's (2 stages), plus an O buffer when it fits
// beside them (else O is staged in a V stage), plus the Q empty barrier and kSlots unit slots.
template <int kD, int kBN, int kBM, int kSlots = 2>
struct PersistSmemX {
  using Base = Smem<kD, kBN, 2, kBM>;
  static constexpr int kTileO = kBM * kD * 2;
  static constexpr int kMaxSmem = 227 * 1024;
  static constexpr bool kOInV = Base::bytes + kTileO + 8 > kMaxSmem;
  static_assert(!kOInV || kTileO <= Base::kTileKV, "O fits one V stage");
  static constexpr int o = Base::bar;  // the separate O buffer (unused with kOInV)
  static constexpr int bar = kOInV ? Base::bar : Base::bar + kTileO;
  static constexpr int kBars = Base::kBars + 1;  // fwd_kernel's, then q_empty
  static constexpr int slots = bar + 8 * kBars;  // kSlots unit slots (kSlotBytes each)
  static constexpr int bytes = slots + kSlots * kSlotBytes + 1024;
  static_assert(bytes <= kMaxSmem, "shared memory");
};

// L2 <- global through a 4-D tensor map (a hint: no shared memory, no barrier).
__device__ __forceinline__ void tma_prefetch_l2_4d(const CUtensorMap* map, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}


// The Q tile of unit u (query block, head, batch): fwd_unit's first half, for the L2 prefetch.
template <int kBM>
__device__ __forceinline__ void unit_q_tile(int u, int m_tiles, const FwdParams& p, int* m_block, int* h, int* b) {
  const int per_b = m_tiles * p.heads;
  *b = u / per_b;
  const int r = u - *b * per_b;
  const int x = r % m_tiles;
  int rank = m_tiles - 1 - x;
  *h = r / m_tiles;
  if (p.tiles.begin != nullptr) {
    listed_unit(x, *h, m_tiles, p.heads, p.tiles.heavy, &rank, h);
    *m_block = __ldg(p.tiles.order + rank);
  } else {
    *m_block = rank;
  }
}

// next_unit: a counter that is 0 at launch (the dynamic schedule), or nullptr (static stride).
// kTmaO: O through shared memory and a TMA store (else 4-byte stores from registers, as
// fwd_kernel: the ablation that tells the store's share). kOpt: the bits above.
template <int kD, int kBN, int kC, bool kTmaO, int kOpt = 0>
__global__ void __launch_bounds__(Cfg<kC>::kThreads, 1)
    fwd_persist_x_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                       const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o,
                       const FwdParams p, int* next_unit) {
  static_assert(kD == 64 || kD == 128, "head dim 64 or 128");
  static_assert(kBN % 16 == 0 && kBN <= 256, "key tile: whole wgmma k-steps, one TMA box");
#ifdef SEQPAR_HOPPER_STUB
  __trap();
#else
  constexpr int kStages = 2;
  constexpr int kBM = Cfg<kC>::kBM;
  constexpr bool kFuse = (kOpt & kFuseTiles) != 0;
  // Slots: the producer writes unit t + 2's slot once the consumers free tile t + 1's Q; with
  // fused tiles a consumer still reads tile t's slot in its epilogue then, so 4 slots.
  constexpr int kSlots = kFuse ? 4 : 2;
  using L = PersistSmemX<kD, kBN, kBM, kSlots>;
  static_assert(!(kFuse && kTmaO && L::kOInV),
                "fused tiles: O staged in a V stage would wait for every consumer's last P V");
  constexpr int kTileKV = L::Base::kTileKV;
  constexpr int kCB = kD / 64;
  // Named barriers: 1..kC ping-pong turns, kAllBar the consumers' last P V, kWgBar + c one
  // consumer warpgroup's staging rows.
  constexpr int kAllBar = 4, kWgBar = 5;
  static_assert(kC <= 3, "named barrier ids");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base + L::Base::q, sK = base + L::Base::k, sV = base + L::Base::v, sBar = base + L::bar;
  const uint32_t q_full = sBar, q_empty = sBar + 8u * L::Base::kBars, sSlots = base + L::slots;
  auto k_full = [&](int s) { return sBar + 8u * (1 + s); };
  auto k_empty = [&](int s) { return sBar + 8u * (1 + kStages + s); };
  auto v_full = [&](int s) { return sBar + 8u * (1 + 2 * kStages + s); };
  auto v_empty = [&](int s) { return sBar + 8u * (1 + 3 * kStages + s); };
  auto slot_of = [&](int t) { return sSlots + uint32_t(t & (kSlots - 1)) * kSlotBytes; };

  const bool listed = p.tiles.begin != nullptr;
  const int m_tiles = (p.seq_q + kBM - 1) / kBM;
  const int units = m_tiles * p.heads * p.batch;

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  if (tid == 0) {
    mbar_init(q_full, 1);
    mbar_init(q_empty, kC);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), kC);
      mbar_init(v_empty(s), kC);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Cfg<kC>::kProducerRegs));
    if (tid == 0) {
      int kv_it = 0, t = 0;
      for (int u = blockIdx.x;; ++t) {
        const uint32_t slot = slot_of(t);
        if constexpr ((kOpt & kPrefetchQ) != 0) {
          // The unit's Q into L2 while the consumers still use the Q buffer (the first unit's
          // load follows at once: no prefetch). The unit is worked out again after the wait, so
          // that nothing stays in the producer's 24 registers across it.
          if (t > 0 && u < units) {
            int mb, h, b;
            unit_q_tile<kBM>(u, m_tiles, p, &mb, &h, &b);
#pragma unroll
            for (int cb = 0; cb < kCB; ++cb) tma_prefetch_l2_4d(&tm_q, cb * 64, h, mb * kBM, b);
          }
        }
        mbar_wait(q_empty, (t & 1) ^ 1);  // the consumers are done with the previous tile's Q
        if (u >= units) {  // no more: tell the consumers
          st_shared_u32(slot + kSlotN, uint32_t(-1));
          mbar_arrive(q_full);
          break;
        }
        const FwdUnit w = fwd_unit<kBM, kBN>(u, m_tiles, p);
        const int kvh = w.h / (p.heads / p.kv_heads);
        st_shared_u32(slot + kSlotM, w.m_block);
        st_shared_u32(slot + kSlotH, w.h);
        st_shared_u32(slot + kSlotB, w.b);
        st_shared_u32(slot + kSlotN, w.n_blocks);
        st_shared_u32(slot + kSlotE0, w.e0);
        // The arrival below releases the slot's stores to the consumers' wait on q_full.
        mbar_expect_tx(q_full, L::Base::kTileQ);
#pragma unroll
        for (int cb = 0; cb < kCB; ++cb)
          tma_load_4d(sQ + cb * kBM * 128, &tm_q, q_full, cb * 64, w.h, w.m_block * kBM, w.b);
        for (int it = 0; it < w.n_blocks; ++it) {
          const int n_block = listed ? __ldg(p.tiles.entries + w.e0 + it) >> 2 : w.n_blocks - 1 - it;
          const int g = kv_it + it, st = g % kStages;
          const uint32_t ph = (g / kStages) & 1;
          mbar_wait(k_empty(st), ph ^ 1);
          mbar_expect_tx(k_full(st), kTileKV);
#pragma unroll
          for (int cb = 0; cb < kCB; ++cb)
            tma_load_4d(sK + st * kTileKV + cb * kBN * 128, &tm_k, k_full(st), cb * 64, kvh, n_block * kBN, w.b);
          mbar_wait(v_empty(st), ph ^ 1);
          mbar_expect_tx(v_full(st), kTileKV);
#pragma unroll
          for (int cb = 0; cb < kCB; ++cb)
            tma_load_4d(sV + st * kTileKV + cb * kBN * 128, &tm_v, v_full(st), cb * 64, kvh, n_block * kBN, w.b);
        }
        kv_it += w.n_blocks;
        // The next unit; the atomic's latency hides behind the wait for q_empty above.
        u = next_unit ? int(gridDim.x) + atomicAdd(next_unit, 1) : u + int(gridDim.x);
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Cfg<kC>::kConsumerRegs));
  constexpr bool kUni = (kOpt & kUniformHints) != 0;
  const int c = kUni ? __shfl_sync(0xffffffffu, wg - 1, 0) : wg - 1;
  const int lane = tid % 32, warp = (tid % 128) / 32;
  const bool is_signaller = (tid % 128) == 0;

  const uint32_t qa = sQ + c * 64 * 128;
  auto desc_q = [&](int kk) { return make_desc(qa + (kk / 4) * kBM * 128 + (kk % 4) * 32, 16, 1024); };
  auto desc_k = [&](int st, int kk) {
    return make_desc(sK + st * kTileKV + (kk / 4) * kBN * 128 + (kk % 4) * 32, 16, 1024);
  };
  auto desc_v = [&](int st, int kk) { return make_desc(sV + st * kTileKV + kk * 16 * 128, kBN * 128, 1024); };
  auto pp_sync = [&]() { named_bar_sync(1 + c, 256); };
  auto pp_arrive = [&]() { named_bar_arrive(1 + (c + 1) % kC, 256); };
  if (c == kC - 1) named_bar_arrive(1, 256);  // consumer 0 takes the first turn
  using WithPattern = std::true_type;

  float o[kD / 2];
  float s[kBN / 2];
  uint32_t pf[kBN / 16][4];
  float m[2], l[2], resc[2];
  // The current tile (from its slot): key-block count, first list entry, first query row of
  // this consumer, and this thread's rows row0, row0 + 8.
  // With fused tiles the tile's first list entry and rows are read from its slot when needed
  // (`cur`), not kept in registers: the fused boundary needs the registers.
  int n_blocks = 0, e0 = 0, tile_row_lo = 0, row0 = 0;
  uint32_t cur = 0;
  auto enter_tile = [&](uint32_t slot) {
    n_blocks = ld_shared_s32(slot + kSlotN);
    if constexpr (kUni) n_blocks = __shfl_sync(0xffffffffu, n_blocks, 0);
    if constexpr (kFuse) {
      cur = slot;
    } else {
      e0 = ld_shared_s32(slot + kSlotE0);
      tile_row_lo = ld_shared_s32(slot + kSlotM) * kBM + c * 64;
      row0 = tile_row_lo + warp * 16 + lane / 4;
    }
  };
  auto tile_e0 = [&]() {
    if constexpr (kFuse) return ld_shared_s32(cur + kSlotE0);
    return e0;
  };
  auto tile_lo = [&]() {
    if constexpr (kFuse) return ld_shared_s32(cur + kSlotM) * kBM + c * 64;
    return tile_row_lo;
  };
  auto tile_row0 = [&]() {
    if constexpr (kFuse) return tile_lo() + warp * 16 + lane / 4;
    return row0;
  };
  auto issue_s = [&](int st) {
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) wgmma_qk<kBN>(s, desc_q(kk), desc_k(st, kk), kk > 0 ? 1 : 0);
  };
  auto issue_pv = [&](int st) {
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) wgmma_pv<kD>(o, pf[kk], desc_v(st, kk));
  };
  auto mask_step = [&](int it, auto pattern) {
    if (listed) {
      const int e = __ldg(p.tiles.entries + tile_e0() + it);
      if (e & 3)
        apply_tile_mask<kBN, decltype(pattern)::value>(s, p.tiles, (e >> 2) * kBN, tile_row0(), p.seq_q, lane,
                                                       e & 3);
    } else {
      const int n_block = n_blocks - 1 - it;
      const int key_hi = n_block * kBN + kBN - 1;
      if (key_hi >= p.seq_k || (p.causal && key_hi > tile_lo() + p.causal_offset))
        apply_mask<kBN>(s, n_block * kBN, tile_row0(), lane, p);
    }
  };
  auto pattern_step = [&](int it) {
    return listed && (__ldg(p.tiles.entries + tile_e0() + it) & kTilePatternMask);
  };
  // LSE of the current tile (tile slot `slot`); returns 1 / l of the thread's two rows for its O
  // (a float2, not an array: an array passed by reference here went to the stack).
  auto finish_stats = [&](uint32_t slot) {
    float2 inv;
    const int h = ld_shared_s32(slot + kSlotH), b = ld_shared_s32(slot + kSlotB);
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      float lx = l[x];
      lx += __shfl_xor_sync(0xffffffff, lx, 1);
      lx += __shfl_xor_sync(0xffffffff, lx, 2);
      (x ? inv.y : inv.x) = lx > 0.f ? 1.f / lx : 0.f;
      const int row = tile_row0() + 8 * x;
      if (row < p.seq_q && lane % 4 == 0)
        p.lse[b * p.lse_sb + h * p.lse_sh + row] =
            lx > 0.f ? (m[x] + __log2f(lx)) * 0.6931471805599453f : -INFINITY;
    }
    return inv;
  };
  // O / l of the tile in `slot` from registers (4-byte stores; rows r0, r0 + 8).
  auto store_o_regs = [&](uint32_t slot, float2 inv, int r0) {
    const int h = ld_shared_s32(slot + kSlotH), b = ld_shared_s32(slot + kSlotB);
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const int row = r0 + 8 * x;
      if (row < p.seq_q) {
        const int64_t orow = b * p.o_sb + row * p.o_ss + h * p.o_sh;
#pragma unroll
        for (int j = 0; j < kD / 8; ++j)
          *reinterpret_cast<uint32_t*>(static_cast<__nv_bfloat16*>(p.o) + orow + 8 * j + 2 * (lane % 4)) =
              pack_bf16(o[4 * j + 2 * x] * (x ? inv.y : inv.x), o[4 * j + 2 * x + 1] * (x ? inv.y : inv.x));
      }
    }
  };
  // O / l of the tile in `slot` through this consumer's own O buffer and a TMA store (not
  // with kOInV: there the staging rows are a V stage, handled below).
  auto store_o_buffer = [&](uint32_t slot, float2 inv, int lo) {
    const int h = ld_shared_s32(slot + kSlotH), b = ld_shared_s32(slot + kSlotB);
    if (is_signaller) bulk_wait_read<0>();  // our previous store has read the buffer
    named_bar_sync(kWgBar + c, 128);
    const uint32_t so = base + L::o + c * kCB * 64 * 128;
    const int r = warp * 16 + lane / 4;  // local row (+ 8 x); r % 8 == lane / 4
#pragma unroll
    for (int x = 0; x < 2; ++x)
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        const uint32_t addr =
            so + (j / 8) * 64 * 128 + (r + 8 * x) * 128 + (((j % 8) ^ (lane / 4)) << 4) + 4 * (lane % 4);
        st_shared_u32(addr, pack_bf16(o[4 * j + 2 * x] * (x ? inv.y : inv.x), o[4 * j + 2 * x + 1] * (x ? inv.y : inv.x)));
      }
    fence_proxy_async();
    named_bar_sync(kWgBar + c, 128);
    if (is_signaller) {
      if (lo < p.seq_q) {
#pragma unroll
        for (int cb = 0; cb < kCB; ++cb) tma_store_4d(&tm_o, so + cb * 64 * 128, cb * 64, h, lo, b);
      }
      bulk_commit();
    }
  };

  int kv_it = 0;
  bool carried = false;  // kFuse: this tile's first S was done in the previous tile's last turn
  for (int t = 0;; ++t) {
    const uint32_t slot = slot_of(t);
    if (!carried) {
      mbar_wait(q_full, t & 1);
      enter_tile(slot);
      if (n_blocks < 0) break;

      if (n_blocks == 0) {
        // No visible key: O = 0, LSE = -inf, plain stores (no V stage to stage O in).
        if (is_signaller) mbar_arrive(q_empty);
        const int h = ld_shared_s32(slot + kSlotH), b = ld_shared_s32(slot + kSlotB);
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          const int row = tile_row0() + 8 * x;
          if (row < p.seq_q) {
            const int64_t orow = b * p.o_sb + row * p.o_ss + h * p.o_sh;
#pragma unroll
            for (int j = 0; j < kD / 8; ++j)
              *reinterpret_cast<uint32_t*>(static_cast<__nv_bfloat16*>(p.o) + orow + 8 * j + 2 * (lane % 4)) = 0u;
            if (lane % 4 == 0) p.lse[b * p.lse_sb + h * p.lse_sh + row] = -INFINITY;
          }
        }
        continue;
      }
#pragma unroll
      for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
      m[0] = m[1] = -INFINITY;
      l[0] = l[1] = 0.f;
      {  // first block: S alone
        const int st = kv_it % kStages;
        const uint32_t ph = (kv_it / kStages) & 1;
        mbar_wait(k_full(st), ph);
        pp_sync();
        fence_regs(s);
        wgmma_fence();
        issue_s(st);
        wgmma_commit();
        pp_arrive();
        wgmma_wait<0>();
        fence_regs(s);
        if (is_signaller) {
          mbar_arrive(k_empty(st));
          if (n_blocks == 1) mbar_arrive(q_empty);
        }
        mask_step(0, WithPattern{});
        online_softmax<kBN>(s, m, l, resc, p.scale_log2);
        convert_p<kBN>(s, pf);
      }
    }
    for (int it = 1; it < n_blocks; ++it) {
      const int g = kUni ? __shfl_sync(0xffffffffu, kv_it + it, 0) : kv_it + it;
      const int st = g % kStages, pst = (g - 1) % kStages;
      const uint32_t ph = (g / kStages) & 1, pph = ((g - 1) / kStages) & 1;
      mbar_wait(k_full(st), ph);
      mbar_wait(v_full(pst), pph);
      pp_sync();
      fence_regs(s);
      fence_regs(o);
      fence_regs(pf);
      wgmma_fence();
      issue_s(st);
      wgmma_commit();
      issue_pv(pst);
      wgmma_commit();
      pp_arrive();
      wgmma_wait<1>();
      fence_regs(s);
      if (is_signaller) {
        mbar_arrive(k_empty(st));
        if (it == n_blocks - 1) mbar_arrive(q_empty);  // the tile's last Q K^T is done
      }
      if (pattern_step(it)) {
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pf);
        if (is_signaller) mbar_arrive(v_empty(pst));
        mask_step(it, WithPattern{});
        online_softmax<kBN>(s, m, l, resc, p.scale_log2);
      } else if constexpr ((kOpt & kWaitFirst) != 0) {
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pf);
        fence_regs(s);  // the softmax below cannot move above the wait
        if (is_signaller) mbar_arrive(v_empty(pst));
        mask_step(it, std::false_type{});
        online_softmax<kBN>(s, m, l, resc, p.scale_log2);
      } else if constexpr ((kOpt & kOverlapSoftmax) != 0) {
        mask_step(it, std::false_type{});
        online_softmax<kBN>(s, m, l, resc, p.scale_log2);
        fence_regs(s);  // the softmax is done before the wait below
        fence_regs(m);
        fence_regs(l);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pf);
        if (is_signaller) mbar_arrive(v_empty(pst));
      } else {
        mask_step(it, std::false_type{});
        online_softmax<kBN>(s, m, l, resc, p.scale_log2);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pf);
        if (is_signaller) mbar_arrive(v_empty(pst));
      }
      rescale_o<kD>(o, resc);
      convert_p<kBN>(s, pf);
    }
    const int last = kv_it + n_blocks - 1;
    const int st_last = last % kStages;
    const uint32_t ph_last = (last / kStages) & 1;
    kv_it += n_blocks;
    if constexpr (kUni) kv_it = __shfl_sync(0xffffffffu, kv_it, 0);
    float2 inv;

    if constexpr (kFuse) {
      // ---------------- fused boundary: the next tile's first S with this tile's last P V ----------------
      inv = finish_stats(slot);  // m and l are final: LSE now, 1 / l kept for O
      const uint32_t next = slot_of(t + 1);
      mbar_wait(q_full, (t + 1) & 1);  // the next unit's slot and Q
      if (ld_shared_s32(next + kSlotN) > 0) {
        const int st = kv_it % kStages;
        const uint32_t ph = (kv_it / kStages) & 1;
        mbar_wait(v_full(st_last), ph_last);
        mbar_wait(k_full(st), ph);
        pp_sync();
        fence_regs(s);
        fence_regs(o);
        fence_regs(pf);
        wgmma_fence();
        issue_pv(st_last);  // first: O is final while the next S still runs
        wgmma_commit();
        issue_s(st);
        wgmma_commit();
        pp_arrive();
        wgmma_wait<1>();  // this tile's last P V is done; the next tile's S may still run
        fence_regs(o);
        fence_regs(pf);
        if (is_signaller) mbar_arrive(v_empty(st_last));
        // This tile's O (its slot stays: the producer writes at most tile t + 2's meanwhile).
        if constexpr (kTmaO)
          store_o_buffer(slot, inv, tile_lo());
        else
          store_o_regs(slot, inv, tile_row0());
#pragma unroll
        for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
        wgmma_wait<0>();
        fence_regs(s);
        enter_tile(next);
        if (is_signaller) {
          mbar_arrive(k_empty(st));
          if (n_blocks == 1) mbar_arrive(q_empty);
        }
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.f;
        mask_step(0, WithPattern{});
        online_softmax<kBN>(s, m, l, resc, p.scale_log2);
        convert_p<kBN>(s, pf);
        carried = true;
        continue;
      }
      carried = false;  // the next tile has no key or there is none: the plain end below
    }
    {  // last P V
      mbar_wait(v_full(st_last), ph_last);
      pp_sync();
      fence_regs(o);
      fence_regs(pf);
      wgmma_fence();
      issue_pv(st_last);
      wgmma_commit();
      pp_arrive();
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pf);
      if ((!kTmaO || !L::kOInV) && is_signaller) mbar_arrive(v_empty(st_last));
    }

    // ---------------- epilogue: LSE, O / l to bf16 through shared memory, TMA store ----------------
    if constexpr (!kFuse) inv = finish_stats(slot);
    if constexpr (!kTmaO) {
      store_o_regs(slot, inv, tile_row0());
      continue;
    }
    if constexpr (!L::kOInV) {
      store_o_buffer(slot, inv, tile_lo());
      continue;
    }
    // O in the V stage of the last P V: every consumer's last P V must have read it.
    named_bar_sync(kAllBar, 128 * kC);
    const uint32_t so = sV + st_last * kTileKV + c * kCB * 64 * 128;  // kCB boxes of [64 rows][128 bytes]
    {
      const int r = warp * 16 + lane / 4;  // local row (+ 8 x); r % 8 == lane / 4
#pragma unroll
      for (int x = 0; x < 2; ++x)
#pragma unroll
        for (int j = 0; j < kD / 8; ++j) {
          const uint32_t addr = so + (j / 8) * 64 * 128 + (r + 8 * x) * 128 + (((j % 8) ^ (lane / 4)) << 4) +
                                4 * (lane % 4);
          st_shared_u32(addr, pack_bf16(o[4 * j + 2 * x] * (x ? inv.y : inv.x),
                                        o[4 * j + 2 * x + 1] * (x ? inv.y : inv.x)));
        }
    }
    fence_proxy_async();
    named_bar_sync(kWgBar + c, 128);
    if (is_signaller) {
      if (tile_lo() < p.seq_q) {
        const int h = ld_shared_s32(slot + kSlotH), b = ld_shared_s32(slot + kSlotB);
#pragma unroll
        for (int cb = 0; cb < kCB; ++cb) tma_store_4d(&tm_o, so + cb * 64 * 128, cb * 64, h, tile_lo(), b);
      }
      bulk_commit();
      bulk_wait_read<0>();  // the staging rows are read: the V stage may be reloaded
      mbar_arrive(v_empty(st_last));
    }
  }
  if (c == 0) named_bar_sync(1, 256);  // absorbs the last consumer's last arrival
  if (is_signaller) bulk_wait<0>();    // the O stores are complete before the CTA exits
#endif  // SEQPAR_HOPPER_STUB
}


// The persistent forward: fwd_kernel<kD, kBN, 2, overlap, ping-pong, kC>'s tiles on a grid of
// (CTAs that fit per SM) x SMs; dynamic: units from a counter (zeroed on the stream before the
// launch), else a static stride. O must be bf16 with 16-byte aligned strides (the TMA store);
// otherwise this launches fwd_kernel. kOpt: kFuseTiles, kPrefetchQ (kFuseTiles with a V-staged
// O, D = 128, needs kTmaO = false). max_grid > 0 caps the grid (the lab's checks use it, so that
// each CTA of a small problem walks several units).
template <int kD, int kBN, int kC, bool kTmaO = true, int kOpt = 0>
cudaError_t launch_fwd_persist_x(const FwdArgs& a, cudaStream_t stream, bool dynamic = true, int max_grid = 0) {
  constexpr int kBM = Cfg<kC>::kBM;
  const RowStrides ost = row_strides(a.o_st, a.seq_q, a.heads, kD);
  if (a.o_f32 || (reinterpret_cast<uintptr_t>(a.o) & 15) || (ost.b | ost.s | ost.h) % 8 != 0)
    return launch_fwd<kD, kBN, 2, true, true, kC>(a, stream);
  CUtensorMap tq, tk, tv, to;
  if (!fwd_tmaps(a, kD, kBM, kBN, &tq, &tk, &tv) ||
      make_tmap(&to, a.o, a.batch, a.seq_q, a.heads, kD, 64, a.o_st) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  const FwdParams p = fwd_params(a, kD, ost);
  auto kernel = fwd_persist_x_kernel<kD, kBN, kC, kTmaO, kOpt>;
  constexpr int smem = PersistSmemX<kD, kBN, kBM, (kOpt & kFuseTiles) ? 4 : 2>::bytes;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  int device = 0, sms = 0, per_sm = 0;
  if ((e = cudaGetDevice(&device)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess ||
      (e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Cfg<kC>::kThreads, smem)) != cudaSuccess)
    return e;
  const int64_t units = int64_t((a.seq_q + kBM - 1) / kBM) * a.heads * a.batch;
  if (units == 0) return cudaSuccess;
  int grid = int(std::min<int64_t>(units, int64_t(sms) * std::max(per_sm, 1)));
  if (max_grid > 0) grid = std::min(grid, max_grid);
  int* counter = nullptr;
  if (dynamic && grid < units) {
    if ((e = persist_counter(stream, &counter)) != cudaSuccess ||
        (e = cudaMemsetAsync(counter, 0, sizeof(int), stream)) != cudaSuccess)
      return e;
  }
  kernel<<<grid, Cfg<kC>::kThreads, smem, stream>>>(tq, tk, tv, to, p, counter);
  return cudaGetLastError();
}

}  // namespace seqpar::hopper::persist_lab
