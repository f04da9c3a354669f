// The Hopper attention FORWARD on short tiles, persistent, two CTAs per SM (issue 34, masks of
// short documents; dev/hopper_attention/README.md, "Forward on 64 x 64 tiles for short lists"):
// the persistent forward's math, masks, schedule and contract (hopper_fwd_persist.cuh) with
// 64-row query tiles, kBN-key tiles (64) and ONE consumer warpgroup, so that a CTA needs about
// 97 KB of shared memory and 128 registers a thread at launch and two CTAs fit on an SM: one
// CTA's per-tile latency (the unit's Q load, a list of one to three key tiles, the epilogue)
// runs under the other's GEMMs, where the 128 x 192 kernel on one CTA per SM leaves the tensor
// cores idle between its short units.
// - Grid: (CTAs per SM that fit, 2 expected) x SMs; units in fwd_unit's order (the lists'
//   listed_unit order, or the dense launch order), the next from a global counter, as the
//   persistent kernel does.
// - One consumer: no ping-pong turns (PingPong<1, false>: a lone warpgroup would only pass the
//   turn to itself); the intra-warpgroup overlap stays (S of block j + 1 with P V of block j).
// - Registers: launch bounds of 2 x 256 threads (128 a thread); setmaxnreg gives the producer 24
//   and the consumer 232 (Cfg<1>).
// - Shared memory (D = 128, 64 keys): Q 16 KB + 2 stages x (K + V) 64 KB + O 16 KB (its own
//   buffer: each consumer waits for its previous TMA store's reads before writing it again).
// Tile lists must be planned with 64-row query tiles and kBN-key tiles (plan_tiles(m, 64, kBN, ..)).
// O must be bf16 with 16-byte aligned strides (the TMA store): otherwise the launcher refuses.
#pragma once

#include <algorithm>

#include "kernels/hopper/hopper_fwd_persist.cuh"

