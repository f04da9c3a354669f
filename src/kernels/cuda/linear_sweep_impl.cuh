// The chunk-sweep kernel of linear_sweep.hpp and its launcher, included by the translation
// units that instantiate it (linear_forward.cu, linear_backward.cu).
//
// A CTA owns one (span, batch * head, 64-column slice of c) and walks the span's chunks one by
// one, keeping its T slice ([width(b), 64] fp32) in registers: warp w holds rows
// [w * width / 4, (w + 1) * width / 4). Each chunk's tiles sit in shared memory with rows padded
// by 16 bytes, so that the eight rows one ldmatrix reads fall in distinct banks. With kStages = 2
// the tiles of the next chunk are copied while this one is computed (twice the tile memory,
// which for the width-128 output sweeps leaves room for one CTA per SM instead of two).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/linear_sweep.hpp"
#include "kernels/cuda/mma_utils.cuh"

namespace seqpar::cuda {

namespace linear_detail {

constexpr int kChunk = kLinearChunk, kSlice = kLinearSlice, kThreads = kLinearThreads;
constexpr int kLdSlice = kSlice + 8;

// Elements of one stage of copied tiles: b, c and (output sweeps) a.
template <int kWidth, bool kOutput>
__host__ __device__ constexpr int stage_elems() {
  return kChunk * (kWidth + 8) + kChunk * kLdSlice + (kOutput ? kChunk * (kWidth + 8) : 0);
}

template <class Elem, int kWidth, bool kOutput, int kStages>
constexpr int smem_bytes() {
  int elems = kStages * stage_elems<kWidth, kOutput>() + kChunk * kLdSlice;  // tiles, u*c
  if (kOutput) elems += kWidth * kLdSlice;                                  // T as an operand
  return elems * int(sizeof(Elem)) + (kChunk + 1) * int(sizeof(float));
}

// ldmatrix x4 of the 16 x 16 block at (row0, col0) of a row-major tile with leading dim ld,
// lanes addressing the four 8 x 8 matrices in the order the mma fragments want:
//   a_operand: non-transposed A (rows m, cols k) -> a0..a3
//   a_operand_t: A stored transposed (rows k, cols m) -> a0..a3
//   b_operand: B stored as [n][k] -> (b0, b1) of n-tiles col0/8 and col0/8 + 1 ... of rows
//   b_operand_t: B stored as [k][n] -> (b0, b1) of n-tiles col0/8 and col0/8 + 1
template <class Elem>
__device__ __forceinline__ void ld_a(uint32_t (&r)[4], const Elem* tile, int ld, int row0, int col0, int lane) {
  ldmatrix_x4(r, tile + (row0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + col0 + (lane >> 4) * 8);
}
template <class Elem>
__device__ __forceinline__ void ld_a_t(uint32_t (&r)[4], const Elem* tile, int ld, int row0, int col0, int lane) {
  // row0 indexes k (stored rows), col0 indexes m (stored cols).
  ldmatrix_x4_trans_at(r, smem_address(tile + (row0 + (lane & 7) + (lane >> 4) * 8) * ld + col0 +
                                       ((lane >> 3) & 1) * 8));
}
template <class Elem>
__device__ __forceinline__ void ld_b(uint32_t (&r)[4], const Elem* tile, int ld, int row0, int col0, int lane) {
  // row0 indexes n (stored rows), col0 indexes k.
  ldmatrix_x4(r, tile + (row0 + (lane & 7) + (lane >> 4) * 8) * ld + col0 + ((lane >> 3) & 1) * 8);
}
template <class Elem>
__device__ __forceinline__ void ld_b_t(uint32_t (&r)[4], const Elem* tile, int ld, int row0, int col0, int lane) {
  // row0 indexes k (stored rows), col0 indexes n.
  ldmatrix_x4_trans_at(r, smem_address(tile + (row0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + col0 +
                                       (lane >> 4) * 8));
}

// Rows [row0, row0 + 64) x kCols of a global operand into a padded tile; rows at or past seq
// become zeros.
template <class Elem, int kCols, int kLd>
__device__ __forceinline__ void load_tile(Elem* dst, const Elem* src, int64_t row_stride, int64_t row0,
                                          int64_t seq, int tid) {
  constexpr int kPieces = kCols / 8;
#pragma unroll
  for (int idx = tid; idx < kChunk * kPieces; idx += kThreads) {
    const int r = idx / kPieces, piece = idx % kPieces;
    const bool valid = row0 + r < seq;
    cp_async_16(dst + r * kLd + piece * 8, valid ? src + (row0 + r) * row_stride + piece * 8 : src, valid);
  }
}

}  // namespace linear_detail

template <class Elem, int kWidth, bool kReverse, bool kOutput, class OutT, int kStages>
__global__ void __launch_bounds__(kLinearThreads) linear_sweep_kernel(const __grid_constant__ LinearSweepParams p) {
  using namespace linear_detail;
  using Traits = ElemTraits<Elem>;
  constexpr int kLdW = kWidth + 8;
  constexpr int kMT = kWidth / 64;  // 16-row tiles of T per warp
  constexpr int kStage = stage_elems<kWidth, kOutput>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Per stage: b [64][kLdW], c [64][kLdSlice], a [64][kLdW] (kOutput); then u_r c_r
  // [64][kLdSlice], T as an operand [kWidth][kLdSlice] (kOutput), lambda^t for t <= 64.
  Elem* const tiles = reinterpret_cast<Elem*>(smem_raw);
  Elem* const sCu = tiles + kStages * kStage;
  Elem* const sT = sCu + kChunk * kLdSlice;
  float* const pw = reinterpret_cast<float*>(kOutput ? sT + kWidth * kLdSlice : sT);

  const int span = blockIdx.x, bh = blockIdx.y, slice = blockIdx.z;
  const int b = bh / p.heads, h = bh % p.heads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // Each power is its own exp2 of the distance (never a product of powers).
  for (int i = tid; i <= kChunk; i += kThreads) pw[i] = exp2f(-p.log2_inv_decay[h] * float(i));

  const Elem* A = static_cast<const Elem*>(p.a) + b * p.a_batch + (h / p.a_head_div) * p.a_head;
  const Elem* B = static_cast<const Elem*>(p.b) + b * p.b_batch + (h / p.b_head_div) * p.b_head;
  const Elem* C = static_cast<const Elem*>(p.c) + b * p.c_batch + (h / p.c_head_div) * p.c_head + slice * kSlice;
  const int64_t total_chunks = (p.seq + kChunk - 1) / kChunk;
  const int64_t first_chunk = int64_t(span) * p.chunks_per_span;
  const int64_t end_chunk = min(first_chunk + int64_t(p.chunks_per_span), total_chunks);
  const int64_t state_elems = int64_t(p.b_width) * p.c_width;
  const int t_row0 = warp * (kWidth / 4);

  // T: rows t_row0 + 16 mt + g (+ 8), columns 8 nt + 2 t (+ 1) of this slice.
  float T[kMT][8][4];
  {
    const float* t0 = kOutput ? p.t0 + (int64_t(bh) * p.num_spans + span) * state_elems : nullptr;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = t_row0 + mt * 16 + g + (e >> 1) * 8;
          const int col = slice * kSlice + nt * 8 + 2 * t + (e & 1);
          T[mt][nt][e] = kOutput ? t0[row * p.t0_ld_b + col * p.t0_ld_c] : 0.f;
        }
  }

  const int64_t steps = end_chunk - first_chunk;
  const auto chunk_of = [&](int64_t step) { return kReverse ? end_chunk - 1 - step : first_chunk + step; };
  // Copies the tiles of chunk `step` into `stage`.
  const auto load_chunk = [&](int64_t step, int stage) {
    Elem* base = tiles + stage * kStage;
    const int64_t row0 = chunk_of(step) * kChunk;
    load_tile<Elem, kWidth, kLdW>(base, B, p.b_row, row0, p.seq, tid);
    load_tile<Elem, kSlice, kLdSlice>(base + kChunk * kLdW, C, p.c_row, row0, p.seq, tid);
    if constexpr (kOutput) load_tile<Elem, kWidth, kLdW>(base + kChunk * kLdW + kChunk * kLdSlice, A, p.a_row, row0, p.seq, tid);
  };

  for (int64_t step = 0; step < steps; ++step) {
    const int64_t row0 = chunk_of(step) * kChunk;
    const int m = int(min(int64_t(kChunk), p.seq - row0));  // rows of this chunk
    const int stage = kStages == 2 ? int(step & 1) : 0;
    const Elem* sB = tiles + stage * kStage;
    const Elem* sC = sB + kChunk * kLdW;
    const Elem* sA = sC + kChunk * kLdSlice;
    if constexpr (kStages == 2) {
      // The other stage was last read in the previous step, which ended with a barrier.
      if (step == 0) {
        load_chunk(0, 0);
        cp_async_commit();
      }
      if (step + 1 < steps) load_chunk(step + 1, stage ^ 1);
      cp_async_commit();  // possibly empty: the wait below always leaves the newest group
    } else {
      load_chunk(step, 0);
      cp_async_commit();
    }
    if constexpr (kOutput) {  // T as an mma operand, rounded, while the copies fly
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = t_row0 + mt * 16 + g + half * 8;
            *reinterpret_cast<uint32_t*>(&sT[row * kLdSlice + nt * 8 + 2 * t]) =
                Traits::pack(T[mt][nt][2 * half], T[mt][nt][2 * half + 1]);
          }
    }
    cp_async_wait<kStages - 1>();  // this chunk's tiles have landed (the next may be in flight)
    __syncthreads();
    // u_r c_r: the decay (and in reverse the scale) of row r folded into c, rounded.
    for (int idx = tid; idx < kChunk * kSlice / 2; idx += kThreads) {
      const int r = idx / (kSlice / 2), col = (idx % (kSlice / 2)) * 2;
      const float u = r < m ? (kReverse ? p.scale * pw[r + 1] : pw[m - 1 - r]) : 0.f;
      const float2 x = Traits::unpack(*reinterpret_cast<const uint32_t*>(&sC[r * kLdSlice + col]));
      *reinterpret_cast<uint32_t*>(&sCu[r * kLdSlice + col]) = Traits::pack(u * x.x, u * x.y);
    }
    __syncthreads();

    if constexpr (kOutput) {
      const int row_base = warp * 16;
      float acc[8][4];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
      // The state term a_i T, weighted per row.
#pragma unroll
      for (int kk = 0; kk < kWidth / 16; ++kk) {
        uint32_t af[4];
        ld_a(af, sA, kLdW, row_base, kk * 16, lane);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t bf[4];
          ld_b_t(bf, sT, kLdSlice, kk * 16, np * 16, lane);
          mma_16816<Elem>(acc[2 * np], af, bf[0], bf[1]);
          mma_16816<Elem>(acc[2 * np + 1], af, bf[2], bf[3]);
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = row_base + g + half * 8;
        const float w = i < m ? (kReverse ? pw[m - 1 - i] : p.scale * pw[i + 1]) : 0.f;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          acc[nt][2 * half] *= w;
          acc[nt][2 * half + 1] *= w;
        }
      }
      // Scores a_i . b_j on the 16-column blocks the causal mask leaves (j <= i, or j >= i).
      float s[8][4];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kWidth / 16; ++kk) {
        uint32_t af[4];
        ld_a(af, sA, kLdW, row_base, kk * 16, lane);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          if (kReverse ? np < warp : np > warp) continue;
          uint32_t bf[4];
          ld_b(bf, sB, kLdW, np * 16, kk * 16, lane);
          mma_16816<Elem>(s[2 * np], af, bf[0], bf[1]);
          mma_16816<Elem>(s[2 * np + 1], af, bf[2], bf[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = row_base + g + (e >> 1) * 8, j = nt * 8 + 2 * t + (e & 1);
          const bool seen = (kReverse ? j >= i : j <= i) && i < m && j < m;
          s[nt][e] = seen ? p.scale * pw[kReverse ? j - i : i - j] * s[nt][e] : 0.f;
        }
      // + scores (rounded) times c.
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if (kReverse ? kk < warp : kk > warp) continue;
        const uint32_t af[4] = {Traits::pack(s[2 * kk][0], s[2 * kk][1]), Traits::pack(s[2 * kk][2], s[2 * kk][3]),
                                Traits::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                Traits::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t bf[4];
          ld_b_t(bf, sC, kLdSlice, kk * 16, np * 16, lane);
          mma_16816<Elem>(acc[2 * np], af, bf[0], bf[1]);
          mma_16816<Elem>(acc[2 * np + 1], af, bf[2], bf[3]);
        }
      }
      OutT* out = static_cast<OutT*>(p.out) + b * p.out_batch + h * p.out_head + slice * kSlice;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = row_base + g + half * 8;
        if (i >= m) continue;
        OutT* row = out + (row0 + i) * p.out_row;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const int col = nt * 8 + 2 * t;
          if constexpr (std::is_same_v<OutT, float>)
            *reinterpret_cast<float2*>(&row[col]) = make_float2(acc[nt][2 * half], acc[nt][2 * half + 1]);
          else
            *reinterpret_cast<uint32_t*>(&row[col]) = Traits::pack(acc[nt][2 * half], acc[nt][2 * half + 1]);
        }
      }
    }

    // T <- lambda^m T + b^T (u c): the a operand is b read transposed.
    const float carry = pw[m];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) T[mt][nt][e] *= carry;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t af[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) ld_a_t(af[mt], sB, kLdW, kk * 16, t_row0 + mt * 16, lane);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t bf[4];
        ld_b_t(bf, sCu, kLdSlice, kk * 16, np * 16, lane);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<Elem>(T[mt][2 * np], af[mt], bf[0], bf[1]);
          mma_16816<Elem>(T[mt][2 * np + 1], af[mt], bf[2], bf[3]);
        }
      }
    }
    __syncthreads();  // the tiles are refilled next chunk
  }

  if constexpr (!kOutput) {  // the span-local state (or dState) for the scan
    float* dst = p.states + (int64_t(bh) * p.num_spans + span) * state_elems + slice * kSlice;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = t_row0 + mt * 16 + g + half * 8;
          *reinterpret_cast<float2*>(&dst[int64_t(row) * p.c_width + nt * 8 + 2 * t]) =
              make_float2(T[mt][nt][2 * half], T[mt][nt][2 * half + 1]);
        }
  }
}

