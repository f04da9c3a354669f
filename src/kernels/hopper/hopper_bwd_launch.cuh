// The Hopper attention backward's host side: the preprocessing kernel (LSE * log2(e) and
// D = rowsum(dO * O) into padded rows), the dQ conversion kernels (the fp32 accumulator to dQ),
// the workspace's size, and the host launchers that run them around a main kernel:
// launch_bwd_with (any main kernel; the lab's options use it too) and launch_bwd<D, defer,
// prologue, query rows> (the library's, hopper_bwd.cuh; dev/hopper_attention/README.md, "Backward").
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/hopper/hopper_bwd.cuh"
#include "kernels/hopper/hopper_bwd_q80.cuh"

namespace seqpar::hopper {

// ---- preprocessing and dQ conversion -------------------------------------------------------

// LSE2 = LSE * log2(e) (+inf where LSE = -inf: such rows see no key, and P must be 0), D =
// rowsum(dO * O) unless given; padded rows (S_q .. S_q_pad) get LSE2 = +inf and D = 0. One group
// of kD/8 lanes per (q, h) row of batch blockIdx.y, 16-byte loads (O's and dO's strides are
// multiples of 8 elements); h fastest so contiguous O and dO stream. The row's (q, h) comes from
// 32-bit divisions (Sq_pad * H < 2^31 rows per batch; the batch is the grid's y): 25% fewer
// instructions than three 64-bit divisions per thread, the same time (ncu, one H200: 43-44 us at
// 8K, H = 32, D = 128; the loads bound it).
template <int kD>
__global__ void bwd_preprocess_kernel(const __nv_bfloat16* o, const __nv_bfloat16* dout, const float* lse,
                                      const float* delta, float* lse2, float* dpsum, int H, int Sq, int Sq_pad,
                                      StatStrides lse_st, StatStrides delta_st, RowStrides o_st,
                                      RowStrides dout_st) {
  constexpr int kLanes = kD / 8;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= static_cast<int64_t>(Sq_pad) * H * kLanes) return;
  const int row = static_cast<int>(t / kLanes), sub = static_cast<int>(t % kLanes);
  const int h = row % H, q = row / H, b = blockIdx.y;
  float acc = 0.f;
  if (q < Sq && delta == nullptr) {
    const uint4 ov = *reinterpret_cast<const uint4*>(o + b * o_st.b + q * o_st.s + h * o_st.h + sub * 8);
    const uint4 dv = *reinterpret_cast<const uint4*>(dout + b * dout_st.b + q * dout_st.s + h * dout_st.h + sub * 8);
    const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&ov);
    const __nv_bfloat162* d2 = reinterpret_cast<const __nv_bfloat162*>(&dv);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 a = __bfloat1622float2(o2[i]), c = __bfloat1622float2(d2[i]);
      acc = fmaf(a.x, c.x, acc);
      acc = fmaf(a.y, c.y, acc);
    }
  }
#pragma unroll
  for (int s = kLanes / 2; s > 0; s /= 2) acc += __shfl_xor_sync(0xffffffff, acc, s);
  if (sub == 0) {
    const int64_t si = (static_cast<int64_t>(b) * H + h) * Sq_pad + q;
    float l2 = INFINITY, d = 0.f;
    if (q < Sq) {
      const float l = lse[b * lse_st.b + h * lse_st.h + q];
      l2 = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
      d = delta ? delta[b * delta_st.b + h * delta_st.h + q] : acc;
    }
    lse2[si] = l2;
    dpsum[si] = d;
  }
}

