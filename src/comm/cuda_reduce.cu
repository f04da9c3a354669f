// device_reduce_into (device_reduce.hpp): one grid-stride elementwise kernel per dtype and op.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "comm/device_reduce.hpp"
#include "core/cuda_check.hpp"

namespace seqpar {
namespace {

// Loads and stores through float for the 16-bit types, as the host ring does.
template <class T> struct Arith { using type = T; };
template <> struct Arith<__nv_bfloat16> { using type = float; };
template <> struct Arith<__half> { using type = float; };

template <class T> __device__ typename Arith<T>::type load(T x) { return x; }
template <> __device__ float load(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ float load(__half x) { return __half2float(x); }
template <class T> __device__ T store(typename Arith<T>::type x) { return x; }
template <> __device__ __nv_bfloat16 store<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __half store<__half>(float x) { return __float2half_rn(x); }

template <class T, bool kMax>
__global__ void reduce_kernel(T* acc, const T* in, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const auto a = load(acc[i]), b = load(in[i]);
    // max as std::max(a, b) on the host: a unless a < b (the same NaN behaviour).
    acc[i] = store<T>(kMax ? (a < b ? b : a) : a + b);
  }
}

template <class T>
Status launch(void* acc, const void* in, size_t count, ReduceOp op, cudaStream_t stream) {
  constexpr unsigned kThreads = 256;
  const unsigned blocks = unsigned(std::min<size_t>((count + kThreads - 1) / kThreads, 4096));
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(in);
  if (op == ReduceOp::kMax) reduce_kernel<T, true><<<blocks, kThreads, 0, stream>>>(a, b, count);
  else reduce_kernel<T, false><<<blocks, kThreads, 0, stream>>>(a, b, count);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace

Status device_reduce_into(void* acc, const void* in, size_t count, DType dtype, ReduceOp op, void* stream) {
  if (count == 0) return Status::Ok();
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::kF64: return launch<double>(acc, in, count, op, s);
    case DType::kF32: return launch<float>(acc, in, count, op, s);
    case DType::kBF16: return launch<__nv_bfloat16>(acc, in, count, op, s);
    case DType::kF16: return launch<__half>(acc, in, count, op, s);
  }
  return SP_STATUS(StatusCode::kInvalidArgument, "unknown dtype");
}

}  // namespace seqpar
