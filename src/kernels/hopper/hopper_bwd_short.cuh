// The Hopper attention BACKWARD on short tiles, two CTAs per SM (issue 34, masks of short
// documents; dev/hopper_attention/README.md, "Backward on 64-key tiles for short lists"): the base
// backward (hopper_bwd.cuh, kDefer = false) with 64-key tiles and ONE consumer warpgroup, so that a
// CTA needs about 108 KB of shared memory and 128 registers a thread at launch and two CTAs fit on
// an SM: one CTA's fixed latency (K/V load, pipeline fill, the dK/dV epilogue, the next Q's load)
// runs under the other's GEMMs, where the base kernel (128-key tiles, one CTA per SM) leaves the
// tensor cores idle on a key tile that lists two or three query tiles.
// - Grid: one CTA per (64-key tile, KV head, batch); with tile lists, the lists' order
//   (listed_unit), the key tile's listed 64-row query tiles only (plan_tiles(m, .., 64, 64)).
// - Warpgroups (256 threads): WG0 the producer (setmaxnreg 24): warp 0 loads K, V once and per
//   step Q (2 stages) and dO (1 stage) with their LSE2 / D rows; warp 1 drains dQ. WG1 the
//   consumer (setmaxnreg 232), all 64 keys: S^T, dP^T (m64n64), P^T, dS^T as base; dV += P^T dO,
//   dK += dS^T Q (m64n128, A from registers); dQ = dS K in two column halves (m64n64 over the 64
//   keys, 32 registers each), the first while dK runs, each handed to the drain warp through ONE
//   16 KB buffer (cp.reduce.async.bulk into the zeroed fp32 accumulator, the base kernel's
//   fragment order: the same workspace and conversion kernel).
// - Shared memory (D = 128): K 16 KB, V 16 KB, Q 2 x 16 KB, dO 16 KB, dS^T 8 KB, dQ 16 KB, the
//   stats and barriers: 104.8 KB + 1 KB alignment slack.
// The backend runs it on lists of 64 x 64 tiles (plan_tiles chose them where short_bwd_pays
// says so, hopper_tiles.hpp; backward_kernel, hopper_args.hpp); the lab's variant "short64"
// (dev/hopper_attention/variants.cuh) runs it dense too.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/hopper/hopper_bwd_launch.cuh"

