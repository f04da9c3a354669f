// The Hopper attention FORWARD kernel: FlashAttention-3-style, for sm_90a (H100/H200), bf16,
// head dim 64 or 128, full or causal mask with a position offset, or any mask as visible-tile
// lists (documents, windows, block-sparse), GQA; writes O (bf16 or fp32,
// any row strides) and LSE (fp32, natural log of the scaled scores, -inf for rows that see no
// key), following include/seqpar/backend.hpp: q, o [B, S_q, H, D]; k, v [B, S_k, H_kv, D]; lse [B, H, S_q]; query head h reads K/V head
// h / (H / H_kv) (no copy of K/V).
//
// Design (dev/hopper_attention/README.md has the reasoning, the A/B runs and the numbers):
// - one CTA per (64 kC query rows, head, batch); 1 + kC warpgroups: WG0 is the producer (one
//   thread issues every TMA load, the rest exit), the kC others are consumers of 64 query rows
//   each; setmaxnreg moves registers from the producer (24) to the consumers (240 at kC = 2).
// - Q, K, V tiles land in shared memory through TMA (cp.async.bulk.tensor, 128-byte swizzle)
//   completing on mbarriers; K and V have separate full/empty barrier rings of kStages stages
//   so a K stage is released as soon as S = Q K^T is done, before P V needs its V.
// - kBN keys per K/V tile: 128, or 176 (FA3's choice at D = 128 without a mask: fewer
//   softmax rounds and barrier turns per key).
// - S = Q K^T: wgmma m64nkBNk16, A (Q) and B (K) from shared memory, both K-major.
//   O += P V: wgmma with A (P, bf16) from registers (the fp32 S accumulator layout is the A
//   fragment layout, so no shuffles) and B (V) from shared memory, MN-major (tnspB).
// - kOverlap: intra-warpgroup overlap, FA3's: the S GEMM of block j+1 and the P V GEMM of
//   block j are in flight together while the softmax of block j+1 runs.
// - kPingPong: two named barriers make the consumer warpgroups take turns issuing GEMMs, so
//   one's softmax runs under the other's GEMMs.
// Key blocks are walked from the last to the first, so the few blocks that need the causal or
// length mask come first and the loop body after them runs unmasked.
// Masks given as visible-tile lists (documents, windows, block-sparse; FwdParams::tiles, see
// hopper_tiles.hpp): each CTA walks its query tile's list instead, loads and multiplies only the
// listed key tiles, and evaluates the mask element by element only in the entries flagged as
// boundary tiles (hopper_mask.cuh); each head's CTAs take its query tiles in the lists' order.
// What every forward kernel shares is in hopper_fwd_params.cuh (parameters, shared-memory layout,
// mbarriers), hopper_fwd_math.cuh (one key block's math) and hopper_fwd_steps.cuh (the loads and
// the consumers' pipeline); this file holds the kernel's own schedule, its epilogue and launcher.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/hopper/hopper_fwd_math.cuh"
#include "kernels/hopper/hopper_fwd_params.cuh"
#include "kernels/hopper/hopper_fwd_steps.cuh"
#include "kernels/hopper/hopper_mask.cuh"
#include "kernels/hopper/hopper_ptx.cuh"

