// The Hopper attention FORWARD kernel, persistent: the same math, masks and contract as
// fwd_kernel (hopper_fwd.cuh: overlap + ping-pong, 2 K/V stages), but a grid of one CTA per SM
// that walks work tiles (query tile, head, batch) in the order the one-CTA-per-tile grids launch
// them, and an O epilogue through shared memory with a TMA store.
//
// - Schedule: units in the linear launch order of fwd_kernel's grid (query tile fastest, then
//   head, then batch; within a head the heaviest causal tile first; with tile lists,
//   listed_unit's order). CTA i takes unit i first, then (dynamic, the default) the next unit
//   of a global counter (an atomic add by the producer thread, fetched one tile ahead), as the
//   hardware hands out the blocks of a one-CTA-per-tile grid; or (static) units i + G, i + 2G, ...
//   Either way the CTAs busy at one moment hold neighbouring units, one or two heads' tiles, so
//   K/V stay in L2 as before. kOrder 1 / 2 (dense masks) put the query heads of one K/V head
//   (or 4 heads) in step instead (fwd_unit). The producer writes each unit's tile (query block, head, batch,
//   key-block count, first list entry) into one of two shared-memory slots before its Q load;
//   the consumers read it there after the Q barrier, so they hold no scheduling state in the
//   registers their main loop needs.
// - Q: one buffer with a full and an empty barrier. The consumers free it as soon as the last
//   S = Q K^T of a tile is done, so the producer loads the next tile's Q (and its first K/V
//   stages) while the consumers finish the last softmax, P V and the epilogue. The K/V rings'
//   stage counter runs on across tiles.
// - O: normalised and rounded to bf16 into shared memory (the 128-byte swizzled layout, 4-byte
//   conflict-free stores), then one TMA store per 64 columns and consumer (rows past S_q are
//   clipped by the tensor map). At D = 128 with 192-key tiles there is no room for a separate
//   O buffer (Q + 2 x (K + V) = 224 KB), so O goes into the V stage of the tile's last P V: the
//   consumers first wait for each other's last P V (one named barrier), and each releases that
//   V stage only when its store has read the staging rows (cp.async.bulk.wait_group.read), so
//   the producer reloads it after that. Elsewhere (D = 64) O has its own buffer and each
//   consumer waits for its previous store's reads before writing it again.
// - A tile with no visible key (a causal offset, an empty list) writes O = 0 and LSE = -inf
//   with plain stores, as fwd_kernel does.
// LSE is written with plain stores (one float per row). O must be bf16 with 16-byte aligned
// strides for the TMA store; launch_fwd_persist falls back to launch_fwd otherwise.
#pragma once

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/hopper/hopper_fwd.cuh"

namespace seqpar::hopper {

// global <- shared through a 4-D tensor map (bulk group; out-of-bounds elements are not written).
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
               : "memory");
}

// Shared memory of the persistent kernel: fwd_kernel's (2 stages), plus an O buffer when it fits
// beside them (else O is staged in a V stage), plus the Q empty barrier.
template <int kD, int kBN, int kBM>
struct PersistSmem {
  using Base = Smem<kD, kBN, 2, kBM>;
  static constexpr int kTileO = kBM * kD * 2;
  static constexpr int kMaxSmem = 227 * 1024;
  static constexpr bool kOInV = Base::bytes + kTileO + 8 > kMaxSmem;
  static_assert(!kOInV || kTileO <= Base::kTileKV, "O fits one V stage");
  static constexpr int o = Base::bar;  // the separate O buffer (unused with kOInV)
  static constexpr int bar = kOInV ? Base::bar : Base::bar + kTileO;
  static constexpr int kBars = Base::kBars + 1;  // fwd_kernel's, then q_empty
  static constexpr int slots = bar + 8 * kBars;  // two unit slots (kSlotBytes each)
  static constexpr int bytes = slots + 2 * 32 + 1024;
  static_assert(bytes <= kMaxSmem, "shared memory");
};

