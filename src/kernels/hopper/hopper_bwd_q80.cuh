// The Hopper attention backward's main kernel at D = 128 with 80-row query tiles, "q80"
// (dev/hopper_attention/README.md, "Backward at D = 128: 80-row query tiles"): FlashAttention-3's
// non-causal hdim-128 tile shape written in our own PTX, the backend's dense D = 128 backward (it
// takes tile lists too, kListed; the backend keeps base for those, README "Masked backward at
// D = 128 on q80"): one CTA per (128-key tile, KV head, batch), two consumer
// warpgroups of 64 keys each, per 80-row query tile:
//   S^T  = K_w Q^T, dP^T = V_w dO^T      m64n80 (A = K or V, B = Q or dO, both K-major)
//   P^T, dS^T as in the library's kernel (hopper_bwd.cuh), 40 accumulators per thread
//   dV += P^T dO, dK += dS^T Q          m64n128, A from registers, 5 k-steps of 16 queries
//   dS^T -> shared memory with stmatrix .trans, i.e. as dS [80 queries][128 keys] (keys
//           contiguous, in two 64-key blocks, 128-byte swizzled; consumer w writes block w)
//   dQ^T_w = K[:, w half]^T dS^T          m64n80 over all 128 keys: A = K (M-major: d is
//           contiguous in K's rows), B = dS (K-major); consumer w computes d columns 64w..64w+63
//           of all 80 rows. (dQ itself would be an m80 GEMM, which wgmma does not have.)
// Against the 64-row kernel: the same per-tile fixed costs (waits, barriers, the dQ hand-off)
// for 1.25x the GEMM work, and dQ's A operand (K, 16 KB per consumer) read once per 80 rows.
// The fp32 dQ accumulator keeps each 80-row tile as [consumer w][warp][jj (10)][lane][4] (the
// dQ^T fragment order: float4 jj of lane l is d = 64w + 16 warp + l/4 (+8), query 8jj + 2(l%4)
// (+1)); bwd_convert_dq_q80_kernel (hopper_bwd_launch.cuh) turns it into dQ. Rows are padded to
// a multiple of 640 (80 and 128 divide it; lab_workspace_bytes), the padding rows with LSE2 =
// +inf, so their P and dS are 0.
// Masks: full, causal with offset, and visible-tile lists (hopper_tiles.hpp, planned with 80-row
// query tiles, tile_shape(128).bwd_bm_tall, where tall_tiles_pay chose them; the boundary tiles'
// element masks are hopper_mask.cuh's, as in hopper_bwd.cuh). Shared memory: K, V 32 KB each,
// Q, dO 2 x 20 KB each, dS 2 x 20 KB, dQ 2 x 20 KB: 226 KB of the 227.
#pragma once

#include <cstdint>

#include "kernels/hopper/hopper_bwd_params.cuh"
#include "kernels/hopper/hopper_bwd_steps.cuh"
#include "kernels/hopper/hopper_fwd.cuh"  // the PTX helpers, convert_p, wgmma_pv
#include "kernels/hopper/hopper_mask.cuh"
#include "kernels/hopper/hopper_ptx.cuh"
#include "kernels/hopper/wgmma_bwd_ops.cuh"

