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
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/hopper/hopper_mask.cuh"
#include "kernels/hopper/hopper_ptx.cuh"
#include "kernels/hopper/wgmma_ops.cuh"

namespace seqpar::hopper {

// Flat, zero-initialisable parameters (FwdParams p{}; then fill).
struct FwdParams {
  void* o;            // [B, S_q, H, D]: bf16, or fp32 with o_f32; element strides o_sb, o_ss, o_sh
  float* lse;         // [B, H, S_q]; element strides lse_sb, lse_sh
  int batch, heads, kv_heads, seq_q, seq_k;
  int causal;         // 0: full; 1: key j visible from query i iff j <= i + causal_offset
  int causal_offset;  // 0 is top-left aligned causal; negative offsets leave rows with no key
  float scale_log2;   // softmax scale * log2(e): scores are exponentiated with exp2
  int o_f32;
  int64_t o_sb, o_ss, o_sh, lse_sb, lse_sh;
  TileMask tiles;     // tiles.begin != nullptr: walk the visible-tile lists (causal unused)
};

// kC consumer warpgroups of 64 query rows each: 2 (128 rows; FA3's choice at D = 128) or 3
// (192 rows; FA3's at D = 64, where each key tile carries half the GEMM work per score and a
// taller tile amortises its loads and barrier turns). Registers after setmaxnreg: the producer
// keeps 24, the consumers share the rest of the 64K (2 x 240 or 3 x 160).
template <int kC>
struct Cfg {
  static constexpr int kBM = 64 * kC;
  static constexpr int kThreads = 128 * (1 + kC);
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kC == 2 ? 240 : 160;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kC <= 65536, "register file");
};

template <int kD, int kBN, int kStages, int kBM>
struct Smem {
  // Every tile is stored as kD/64 column blocks of [rows][64 bf16 = 128 bytes], each block
  // 128-byte swizzled by TMA: the canonical layout wgmma's descriptors describe. All offsets
  // are multiples of 1024 (the swizzle pattern's period), so descriptors need no base offset.
  static constexpr int kTileQ = kBM * kD * 2;
  static constexpr int kTileKV = kBN * kD * 2;
  static constexpr int q = 0;
  static constexpr int k = q + kTileQ;
  static constexpr int v = k + kStages * kTileKV;
  static constexpr int bar = v + kStages * kTileKV;
  static constexpr int kBars = 1 + 4 * kStages;  // q_full, k_full[], k_empty[], v_full[], v_empty[]
  static constexpr int bytes = bar + 8 * kBars + 1024;  // + slack to align the base to 1024
};

// ---- the consumer's per-block math ------------------------------------------------------

// Sets to -inf the scores this thread holds that are past S_k or above the causal diagonal.
// Accumulator layout (wgmma m64nN, per warp 16 rows): s[4j + e] is row lane/4 + 8*(e>>1),
// column 8j + 2*(lane%4) + (e&1).
template <int kBN>
__device__ __forceinline__ void apply_mask(float (&s)[kBN / 2], int key0, int row0, int lane, const FwdParams& p) {
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + 8 * j + 2 * (lane % 4) + (e & 1);
      const int row = row0 + 8 * (e >> 1);
      if (key >= p.seq_k || (p.causal && key > row + p.causal_offset)) s[4 * j + e] = -INFINITY;
    }
}

// Online softmax on one block of scores: updates the running max m (log2 units) and the
// per-thread partial sum l, turns s into unnormalised probabilities, and returns the factor
// each of the thread's two rows of O must be rescaled by. A row that has seen no key yet keeps
// m = -inf and uses 0 as its reference, so exp2 never sees (-inf) - (-inf).
template <int kBN>
__device__ __forceinline__ void online_softmax(float (&s)[kBN / 2], float (&m)[2], float (&l)[2], float (&resc)[2],
                                               float scale_log2) {
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * x], s[4 * j + 2 * x + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
    const float m_new = fmaxf(m[x], mx * scale_log2);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    resc[x] = fast_exp2(m[x] - m_use);
    m[x] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float v = fast_exp2(fmaf(s[4 * j + 2 * x + e], scale_log2, -m_use));
        s[4 * j + 2 * x + e] = v;
        sum += v;
      }
    l[x] = l[x] * resc[x] + sum;
  }
}

