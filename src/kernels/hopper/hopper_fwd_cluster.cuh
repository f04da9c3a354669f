// The Hopper attention FORWARD kernel, persistent, in clusters of 2 CTAs that multicast K/V: the
// persistent kernel (hopper_fwd_persist.cuh with kUniform, kOrder 0) where each K/V tile crosses
// L2 once per pair of CTAs. At the 700 W cap the forward's time per FLOP follows the SM clock;
// on one H200 this cuts the L2 bytes of dense full D = 128 by 41%, runs 0.97x the cycles at a
// 1-2% higher clock, and is 1.03-1.06x the backend's previous kernel at 8K-64K keys (full) and
// 1.03-1.07x at 8K-128K (causal); the backend runs it there (forward_kernel, hopper_args.hpp;
// dev/hopper_attention/README.md, "Persistent forward in 2-CTA clusters", calls 3-4, and
// "Session w: the cluster forward at 8K and 128K causal").
//
// - Pairs: a unit is two query tiles of one head (tiles 2j and 2j + 1 in the heaviest-first order
//   of a head, so rank 0 takes the heavier). Both CTAs walk the same K/V blocks: the heavier
//   member's count. Under the causal mask the lighter member's extra blocks (at most one or two,
//   the newest keys, which it would mask entirely) are only drained: its consumers wait for the
//   stage and release it without math. An odd tile count leaves rank 1 a void member in the last
//   pair of a head (no Q load, no output, every stage drained).
// - Loads: Q per CTA as before. Each K and V tile is loaded as two half-tiles of kBN / 2 rows
//   (own tensor maps with that box), rank r issuing half r with .multicast::cluster to both CTAs;
//   each CTA's full barrier expects the whole tile's bytes (its own producer's expect_tx; the
//   peer's half may land first, the phase still needs the local arrival). A half starts at a
//   multiple of 1024 bytes, so the 128-byte swizzle is the same as one whole-tile box.
// - Release: every K/V empty barrier counts 2 x kC arrivals, and each consumer arrives on its own
//   CTA's and on the peer's, because either producer's half lands in both CTAs' stage: a stage is
//   refilled only when both CTAs consumed it. The D = 128 O staging in a V stage keeps working:
//   that stage's release still waits for the O store's reads.
// - Schedule: rank 0's producer takes pair indices from the global counter (cluster i first pair
//   i) and passes each to rank 1's producer through a 2-deep mailbox in rank 1's shared memory
//   (a full barrier in rank 1, an empty one in rank 0, both arrived on remotely with cluster-scope
//   release). Both producers then build the same pair, each its own member.
// - Exit: the producer warpgroup's idle warps do not exit; every thread of both CTAs meets at a
//   cluster barrier at the end (and after the barriers' init), so no CTA leaves while the peer can
//   still arrive on its barriers or multicast into its shared memory.
// Dense masks only: tile lists and O that the TMA store cannot write go to launch_fwd_persist.
// What it shares with the persistent kernel (shared-memory layout, slots, loads, GEMM steps, the
// epilogue) comes from hopper_fwd_persist.cuh and hopper_fwd_steps.cuh; this file holds what
// differs: the pairs, the mailbox, the multicast halves, the releases on both CTAs, the drain.
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/hopper/hopper_fwd_persist.cuh"