// dQ = scale * dQ_acc (+ dQ if accumulating), bf16 or fp32. One thread per float4 of the accumulator,
// whose in-tile order is the consumers' fragment order (see the kernel's dQ store). dq_state (or
// null): a tile no CTA reached (state 0: its rows see no key) is zero, whatever the accumulator holds.
template <int kD>
__global__ void bwd_convert_dq_kernel(const float* dq_acc, const int* dq_state, void* dq, RowStrides dq_st,
                                      int out_f32, int B, int H, int Sq, int n_mtiles, float scale, int accumulate) {
  constexpr int kBM = bwd::kBM, kHalf = kBM * kD / 2, kJJ = kD / 16;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t f = t * 4;
  const int64_t total = static_cast<int64_t>(B) * H * n_mtiles * kBM * kD;
  if (f >= total) return;
  const int64_t tile = f / (kBM * kD);
  const int in_tile = static_cast<int>(f % (kBM * kD));
  const int m = static_cast<int>(tile % n_mtiles);
  const int h = static_cast<int>((tile / n_mtiles) % H);
  const int b = static_cast<int>(tile / (static_cast<int64_t>(n_mtiles) * H));
  const int w = in_tile / kHalf, r = in_tile % kHalf;
  const int lane = (r / 4) % 32, jj = (r / 128) % kJJ, warp = r / (128 * kJJ);
  const float4 v = dq_state && dq_state[tile] == 0 ? make_float4(0.f, 0.f, 0.f, 0.f)
                                                   : *reinterpret_cast<const float4*>(dq_acc + f);
  const int col = w * (kD / 2) + 8 * jj + 2 * (lane % 4);
  const float vals[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int x = 0; x < 2; ++x) {  // e = 2x, 2x + 1: row + 8x, columns col, col + 1
    const int q = m * kBM + warp * 16 + lane / 4 + 8 * x;
    if (q >= Sq) continue;
    add_out(dq, b * dq_st.b + q * dq_st.s + h * dq_st.h + col,
            make_float2(vals[2 * x] * scale, vals[2 * x + 1] * scale), out_f32, accumulate);
  }
}

// dq[off .. off + 8) = v (+ dq with accumulate), fp32 or bf16, in 16-byte accesses (dq + off
// 16-byte aligned): the store of both row-order conversions below.
__device__ __forceinline__ void store_dq8(void* dq, int64_t off, float (&v)[8], int out_f32, int accumulate) {
  if (out_f32) {
    float4* dst = reinterpret_cast<float4*>(static_cast<float*>(dq) + off);
    float4 lo = make_float4(v[0], v[1], v[2], v[3]), hi = make_float4(v[4], v[5], v[6], v[7]);
    if (accumulate) {
      const float4 a = dst[0], a2 = dst[1];
      lo.x += a.x, lo.y += a.y, lo.z += a.z, lo.w += a.w;
      hi.x += a2.x, hi.y += a2.y, hi.z += a2.z, hi.w += a2.w;
    }
    dst[0] = lo;
    dst[1] = hi;
  } else {
    uint4* dst = reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(dq) + off);
    if (accumulate) {
      const uint4 old = *dst;
      const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&old);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 g = __bfloat1622float2(o2[i]);
        v[2 * i] += g.x;
        v[2 * i + 1] += g.y;
      }
    }
    *dst = make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
  }
}

// The same conversion in output order: one thread per 8 consecutive dQ columns of one row, so each
// thread writes 16 bytes (bf16; 32 with fp32) and a warp 16 rows x 32 contiguous bytes, where the
// kernel above writes 4 bytes per thread (16 per row and warp). Its reads are the 4 float2 of the
// 4 lanes that hold those columns in the fragment order; 16 threads read one warp's 512 bytes.
// Needs dq 16-byte aligned and its strides multiples of 16 bytes (launch_bwd checks).
template <int kD>
__global__ void bwd_convert_dq_rows_kernel(const float* dq_acc, const int* dq_state, void* dq, RowStrides dq_st,
                                           int out_f32, int B, int H, int Sq, int n_mtiles, float scale,
                                           int accumulate) {
  constexpr int kBM = bwd::kBM, kHalf = kBM * kD / 2, kJJ = kD / 16, kChunks = kBM * kD / 8;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= static_cast<int64_t>(B) * H * n_mtiles * kChunks) return;
  const int64_t tile = t / kChunks;
  const int c = static_cast<int>(t % kChunks);
  // c = (((w * 4 + warp) * kJJ + jj) * 8 + lq) * 2 + x: consumer half w, warp, 8-column group jj,
  // row lq + 8x of the warp's 16 rows.
  const int x = c & 1, lq = (c >> 1) & 7, jj = (c >> 4) % kJJ, warp = (c >> 4) / kJJ % 4, w = (c >> 4) / (4 * kJJ);
  const int m = static_cast<int>(tile % n_mtiles);
  const int h = static_cast<int>((tile / n_mtiles) % H);
  const int b = static_cast<int>(tile / (static_cast<int64_t>(n_mtiles) * H));
  const int q = m * kBM + warp * 16 + lq + 8 * x;
  if (q >= Sq) return;
  // Lane 4 * lq + lp of (warp, jj) holds columns 8 jj + 2 lp, + 1 of rows lq (x = 0) and lq + 8.
  const float* src = dq_acc + tile * (kBM * kD) + w * kHalf + ((warp * kJJ + jj) * 32 + 4 * lq) * 4 + 2 * x;
  const bool reached = dq_state == nullptr || dq_state[tile] != 0;
  float v[8];
