// The CUDA half of rope.cpp: one thread per (row, pair), turning that pair in every head of the
// row, so the angle is made once for all heads. The angle p * theta^(-2i/D) is made and reduced
// to [-pi, pi] in double (positions reach millions: fp32 would lose the angle's fraction), and
// its sine and cosine taken in fp32 of the reduced angle (about 1e-7 off the double's, far
// below bf16's step). The frequencies theta^(-2i/D), one pow each, sit in shared memory.
#include "model/cuda_common.cuh"

namespace seqpar::model::cuda {
namespace {

constexpr int kThreads = 256, kMaxHalf = 512;  // head_dim up to 1024

__device__ inline float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ inline float load(const float* p) { return *p; }
__device__ inline void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
__device__ inline void store(float* p, float v) { *p = v; }

template <class T>
__global__ void rotate(T* x, const int64_t* positions, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                       double theta, bool inverse) {
  __shared__ double inv_freq[kMaxHalf];
  const int64_t half = head_dim / 2, n = batch * seq * half;
  for (int64_t i = threadIdx.x; i < half; i += kThreads) inv_freq[i] = pow(theta, -2.0 * double(i) / double(head_dim));
  __syncthreads();
  constexpr double kTurn = 6.283185307179586476925286766559;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t pair = i % half, row = i / half;  // row: (b, s)
    const double turns = double(positions[row % seq]) * inv_freq[pair] * (1.0 / kTurn);
    float sn, c;
    sincosf(float((turns - rint(turns)) * kTurn), &sn, &c);
    if (inverse) sn = -sn;
    T* r = x + row * heads * head_dim + pair;
    for (int64_t h = 0; h < heads; ++h, r += head_dim) {
      const float x1 = load(r), x2 = load(r + half);
      store(r, x1 * c - x2 * sn);
      store(r + half, x2 * c + x1 * sn);
    }
  }
}

template <class T>
Status launch(T* x, const int64_t* positions, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
              double theta, bool inverse, void* stream) {
  const int64_t n = batch * seq * (head_dim / 2);
  if (n == 0 || heads == 0) return Status::Ok();
  SP_CHECK_SUPPORTED(head_dim / 2 <= kMaxHalf, "RoPE on the GPU takes head dims up to " + std::to_string(2 * kMaxHalf) +
                                                   ", not " + std::to_string(head_dim));
  rotate<<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(x, positions, batch, seq, heads, head_dim, theta,
                                                                       inverse);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace

Status rope_apply(bf16_t* x, const int64_t* positions, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                  double theta, bool inverse, void* stream) {
  return launch(as_bf16(x), positions, batch, seq, heads, head_dim, theta, inverse, stream);
}
Status rope_apply(float* x, const int64_t* positions, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                  double theta, bool inverse, void* stream) {
  return launch(x, positions, batch, seq, heads, head_dim, theta, inverse, stream);
}

}  // namespace seqpar::model::cuda
