// The Hopper attention FORWARD kernel, persistent: the same math, masks and contract as
// fwd_kernel (hopper_fwd.cuh: overlap + ping-pong, 2 K/V stages), but a grid of one CTA per SM
// (two with one consumer warpgroup: the short-tile forward on 64 x 64 tiles) that walks work
// tiles (query tile, head, batch) in the order the one-CTA-per-tile grids launch them, and an O
// epilogue through shared memory with a TMA store.
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
// The loads, GEMM steps, masks and epilogue pieces are shared with the other forward kernels
// (hopper_fwd_steps.cuh, hopper_fwd_math.cuh); this file holds the schedule (units, slots, the
// Q ring across tiles), the consumers' loop over a tile's key blocks and the launcher.
#pragma once

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/hopper/hopper_fwd.cuh"

namespace seqpar::hopper {

// A unit's slot in shared memory: m_block, h, b, n_blocks (-1: no more units), e0.
enum : int { kSlotM = 0, kSlotH = 4, kSlotB = 8, kSlotN = 12, kSlotE0 = 16, kSlotBytes = 32 };

// Shared memory of the persistent kernel: fwd_kernel's (kStages K/V stages), plus an O buffer when
// it fits beside them and the kTail bytes after the barriers (else O is staged in a V stage),
// plus the Q empty barrier and two unit slots. The cluster kernel adds its mailbox (ClusterSmem).
template <int kD, int kBN, int kBM, int kStages = 2, int kTail = 8>
struct PersistSmem {
  using Base = Smem<kD, kBN, kStages, kBM>;
  static constexpr int kTileO = kBM * kD * 2;
  static constexpr int kMaxSmem = 227 * 1024;
  static constexpr bool kOInV = Base::bytes + kTileO + kTail > kMaxSmem;
  static_assert(!kOInV || kTileO <= Base::kTileKV, "O fits one V stage");
  static constexpr int o = Base::bar;  // the separate O buffer (unused with kOInV)
  static constexpr int bar = kOInV ? Base::bar : Base::bar + kTileO;
  static constexpr int kBars = Base::kBars + 1;  // fwd_kernel's, then q_empty
  static constexpr int slots = bar + 8 * kBars;  // two unit slots (kSlotBytes each)
  static constexpr int bytes = slots + 2 * kSlotBytes + 1024;
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
    chunked_unit(r, m_tiles, group, &x, &y);
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
    w.n_blocks = causal_blocks<kBM, kBN>(w.n_blocks, w.m_block * kBM, p);
  }
  return w;
}