#pragma unroll
  for (int lp = 0; lp < 4; ++lp) {
    const float2 f = reached ? *reinterpret_cast<const float2*>(src + 4 * lp) : make_float2(0.f, 0.f);
    v[2 * lp] = f.x * scale;
    v[2 * lp + 1] = f.y * scale;
  }
  const int64_t off = b * dq_st.b + q * dq_st.s + h * dq_st.h + w * (kD / 2) + 8 * jj;
  store_dq8(dq, off, v, out_f32, accumulate);
}

// The 80-row kernel's (hopper_bwd_q80.cuh) conversion: dQ = scale * accumulator (+ dQ with
// accumulate), bf16 or fp32. The accumulator keeps each 80-row tile in the dQ^T fragment order
// [w 2][warp 4][jj 10][lane 32][4]: fragment f = 4w + warp of row octet jj holds d = 16f + lane/4
// (+8 in elements 2, 3) of rows 8jj + 2(lane%4) (+1 in elements 1, 3). One warp per row octet:
// it loads the octet's 8 fragments (512 contiguous bytes each, a float4 per lane, all 8 in
// flight), stages them in its own 4 KB of shared memory with fragment f's float4 slots XORed by f,
// so that the row-order reads below hit 32 distinct banks, and writes the 8 rows with 16-byte
// stores (two with fp32), 2 rows x 256 contiguous bytes per store instruction. Its first form (one
// CTA per tile, 8-way bank conflicts in the row-order reads, 4-byte stores) took 77 us at 8K, H =
// 32, this one 47 (dev/hopper_attention/README.md, "The 80-row dQ conversion"). vec16: dq 16-byte
// aligned and its strides multiples of 16 bytes; else bf16 pairs (4 bytes) or fp32 pairs (8 bytes)
// are stored.
__global__ void __launch_bounds__(256) bwd_convert_dq_q80_kernel(const float* dq_acc, void* dq, RowStrides dq_st,
                                                                 int out_f32, int vec16, int H, int Sq, int n_mtiles,
                                                                 int64_t n_octets, float scale, int accumulate) {
  constexpr int kQ = bwd::kQ80, kD = 128, kOctets = kQ / 8, kFrags = kD / 16, kWarps = 8;
  __shared__ float4 stage[kWarps][kFrags * 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kWarps + warp;  // ((b, h, m), jj)
  if (o >= n_octets) return;  // warp-uniform
  const int jj = static_cast<int>(o % kOctets);
  const int64_t t = o / kOctets;
  const int m = static_cast<int>(t % n_mtiles);
  const int h = static_cast<int>((t / n_mtiles) % H);
  const int b = static_cast<int>(t / (static_cast<int64_t>(n_mtiles) * H));
  const float4* src = reinterpret_cast<const float4*>(dq_acc) + t * (kQ * kD / 4) + jj * 32 + lane;
  float4 frag[kFrags];
#pragma unroll
  for (int f = 0; f < kFrags; ++f) frag[f] = src[f * kOctets * 32];
#pragma unroll
  for (int f = 0; f < kFrags; ++f) stage[warp][f * 32 + (lane ^ f)] = frag[f];
  __syncwarp();
  const float* sf = reinterpret_cast<const float*>(stage[warp]);
  // Lane: columns 8c .. 8c + 7 (fragment f = c / 2, half x = c % 2) of row 2 step + lane / 16.
  const int c = lane % 16, f = c / 2, x = c % 2;
#pragma unroll
  for (int step = 0; step < 4; ++step) {
    const int r = 2 * step + lane / 16, q = m * kQ + 8 * jj + r;
    if (q >= Sq) continue;
    // Column 8c + dd of row r: lane 4 dd + r / 2 of fragment f, element (r & 1) + 2x.
    float v[8];
#pragma unroll
    for (int dd = 0; dd < 8; ++dd) v[dd] = sf[f * 128 + 4 * ((4 * dd + r / 2) ^ f) + (r & 1) + 2 * x] * scale;
    const int64_t off = b * dq_st.b + q * dq_st.s + h * dq_st.h + 8 * c;
    if (!vec16) {
#pragma unroll
      for (int dd = 0; dd < 8; dd += 2) add_out(dq, off + dd, make_float2(v[dd], v[dd + 1]), out_f32, accumulate);
    } else {
      store_dq8(dq, off, v, out_f32, accumulate);
    }
  }
}

// ---- host side ---------------------------------------------------------------------------

// Rows padded to 128 for 64- and 128-row query tiles, so one workspace size serves both, and the
// stats rows past S_q that a 128-row tile reads exist (+inf LSE2); to 640 for 80-row tiles.
inline int bwd_seq_pad(int seq_q, int q_rows = bwd::kBM) {
  const int pad = q_rows == bwd::kQ80 ? bwd::kSeqPadQ80 : bwd::kSeqPad;
  return (seq_q + pad - 1) / pad * pad;
}
// fp32 dQ accumulator + LSE2 + D + the dQ tiles' states (int per 64 rows), for kernels with
// q_rows-row query tiles (at 80, enough for the other tiles too).
inline size_t bwd_workspace_bytes(int B, int H, int Sq, int D, int q_rows = bwd::kBM) {
  const size_t pad = static_cast<size_t>(bwd_seq_pad(Sq, q_rows));
  return static_cast<size_t>(B) * H * pad * D * 4 + 2 * static_cast<size_t>(B) * H * pad * 4 +
         static_cast<size_t>(B) * H * (pad / bwd::kBM) * 4;
}

// What runs around the main kernel (bits of kPrologue; the lab's A/B of issue 34 item 1 compares
// them, dev/hopper_attention/README.md "Backward: the fixed cost"): kRowConvert, dQ is converted
// in output order (bwd_convert_dq_rows_kernel) where dq's alignment allows (else the
// fragment-order kernel); kStoreFirst, the first CTA to reach a dQ tile stores it
// (BwdParams::dq_state), so only the tiles' states are zeroed, not the fp32 accumulator (else a
// cudaMemsetAsync of all of it). The library runs kRowConvert: store-first measured slower on
// dense problems (the lab keeps it as variant "sfirst").
constexpr int kRowConvert = 1, kStoreFirst = 2, kPrologueBest = kRowConvert;

// Before a backward's main kernel (unless a.main_only == 1): zero the fp32 dQ accumulator (with
// store-first, dq_state != nullptr: only the tiles' states) and preprocess LSE and D per padded
// row; then fill the main kernel's flat parameters *out. Shared by launch_bwd_with and the lab's
// launch_bwd_short (hopper_bwd_short.cuh).
template <int kD>
cudaError_t bwd_prologue(const BwdArgs& a, cudaStream_t stream, int pad, int n_mtiles, float* dq_acc, int* dq_state,
                         float* lse2, float* dpsum, BwdParams* out) {
  cudaError_t e = cudaSuccess;
  if (a.main_only != 1) {
    if ((e = dq_state ? cudaMemsetAsync(dq_state, 0, static_cast<size_t>(a.batch) * a.heads * n_mtiles * 4, stream)
                      : cudaMemsetAsync(dq_acc, 0, static_cast<size_t>(a.batch) * a.heads * pad * kD * 4, stream)) !=
        cudaSuccess)
      return e;
    const int64_t threads = static_cast<int64_t>(pad) * a.heads * (kD / 8);  // per batch
    bwd_preprocess_kernel<kD><<<dim3(static_cast<unsigned>((threads + 255) / 256), a.batch), 256, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(a.o), static_cast<const __nv_bfloat16*>(a.dout), a.lse, a.delta, lse2,
        dpsum, a.heads, a.seq_q, pad, stat_strides(a.lse_st, a.heads, a.seq_q),
        stat_strides(a.delta_st, a.heads, a.seq_q), row_strides(a.o_st, a.seq_q, a.heads, kD),
        row_strides(a.dout_st, a.seq_q, a.heads, kD));
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  BwdParams& p = *out;
  p = BwdParams{};
  p.dq_acc = dq_acc;
  p.dq_state = dq_state;
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
  return cudaSuccess;
}

// After it (unless a.main_only == 1): dQ (times the softmax scale; added with accumulate) from the
// accumulator: q80's layout (q80), else in output order where row_order and dq's alignment allow,
// else in the consumers' fragment order.
template <int kD>
cudaError_t bwd_convert_dq(const BwdArgs& a, cudaStream_t stream, int pad, int n_mtiles, const float* dq_acc,
                           const int* dq_state, float scale, bool row_order, bool q80) {
  cudaError_t e = cudaSuccess;
  if (a.main_only != 1) {
    const RowStrides dq_st = row_strides(a.dq_st, a.seq_q, a.heads, kD);
    const int64_t vec = a.dq_f32 ? 4 : 8;  // elements per 16 bytes
    const bool aligned16 = reinterpret_cast<uintptr_t>(a.dq) % 16 == 0 && dq_st.b % vec == 0 &&
                           dq_st.s % vec == 0 && dq_st.h % vec == 0;
    const bool rows = row_order && aligned16;
    const int accumulate_dq = a.accumulate && !a.dq_fresh;
    if (q80) {
      const int64_t octets = static_cast<int64_t>(a.batch) * a.heads * n_mtiles * (bwd::kQ80 / 8);
      bwd_convert_dq_q80_kernel<<<static_cast<unsigned>((octets + 7) / 8), 256, 0, stream>>>(
          dq_acc, a.dq, dq_st, a.dq_f32, aligned16, a.heads, a.seq_q, n_mtiles, octets, scale, accumulate_dq);
    } else if (rows) {
      const int64_t threads = static_cast<int64_t>(a.batch) * a.heads * pad * kD / 8;
      bwd_convert_dq_rows_kernel<kD><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
          dq_acc, dq_state, a.dq, dq_st, a.dq_f32, a.batch, a.heads, a.seq_q, n_mtiles, scale, accumulate_dq);
    } else {
      const int64_t threads = static_cast<int64_t>(a.batch) * a.heads * pad * kD / 4;
      bwd_convert_dq_kernel<kD><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
          dq_acc, dq_state, a.dq, dq_st, a.dq_f32, a.batch, a.heads, a.seq_q, n_mtiles, scale, accumulate_dq);
    }
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// The whole backward around a main kernel: kernel(tm_q, tm_k, tm_v, tm_do, p) with smem bytes of
// dynamic shared memory, one CTA per (key tile, KV head, batch). kQRows: the kernel's query rows
// per tile (64; 128 for "q128", D = 64; 80 for "q80", D = 128).
// heads_inner: BwdParams::heads_inner (-1: the rule, backward_heads_inner in hopper_args.hpp).
template <int kD, int kPrologue, int kQRows>
cudaError_t launch_bwd_with(const BwdArgs& a, cudaStream_t stream, void (*kernel)(CUtensorMap, CUtensorMap,
                            CUtensorMap, CUtensorMap, BwdParams), int smem, int heads_inner = -1) {
  static_assert(kQRows == bwd::kBM || !(kPrologue & kStoreFirst), "store-first keeps one state per 64-row tile");
  constexpr bool k80 = kQRows == bwd::kQ80;  // its own accumulator layout and conversion
  static_assert(!k80 || kD == 128, "80-row tiles: D = 128");
  const int pad = bwd_seq_pad(a.seq_q, kQRows), n_mtiles = pad / (k80 ? bwd::kQ80 : bwd::kBM);
  float* dq_acc = static_cast<float*>(a.workspace);
  float* lse2 = dq_acc + static_cast<size_t>(a.batch) * a.heads * pad * kD;
  float* dpsum = lse2 + static_cast<size_t>(a.batch) * a.heads * pad;
  int* dq_state = (kPrologue & kStoreFirst) ? reinterpret_cast<int*>(dpsum + static_cast<size_t>(a.batch) * a.heads * pad)
                                            : nullptr;
  CUtensorMap tq, tk, tv, tdo;
  if (make_tmap(&tq, a.q, a.batch, a.seq_q, a.heads, kD, kQRows, a.q_st) != CUDA_SUCCESS ||
      make_tmap(&tk, a.k, a.batch, a.seq_k, a.kv_heads, kD, bwd::kBN, a.k_st) != CUDA_SUCCESS ||
      make_tmap(&tv, a.v, a.batch, a.seq_k, a.kv_heads, kD, bwd::kBN, a.v_st) != CUDA_SUCCESS ||
      make_tmap(&tdo, a.dout, a.batch, a.seq_q, a.heads, kD, kQRows, a.dout_st) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  BwdParams p{};
  cudaError_t e = bwd_prologue<kD>(a, stream, pad, n_mtiles, dq_acc, dq_state, lse2, dpsum, &p);
  if (e != cudaSuccess) return e;
  p.heads_inner = heads_inner >= 0 ? heads_inner : backward_heads_inner(a);
  if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) != cudaSuccess) return e;
  const int n_tiles = (a.seq_k + bwd::kBN - 1) / bwd::kBN;
  const dim3 grid(n_tiles, a.kv_heads, a.batch);
  if (a.main_only != 2) {  // 2: the timing aid that runs everything but the main kernel
    kernel<<<grid, bwd::kThreads, smem, stream>>>(tq, tk, tv, tdo, p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  return bwd_convert_dq<kD>(a, stream, pad, n_mtiles, dq_acc, dq_state, p.scale, (kPrologue & kRowConvert) != 0, k80);
}

// The library's backward: bwd_kernel<kD, kDefer, kQRows> (hopper_bwd.cuh) with the kPrologue bits.
template <int kD, bool kDefer, int kPrologue = kPrologueBest, int kQRows = bwd::kBM>
cudaError_t launch_bwd(const BwdArgs& a, cudaStream_t stream, int heads_inner = -1) {
  return launch_bwd_with<kD, kPrologue, kQRows>(a, stream, bwd_kernel<kD, kDefer, kQRows>,
                                                BwdSmem<kD, kQRows>::bytes, heads_inner);
}

// The D = 128 backward with 80-row query tiles (hopper_bwd_q80.cuh; dense masks, or tile lists
// planned with 80-row query tiles); its workspace: bwd_workspace_bytes(..., bwd::kQ80).
inline cudaError_t launch_bwd_q80(const BwdArgs& a, cudaStream_t stream, int heads_inner = -1) {
  if (a.head_dim != 128) return cudaErrorInvalidValue;
  return launch_bwd_with<128, kPrologueBest, bwd::kQ80>(
      a, stream, a.tiles.begin != nullptr ? bwd_q80_kernel<true> : bwd_q80_kernel<false>, BwdQ80Smem::bytes,
      heads_inner);
}

}  // namespace seqpar::hopper
