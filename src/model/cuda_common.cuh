// What the model's CUDA layer files share: bf16 access, launch shapes, the cuBLAS handle of the
// calling thread, and the error checks.
#pragma once

#include <cublas_v2.h>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/cuda_check.hpp"
#include "model/layers_cuda.hpp"

namespace seqpar::model::cuda {

inline __nv_bfloat16* as_bf16(bf16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }
inline const __nv_bfloat16* as_bf16(const bf16_t* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }
inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Eight bf16 or four fp32 values: one 16-byte load or store, for the memory-bound elementwise
// kernels (where every pointer is aligned16; the rest go one element at a time).
struct alignas(16) Bf16x8 {
  __nv_bfloat162 v[4];
};
struct alignas(16) F32x4 {
  float v[4];
};
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline unsigned blocks_for(int64_t n, int threads = 256) {
  return unsigned(std::min<int64_t>((n + threads - 1) / threads, 65535LL * 32));
}

// The sum of v over a block of `threads` threads in a fixed order (a butterfly within each warp,
// then the warps in order), given to every thread: the same bits every run.
template <int threads, class T>
__device__ T block_sum(T v) {
  __shared__ T partial[threads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < threads / 32; ++w) total += partial[w];
  __syncthreads();  // partial may be written again
  return total;
}

// One cuBLAS handle per thread (a rank is a thread), set to the stream of each call.
cublasHandle_t cublas_for(void* stream);

#define SP_CUBLAS_CHECK(expr)                                                                          \
  do {                                                                                                \
    const cublasStatus_t sp_cublas_status = (expr);                                                   \
    if (sp_cublas_status != CUBLAS_STATUS_SUCCESS)                                                    \
      return SP_STATUS(::seqpar::StatusCode::kInternal,                                              \
                       std::string("cuBLAS: ") + cublasGetStatusString(sp_cublas_status) + " in " #expr); \
  } while (0)

// Row-major C[M, N] = alpha op(A) op(B) + beta C with bf16 A and B, C of ctype, fp32 compute,
// through cuBLASLt with the algorithm timed fastest for the shape (gemm_bf16.cu). lda: A's row
// stride in elements (0: packed, K or M).
Status gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16_t* A,
                 const bf16_t* B, float beta, void* C, cudaDataType_t ctype, void* stream, int64_t lda = 0);

}  // namespace seqpar::model::cuda