__device__ __forceinline__ int ld_shared_s32(uint32_t addr) {
  int v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
// The producer's record of a unit for the consumers (the arrival on q_full that follows releases
// these stores to them).
__device__ __forceinline__ void write_slot(uint32_t slot, int m_block, int h, int b, int n_blocks, int e0) {
  st_shared_u32(slot + kSlotM, m_block);
  st_shared_u32(slot + kSlotH, h);
  st_shared_u32(slot + kSlotB, b);
  st_shared_u32(slot + kSlotN, n_blocks);
  st_shared_u32(slot + kSlotE0, e0);
}

// next_unit: a counter that is 0 at launch (the dynamic schedule), or nullptr (static stride).
// kTmaO: O through shared memory and a TMA store (else 4-byte stores from registers, as
// fwd_kernel: the ablation that tells the store's share). kUniform: the consumer index and the K/V
// stage counter go through warp broadcasts (__shfl_sync from lane 0), so that ptxas knows they are
// warp-uniform and builds the wgmma descriptors in uniform registers (fwd_kernel's kUniform).
// kC = 1, the short-tile forward (64 x 64 tiles on lists of short documents, windows and block
// patterns; hopper_tiles.hpp's short_tiles_pay): one consumer warpgroup, no ping-pong turns (a lone
// warpgroup would pass the turn to itself; the overlap of S of block j + 1 with P V of block j
// stays), O in its own buffer, and launch bounds for two CTAs per SM (128 registers a thread at
// launch; setmaxnreg 24 / 232), so that one CTA's per-tile latency (the Q load, a list of one to
// three key tiles, the epilogue) runs under the other's GEMMs (dev/hopper_attention/README.md,
// "Forward on 64 x 64 tiles for short lists").
template <int kD, int kBN, int kC, bool kTmaO, bool kUniform = false, int kOrder = 0>
__global__ void __launch_bounds__(Cfg<kC>::kThreads, kC == 1 ? 2 : 1)
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
  static_assert(kC < kFwdBarAllPv, "named barrier ids: the ping-pong turns, then the O store's");
  static_assert(kC > 1 || (!L::kOInV && 2 * L::bytes + 2 * 1024 <= 228 * 1024), "one consumer: two CTAs per SM");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base + L::Base::q, sK = base + L::Base::k, sV = base + L::Base::v, sSlots = base + L::slots;
  const FwdBars<kStages> bars{base + L::bar};

  const bool listed = p.tiles.begin != nullptr;
  const int m_tiles = (p.seq_q + kBM - 1) / kBM;
  const int units = m_tiles * p.heads * p.batch;

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  if (tid == 0) {
    bars.init(kC, kC);
    fence_bar_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Cfg<kC>::kProducerRegs));
    if (tid == 0) {
      int kv_it = 0, t = 0;
      for (int u = blockIdx.x;; ++t) {
        const uint32_t slot = sSlots + (t & 1) * kSlotBytes;
        mbar_wait(bars.q_empty(), (t & 1) ^ 1);  // the consumers are done with the previous tile's Q
        if (u >= units) {  // no more: tell the consumers
          st_shared_u32(slot + kSlotN, uint32_t(-1));
          mbar_arrive(bars.q_full());
          break;
        }
        const FwdUnit w = fwd_unit<kBM, kBN, kOrder>(u, m_tiles, p);
        const int kvh = w.h / (p.heads / p.kv_heads);
        write_slot(slot, w.m_block, w.h, w.b, w.n_blocks, w.e0);
        fwd_load_q<kD, kBM>(sQ, &tm_q, bars.q_full(), w.h, w.m_block * kBM, w.b);
        for (int it = 0; it < w.n_blocks; ++it) {
          const int n_block = listed ? __ldg(p.tiles.entries + w.e0 + it) >> 2 : w.n_blocks - 1 - it;
          const int g = kv_it + it;
          fwd_load_kv<kD, kBN>(bars, sK, sV, &tm_k, &tm_v, g % kStages, (g / kStages) & 1, kvh, w.b,
                               FwdTmaLoad<kBN>{n_block});
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
  const int c = kC == 1 ? 0 : kUniform ? __shfl_sync(0xffffffffu, wg - 1, 0) : wg - 1;
  const int lane = tid % 32, warp = (tid % 128) / 32;
  const bool is_signaller = (tid % 128) == 0;

  const FwdConsumer<kD, kBN, kBM, kStages, kC, (kC > 1)> mma{sQ + c * 64 * 128, sK, sV, bars, {c}};
  if constexpr (kC > 1) mma.pp.start();

  int kv_it = 0;
  for (int t = 0;; ++t) {
    const uint32_t slot = sSlots + (t & 1) * kSlotBytes;
    mbar_wait(bars.q_full(), t & 1);
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

    FwdAcc<kD, kBN> a{o, s, pf, m, l, resc};
    const int tile_row_lo = m0 + c * 64;
    const FwdMaskBlock mask{listed, e0, n_blocks, tile_row_lo, row0, lane};

    if constexpr (kUniform) kv_it = __shfl_sync(0xffffffffu, kv_it, 0);
    if (n_blocks == 0) {
      // No visible key: O = 0, LSE = -inf, plain stores (no V stage to stage O in).
      if (is_signaller) mbar_arrive(bars.q_empty());
      const int h = ld_shared_s32(slot + kSlotH), b = ld_shared_s32(slot + kSlotB);
      fwd_store_empty<kD>(p, row0, lane, h, b);
      continue;
    }
    {  // first block: S alone
      const int st = kv_it % kStages;
      const uint32_t ph = (kv_it / kStages) & 1;
      mma.gemm_s(a, st, ph);
      if (is_signaller) {
        mbar_arrive(bars.k_empty(st));
        if (n_blocks == 1) mbar_arrive(bars.q_empty());
      }
      mask.apply<kBN, true>(s, p, 0);
      online_softmax<kBN>(s, m, l, resc, p.scale_log2);
      convert_p<kBN>(s, pf);
    }
    for (int it = 1; it < n_blocks; ++it) {
      const int g = kUniform ? __shfl_sync(0xffffffffu, kv_it + it, 0) : kv_it + it;
      const int st = g % kStages, pst = (g - 1) % kStages;
      const uint32_t ph = (g / kStages) & 1, pph = ((g - 1) / kStages) & 1;
      mma.gemm_s_pv(a, st, ph, pst, pph);
      if (is_signaller) {
        mbar_arrive(bars.k_empty(st));
        if (it == n_blocks - 1) mbar_arrive(bars.q_empty());  // the tile's last Q K^T is done
      }
      if (mask.pattern(p, it)) {
        mma.pv_done(a);
        if (is_signaller) mbar_arrive(bars.v_empty(pst));
        mask.apply<kBN, true>(s, p, it);
        online_softmax<kBN>(s, m, l, resc, p.scale_log2);
      } else {
        mask.apply<kBN, false>(s, p, it);
        online_softmax<kBN>(s, m, l, resc, p.scale_log2);
        mma.pv_done(a);
        if (is_signaller) mbar_arrive(bars.v_empty(pst));
      }
      rescale_o<kD>(o, resc);
      convert_p<kBN>(s, pf);
    }
    const int last = kv_it + n_blocks - 1;
    const int st_last = last % kStages;
    {  // last P V
      const uint32_t ph = (last / kStages) & 1;
      mma.gemm_pv(a, st_last, ph);
      if ((!kTmaO || !L::kOInV) && is_signaller) mbar_arrive(bars.v_empty(st_last));
    }
    kv_it += n_blocks;

    // ---------------- epilogue: LSE, O / l to bf16 through shared memory, TMA store ----------------
    const int h = ld_shared_s32(slot + kSlotH), b = ld_shared_s32(slot + kSlotB);
    float inv[2];
    fwd_store_lse(m, l, inv, p, row0, lane, h, b);
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
    fwd_store_o_tma<kD, kC, L::kOInV>(o, inv, sV + st_last * kTileKV, base + L::o, &tm_o, c, warp, lane, is_signaller,
                                      h, tile_row_lo, b, p, [&]() { mbar_arrive(bars.v_empty(st_last)); });
  }
  if constexpr (kC > 1) mma.pp.finish();
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
// otherwise this launches fwd_kernel (kC = 1: refuses it, cudaErrorInvalidValue; the backend
// gives that kernel a bf16 part, forward_writes_o). max_grid > 0 caps the grid (the lab's checks
// use it, so that each CTA of a small problem walks several units).
template <int kD, int kBN, int kC, bool kTmaO = true, bool kUniform = false, int kOrder = 0>
cudaError_t launch_fwd_persist(const FwdArgs& a, cudaStream_t stream, bool dynamic = true, int max_grid = 0) {
  constexpr int kBM = Cfg<kC>::kBM;
  const RowStrides ost = row_strides(a.o_st, a.seq_q, a.heads, kD);
  if (a.o_f32 || (reinterpret_cast<uintptr_t>(a.o) & 15) || (ost.b | ost.s | ost.h) % 8 != 0) {
    if constexpr (kC == 1) return cudaErrorInvalidValue;
    else return launch_fwd<kD, kBN, 2, true, true, kC>(a, stream);
  }
  CUtensorMap tq, tk, tv, to;
  if (!fwd_tmaps(a, kD, kBM, kBN, &tq, &tk, &tv) ||
      make_tmap(&to, a.o, a.batch, a.seq_q, a.heads, kD, 64, a.o_st) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  const FwdParams p = fwd_params(a, kD, ost);
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
