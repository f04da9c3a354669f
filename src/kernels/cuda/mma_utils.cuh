// Tensor-core building blocks for our CUDA kernels: mma.sync m16n8k16 (bf16/fp16 in, fp32
// accumulate), ldmatrix loads from XOR-swizzled shared memory, cp.async copies, and element
// type helpers. Fragment layouts follow the PTX ISA for m16n8k16:
//   A (16x16, row): a0 (row g, k 2t..2t+1), a1 (row g+8), a2 (row g, k+8), a3 (row g+8, k+8)
//   B (16x8, col):  b0 (k 2t..2t+1, col g), b1 (k+8)
//   C (16x8):       c0,c1 (row g, cols 2t, 2t+1), c2,c3 (row g+8)
// with g = lane / 4 and t = lane % 4.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace seqpar::cuda {

template <class Elem>
struct ElemTraits;
template <>
struct ElemTraits<__nv_bfloat16> {
  __device__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ static float2 unpack(uint32_t v) {  // pack's two values as the mma sees them
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  }
};
template <>
struct ElemTraits<__half> {
  __device__ static uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ static float2 unpack(uint32_t v) { return __half22float2(*reinterpret_cast<__half2*>(&v)); }
};

// d += a * b on tensor cores.
template <class Elem>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ldmatrix from a 32-bit shared-memory address (smem_address). The kernels precompute these
// per thread, so that each load in an unrolled loop is a base plus an immediate.
__device__ __forceinline__ void ldmatrix_x4_at(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans_at(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
// The same from a generic pointer into shared memory.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) { ldmatrix_x4_at(r, smem_address(p)); }

// 16-byte global -> shared copy; src_bytes = 0 writes zeros (rows past the end).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)),
               "l"(src), "r"(src_bytes));
}
// 4-byte copy (cp.async.ca: the 16-byte .cg form needs 16-byte aligned rows); src_bytes = 0
// writes zeros.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(dst)),
               "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Shared-memory tile of rows x kDim elements, 16-byte chunks XOR-swizzled by row so that the
// eight rows an ldmatrix reads hit eight different banks.
template <int kDim>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * kDim + ((chunk ^ (row & 7)) << 3);
}

// The swizzle split for unrolled loops: for chunk = 8 a + c (c < 8) of a row with row & 7 = r,
// swizzled(row, chunk) = row * kDim + 64 a + ((c ^ r) << 3): the XOR touches only the low
// three bits. A thread that reads chunks 2 b + c0 (b = 0..3, its lane fixing c0 and r) needs
// four offsets; the rest is a per-row base and a compile-time 64 a.
struct SwizzleOffsets {
  int bytes[4];  // ((2 b + c0) ^ r) * 8 elements, in bytes of a 2-byte element
  __device__ __forceinline__ SwizzleOffsets(int c0, int r) {
    for (int b = 0; b < 4; ++b) bytes[b] = (((2 * b + c0) ^ r) << 3) * 2;
  }
  // Byte offset within a row of 16-byte chunk 2 ks + c0.
  __device__ __forceinline__ int of(int ks) const { return bytes[ks & 3] + (ks >> 2) * 128; }
};

// cp.async of a tile of rows x kDim elements into an XOR-swizzled shared tile by a CTA of
// kThreads threads. Thread tid copies 16-byte chunk tid % kChunks of rows tid / kChunks +
// i kRowsPerPass; kRowsPerPass is a multiple of 8, so those rows share one swizzle and each
// pass moves both addresses by a constant (no per-row address arithmetic).
template <class Elem, int kDim, int kThreads>
struct TileLoader {
  static constexpr int kChunks = kDim / 8, kRowsPerPass = kThreads / kChunks;
  static_assert(kRowsPerPass % 8 == 0, "rows of one pass must share the swizzle");
  int lane_row, lane_chunk, lane_smem;
  __device__ __forceinline__ explicit TileLoader(int tid)
      : lane_row(tid / kChunks), lane_chunk(tid % kChunks), lane_smem(swizzled<kDim>(lane_row, lane_chunk)) {}
  // Rows [row0, row0 + kTileRows) of src (row_stride elements apart) into dst; rows at or past
  // rows_total are written as zeros.
  template <int kTileRows>
  __device__ __forceinline__ void load(Elem* dst, const Elem* src, int64_t row_stride, int row0,
                                       int rows_total) const {
    static_assert(kTileRows % kRowsPerPass == 0, "whole passes");
    const Elem* from = src + int64_t(row0 + lane_row) * row_stride + lane_chunk * 8;
    if (row0 + kTileRows <= rows_total) {  // the whole tile exists: no per-row test
#pragma unroll
      for (int pass = 0; pass < kTileRows / kRowsPerPass; ++pass) {
        cp_async_16(dst + lane_smem + pass * kRowsPerPass * kDim, from, true);
        from += kRowsPerPass * row_stride;
      }
      return;
    }
#pragma unroll
    for (int pass = 0; pass < kTileRows / kRowsPerPass; ++pass) {
      const bool valid = row0 + lane_row + pass * kRowsPerPass < rows_total;
      cp_async_16(dst + lane_smem + pass * kRowsPerPass * kDim, valid ? from : src, valid);
      from += kRowsPerPass * row_stride;
    }
  }
};

}  // namespace seqpar::cuda