template <int kD>
__device__ __forceinline__ void rescale_o(float (&o)[kD / 2], const float (&resc)[2]) {
#pragma unroll
  for (int j = 0; j < kD / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[4 * j + e] *= resc[e >> 1];
}

// P (fp32 probabilities in the S accumulator layout) to wgmma A fragments, one per 16 keys:
// registers {row r cols k..k+1, row r+8 cols k..k+1, row r cols k+8.., row r+8 cols k+8..}.
template <int kBN>
__device__ __forceinline__ void convert_p(const float (&s)[kBN / 2], uint32_t (&pf)[kBN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) pf[kk][r] = pack_bf16(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

template <int kBN>
__device__ __forceinline__ void wgmma_qk(float (&s)[kBN / 2], uint64_t da, uint64_t db, int scale_d) {
  if constexpr (kBN == 192)
    wgmma_ss_m64n192k16(s, da, db, scale_d);
  else if constexpr (kBN == 176)
    wgmma_ss_m64n176k16(s, da, db, scale_d);
  else
    wgmma_ss_m64n128k16(s, da, db, scale_d);
}

template <int kD>
__device__ __forceinline__ void wgmma_pv(float (&o)[kD / 2], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (kD == 128)
    wgmma_rs_m64n128k16_tb(o, a, db);
  else
    wgmma_rs_m64n64k16_tb(o, a, db);
}

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
  constexpr int kCB = kD / 64;  // 64-column blocks per row (one 128-byte swizzle atom wide each)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base + L::q, sK = base + L::k, sV = base + L::v, sBar = base + L::bar;
  const uint32_t q_full = sBar;
  auto k_full = [&](int s) { return sBar + 8u * (1 + s); };
  auto k_empty = [&](int s) { return sBar + 8u * (1 + kStages + s); };
  auto v_full = [&](int s) { return sBar + 8u * (1 + 2 * kStages + s); };
  auto v_empty = [&](int s) { return sBar + 8u * (1 + 3 * kStages + s); };

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
    const int last_key = min(m0 + kBM, p.seq_q) - 1 + p.causal_offset;
    n_blocks = last_key < 0 ? 0 : min(n_blocks, last_key / kBN + 1);
  }
  // The key block of step it: listed, or from the last to the first.
  auto key_block = [&](int it) { return listed ? __ldg(p.tiles.entries + e0 + it) >> 2 : n_blocks - 1 - it; };

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  if (tid == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), kC);  // one arrival per consumer warpgroup
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
      mbar_expect_tx(q_full, L::kTileQ);
#pragma unroll
      for (int cb = 0; cb < kCB; ++cb) tma_load_4d(sQ + cb * kBM * 128, &tm_q, q_full, cb * 64, h, m0, b);
      for (int it = 0; it < n_blocks; ++it) {
        const int n_block = key_block(it);
        const int st = it % kStages;
        const uint32_t ph = (it / kStages) & 1;
        mbar_wait(k_empty(st), ph ^ 1);
        mbar_expect_tx(k_full(st), L::kTileKV);
#pragma unroll
        for (int cb = 0; cb < kCB; ++cb)
          tma_load_4d(sK + st * L::kTileKV + cb * kBN * 128, &tm_k, k_full(st), cb * 64, kvh, n_block * kBN, b);
        mbar_wait(v_empty(st), ph ^ 1);
        mbar_expect_tx(v_full(st), L::kTileKV);
#pragma unroll
        for (int cb = 0; cb < kCB; ++cb)
          tma_load_4d(sV + st * L::kTileKV + cb * kBN * 128, &tm_v, v_full(st), cb * 64, kvh, n_block * kBN, b);
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

  const uint32_t qa = sQ + c * 64 * 128;
  auto desc_q = [&](int kk) { return make_desc(qa + (kk / 4) * kBM * 128 + (kk % 4) * 32, 16, 1024); };
  auto desc_k = [&](int st, int kk) {
    return make_desc(sK + st * L::kTileKV + (kk / 4) * kBN * 128 + (kk % 4) * 32, 16, 1024);
  };
  auto desc_v = [&](int st, int kk) { return make_desc(sV + st * L::kTileKV + kk * 16 * 128, kBN * 128, 1024); };
  auto issue_s = [&](int st) {
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) wgmma_qk<kBN>(s, desc_q(kk), desc_k(st, kk), kk > 0 ? 1 : 0);
  };
  auto issue_pv = [&](int st) {
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) wgmma_pv<kD>(o, pf[kk], desc_v(st, kk));
  };
  // Blocks that need the mask: past S_k, or crossing the causal diagonal of some row here.
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
  // Ping-pong turn-taking (round robin over the kC consumers): consumer c issues GEMMs only
  // after bar (1 + c) completes, which consumer c - 1's arrival after its own issue provides.
  // Each consumer passes the same number of turns, so the counts balance.
  auto pp_sync = [&]() {
    if constexpr (kPingPong) named_bar_sync(1 + c, 256);
  };
  auto pp_arrive = [&]() {
    if constexpr (kPingPong) named_bar_arrive(1 + (c + 1) % kC, 256);
  };
  if constexpr (kPingPong) {
    if (c == kC - 1) named_bar_arrive(1, 256);  // consumer 0 takes the first turn
  }

  mbar_wait(q_full, 0);

  if constexpr (!kOverlap) {
    for (int it = 0; it < n_blocks; ++it) {
      const int st = it % kStages;
      const uint32_t ph = (it / kStages) & 1;
      mbar_wait(k_full(st), ph);
      pp_sync();
      fence_regs(s);
      wgmma_fence();
      issue_s(st);
      wgmma_commit();
      pp_arrive();
      wgmma_wait<0>();
      fence_regs(s);
      if (is_signaller) mbar_arrive(k_empty(st));
      mask_step(it, WithPattern{});
      online_softmax<kBN>(s, m, l, resc, p.scale_log2);
      rescale_o<kD>(o, resc);
      convert_p<kBN>(s, pf);
      mbar_wait(v_full(st), ph);
      pp_sync();
      fence_regs(o);
      wgmma_fence();
      issue_pv(st);
      wgmma_commit();
      pp_arrive();
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pf);
      if (is_signaller) mbar_arrive(v_empty(st));
    }
  } else if (n_blocks > 0) {
    {  // first block: S alone
      mbar_wait(k_full(0), 0);
      pp_sync();
      fence_regs(s);
      wgmma_fence();
      issue_s(0);
      wgmma_commit();
      pp_arrive();
      wgmma_wait<0>();
      fence_regs(s);
      if (is_signaller) mbar_arrive(k_empty(0));
      mask_step(0, WithPattern{});
      online_softmax<kBN>(s, m, l, resc, p.scale_log2);
      convert_p<kBN>(s, pf);
    }
    for (int it = 1; it < n_blocks; ++it) {
      const int st = it % kStages, pst = (it - 1) % kStages;
      const uint32_t ph = (it / kStages) & 1, pph = ((it - 1) / kStages) & 1;
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
      wgmma_wait<1>();  // S of this block is done; P V of the previous may still run
      fence_regs(s);
      if (is_signaller) mbar_arrive(k_empty(st));
      if (pattern_step(it)) {
        // The pattern's element mask needs registers that the P V in flight holds (with both,
        // ptxas spilled): let it finish first, in these boundary tiles only.
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
    {  // last P V
      const int st = (n_blocks - 1) % kStages;
      const uint32_t ph = ((n_blocks - 1) / kStages) & 1;
      mbar_wait(v_full(st), ph);
      pp_sync();
      fence_regs(o);
      fence_regs(pf);
      wgmma_fence();
      issue_pv(st);
      wgmma_commit();
      pp_arrive();
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pf);
      if (is_signaller) mbar_arrive(v_empty(st));
    }
  }
  if constexpr (kPingPong) {
    if (c == 0) named_bar_sync(1, 256);  // absorbs the last consumer's last arrival
  }

  // ---------------- epilogue: O / l to bf16, LSE ----------------
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    float lx = l[x];
    lx += __shfl_xor_sync(0xffffffff, lx, 1);
    lx += __shfl_xor_sync(0xffffffff, lx, 2);
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
      if (lane % 4 == 0)
        p.lse[b * p.lse_sb + h * p.lse_sh + row] = lx > 0.f ? (m[x] + __log2f(lx)) * 0.6931471805599453f : -INFINITY;
    }
  }