namespace seqpar::hopper {
namespace cluster {

// An opaque copy of a value: ptxas cannot hoist what is computed from it out of the producer's
// loop (hoisted values spilled from its 24 registers), so it recomputes them per tile instead.
__device__ __forceinline__ int opaque(int v) {
  int r;
  asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(v));
  return r;
}
__device__ __forceinline__ int grid_ctas() {
  int r;
  asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(r));
  return r;
}
// Volatile, so the producer re-reads it where it is used rather than keeping it in a register.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// The shared::cluster address of `addr` (a shared::cta address of this kernel) in CTA `rank`.
__device__ __forceinline__ uint32_t map_peer(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t cluster_addr) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_addr) : "memory");
}
// A consumer's release of a K/V stage on the peer's empty barrier. The default semantics
// (release at CTA scope) are enough: what must be ordered is this CTA's reads of its own stage
// before the peer's TMA overwrites it, and those reads completed (wgmma wait) before the arrive.
// The cluster-scope form above costs a MEMBAR.ALL.GPU per arrive in the consumers' loop (call 2's
// SASS; 0.87-0.96x of the version without clusters in calls 1 and 2).
__device__ __forceinline__ void mbar_arrive_remote(uint32_t cluster_addr) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_addr) : "memory");
}
// mbar_wait with cluster-scope acquire: what the peer stored before its release-arrive is visible.
__device__ __forceinline__ void mbar_wait_cluster(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, "
        "p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void st_cluster_u32(uint32_t cluster_addr, uint32_t v) {
  asm volatile("st.shared::cluster.b32 [%0], %1;" ::"r"(cluster_addr), "r"(v) : "memory");
}
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
// A TMA load into the same offset of every CTA in `mask`, completing bytes on each one's barrier
// at the same offset.
__device__ __forceinline__ void tma_load_4d_mc(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                               int c2, int c3, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%2, %3, %4, %5}], [%6], %7;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "h"(mask)
      : "memory");
}
// fwd_load_kv's box load for a cluster: this CTA's half of the tile (rows `row` .., at `half` bytes
// into the stage) to both CTAs.
struct McastLoad {
  int row;
  uint32_t half;
  __device__ __forceinline__ void operator()(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                             int c3) const {
    tma_load_4d_mc(dst + half, map, bar, c0, c1, row, c3, 3);
  }
};

// The persistent kernel's shared memory (PersistSmem with kStages K/V stages; O gets its own
// buffer where it fits beside q_empty, the slots and the mailbox, < 128 bytes) plus the mailbox:
// full[2] (used in rank 1), empty[2] (rank 0), the two pair indices (rank 1).
template <int kD, int kBN, int kBM, int kStages>
struct ClusterSmem : PersistSmem<kD, kBN, kBM, kStages, 128> {
  using P = PersistSmem<kD, kBN, kBM, kStages, 128>;
  static constexpr int mail_bar = P::slots + 2 * kSlotBytes;
  static constexpr int mail = mail_bar + 4 * 8;
  static constexpr int bytes = mail + 8 + 1024;
  static_assert(bytes <= P::kMaxSmem, "shared memory");
};

// A pair's member: the tile's m_block (-1: void) and key-block count, and the pair's count.
struct Member {
  int m_block, h, b, n_own, n_pair;
};
template <int kBM, int kBN>
__device__ __forceinline__ Member pair_member(int u, int rank, int m_tiles, const FwdParams& p) {
  const int mp = (m_tiles + 1) / 2, per_b = mp * p.heads;
  Member w;
  w.b = u / per_b;
  const int r = u - w.b * per_b;
  // Heads in step (FwdParams::head_chunk C > 1): pair j of C heads before pair j + 1.
  int j;
  chunked_unit(r, mp, p.head_chunk > 1 ? p.head_chunk : 1, &j, &w.h);
  const int x0 = 2 * j;
  const int seq_k = opaque(p.seq_k);
  auto blocks = [&](int m_block) {
    int n = (seq_k + kBN - 1) / kBN;
    if (p.causal) n = causal_blocks<kBM, kBN>(n, m_block * kBM, p);
    return n;
  };
  w.n_pair = blocks(m_tiles - 1 - x0);  // the heavier member's
  w.m_block = m_tiles - 1 - (x0 + rank);
  w.n_own = w.m_block < 0 ? 0 : blocks(w.m_block);
  return w;
}

// Slot fields besides hopper_fwd_persist.cuh's: kSlotE0 holds the stages to drain first.
enum : int { kSlotSkip = kSlotE0 };