namespace seqpar::hopper {

namespace bwds {
constexpr int kD = 128, kBM = 64, kBN = 64, kThreads = 256;
constexpr int kProducerRegs = 24, kConsumerRegs = 232;
constexpr int kBarDS = 1;        // the consumer stored dS^T (128 threads)
constexpr int kBarDqEmpty = 2;   // the consumer may write the dQ buffer (128 + 32 threads)
constexpr int kBarDqFull = 3;    // the dQ buffer is written (128 + 32 threads)
}  // namespace bwds

struct BwdShortSmem {
  static constexpr int kTileQ = bwds::kBM * bwds::kD * 2;   // 16 KB
  static constexpr int kTileK = bwds::kBN * bwds::kD * 2;   // 16 KB
  static constexpr int kTileDS = bwds::kBN * bwds::kBM * 2; // 8 KB: [64 keys][64 queries] bf16
  static constexpr int kHalfDQ = bwds::kBM * (bwds::kD / 2) * 4;  // 16 KB: one dQ column half, fp32
  static constexpr int kStat = bwds::kBM * 4;
  static constexpr int k = 0;
  static constexpr int v = k + kTileK;
  static constexpr int q = v + kTileK;         // 2 stages
  static constexpr int dO = q + 2 * kTileQ;    // 1 stage
  static constexpr int ds = dO + kTileQ;
  static constexpr int dq = ds + kTileDS;
  static constexpr int lse = dq + kHalfDQ;     // 2 stages (with Q)
  static constexpr int dpsum = lse + 2 * kStat;  // 1 stage (with dO)
  static constexpr int bar = dpsum + kStat;
  static constexpr int kBars = 7;  // kv_full, q_full[2], q_empty[2], do_full, do_empty
  static constexpr int bytes = bar + 8 * kBars + 1024;
};
static_assert(2 * (BwdShortSmem::bytes + 1024) <= 228 * 1024, "two CTAs per SM");

template <bool kListed>
__global__ void __launch_bounds__(bwds::kThreads, 2)
    bwd_short_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                     const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                     const BwdParams p) {
#ifdef SEQPAR_HOPPER_STUB
  __trap();
#else
  using L = BwdShortSmem;
  using namespace bwds;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = base + L::k, sV = base + L::v, sQ = base + L::q, sdO = base + L::dO, sdS = base + L::ds;
  const uint32_t sDQ = base + L::dq, sLSE = base + L::lse, sDP = base + L::dpsum, sBar = base + L::bar;
  const uint32_t kv_full = sBar, do_full = sBar + 8u * 5, do_empty = sBar + 8u * 6;
  auto q_full = [&](int s) { return sBar + 8u * (1 + s); };
  auto q_empty = [&](int s) { return sBar + 8u * (3 + s); };

  // The CTA's key tile (keys n0 ..), K/V head, and query tiles.
  int rank = blockIdx.x, kvh = blockIdx.y, n_m = 0, e0 = 0, m_lo = 0;
  const int b = blockIdx.z, G = p.heads / p.kv_heads;
  const int n_m_total = (p.seq_q + kBM - 1) / kBM;
  int n_block;
  if constexpr (kListed) {
    listed_unit(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, p.tiles.heavy, &rank, &kvh);
    n_block = __ldg(p.tiles.order + rank);
    e0 = __ldg(p.tiles.begin + n_block);
    n_m = __ldg(p.tiles.begin + n_block + 1) - e0;
  } else {
    n_block = rank;
    if (p.causal) {
      const int x = n_block * kBN - p.causal_offset;
      m_lo = x > 0 ? x / kBM : 0;
    }
    n_m = n_m_total > m_lo ? n_m_total - m_lo : 0;
  }
  const int n0 = n_block * kBN, n_iter = n_m * G;
  auto entry = [&](int it) { return __ldg(p.tiles.entries + e0 + it % n_m); };
  auto q_tile = [&](int it) { return kListed ? entry(it) >> 2 : m_lo + it % n_m; };

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  if (tid == 0) {
    mbar_init(kv_full, 1);
    for (int s = 0; s < 2; ++s) {
      mbar_init(q_full(s), 1);
      mbar_init(q_empty(s), 1);
    }
    mbar_init(do_full, 1);
    mbar_init(do_empty, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer warpgroup ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    const int warp = tid / 32, lane = tid % 32;
    if (warp == 0 && lane == 0 && n_iter > 0) {
      mbar_expect_tx(kv_full, 2 * L::kTileK);
#pragma unroll
      for (int cb = 0; cb < 2; ++cb) tma_load_4d(sK + cb * kBN * 128, &tm_k, kv_full, cb * 64, kvh, n0, b);
#pragma unroll
      for (int cb = 0; cb < 2; ++cb) tma_load_4d(sV + cb * kBN * 128, &tm_v, kv_full, cb * 64, kvh, n0, b);
      for (int it = 0; it < n_iter; ++it) {
        const int h = kvh * G + it / n_m, m = q_tile(it);
        const int st = it & 1;
        const int64_t row_stat = (static_cast<int64_t>(b) * p.heads + h) * p.seq_q_pad + m * kBM;
        mbar_wait(q_empty(st), ((it >> 1) & 1) ^ 1);
        mbar_expect_tx(q_full(st), L::kTileQ + L::kStat);
#pragma unroll
        for (int cb = 0; cb < 2; ++cb)
          tma_load_4d(sQ + st * L::kTileQ + cb * kBM * 128, &tm_q, q_full(st), cb * 64, h, m * kBM, b);
        bulk_load(sLSE + st * L::kStat, p.lse2 + row_stat, L::kStat, q_full(st));
        mbar_wait(do_empty, (it & 1) ^ 1);
        mbar_expect_tx(do_full, L::kTileQ + L::kStat);
#pragma unroll
        for (int cb = 0; cb < 2; ++cb) tma_load_4d(sdO + cb * kBM * 128, &tm_do, do_full, cb * 64, h, m * kBM, b);
        bulk_load(sDP, p.dpsum + row_stat, L::kStat, do_full);
      }
    } else if (warp == 1 && n_iter > 0) {
      // dQ drain: per step, the two column halves in turn through the one buffer, each added to
      // the accumulator's 64-row tile (half c at c * 64 * 64 floats) with one bulk reduction and
      // the buffer handed back once the bulk engine has read it. One "empty" up front and none
      // after the last half: the named barriers' arrivals balance.
      named_bar_arrive(kBarDqEmpty, 160);
      for (int it = 0; it < n_iter; ++it) {
        const int64_t rows = (static_cast<int64_t>(b) * p.heads + kvh * G + it / n_m) * p.seq_q_pad + q_tile(it) * kBM;
        float* gtile = p.dq_acc + rows * kD;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          named_bar_sync(kBarDqFull, 160);
          if (lane == 0) {
            bulk_reduce_add_f32(gtile + c * (kBM * kD / 2), sDQ, L::kHalfDQ);
            bulk_commit();
            bulk_wait_read<0>();
          }
          __syncwarp();
          if (c == 0 || it + 1 < n_iter) named_bar_arrive(kBarDqEmpty, 160);
        }
      }
      if (lane == 0) bulk_wait<0>();
    }
    return;
  }

  // ---------------- consumer ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
  const int lane = tid % 32, warp = (tid % 128) / 32;
  const bool is_signaller = (tid % 128) == 0;
  const int key_r0 = n0 + warp * 16 + lane / 4;  // this thread's keys: key_r0, key_r0 + 8

  float dv[kD / 2], dk[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dv[i] = dk[i] = 0.f;
  float s[kBM / 2], dp[kBM / 2], dq[32];
  uint32_t pf[kBM / 16][4], dsf[kBM / 16][4];

  // Descriptors (as base, with 64-row K/V column blocks): K-major operands step k inside a
  // swizzle atom by +32 B and across 64-column blocks by a block; MN-major ones by 16 rows.
  auto desc_kmaj = [&](uint32_t tile, int kk) {  // K, V (A) or Q, dO (B), K-major, 64-row blocks
    return make_desc(tile, 16, 1024) + (((kk / 4) * 64 * 128 + (kk % 4) * 32) >> 4);
  };
  auto desc_qmn = [&](uint32_t tile, int kk) {  // Q or dO as B, MN-major (K = queries, N = d)
    return make_desc(tile, kBM * 128, 1024) + ((kk * 16 * 128) >> 4);
  };
  auto desc_ds = [&](uint32_t buf, int kk) {  // dS^T [keys][queries] as A = dS, M-major
    return make_desc(buf, kBN * 128, 1024) + ((kk * 16 * 128) >> 4);
  };
  auto desc_kmn = [&](uint32_t tk, int c, int kk) {  // K's column block c as B of dQ, MN-major
    return make_desc(tk + c * kBN * 128, kBN * 128, 1024) + ((kk * 16 * 128) >> 4);
  };
  auto opaque = [](uint32_t x) {
    uint32_t r;
    asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(x));
    return r;
  };
  // dQ column half c to the buffer in the accumulator's fragment order (base's consumer c's).
  auto handoff_dq = [&]() {
    named_bar_sync(kBarDqEmpty, 160);
#pragma unroll
    for (int jj = 0; jj < 8; ++jj)
      st_shared_v4(sDQ + ((warp * 8 + jj) * 32 + lane) * 16, dq[4 * jj], dq[4 * jj + 1], dq[4 * jj + 2], dq[4 * jj + 3]);
    fence_proxy_async();
    named_bar_arrive(kBarDqFull, 160);
  };

  if (n_iter > 0) mbar_wait(kv_full, 0);

  for (int it = 0; it < n_iter; ++it) {
    const int m = q_tile(it);
    const int q0 = m * kBM;
    const int st = it & 1;
    const uint32_t tQ = opaque(sQ + st * L::kTileQ), tdO = opaque(sdO);
    const uint32_t tK = opaque(sK), tV = opaque(sV), tdS = opaque(sdS);

    // S^T and dP^T, both in flight.
    mbar_wait(q_full(st), (it >> 1) & 1);
    fence_regs(s);
    fence_regs(dp);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) wgmma_ss_m64n64k16(s, desc_kmaj(tK, kk), desc_kmaj(tQ, kk), kk > 0 ? 1 : 0);
    wgmma_commit();
    mbar_wait(do_full, it & 1);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) wgmma_ss_m64n64k16(dp, desc_kmaj(tV, kk), desc_kmaj(tdO, kk), kk > 0 ? 1 : 0);
    wgmma_commit();

    // Row statistics of this thread's query columns 8 j + 2 (lane % 4) + {0, 1}, read at use
    // (preloaded as base does, their 32 registers made ptxas serialize the wgmmas at 232).
    auto stat = [&](uint32_t at, int j) { return ld_shared_f2(at + (8 * j + 2 * (lane % 4)) * 4); };

    wgmma_wait<1>();
    fence_regs(s);
    // P^T = exp2(S^T * scale * log2(e) - LSE2): s[4j + e] is key key_r0 + 8 (e >> 1), query
    // q0 + 8j + 2 (lane % 4) + (e & 1).
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j) {
      const float2 lj = stat(sLSE + st * L::kStat, j);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float l2 = (e & 1) ? lj.y : lj.x;
        s[4 * j + e] = fast_exp2(fmaf(s[4 * j + e], p.scale_log2, -l2));
      }
    }
    if constexpr (kListed) {
      const int flags = entry(it) & 3;
      if (flags != 0) apply_tile_mask_t<64, true>(s, p.tiles, q0, key_r0, p.seq_k, lane, flags);
    } else {
      if (n0 + kBN > p.seq_k || (p.causal && n0 + kBN - 1 > q0 + p.causal_offset)) {
#pragma unroll
        for (int j = 0; j < kBM / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key_r0 + 8 * (e >> 1);
            const int q = q0 + 8 * j + 2 * (lane % 4) + (e & 1);
            if (key >= p.seq_k || (p.causal && key > q + p.causal_offset)) s[4 * j + e] = 0.f;
          }
      }
    }

    wgmma_wait<0>();
    fence_regs(dp);
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j) {
      const float2 dj = stat(sDP, j);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float dd = (e & 1) ? dj.y : dj.x;
        dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - dd);
      }
    }
    convert_p<kBM>(s, pf);
    convert_p<kBM>(dp, dsf);

    // dV += P^T dO (P^T from registers).
    fence_regs(dv);
    fence_regs(pf);
    fence_regs(dsf);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk) wgmma_pv<kD>(dv, pf[kk], desc_qmn(tdO, kk));
    wgmma_commit();

    // dS^T to shared memory: rows = keys, 128 B = 64 queries per row, 128-byte swizzled (16-byte
    // chunk c of row r at c ^ (r % 8)). The previous step's dQ GEMMs, which read it, are done.
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = warp * 16 + lane / 4 + 8 * (r & 1);
        const int chunk = (2 * kk + (r >> 1)) ^ (row & 7);
        st_shared_u32(tdS + row * 128 + chunk * 16 + 4 * (lane % 4), dsf[kk][r]);
      }
    fence_proxy_async();
    named_bar_sync(kBarDS, 128);

    // dQ[:, 0:64] = dS K[:, 0:64] (64 keys), then dK += dS^T Q (dS^T from registers).
    fence_regs(dq);
    fence_regs(dk);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) wgmma_ss_m64n64k16_tt(dq, desc_ds(tdS, kk), desc_kmn(tK, 0, kk), kk > 0 ? 1 : 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk) wgmma_pv<kD>(dk, dsf[kk], desc_qmn(tQ, kk));
    wgmma_commit();

    wgmma_wait<1>();  // dV and dQ's first half are done; dK may still run
    fence_regs(dv);
    fence_regs(pf);
    fence_regs(dq);
    if (is_signaller) mbar_arrive(do_empty);
    handoff_dq();

    // dQ[:, 64:128] while dK finishes.
    fence_regs(dq);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) wgmma_ss_m64n64k16_tt(dq, desc_ds(tdS, kk), desc_kmn(tK, 1, kk), kk > 0 ? 1 : 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(dk);
    fence_regs(dsf);
    fence_regs(dq);
    if (is_signaller) mbar_arrive(q_empty(st));
    handoff_dq();
  }
  bwd_store_dkv<kD>(dk, dv, p, key_r0, kvh, b, lane);