// One work unit of the persistent grid: the tile fwd_kernel's block (x, y, z) would take, for
// the unit's place u in the launch order x + tiles (y + heads z).
struct FwdUnit {
  int m_block, h, b, n_blocks, e0;
};
// kOrder 1 (dense masks only; tile lists keep listed_unit's order): the query heads that share
// one K/V head run in step: units by batch, then K/V head, then query tile (heaviest causal tile
// first), then the head inside the group fastest, so the CTAs busy at one moment hold a few
// query tiles of every head of one group and read the same K/V tiles at about the same time, and
// the grid's last units are light tiles (under the causal mask a head's heavy tiles no longer
// come last of all). kOrder 2: the same over chunks of 4 query heads where a group is smaller
// (H = H_kv: 4 K/V heads in step), whole groups otherwise.
template <int kBM, int kBN, int kOrder = 0>
__device__ __forceinline__ FwdUnit fwd_unit(int u, int m_tiles, const FwdParams& p) {
  FwdUnit w;
  const int per_b = m_tiles * p.heads;
  w.b = u / per_b;
  const int r = u - w.b * per_b;
  const bool listed = p.tiles.begin != nullptr;
  int x = r % m_tiles, y = r / m_tiles;
  if (kOrder != 0 && !listed) {
    int group = p.heads / p.kv_heads;
    if (kOrder == 2 && group < 4 && p.heads % 4 == 0) group = 4;
    const int per_chunk = m_tiles * group;
    const int chunk = r / per_chunk, r2 = r - chunk * per_chunk;
    x = r2 / group;
    y = chunk * group + (r2 - x * group);
  }
  int rank = m_tiles - 1 - x;
  w.h = y;
  if (listed) listed_unit(x, y, m_tiles, p.heads, p.tiles.heavy, &rank, &w.h);
  w.m_block = listed ? __ldg(p.tiles.order + rank) : rank;
  // S_k through an opaque move, so the compiler does not hoist the key-block count out of the
  // producer's loop and keep it in one of its 24 registers (it spilled 4 bytes).
  int seq_k;
  asm volatile("mov.b32 %0, %1;" : "=r"(seq_k) : "r"(p.seq_k));
  w.n_blocks = (seq_k + kBN - 1) / kBN;
  w.e0 = 0;
  if (listed) {
    w.e0 = __ldg(p.tiles.begin + w.m_block);
    w.n_blocks = __ldg(p.tiles.begin + w.m_block + 1) - w.e0;
  } else if (p.causal) {
    const int last_key = min(w.m_block * kBM + kBM, p.seq_q) - 1 + p.causal_offset;
    w.n_blocks = last_key < 0 ? 0 : min(w.n_blocks, last_key / kBN + 1);
  }
  return w;
}