template <class Elem, int kWidth, bool kReverse, bool kOutput, class OutT, int kStages>
void launch_linear_sweep(const LinearSweepParams& p, int batch, void* stream) {
  auto* kernel = &linear_sweep_kernel<Elem, kWidth, kReverse, kOutput, OutT, kStages>;
  constexpr int smem = linear_detail::smem_bytes<Elem, kWidth, kOutput, kStages>();
  // Above the 48 KB default for the output sweeps; the host checks launch errors after.
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const dim3 grid(unsigned(p.num_spans), unsigned(batch * p.heads), unsigned(p.c_width / kLinearSlice));
  kernel<<<grid, kLinearThreads, smem, static_cast<cudaStream_t>(stream)>>>(p);
}

// launch_linear_sweep with the width of b (64 or 128) and the stages (1, or 2 when pipelined)
// chosen at run time.
template <class Elem, bool kReverse, bool kOutput, class OutT>
void launch_sweep_width(const LinearSweepParams& p, bool pipelined, int batch, void* stream) {
  if (p.b_width == 64 && pipelined)
    launch_linear_sweep<Elem, 64, kReverse, kOutput, OutT, 2>(p, batch, stream);
  else if (p.b_width == 64)
    launch_linear_sweep<Elem, 64, kReverse, kOutput, OutT, 1>(p, batch, stream);
  else if (pipelined)
    launch_linear_sweep<Elem, 128, kReverse, kOutput, OutT, 2>(p, batch, stream);
  else
    launch_linear_sweep<Elem, 128, kReverse, kOutput, OutT, 1>(p, batch, stream);
}

}  // namespace seqpar::cuda