namespace seqpar::hopper {

template <int kD, int kBN>
__global__ void __launch_bounds__(Cfg<1>::kThreads, 2)
    fwd_short_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                     const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o,
                     const FwdParams p, int* next_unit) {
  static_assert(kD == 64 || kD == 128, "head dim 64 or 128");
  static_assert(kBN % 16 == 0 && kBN <= 256, "key tile: whole wgmma k-steps, one TMA box");
#ifdef SEQPAR_HOPPER_STUB
  __trap();
#else
  constexpr int kStages = 2, kC = 1;
  constexpr int kBM = Cfg<kC>::kBM;
  using L = PersistSmem<kD, kBN, kBM>;
  static_assert(!L::kOInV, "O has its own buffer");
  static_assert(2 * L::bytes + 2 * 1024 <= 228 * 1024, "two CTAs per SM");
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
    // ---------------- producer (as the persistent kernel's) ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Cfg<kC>::kProducerRegs));
    if (tid == 0) {
      int kv_it = 0, t = 0;
      for (int u = blockIdx.x;; ++t) {
        const uint32_t slot = sSlots + (t & 1) * kSlotBytes;
        mbar_wait(bars.q_empty(), (t & 1) ^ 1);
        if (u >= units) {
          st_shared_u32(slot + kSlotN, uint32_t(-1));
          mbar_arrive(bars.q_full());
          break;
        }
        const FwdUnit w = fwd_unit<kBM, kBN, 0>(u, m_tiles, p);
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
        u = next_unit ? int(gridDim.x) + atomicAdd(next_unit, 1) : u + int(gridDim.x);
      }
    }
    return;
  }

  // ---------------- the consumer ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Cfg<kC>::kConsumerRegs));
  const int lane = tid % 32, warp = (tid % 128) / 32;
  const bool is_signaller = (tid % 128) == 0;

  const FwdConsumer<kD, kBN, kBM, kStages, kC, false> mma{sQ, sK, sV, bars, {0}};

  int kv_it = 0;
  for (int t = 0;; ++t) {
    const uint32_t slot = sSlots + (t & 1) * kSlotBytes;
    mbar_wait(bars.q_full(), t & 1);
    const int n_blocks = ld_shared_s32(slot + kSlotN);
    if (n_blocks < 0) break;
    const int m0 = ld_shared_s32(slot + kSlotM) * kBM, e0 = ld_shared_s32(slot + kSlotE0);
    const int row0 = m0 + warp * 16 + lane / 4;  // this thread's rows: row0, row0 + 8

    float o[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
    float s[kBN / 2];
    uint32_t pf[kBN / 16][4];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, resc[2];

    FwdAcc<kD, kBN> a{o, s, pf, m, l, resc};
    const FwdMaskBlock mask{listed, e0, n_blocks, m0, row0, lane};

    if (n_blocks == 0) {
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
      const int g = kv_it + it;
      const int st = g % kStages, pst = (g - 1) % kStages;
      const uint32_t ph = (g / kStages) & 1, pph = ((g - 1) / kStages) & 1;
      mma.gemm_s_pv(a, st, ph, pst, pph);
      if (is_signaller) {
        mbar_arrive(bars.k_empty(st));
        if (it == n_blocks - 1) mbar_arrive(bars.q_empty());
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
      if (is_signaller) mbar_arrive(bars.v_empty(st_last));
    }
    kv_it += n_blocks;

    // ---------------- epilogue: LSE, O / l to bf16 through O's buffer, TMA store ----------------
    const int h = ld_shared_s32(slot + kSlotH), b = ld_shared_s32(slot + kSlotB);
    float inv[2];
    fwd_store_lse(m, l, inv, p, row0, lane, h, b);
    fwd_store_o_tma<kD, kC, false>(o, inv, 0u, base + L::o, &tm_o, 0, warp, lane, is_signaller, h, m0, b, p,
                                   []() {});
  }
  if (is_signaller) bulk_wait<0>();  // the O stores are complete before the CTA exits
#endif  // SEQPAR_HOPPER_STUB
}

// The short-tile forward: fwd_short_kernel on a grid of (CTAs that fit per SM) x SMs, units from
// the stream's counter (zeroed before the launch; persist_counter). O must be bf16 with 16-byte
// aligned strides (else cudaErrorInvalidValue: no fallback kernel is instantiated). max_grid > 0
// caps the grid (the lab's checks); *ctas_per_sm, if given, receives the occupancy the grid used.
template <int kD, int kBN>
cudaError_t launch_fwd_short(const FwdArgs& a, cudaStream_t stream, int max_grid = 0, int* ctas_per_sm = nullptr) {
  constexpr int kBM = Cfg<1>::kBM;
  const RowStrides ost = row_strides(a.o_st, a.seq_q, a.heads, kD);
  if (a.o_f32 || (reinterpret_cast<uintptr_t>(a.o) & 15) || (ost.b | ost.s | ost.h) % 8 != 0)
    return cudaErrorInvalidValue;
  CUtensorMap tq, tk, tv, to;
  if (!fwd_tmaps(a, kD, kBM, kBN, &tq, &tk, &tv) ||
      make_tmap(&to, a.o, a.batch, a.seq_q, a.heads, kD, 64, a.o_st) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  const FwdParams p = fwd_params(a, kD, ost);
  auto kernel = fwd_short_kernel<kD, kBN>;
  constexpr int smem = PersistSmem<kD, kBN, kBM>::bytes;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  int device = 0, sms = 0, per_sm = 0;
  if ((e = cudaGetDevice(&device)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess ||
      (e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Cfg<1>::kThreads, smem)) != cudaSuccess)
    return e;
  if (ctas_per_sm) *ctas_per_sm = per_sm;
  const int64_t units = int64_t((a.seq_q + kBM - 1) / kBM) * a.heads * a.batch;
  if (units == 0) return cudaSuccess;
  int grid = int(std::min<int64_t>(units, int64_t(sms) * std::max(per_sm, 1)));
  if (max_grid > 0) grid = std::min(grid, max_grid);
  int* counter = nullptr;
  if (grid < units) {
    if ((e = persist_counter(stream, &counter)) != cudaSuccess ||
        (e = cudaMemsetAsync(counter, 0, sizeof(int), stream)) != cudaSuccess)
      return e;
  }
  kernel<<<grid, Cfg<1>::kThreads, smem, stream>>>(tq, tk, tv, to, p, counter);
  return cudaGetLastError();
}

}  // namespace seqpar::hopper
