// Portable SIMD for the CPU kernels through GCC/Clang vector extensions: one 64-byte vector
// type per scalar type (AVX-512 registers where the build targets them; split into smaller
// registers otherwise), a register-blocked GEMM micro-kernel, and a vectorised exp2.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

namespace seqpar::cpu {

// Cache-line aligned storage for tiles and packed operands: 64-byte vector loads from a
// 16-byte aligned malloc block would straddle cache lines and run at a fraction of speed.
template <class T>
struct CacheAlignedAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheAlignedAllocator() = default;
  template <class U>
  CacheAlignedAllocator(const CacheAlignedAllocator<U>&) {}  // NOLINT: rebinding
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const CacheAlignedAllocator<U>&) const { return true; }
};
template <class T>
using AlignedVector = std::vector<T, CacheAlignedAllocator<T>>;

typedef float vfloat __attribute__((vector_size(64), aligned(4), may_alias));
typedef double vdouble __attribute__((vector_size(64), aligned(8), may_alias));
typedef int32_t vint32 __attribute__((vector_size(64)));

template <class T>
struct Simd;
template <>
struct Simd<float> {
  using V = vfloat;
  static constexpr int kWidth = 16;
};
template <>
struct Simd<double> {
  using V = vdouble;
  static constexpr int kWidth = 8;
};

template <class T>
inline typename Simd<T>::V load(const T* p) {
  return *reinterpret_cast<const typename Simd<T>::V*>(p);
}
template <class T>
inline void store(T* p, typename Simd<T>::V x) {
  *reinterpret_cast<typename Simd<T>::V*>(p) = x;
}

// C[MR x NV*W] (+)= A[MR x K] * B[K x NV*W]; rows of A, B, C at strides lda, ldb, ldc.
// MR x NV accumulators stay in registers across the whole K loop.
template <class T, int MR, int NV, bool kAccumulate>
inline void gemm_micro_kernel(int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C,
                              int64_t ldc) {
  using V = typename Simd<T>::V;
  constexpr int W = Simd<T>::kWidth;
  V acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = kAccumulate ? load(C + r * ldc + v * W) : V{};
  for (int64_t k = 0; k < K; ++k) {
    V b[NV];
    for (int v = 0; v < NV; ++v) b[v] = load(B + k * ldb + v * W);
    for (int r = 0; r < MR; ++r) {
      const T a = A[r * lda + k];
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) store(C + r * ldc + v * W, acc[r][v]);
}

template <class T, int NV, bool kAccumulate>
inline void gemm_column_panel(int64_t M, int64_t K, const T* A, int64_t lda, const T* B,
                              int64_t ldb, T* C, int64_t ldc) {
  constexpr int MR = 4;
  int64_t m = 0;
  for (; m + MR <= M; m += MR)
    gemm_micro_kernel<T, MR, NV, kAccumulate>(K, A + m * lda, lda, B, ldb, C + m * ldc, ldc);
  for (; m < M; ++m)
    gemm_micro_kernel<T, 1, NV, kAccumulate>(K, A + m * lda, lda, B, ldb, C + m * ldc, ldc);
}

// C[M x N] (+)= A[M x K] * B[K x N], row-major with leading dimensions; N a multiple of the
// vector width (callers pad).
template <class T, bool kAccumulate>
inline void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
                 int64_t ldb, T* C, int64_t ldc) {
  constexpr int W = Simd<T>::kWidth;
  int64_t n = 0;
  for (; n + 4 * W <= N; n += 4 * W)
    gemm_column_panel<T, 4, kAccumulate>(M, K, A, lda, B + n, ldb, C + n, ldc);
  switch ((N - n) / W) {
    case 3: gemm_column_panel<T, 3, kAccumulate>(M, K, A, lda, B + n, ldb, C + n, ldc); break;
    case 2: gemm_column_panel<T, 2, kAccumulate>(M, K, A, lda, B + n, ldb, C + n, ldc); break;
    case 1: gemm_column_panel<T, 1, kAccumulate>(M, K, A, lda, B + n, ldb, C + n, ldc); break;
    default: break;
  }
}

// x[i] <- 2^(x[i] - offset) for n a multiple of the vector width. Arguments below -126
// (including -inf) give exactly 0, so masked scores vanish without NaN.
inline void exp2_shifted(float* x, int64_t n, float offset) {
  using V = vfloat;
  const V lo = V{} - 126.0f;
  for (int64_t i = 0; i < n; i += 16) {
    V t = load(x + i) - offset;
    const vint32 underflow = t < lo;
    t = t < lo ? lo : t;
    t = t > 127.0f ? V{} + 127.0f : t;
    // Round to nearest: 1.5 * 2^23 pushes the fraction out of the mantissa.
    const V shifter = V{} + 12582912.0f;
    const V n_float = (t + shifter) - shifter;
    const V f = t - n_float;  // in [-0.5, 0.5]
    // 2^f by its Taylor series to degree 7 (relative error below 3e-9 on [-0.5, 0.5]).
    V p = V{} + 1.5252733804059840e-5f;
    p = p * f + 1.5403530393381609e-4f;
    p = p * f + 1.3333558146428443e-3f;
    p = p * f + 9.6181291076284772e-3f;
    p = p * f + 5.5504108664821580e-2f;
    p = p * f + 2.4022650695910071e-1f;
    p = p * f + 6.9314718055994531e-1f;
    p = p * f + 1.0f;
    const vint32 bits = (__builtin_convertvector(n_float, vint32) + 127) << 23;
    V scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    const V result = p * scale;
    store(x + i, underflow ? V{} : result);
  }
}

inline void exp2_shifted(double* x, int64_t n, double offset) {
  for (int64_t i = 0; i < n; ++i) x[i] = std::exp2(x[i] - offset);
}

}  // namespace seqpar::cpu