template <int kD, int kBN, int kC, int kStages>
__global__ void __launch_bounds__(Cfg<kC>::kThreads, 1)
    fwd_cluster_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                       const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o,
                       const FwdParams p, int* next_pair) {
#ifdef SEQPAR_HOPPER_STUB
  __trap();
#else
  constexpr int kBM = Cfg<kC>::kBM;
  using L = ClusterSmem<kD, kBN, kBM, kStages>;
  constexpr int kTileKV = L::Base::kTileKV;
  constexpr int kHalf = kBN / 2;  // rows of one CTA's half of a K/V tile
  static_assert(kHalf % 8 == 0, "a half-tile starts on a swizzle period");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base + L::Base::q, sK = base + L::Base::k, sV = base + L::Base::v, sSlots = base + L::slots;
  const uint32_t mail_full = base + L::mail_bar, mail_empty = mail_full + 16, sMail = base + L::mail;
  const FwdBars<kStages> bars{base + L::bar};

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  if (tid == 0) {
    bars.init(kC, 2 * kC);  // K/V stages: both CTAs' consumers
    for (int s = 0; s < 2; ++s) {
      mbar_init(mail_full + 8 * s, 1);
      mbar_init(mail_empty + 8 * s, 1);
    }
    fence_bar_init();
  }
  cluster_sync_all();  // the peer's barriers exist before anything arrives on them

  if (wg == 0) {
    // ---------------- producer ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Cfg<kC>::kProducerRegs));
    if (tid == 0) {
      int kv_it = 0;
      int u = int(blockIdx.x / 2);
      for (int t = 0;; ++t) {
        const uint32_t rank = cluster_rank();
        const int m_tiles = (opaque(p.seq_q) + kBM - 1) / kBM;
        const int pairs = (m_tiles + 1) / 2 * opaque(p.heads) * p.batch;
        const uint32_t slot = sSlots + (t & 1) * kSlotBytes;
        const uint32_t mslot = 8u * (t & 1), mph = (t >> 1) & 1;
        if (rank == 0) {  // hand the pair index to rank 1
          mbar_wait_cluster(mail_empty + mslot, mph ^ 1);
          st_cluster_u32(map_peer(sMail + 4u * (t & 1), 1), uint32_t(u));
          mbar_arrive_cluster(map_peer(mail_full + mslot, 1));
        } else {
          mbar_wait_cluster(mail_full + mslot, mph);
          u = ld_shared_s32(sMail + 4u * (t & 1));
          mbar_arrive_cluster(map_peer(mail_empty + mslot, 0));
        }
        mbar_wait(bars.q_empty(), (t & 1) ^ 1);
        if (u >= pairs) {
          st_shared_u32(slot + kSlotN, uint32_t(-1));
          mbar_arrive(bars.q_full());
          break;
        }
        const Member w = pair_member<kBM, kBN>(u, int(rank), m_tiles, p);
        const int kvh = w.h / (p.heads / p.kv_heads);
        write_slot(slot, w.m_block, w.h, w.b, w.n_own, w.n_pair - w.n_own);  // kSlotSkip = kSlotE0
        if (w.m_block >= 0)
          fwd_load_q<kD, kBM>(sQ, &tm_q, bars.q_full(), w.h, w.m_block * kBM, w.b);
        else
          mbar_arrive(bars.q_full());  // void member: the slot only
        const int kv_end = kv_it + w.n_pair;
        for (int g = kv_it; g < kv_end; ++g) {
          const int st = g % kStages;
          const uint32_t ph = (g / kStages) & 1;
          const uint32_t r = cluster_rank();
          const int row = (kv_end - 1 - g) * kBN + int(r) * kHalf;
          const uint32_t half = r * kHalf * 128;
          // The empty barriers complete when both CTAs released the stage.
          fwd_load_kv<kD, kBN>(bars, sK, sV, &tm_k, &tm_v, st, ph, kvh, w.b, McastLoad{row, half});
        }
        kv_it = kv_end;
        if (cluster_rank() == 0) u = grid_ctas() / 2 + (next_pair ? atomicAdd(next_pair, 1) : u);
      }
    }
  } else {
    // ---------------- consumers ----------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Cfg<kC>::kConsumerRegs));
    const int c = __shfl_sync(0xffffffffu, wg - 1, 0);
    const int lane = tid % 32, warp = (tid % 128) / 32;
    const bool is_signaller = (tid % 128) == 0;
    const uint32_t peer = cluster_rank() ^ 1u;
    // A K/V stage is free once both CTAs' consumers are done with it.
    auto release = [&](uint32_t bar) {
      mbar_arrive(bar);
      mbar_arrive_remote(map_peer(bar, peer));
    };

    const FwdConsumer<kD, kBN, kBM, kStages, kC> mma{sQ + c * 64 * 128, sK, sV, bars, {c}};
    mma.pp.start();

    int kv_it = 0;
    for (int t = 0;; ++t) {
      const uint32_t slot = sSlots + (t & 1) * kSlotBytes;
      mbar_wait(bars.q_full(), t & 1);
      const int n_blocks = ld_shared_s32(slot + kSlotN);
      if (n_blocks < 0) break;
      const int m_block = ld_shared_s32(slot + kSlotM), skip = ld_shared_s32(slot + kSlotSkip);
      kv_it = __shfl_sync(0xffffffffu, kv_it, 0);
      // The pair's newest key blocks that this tile does not see: wait for them, free them.
      for (int i = 0; i < skip; ++i) {
        const int g = kv_it + i, st = g % kStages;
        const uint32_t ph = (g / kStages) & 1;
        mbar_wait(bars.k_full(st), ph);
        if (is_signaller) release(bars.k_empty(st));
        mbar_wait(bars.v_full(st), ph);
        if (is_signaller) release(bars.v_empty(st));
      }
      kv_it += skip;
      const int m0 = m_block * kBM;
      const int row0 = m0 + c * 64 + warp * 16 + lane / 4;

      float o[kD / 2];
#pragma unroll
      for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
      float s[kBN / 2];
      uint32_t pf[kBN / 16][4];
      float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, resc[2];
      FwdAcc<kD, kBN> a{o, s, pf, m, l, resc};
      const int tile_row_lo = m0 + c * 64;
      const FwdMaskBlock mask{false, 0, n_blocks, tile_row_lo, row0, lane};  // dense masks only

      if (n_blocks == 0) {
        // No visible key (or a void member): O = 0, LSE = -inf for a real tile.
        if (is_signaller) mbar_arrive(bars.q_empty());
        if (m_block < 0) continue;
        const int h = ld_shared_s32(slot + kSlotH), b = ld_shared_s32(slot + kSlotB);
        fwd_store_empty<kD>(p, row0, lane, h, b);
        continue;
      }
      {  // first block: S alone
        const int st = kv_it % kStages;
        const uint32_t ph = (kv_it / kStages) & 1;
        mma.gemm_s(a, st, ph);
        if (is_signaller) {
          release(bars.k_empty(st));
          if (n_blocks == 1) mbar_arrive(bars.q_empty());
        }
        mask.apply<kBN, true>(s, p, 0);
        online_softmax<kBN>(s, m, l, resc, p.scale_log2);
        convert_p<kBN>(s, pf);
      }
      for (int it = 1; it < n_blocks; ++it) {
        const int g = __shfl_sync(0xffffffffu, kv_it + it, 0);
        const int st = g % kStages, pst = (g - 1) % kStages;
        const uint32_t ph = (g / kStages) & 1, pph = ((g - 1) / kStages) & 1;
        mma.gemm_s_pv(a, st, ph, pst, pph);
        if (is_signaller) {
          release(bars.k_empty(st));
          if (it == n_blocks - 1) mbar_arrive(bars.q_empty());
        }
        mask.apply<kBN, false>(s, p, it);
        online_softmax<kBN>(s, m, l, resc, p.scale_log2);
        mma.pv_done(a);
        if (is_signaller) release(bars.v_empty(pst));
        rescale_o<kD>(o, resc);
        convert_p<kBN>(s, pf);
      }
      const int last = kv_it + n_blocks - 1;
      const int st_last = last % kStages;
      {  // last P V
        const uint32_t ph = (last / kStages) & 1;
        mma.gemm_pv(a, st_last, ph);
        if (!L::kOInV && is_signaller) release(bars.v_empty(st_last));
      }
      kv_it += n_blocks;

      // ---------------- epilogue (the persistent kernel's, hopper_fwd_steps.cuh) ----------------
      const int h = ld_shared_s32(slot + kSlotH), b = ld_shared_s32(slot + kSlotB);
      float inv[2];
      fwd_store_lse(m, l, inv, p, row0, lane, h, b);
      fwd_store_o_tma<kD, kC, L::kOInV>(o, inv, sV + st_last * kTileKV, base + L::o, &tm_o, c, warp, lane, is_signaller,
                                        h, tile_row_lo, b, p, [&]() { release(bars.v_empty(st_last)); });
    }
    mma.pp.finish();
    if (is_signaller) bulk_wait<0>();
  }
  cluster_sync_all();  // the peer no longer arrives on our barriers nor writes our stages
#endif  // SEQPAR_HOPPER_STUB
}
}  // namespace cluster

