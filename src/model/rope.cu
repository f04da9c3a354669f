// The CUDA half of rope.cpp: one thread per (row, head, pair); the angle p * theta^(-2i/D) in
// double, as on the CPU (positions reach millions: fp32 would lose the angle's fraction).
#include "model/cuda_common.cuh"

namespace seqpar::model::cuda {
namespace {

__device__ inline float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ inline float load(const float* p) { return *p; }
__device__ inline void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
__device__ inline void store(float* p, float v) { *p = v; }

template <class T>
__global__ void rotate(T* x, const int64_t* positions, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                       double theta, bool inverse) {
  const int64_t half = head_dim / 2, n = batch * seq * heads * half;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pair = i % half, row = i / half;  // row: (b, s, h)
    const int64_t s = (row / heads) % seq;
    const double angle = double(positions[s]) * pow(theta, -2.0 * double(pair) / double(head_dim));
    double sn, c;
    sincos(angle, &sn, &c);
    if (inverse) sn = -sn;
    T* r = x + row * head_dim;
    const double x1 = load(r + pair), x2 = load(r + pair + half);
    store(r + pair, float(x1 * c - x2 * sn));
    store(r + pair + half, float(x2 * c + x1 * sn));
  }
}

template <class T>
Status launch(T* x, const int64_t* positions, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
              double theta, bool inverse, void* stream) {
  const int64_t n = batch * seq * heads * (head_dim / 2);
  if (n == 0) return Status::Ok();
  rotate<<<blocks_for(n), 256, 0, as_stream(stream)>>>(x, positions, batch, seq, heads, head_dim, theta, inverse);
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