namespace seqpar::hopper {

struct BwdQ80Smem {
  static constexpr int kD = 128, kQ = bwd::kQ80, kBN = bwd::kBN;
  static constexpr int kTileQ = kQ * kD * 2;     // Q or dO tile, bf16: [2 column blocks][80][128 B]
  static constexpr int kTileK = kBN * kD * 2;    // K or V tile
  static constexpr int kTileDS = kQ * kBN * 2;   // dS [2 key blocks][80 queries][128 B]
  static constexpr int kHalfDQ = kQ * 64 * 4;    // one consumer's fp32 dQ part (80 x 64)
  static constexpr int kStat = kQ * 4;
  static constexpr int k = 0, v = k + kTileK, q = v + kTileK, dO = q + 2 * kTileQ, ds = dO + 2 * kTileQ;
  static constexpr int dq = ds + 2 * kTileDS, lse = dq + 2 * kHalfDQ, dpsum = lse + 2 * kStat, bar = dpsum + 2 * kStat;
  static constexpr int kBars = 9;  // BwdBars: kv_full, q_full[2], q_empty[2], do_full[2], do_empty[2]
  static constexpr int bytes = bar + 8 * kBars + 1024;
  static_assert(bytes <= 227 * 1024, "shared memory");
  static_assert(ds % 1024 == 0 && kTileQ % 1024 == 0 && kTileDS % 1024 == 0, "swizzle atoms");
};

// kListed: the backward's tile lists (p.tiles, per key tile its listed 80-row query tiles), else the
// dense masks; a template parameter so that the dense kernel compiles to the same SASS as before
// the lists came in (dev/hopper_attention/README.md, "Masked backward at D = 128 on q80").
template <bool kListed>
__global__ void __launch_bounds__(bwd::kThreads, 1)
    bwd_q80_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                   const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                   const BwdParams p) {
#ifdef SEQPAR_HOPPER_STUB
  __trap();  // a device pass without sm_90a features: never launched (device_refusal)
#else
  using L = BwdQ80Smem;
  using namespace bwd;
  constexpr int kD = 128, kQ = kQ80;
  // Query rows per call of the boundary tiles' element mask (a divisor of 80, a multiple of 8):
  // 16 (ptxas, nvcc 13.0: 0 spills, no C7512); all 80 at once spilled 28 bytes and serialized
  // the wgmmas (C7512), 40 serialized them.
  constexpr int kMaskRows = 16;
  static_assert(kQ % kMaskRows == 0 && kMaskRows % 8 == 0, "mask pieces of whole 8-query columns");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = base + L::k, sV = base + L::v, sQ = base + L::q, sdO = base + L::dO, sdS = base + L::ds;
  const uint32_t sDQ = base + L::dq, sLSE = base + L::lse, sDP = base + L::dpsum, sBar = base + L::bar;
  const BwdBars bars{sBar};

  // The CTA's key tile, K/V head and query tiles as the 64-row kernel's (BwdUnit), of 80-row
  // query tiles (tile lists of them: tile_shape(128).bwd_bm_tall).
  constexpr bool listed = kListed;
  const BwdUnit<kQ> u = BwdUnit<kQ>::of(p, listed);
  const int kvh = u.kvh, b = u.b, G = u.G, n0 = u.n0, n_m = u.n_m, n_iter = u.n_iter;
  auto q_tile = [&](int it) { return u.q_tile(p, it); };

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  if (tid == 0) bars.init();
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer warpgroup: loads (warp 0) and the dQ drain (warp 1) ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    const int warp = tid / 32, lane = tid % 32;
    if (warp == 0 && lane == 0 && n_iter > 0) {
      bwd_load_tiles<2, kQ, L>(bars, &tm_q, &tm_k, &tm_v, &tm_do, sK, sV, sQ, sdO, sLSE, sDP, p, n_iter, n_m, G, kvh,
                               n0, b, q_tile);
    } else if (warp == 1 && n_iter > 0) {
      // consumer w's part: 80 rows x its 64 columns, fp32, 20 KB
      bwd_drain_dq<kD, L::kHalfDQ>(sDQ, p, n_iter, lane, [&](int it) {
        return (static_cast<int64_t>(b) * p.heads + kvh * G + it / n_m) * p.seq_q_pad + q_tile(it) * kQ;
      });
    }
    return;
  }

  // ---------------- consumers ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
  const int w = wg - 1;  // keys w*64 .. w*64+63 of the tile; dQ columns w*64 ..
  const int lane = tid % 32, warp = (tid % 128) / 32;
  const bool is_signaller = (tid % 128) == 0;
  const int key_r0 = n0 + w * 64 + warp * 16 + lane / 4;  // this thread's keys: key_r0, key_r0 + 8

  float dv[kD / 2], dk[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dv[i] = dk[i] = 0.f;
  float s[kQ / 2], dp[kQ / 2], dq[kQ / 2];
  uint32_t pf[kQ / 16][4], dsf[kQ / 16][4];

  // Descriptors (as the library's; bases through an opaque move so they are not hoisted).
  auto desc_kw = [&](uint32_t tile, int kk) {  // K or V rows w*64.. as A, K-major over d
    return make_desc(tile + w * 64 * 128, 16, 1024) + (((kk / 4) * kBN * 128 + (kk % 4) * 32) >> 4);
  };
  auto desc_qk = [&](uint32_t tile, int kk) {  // [2 blocks][80 rows][128 B] as B, K-major: Q or dO
    // over d (S^T, dP^T), or dS over keys (dQ^T)
    return make_desc(tile, 16, 1024) + (((kk / 4) * kQ * 128 + (kk % 4) * 32) >> 4);
  };
  auto desc_qmn = [&](uint32_t tile, int kk) {  // Q or dO as B, MN-major (K = queries, N = d)
    return make_desc(tile, kQ * 128, 1024) + ((kk * 16 * 128) >> 4);
  };
  auto desc_kt = [&](uint32_t tk, int kk) {  // K^T as A of dQ^T, M-major: d block w, K = keys
    return make_desc(tk + w * kBN * 128, kBN * 128, 1024) + ((kk * 16 * 128) >> 4);
  };
  auto opaque = [](uint32_t x) {
    uint32_t r;
    asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(x));
    return r;
  };

  if (n_iter > 0) mbar_wait(bars.kv_full(), 0);

  for (int it = 0; it < n_iter; ++it) {
    const int m = q_tile(it);
    const int q0 = m * kQ;
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
    for (int kk = 0; kk < kD / 16; ++kk) wgmma_ss_m64n80k16(s, desc_kw(tK, kk), desc_qk(tQ, kk), kk > 0 ? 1 : 0);
    wgmma_commit();
    mbar_wait(bars.do_full(st), ph);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) wgmma_ss_m64n80k16(dp, desc_kw(tV, kk), desc_qk(tdO, kk), kk > 0 ? 1 : 0);
    wgmma_commit();

    // Row statistics of this thread's 20 query columns 8j + 2 (lane % 4) + {0, 1}, read at use.
    auto stat = [&](uint32_t at, int j) { return ld_shared_f2(at + st * L::kStat + (8 * j + 2 * (lane % 4)) * 4); };

    wgmma_wait<1>();  // S^T done
    fence_regs(s);
    // P^T = exp2(S^T * scale * log2(e) - LSE2); s[4j + e]: key key_r0 + 8 (e >> 1), query
    // q0 + 8j + 2 (lane % 4) + (e & 1).
    // With tile lists the entry's flags say which element masks the tile needs (none: wholly
    // visible).
    const int flags = listed ? u.entry(p, it) & 3 : 0;
    const bool need_mask =
        listed ? flags != 0 : n0 + kBN > p.seq_k || (p.causal && n0 + kBN - 1 > q0 + p.causal_offset);