__device__ __forceinline__ int ld_shared_s32(uint32_t addr) {
  int v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
// A unit's slot in shared memory: m_block, h, b, n_blocks (-1: no more units), e0.
enum : int { kSlotM = 0, kSlotH = 4, kSlotB = 8, kSlotN = 12, kSlotE0 = 16, kSlotBytes = 32 };

// next_unit: a counter that is 0 at launch (the dynamic schedule), or nullptr (static stride).
// kTmaO: O through shared memory and a TMA store (else 4-byte stores from registers, as
// fwd_kernel: the ablation that tells the store's share). kUniform: the consumer index and the K/V
// stage counter go through warp broadcasts (__shfl_sync from lane 0), so that ptxas knows they are
// warp-uniform and builds the wgmma descriptors in uniform registers (fwd_kernel's kUniform).
template <int kD, int kBN, int kC, bool kTmaO, bool kUniform = false, int kOrder = 0>
__global__ void __launch_bounds__(Cfg<kC>::kThreads, 1)
    fwd_persist_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                       const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o,
                       const FwdParams p, int* next_unit) {
  static_assert(kD == 64 || kD == 128, "head dim 64 or 128");
  static_assert(kBN % 16 == 0 && kBN <= 256, "key tile: whole wgmma k-steps, one TMA box");
#ifdef SEQPAR_HOPPER_STUB
  __trap();
#else
  constexpr int kStages = 2;
  constexpr int kBM = Cfg<kC>::kBM;
  using L = PersistSmem<kD, kBN, kBM>;
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
        const uint32_t slot = sSlots + (t & 1) * kSlotBytes;
        mbar_wait(q_empty, (t & 1) ^ 1);  // the consumers are done with the previous tile's Q
        if (u >= units) {  // no more: tell the consumers
          st_shared_u32(slot + kSlotN, uint32_t(-1));
          mbar_arrive(q_full);
          break;
        }
        const FwdUnit w = fwd_unit<kBM, kBN, kOrder>(u, m_tiles, p);
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
  const int c = kUniform ? __shfl_sync(0xffffffffu, wg - 1, 0) : wg - 1;
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

  int kv_it = 0;
  for (int t = 0;; ++t) {
    const uint32_t slot = sSlots + (t & 1) * kSlotBytes;
    mbar_wait(q_full, t & 1);
    const int n_blocks = ld_shared_s32(slot + kSlotN);
    if (n_blocks < 0) break;
    const int m0 = ld_shared_s32(slot + kSlotM) * kBM, e0 = ld_shared_s32(slot + kSlotE0);
    const int row0 = m0 + c * 64 + warp * 16 + lane / 4;  // this thread's rows: row0, row0 + 8

    float o[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
    float s[kBN / 2];
    uint32_t pf[kBN / 16][4];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, resc[2];

    auto issue_s = [&](int st) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) wgmma_qk<kBN>(s, desc_q(kk), desc_k(st, kk), kk > 0 ? 1 : 0);
    };
    auto issue_pv = [&](int st) {
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) wgmma_pv<kD>(o, pf[kk], desc_v(st, kk));
    };
    const int tile_row_lo = m0 + c * 64;
    auto mask_step = [&](int it, auto pattern) {
      if (listed) {
        const int e = __ldg(p.tiles.entries + e0 + it);
        if (e & 3)
          apply_tile_mask<kBN, decltype(pattern)::value>(s, p.tiles, (e >> 2) * kBN, row0, p.seq_q, lane, e & 3);
      } else {
        const int n_block = n_blocks - 1 - it;
        const int key_hi = n_block * kBN + kBN - 1;
        if (key_hi >= p.seq_k || (p.causal && key_hi > tile_row_lo + p.causal_offset))
          apply_mask<kBN>(s, n_block * kBN, row0, lane, p);
      }
    };
    auto pattern_step = [&](int it) { return listed && (__ldg(p.tiles.entries + e0 + it) & kTilePatternMask); };

    if constexpr (kUniform) kv_it = __shfl_sync(0xffffffffu, kv_it, 0);
    if (n_blocks == 0) {
      // No visible key: O = 0, LSE = -inf, plain stores (no V stage to stage O in).
      if (is_signaller) mbar_arrive(q_empty);
      const int h = ld_shared_s32(slot + kSlotH), b = ld_shared_s32(slot + kSlotB);
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
      continue;
    }
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
    for (int it = 1; it < n_blocks; ++it) {
      const int g = kUniform ? __shfl_sync(0xffffffffu, kv_it + it, 0) : kv_it + it;
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
    {  // last P V
      const uint32_t ph = (last / kStages) & 1;
      mbar_wait(v_full(st_last), ph);
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
    kv_it += n_blocks;

    // ---------------- epilogue: LSE, O / l to bf16 through shared memory, TMA store ----------------
    const int h = ld_shared_s32(slot + kSlotH), b = ld_shared_s32(slot + kSlotB);
    float inv[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      float lx = l[x];
      lx += __shfl_xor_sync(0xffffffff, lx, 1);
      lx += __shfl_xor_sync(0xffffffff, lx, 2);
      inv[x] = lx > 0.f ? 1.f / lx : 0.f;
      const int row = row0 + 8 * x;
      if (row < p.seq_q && lane % 4 == 0)
        p.lse[b * p.lse_sb + h * p.lse_sh + row] =
            lx > 0.f ? (m[x] + __log2f(lx)) * 0.6931471805599453f : -INFINITY;
    }
    if constexpr (!kTmaO) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int row = row0 + 8 * x;
        if (row < p.seq_q) {
          const int64_t orow = b * p.o_sb + row * p.o_ss + h * p.o_sh;
#pragma unroll
          for (int j = 0; j < kD / 8; ++j)
            *reinterpret_cast<uint32_t*>(static_cast<__nv_bfloat16*>(p.o) + orow + 8 * j + 2 * (lane % 4)) =
                pack_bf16(o[4 * j + 2 * x] * inv[x], o[4 * j + 2 * x + 1] * inv[x]);
        }
      }
      continue;
    }
    uint32_t so;  // this consumer's staging rows: kCB boxes of [64 rows][128 bytes], swizzled
    if constexpr (L::kOInV) {
      named_bar_sync(kAllBar, 128 * kC);  // every consumer's last P V has read this V stage
      so = sV + st_last * kTileKV + c * kCB * 64 * 128;
    } else {
      if (is_signaller) bulk_wait_read<0>();  // our previous store has read the buffer
      named_bar_sync(kWgBar + c, 128);
      so = base + L::o + c * kCB * 64 * 128;
    }
    {
      const int r = warp * 16 + lane / 4;  // local row (+ 8 x); r % 8 == lane / 4
#pragma unroll
      for (int x = 0; x < 2; ++x)
#pragma unroll
        for (int j = 0; j < kD / 8; ++j) {
          const uint32_t addr = so + (j / 8) * 64 * 128 + (r + 8 * x) * 128 + (((j % 8) ^ (lane / 4)) << 4) +
                                4 * (lane % 4);
          st_shared_u32(addr, pack_bf16(o[4 * j + 2 * x] * inv[x], o[4 * j + 2 * x + 1] * inv[x]));
        }
    }
    fence_proxy_async();
    named_bar_sync(kWgBar + c, 128);
    if (is_signaller) {
      if (tile_row_lo < p.seq_q) {
#pragma unroll
        for (int cb = 0; cb < kCB; ++cb) tma_store_4d(&tm_o, so + cb * 64 * 128, cb * 64, h, tile_row_lo, b);
      }
      bulk_commit();
      if constexpr (L::kOInV) {
        bulk_wait_read<0>();  // the staging rows are read: the V stage may be reloaded
        mbar_arrive(v_empty(st_last));
      }
    }
  }
  if (c == 0) named_bar_sync(1, 256);  // absorbs the last consumer's last arrival
  if (is_signaller) bulk_wait<0>();    // the O stores are complete before the CTA exits