#endif  // SEQPAR_HOPPER_STUB
}

// The whole backward around bwd_short_kernel<kListed> (launch_bwd_with's prologue, workspace and
// dQ conversion, with 64-key tiles): zero the accumulator, preprocess, the main kernel on one CTA
// per (64-key tile, KV head, batch), convert dQ. D = 128 only; kListed: tile lists (a.tiles.begin
// set), planned with 64-row query tiles and 64-key tiles; else the dense masks (the lab's only).
// *ctas_per_sm (if given): the CTAs per SM the occupancy API allows.
template <bool kListed>
cudaError_t launch_bwd_short(const BwdArgs& a, cudaStream_t stream, int* ctas_per_sm = nullptr) {
  using namespace bwds;
  if (a.head_dim != kD || (a.tiles.begin != nullptr) != kListed) return cudaErrorInvalidValue;
  const int pad = bwd_seq_pad(a.seq_q, kBM), n_mtiles = pad / kBM;
  float* dq_acc = static_cast<float*>(a.workspace);
  float* lse2 = dq_acc + static_cast<size_t>(a.batch) * a.heads * pad * kD;
  float* dpsum = lse2 + static_cast<size_t>(a.batch) * a.heads * pad;
  CUtensorMap tq, tk, tv, tdo;
  if (make_tmap(&tq, a.q, a.batch, a.seq_q, a.heads, kD, kBM, a.q_st) != CUDA_SUCCESS ||
      make_tmap(&tk, a.k, a.batch, a.seq_k, a.kv_heads, kD, kBN, a.k_st) != CUDA_SUCCESS ||
      make_tmap(&tv, a.v, a.batch, a.seq_k, a.kv_heads, kD, kBN, a.v_st) != CUDA_SUCCESS ||
      make_tmap(&tdo, a.dout, a.batch, a.seq_q, a.heads, kD, kBM, a.dout_st) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  BwdParams p{};
  cudaError_t e = bwd_prologue<kD>(a, stream, pad, n_mtiles, dq_acc, nullptr, lse2, dpsum, &p);
  if (e != cudaSuccess) return e;
  auto kernel = bwd_short_kernel<kListed>;
  constexpr int smem = BwdShortSmem::bytes;
  if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) != cudaSuccess) return e;
  if (ctas_per_sm && (e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, kernel, kThreads, smem)) != cudaSuccess)
    return e;
  const int n_tiles = (a.seq_k + kBN - 1) / kBN;
  const dim3 grid(n_tiles, a.kv_heads, a.batch);
  if (a.main_only != 2) {
    kernel<<<grid, kThreads, smem, stream>>>(tq, tk, tv, tdo, p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  return bwd_convert_dq<kD>(a, stream, pad, n_mtiles, dq_acc, nullptr, p.scale, true, false);
}

}  // namespace seqpar::hopper