#pragma unroll
    for (int j = 0; j < kQ / 8; ++j) {
      const float2 lj = stat(sLSE, j);
#pragma unroll
      for (int e = 0; e < 4; ++e) s[4 * j + e] = fast_exp2(fmaf(s[4 * j + e], p.scale_log2, -((e & 1) ? lj.y : lj.x)));
    }
    if (need_mask && listed) {
      // The boundary tile's element masks (hopper_mask.cuh), over the 80 queries in 16-query
      // pieces (s[8h ..] is the m64n16 layout of queries q0 + 16h ..), as q128 runs its in halves.
#pragma unroll
      for (int h = 0; h < kQ / kMaskRows; ++h)
        apply_tile_mask_t<kMaskRows, true>(*reinterpret_cast<float(*)[kMaskRows / 2]>(s + (kMaskRows / 2) * h),
                                           p.tiles, q0 + kMaskRows * h, key_r0, p.seq_k, lane, flags);
    } else if (need_mask) {
#pragma unroll
      for (int j = 0; j < kQ / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key_r0 + 8 * (e >> 1);
          const int q = q0 + 8 * j + 2 * (lane % 4) + (e & 1);
          if (key >= p.seq_k || (p.causal && key > q + p.causal_offset)) s[4 * j + e] = 0.f;
        }
    }

    wgmma_wait<0>();
    fence_regs(dp);
    // dS^T = P^T * (dP^T - D)
#pragma unroll
    for (int j = 0; j < kQ / 8; ++j) {
      const float2 dj = stat(sDP, j);
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - ((e & 1) ? dj.y : dj.x));
    }
    convert_p<kQ>(s, pf);
    convert_p<kQ>(dp, dsf);

    // dV += P^T dO (P^T from registers).
    fence_regs(dv);
    fence_regs(pf);
    fence_regs(dsf);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kQ / 16; ++kk) wgmma_pv<kD>(dv, pf[kk], desc_qmn(tdO, kk));
    wgmma_commit();

    // dS^T -> shared memory as dS [queries][keys]: dsf[kk][r] is the fragment of the 8x8 block of
    // keys key_r0 - lane/4 + 8 (r & 1), queries 16 kk + 8 (r >> 1); stored transposed, block r's
    // row j (query 16 kk + 8 (r >> 1) + j) is 8 keys = 16-byte chunk 2 warp + (r & 1) of the
    // consumer's key block w, at chunk ^ (query % 8) (128-byte swizzle).
    {
      const int r = lane / 8, j = lane % 8;
      const uint32_t row_addr = tdS + w * (kQ * 128) + (8 * (r >> 1) + j) * 128 + (((2 * warp + (r & 1)) ^ j) * 16);
#pragma unroll
      for (int kk = 0; kk < kQ / 16; ++kk) stmatrix_x4_trans(row_addr + kk * 16 * 128, dsf[kk]);
    }
    fence_proxy_async();
    named_bar_sync(kBarDS, 256);

    // dQ^T_w = K[:, w half]^T dS^T (all 128 keys), then dK += dS^T Q (dS^T from registers).
    fence_regs(dq);
    fence_regs(dk);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) wgmma_ss_m64n80k16_ta(dq, desc_kt(tK, kk), desc_qk(tdS, kk), kk > 0 ? 1 : 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kQ / 16; ++kk) wgmma_pv<kD>(dk, dsf[kk], desc_qmn(tQ, kk));
    wgmma_commit();

    wgmma_wait<1>();  // dV and dQ^T are done; dK may still run
    fence_regs(dv);
    fence_regs(pf);
    fence_regs(dq);
    if (is_signaller) mbar_arrive(bars.do_empty(st));
    // dQ^T part to shared memory in fragment order (float4 jj of each lane; 512 contiguous bytes
    // per warp store), for the drain warp.
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

  bwd_store_dkv<kD>(dk, dv, p, key_r0, kvh, b, lane);  // the epilogue
#endif  // SEQPAR_HOPPER_STUB
}

}  // namespace seqpar::hopper
