// The CUDA half of linear.cpp: products through gemm_bf16 (gemm_bf16.cu), bf16 inputs, fp32 compute; and the
// fp32 <-> bf16 copies and the fp32 add the engine moves weights, activations and gradients with
// (memory-bound: 16-byte loads where the pointers allow).
#include <algorithm>
#include <string>

#include "model/cuda_common.cuh"

namespace seqpar::model::cuda {

Status linear_forward(const bf16_t* x, const bf16_t* w, bf16_t* y, int64_t rows, int64_t in, int64_t out,
                      void* stream) {
  return gemm_bf16(false, true, rows, out, in, 1.0f, x, w, 0.0f, y, CUDA_R_16BF, stream);
}

Status linear_forward_add(const bf16_t* x, const bf16_t* w, float* y, int64_t rows, int64_t in, int64_t out,
                          void* stream) {
  return gemm_bf16(false, true, rows, out, in, 1.0f, x, w, 1.0f, y, CUDA_R_32F, stream);
}

Status linear_backward(const bf16_t* x, const bf16_t* w, const bf16_t* dy, float* dx, float* dw, int64_t rows,
                       int64_t in, int64_t out, bool accumulate_dx, void* stream) {
  if (dx) SP_RETURN_IF_ERROR(gemm_bf16(false, false, rows, in, out, 1.0f, dy, w, accumulate_dx ? 1.0f : 0.0f, dx,
                                       CUDA_R_32F, stream));
  return gemm_bf16(true, false, out, in, rows, 1.0f, dy, x, 1.0f, dw, CUDA_R_32F, stream);
}

Status linear_backward(const bf16_t* x, const bf16_t* w, const bf16_t* dy, bf16_t* dx, float* dw, int64_t rows,
                       int64_t in, int64_t out, void* stream) {
  SP_RETURN_IF_ERROR(gemm_bf16(false, false, rows, in, out, 1.0f, dy, w, 0.0f, dx, CUDA_R_16BF, stream));
  return gemm_bf16(true, false, out, in, rows, 1.0f, dy, x, 1.0f, dw, CUDA_R_32F, stream);
}

namespace {

// vec: elements [0, n - n % 8) go eight at a time (every pointer aligned16), the rest one by one.
__global__ void to_bf16_kernel(const float* x, __nv_bfloat16* y, int64_t n, bool vec) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t whole = vec ? n / 8 : 0;
  for (int64_t j = first; j < whole; j += stride) {
    const F32x4 a = reinterpret_cast<const F32x4*>(x)[2 * j], b = reinterpret_cast<const F32x4*>(x)[2 * j + 1];
    Bf16x8 o;
    o.v[0] = __floats2bfloat162_rn(a.v[0], a.v[1]), o.v[1] = __floats2bfloat162_rn(a.v[2], a.v[3]);
    o.v[2] = __floats2bfloat162_rn(b.v[0], b.v[1]), o.v[3] = __floats2bfloat162_rn(b.v[2], b.v[3]);
    reinterpret_cast<Bf16x8*>(y)[j] = o;
  }
  for (int64_t i = whole * 8 + first; i < n; i += stride) y[i] = __float2bfloat16(x[i]);
}
__global__ void to_f32_kernel(const __nv_bfloat16* x, float* y, int64_t n, bool vec) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t whole = vec ? n / 8 : 0;
  for (int64_t j = first; j < whole; j += stride) {
    const Bf16x8 v = reinterpret_cast<const Bf16x8*>(x)[j];
    F32x4 a, b;
    for (int k = 0; k < 2; ++k) {
      const float2 lo = __bfloat1622float2(v.v[k]), hi = __bfloat1622float2(v.v[k + 2]);
      a.v[2 * k] = lo.x, a.v[2 * k + 1] = lo.y, b.v[2 * k] = hi.x, b.v[2 * k + 1] = hi.y;
    }
    reinterpret_cast<F32x4*>(y)[2 * j] = a, reinterpret_cast<F32x4*>(y)[2 * j + 1] = b;
  }
  for (int64_t i = whole * 8 + first; i < n; i += stride) y[i] = __bfloat162float(x[i]);
}
__global__ void add_kernel(float* dst, const float* src, int64_t n, bool vec) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t whole = vec ? n / 4 : 0;
  for (int64_t j = first; j < whole; j += stride) {
    F32x4 d = reinterpret_cast<F32x4*>(dst)[j];
    const F32x4 s = reinterpret_cast<const F32x4*>(src)[j];
    for (int k = 0; k < 4; ++k) d.v[k] += s.v[k];
    reinterpret_cast<F32x4*>(dst)[j] = d;
  }
  for (int64_t i = whole * 4 + first; i < n; i += stride) dst[i] += src[i];
}

}  // namespace

Status add(float* dst, const float* src, int64_t n, void* stream) {
  if (n == 0) return Status::Ok();
  const bool vec = aligned16(dst) && aligned16(src);
  add_kernel<<<blocks_for((n + 3) / 4), 256, 0, as_stream(stream)>>>(dst, src, n, vec);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status to_bf16(const float* x, bf16_t* y, int64_t n, void* stream) {
  if (n == 0) return Status::Ok();
  const bool vec = aligned16(x) && aligned16(y);
  to_bf16_kernel<<<blocks_for((n + 7) / 8), 256, 0, as_stream(stream)>>>(x, as_bf16(y), n, vec);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}
Status to_f32(const bf16_t* x, float* y, int64_t n, void* stream) {
  if (n == 0) return Status::Ok();
  const bool vec = aligned16(x) && aligned16(y);
  to_f32_kernel<<<blocks_for((n + 7) / 8), 256, 0, as_stream(stream)>>>(as_bf16(x), y, n, vec);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace seqpar::model::cuda