#endif  // SEQPAR_HOPPER_STUB
}

// ---- host side ---------------------------------------------------------------------------

template <int kD, int kBN, int kStages, bool kOverlap, bool kPingPong, int kC = 2, bool kUniform = false>
cudaError_t launch_fwd(const FwdArgs& a, cudaStream_t stream) {
  constexpr int kBM = Cfg<kC>::kBM;
  CUtensorMap tq, tk, tv;
  if (make_tmap(&tq, a.q, a.batch, a.seq_q, a.heads, kD, kBM, a.q_st) != CUDA_SUCCESS ||
      make_tmap(&tk, a.k, a.batch, a.seq_k, a.kv_heads, kD, kBN, a.k_st) != CUDA_SUCCESS ||
      make_tmap(&tv, a.v, a.batch, a.seq_k, a.kv_heads, kD, kBN, a.v_st) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  FwdParams p{};
  p.o = a.o;
  p.lse = a.lse;
  p.o_f32 = a.o_f32;
  const RowStrides ost = row_strides(a.o_st, a.seq_q, a.heads, kD);
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
  auto kernel = fwd_kernel<kD, kBN, kStages, kOverlap, kPingPong, kC, kUniform>;
  constexpr int smem = Smem<kD, kBN, kStages, kBM>::bytes;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  p.tiles = a.tiles;
  const int m_tiles = (a.seq_q + kBM - 1) / kBM;
  const dim3 grid(m_tiles, a.heads, a.batch);
  kernel<<<grid, Cfg<kC>::kThreads, smem, stream>>>(tq, tk, tv, p);
  return cudaGetLastError();
}

}  // namespace seqpar::hopper