namespace seqpar::hopper {

// ---- the kernel --------------------------------------------------------------------------

// kUniform: the consumer index goes through a warp broadcast (__shfl_sync from lane 0), so that
// ptxas knows it is warp-uniform and builds the Q descriptors in uniform registers (without it,
// nvcc 13.0 computes them per thread and moves them with R2UR before each wgmma).
template <int kD, int kBN, int kStages, bool kOverlap, bool kPingPong, int kC, bool kUniform = false>
__global__ void __launch_bounds__(Cfg<kC>::kThreads, 1)
    fwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const FwdParams p) {
  static_assert(kD == 64 || kD == 128, "head dim 64 or 128");
  static_assert(kBN % 16 == 0 && kBN <= 256, "key tile: whole wgmma k-steps, one TMA box");
#ifdef SEQPAR_HOPPER_STUB
  __trap();  // a device pass without sm_90a features: never launched (device_refusal)
#else
  using L = Smem<kD, kBN, kStages, Cfg<kC>::kBM>;
  constexpr int kBM = Cfg<kC>::kBM;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base + L::q, sK = base + L::k, sV = base + L::v;
  const FwdBars<kStages> bars{base + L::bar};

  // Blocks launch x fastest, so heads are the outer loop: the CTAs in flight at once are one
  // head's tiles and share its K and V in L2. Within a head, heaviest query blocks first under
  // the causal mask (the last ones); with tile lists the lists' order (hopper_tiles.hpp,
  // order_tiles and listed_unit: outliers of every head first, then neighbours together). With
  // x = head instead, the CTAs in flight read 32 heads' K/V and the masked forward ran at the
  // speed of HBM (README, "Schedule").
  const bool listed = p.tiles.begin != nullptr;
  int rank = gridDim.x - 1 - blockIdx.x, h = blockIdx.y;
  if (listed) listed_unit(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, p.tiles.heavy, &rank, &h);
  const int m_block = listed ? __ldg(p.tiles.order + rank) : rank;
  const int b = blockIdx.z;
  const int kvh = h / (p.heads / p.kv_heads);
  const int m0 = m_block * kBM;
  int n_blocks = (p.seq_k + kBN - 1) / kBN, e0 = 0;
  if (listed) {
    e0 = __ldg(p.tiles.begin + m_block);
    n_blocks = __ldg(p.tiles.begin + m_block + 1) - e0;
  } else if (p.causal) {
    n_blocks = causal_blocks<kBM, kBN>(n_blocks, m0, p);
  }
  // The key block of step it: listed, or from the last to the first.
  auto key_block = [&](int it) { return listed ? __ldg(p.tiles.entries + e0 + it) >> 2 : n_blocks - 1 - it; };

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  if (tid == 0) {
    bars.init(0, kC);  // one release per consumer warpgroup
    fence_bar_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Cfg<kC>::kProducerRegs));
    if (tid == 0) {
      fwd_load_q<kD, kBM>(sQ, &tm_q, bars.q_full(), h, m0, b);
      for (int it = 0; it < n_blocks; ++it) {
        const int n_block = key_block(it);
        fwd_load_kv<kD, kBN>(bars, sK, sV, &tm_k, &tm_v, it % kStages, (it / kStages) & 1, kvh, b,
                             FwdTmaLoad<kBN>{n_block});
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Cfg<kC>::kConsumerRegs));
  const int c = kUniform ? __shfl_sync(0xffffffffu, wg - 1, 0) : wg - 1;  // query rows c*64 .. c*64+63
  const int lane = tid % 32, warp = (tid % 128) / 32;
  const int row0 = m0 + c * 64 + warp * 16 + lane / 4;  // this thread's rows: row0, row0 + 8
  const bool is_signaller = (tid % 128) == 0;

  float o[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
  float s[kBN / 2];
  uint32_t pf[kBN / 16][4];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, resc[2];
  FwdAcc<kD, kBN> a{o, s, pf, m, l, resc};
  const FwdConsumer<kD, kBN, kBM, kStages, kC, kPingPong> mma{sQ + c * 64 * 128, sK, sV, bars, {c}};
  // Blocks that need the mask: past S_k, or crossing the causal diagonal of some row here.
  // (FwdMaskBlock tests the same inline; this kernel's form, through the bool of needs_mask,
  // compiles to other code, so it keeps its own.)
  const int tile_row_lo = m0 + c * 64;
  auto needs_mask = [&](int n_block) {
    const int key_hi = n_block * kBN + kBN - 1;
    return key_hi >= p.seq_k || (p.causal && key_hi > tile_row_lo + p.causal_offset);
  };
  // Masks the scores of step it where its key block needs it. kPattern: the pattern's element
  // mask too (else the entry must not need it: pattern_step).
  auto mask_step = [&](int it, auto pattern) {
    if (listed) {
      const int e = __ldg(p.tiles.entries + e0 + it);
      if (e & 3) apply_tile_mask<kBN, decltype(pattern)::value>(s, p.tiles, (e >> 2) * kBN, row0, p.seq_q, lane, e & 3);
    } else {
      const int n_block = n_blocks - 1 - it;
      if (needs_mask(n_block)) apply_mask<kBN>(s, n_block * kBN, row0, lane, p);
    }
  };
  auto pattern_step = [&](int it) { return listed && (__ldg(p.tiles.entries + e0 + it) & kTilePatternMask); };
  using WithPattern = std::true_type;
  mma.pp.start();

  mbar_wait(bars.q_full(), 0);

  if constexpr (!kOverlap) {
    for (int it = 0; it < n_blocks; ++it) {
      const int st = it % kStages;
      const uint32_t ph = (it / kStages) & 1;
      mma.gemm_s(a, st, ph);
      if (is_signaller) mbar_arrive(bars.k_empty(st));
      mask_step(it, WithPattern{});
      online_softmax<kBN>(s, m, l, resc, p.scale_log2);
      rescale_o<kD>(o, resc);
      convert_p<kBN>(s, pf);
      mbar_wait(bars.v_full(st), ph);
      mma.pp.sync();
      fence_regs(o);
      wgmma_fence();
      mma.issue_pv(a, st);
      wgmma_commit();
      mma.pp.arrive();
      mma.pv_done(a);
      if (is_signaller) mbar_arrive(bars.v_empty(st));
    }
  } else if (n_blocks > 0) {
    {  // first block: S alone
      mma.gemm_s(a, 0, 0);
      if (is_signaller) mbar_arrive(bars.k_empty(0));
      mask_step(0, WithPattern{});
      online_softmax<kBN>(s, m, l, resc, p.scale_log2);
      convert_p<kBN>(s, pf);
    }
    for (int it = 1; it < n_blocks; ++it) {
      const int st = it % kStages, pst = (it - 1) % kStages;
      const uint32_t ph = (it / kStages) & 1, pph = ((it - 1) / kStages) & 1;
      mma.gemm_s_pv(a, st, ph, pst, pph);
      if (is_signaller) mbar_arrive(bars.k_empty(st));
      if (pattern_step(it)) {
        // The pattern's element mask needs registers that the P V in flight holds (with both,
        // ptxas spilled): let it finish first, in these boundary tiles only.
        mma.pv_done(a);
        if (is_signaller) mbar_arrive(bars.v_empty(pst));
        mask_step(it, WithPattern{});
        online_softmax<kBN>(s, m, l, resc, p.scale_log2);
      } else {
        mask_step(it, std::false_type{});
        online_softmax<kBN>(s, m, l, resc, p.scale_log2);
        mma.pv_done(a);
        if (is_signaller) mbar_arrive(bars.v_empty(pst));
      }
      rescale_o<kD>(o, resc);
      convert_p<kBN>(s, pf);
    }
    {  // last P V
      const int st = (n_blocks - 1) % kStages;
      const uint32_t ph = ((n_blocks - 1) / kStages) & 1;
      mma.gemm_pv(a, st, ph);
      if (is_signaller) mbar_arrive(bars.v_empty(st));
    }
  }
  mma.pp.finish();

  // ---------------- epilogue: O / l to bf16, LSE ----------------
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const float lx = quad_sum(l[x]);
    const float inv = lx > 0.f ? 1.f / lx : 0.f;
    const int row = row0 + 8 * x;
    if (row < p.seq_q) {
      const int64_t orow = b * p.o_sb + row * p.o_ss + h * p.o_sh;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        const int col = 8 * j + 2 * (lane % 4);
        const float a0 = o[4 * j + 2 * x] * inv, a1 = o[4 * j + 2 * x + 1] * inv;
        if (p.o_f32)
          *reinterpret_cast<float2*>(static_cast<float*>(p.o) + orow + col) = make_float2(a0, a1);
        else
          *reinterpret_cast<uint32_t*>(static_cast<__nv_bfloat16*>(p.o) + orow + col) = pack_bf16(a0, a1);
      }
      if (lane % 4 == 0) p.lse[b * p.lse_sb + h * p.lse_sh + row] = row_lse(m[x], lx);
    }
  }
#endif  // SEQPAR_HOPPER_STUB
}

// ---- host side ---------------------------------------------------------------------------

template <int kD, int kBN, int kStages, bool kOverlap, bool kPingPong, int kC = 2, bool kUniform = false>
cudaError_t launch_fwd(const FwdArgs& a, cudaStream_t stream) {
  constexpr int kBM = Cfg<kC>::kBM;
  CUtensorMap tq, tk, tv;
  if (!fwd_tmaps(a, kD, kBM, kBN, &tq, &tk, &tv)) return cudaErrorInvalidValue;
  const FwdParams p = fwd_params(a, kD, row_strides(a.o_st, a.seq_q, a.heads, kD));
  auto kernel = fwd_kernel<kD, kBN, kStages, kOverlap, kPingPong, kC, kUniform>;
  constexpr int smem = Smem<kD, kBN, kStages, kBM>::bytes;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const int m_tiles = (a.seq_q + kBM - 1) / kBM;
  const dim3 grid(m_tiles, a.heads, a.batch);
  kernel<<<grid, Cfg<kC>::kThreads, smem, stream>>>(tq, tk, tv, p);
  return cudaGetLastError();
}

}  // namespace seqpar::hopper