#endif  // SEQPAR_HOPPER_STUB
}

// ---- host side ---------------------------------------------------------------------------

// The dynamic schedule's counter of stream `stream` on the current device: one int, allocated on
// first use and kept (launches on one stream run in order, so they can share it). Limits: the
// first launch on a stream allocates (cudaMalloc: not inside a stream capture), and two host
// threads launching on one stream at once could interleave one's memset with the other's kernel.
inline cudaError_t persist_counter(cudaStream_t stream, int** counter) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, int*> counters;
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const std::lock_guard<std::mutex> lock(mu);
  int*& c = counters[{device, stream}];
  if (!c && (e = cudaMalloc(&c, sizeof(int))) != cudaSuccess) {
    c = nullptr;
    return e;
  }
  *counter = c;
  return cudaSuccess;
}

// The persistent forward: fwd_kernel<kD, kBN, 2, overlap, ping-pong, kC>'s tiles on a grid of
// (CTAs that fit per SM) x SMs; dynamic: units from a counter (zeroed on the stream before the
// launch), else a static stride. O must be bf16 with 16-byte aligned strides (the TMA store);
// otherwise this launches fwd_kernel. max_grid > 0 caps the grid (the lab's checks use it, so
// that each CTA of a small problem walks several units).
template <int kD, int kBN, int kC, bool kTmaO = true, bool kUniform = false, int kOrder = 0>
cudaError_t launch_fwd_persist(const FwdArgs& a, cudaStream_t stream, bool dynamic = true, int max_grid = 0) {
  constexpr int kBM = Cfg<kC>::kBM;
  const RowStrides ost = row_strides(a.o_st, a.seq_q, a.heads, kD);
  if (a.o_f32 || (reinterpret_cast<uintptr_t>(a.o) & 15) || (ost.b | ost.s | ost.h) % 8 != 0)
    return launch_fwd<kD, kBN, 2, true, true, kC>(a, stream);
  CUtensorMap tq, tk, tv, to;
  if (make_tmap(&tq, a.q, a.batch, a.seq_q, a.heads, kD, kBM, a.q_st) != CUDA_SUCCESS ||
      make_tmap(&tk, a.k, a.batch, a.seq_k, a.kv_heads, kD, kBN, a.k_st) != CUDA_SUCCESS ||
      make_tmap(&tv, a.v, a.batch, a.seq_k, a.kv_heads, kD, kBN, a.v_st) != CUDA_SUCCESS ||
      make_tmap(&to, a.o, a.batch, a.seq_q, a.heads, kD, 64, a.o_st) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  FwdParams p{};
  p.o = a.o;
  p.lse = a.lse;
  const StatStrides lst = stat_strides(a.lse_st, a.heads, a.seq_q);
  p.o_sb = ost.b, p.o_ss = ost.s, p.o_sh = ost.h, p.lse_sb = lst.b, p.lse_sh = lst.h;
  p.batch = a.batch;
  p.heads = a.heads;
  p.kv_heads = a.kv_heads;
  p.seq_q = a.seq_q;
  p.seq_k = a.seq_k;
  p.causal = a.causal;
  p.causal_offset = a.causal_offset;
  const float scale = a.scale != 0.f ? a.scale : 1.f / sqrtf(float(kD));
  p.scale_log2 = scale * 1.4426950408889634f;
  p.tiles = a.tiles;
  auto kernel = fwd_persist_kernel<kD, kBN, kC, kTmaO, kUniform, kOrder>;
  constexpr int smem = PersistSmem<kD, kBN, kBM>::bytes;
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

}  // namespace seqpar::hopper