// The launcher: launch_fwd_persist's checks and maps (K/V boxes of half a tile), a grid of
// 2 x the clusters that fit (capped at 2 x pairs and at max_grid rounded down to even, at least
// 2), units from the persistent kernel's counter. Tile lists and O that the TMA store cannot
// write (fp32, unaligned) go to launch_fwd_persist.
// head_chunk: FwdParams::head_chunk (-1: the rule, forward_head_chunk in hopper_args.hpp; a
// value that does not divide the heads counts as 1).
template <int kD, int kBN, int kC, int kStages = 2>
cudaError_t launch_fwd_cluster(const FwdArgs& a, cudaStream_t stream, int max_grid = 0, int head_chunk = -1) {
  constexpr int kBM = Cfg<kC>::kBM;
  const RowStrides ost = row_strides(a.o_st, a.seq_q, a.heads, kD);
  if (a.tiles.begin || a.o_f32 || (reinterpret_cast<uintptr_t>(a.o) & 15) || (ost.b | ost.s | ost.h) % 8 != 0)
    return launch_fwd_persist<kD, kBN, kC, true, true>(a, stream, true, max_grid);
  CUtensorMap tq, tk, tv, to;
  if (!fwd_tmaps(a, kD, kBM, kBN / 2, &tq, &tk, &tv) ||
      make_tmap(&to, a.o, a.batch, a.seq_q, a.heads, kD, 64, a.o_st) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  FwdParams p = fwd_params(a, kD, ost);
  p.head_chunk = head_chunk >= 0 ? head_chunk : forward_head_chunk(a);
  if (p.head_chunk < 1 || a.heads % p.head_chunk != 0) p.head_chunk = 1;
  auto kernel = cluster::fwd_cluster_kernel<kD, kBN, kC, kStages>;
  constexpr int smem = cluster::ClusterSmem<kD, kBN, kBM, kStages>::bytes;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const int64_t pairs = int64_t((a.seq_q + kBM - 1) / kBM + 1) / 2 * a.heads * a.batch;
  if (pairs == 0) return cudaSuccess;
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(Cfg<kC>::kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cfg.gridDim = dim3(2 * 132);
  int clusters = 0;
  if ((e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg)) != cudaSuccess) return e;
  int64_t n = std::min<int64_t>(pairs, std::max(clusters, 1));
  if (max_grid > 0) n = std::min<int64_t>(n, std::max(max_grid / 2, 1));
  cfg.gridDim = dim3(unsigned(2 * n));
  int* counter = nullptr;
  if (n < pairs) {
    if ((e = persist_counter(stream, &counter)) != cudaSuccess ||
        (e = cudaMemsetAsync(counter, 0, sizeof(int), stream)) != cudaSuccess)
      return e;
  }
  if ((e = cudaLaunchKernelEx(&cfg, kernel, tq, tk, tv, to, p, counter)) != cudaSuccess) return e;
  return cudaGetLastError();
}

}  // namespace seqpar::hopper
