// The CUDA half of swiglu.cpp, elementwise in fp32 on bf16 arrays. Memory-bound, so each thread
// moves 8 elements at a time (16-byte loads) where the pointers allow; the rest one by one.
#include "model/cuda_common.cuh"

namespace seqpar::model::cuda {
namespace {

constexpr int kVec = 8;

__device__ inline float sigmoid(float g) { return 1.0f / (1.0f + __expf(-g)); }

__device__ inline void forward_one(const __nv_bfloat16* g, const __nv_bfloat16* u, __nv_bfloat16* a, int64_t i) {
  const float gi = __bfloat162float(g[i]);
  a[i] = __float2bfloat16(gi * sigmoid(gi) * __bfloat162float(u[i]));
}
__device__ inline void backward_one(float gi, float ui, float dai, float* dg, float* du) {
  const float sig = sigmoid(gi);
  *du = dai * gi * sig;
  *dg = dai * ui * sig * (1.0f + gi * (1.0f - sig));
}

// vec: whether elements [0, n - n % kVec) go kVec at a time (every pointer 16-byte aligned).
__global__ void forward(const __nv_bfloat16* g, const __nv_bfloat16* u, __nv_bfloat16* a, int64_t n, bool vec) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t whole = vec ? n / kVec : 0;
  for (int64_t j = first; j < whole; j += stride) {
    const Bf16x8 gv = reinterpret_cast<const Bf16x8*>(g)[j], uv = reinterpret_cast<const Bf16x8*>(u)[j];
    Bf16x8 av;
    for (int k = 0; k < 4; ++k) {
      const float2 gf = __bfloat1622float2(gv.v[k]), uf = __bfloat1622float2(uv.v[k]);
      av.v[k] = __floats2bfloat162_rn(gf.x * sigmoid(gf.x) * uf.x, gf.y * sigmoid(gf.y) * uf.y);
    }
    reinterpret_cast<Bf16x8*>(a)[j] = av;
  }
  for (int64_t i = whole * kVec + first; i < n; i += stride) forward_one(g, u, a, i);
}

__global__ void backward(const __nv_bfloat16* g, const __nv_bfloat16* u, const __nv_bfloat16* da, __nv_bfloat16* dg,
                         __nv_bfloat16* du, int64_t n, bool vec) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t whole = vec ? n / kVec : 0;
  for (int64_t j = first; j < whole; j += stride) {
    const Bf16x8 gv = reinterpret_cast<const Bf16x8*>(g)[j], uv = reinterpret_cast<const Bf16x8*>(u)[j];
    const Bf16x8 dav = reinterpret_cast<const Bf16x8*>(da)[j];
    Bf16x8 dgv, duv;
    for (int k = 0; k < 4; ++k) {
      const float2 gf = __bfloat1622float2(gv.v[k]), uf = __bfloat1622float2(uv.v[k]), df = __bfloat1622float2(dav.v[k]);
      float dg0, du0, dg1, du1;
      backward_one(gf.x, uf.x, df.x, &dg0, &du0);
      backward_one(gf.y, uf.y, df.y, &dg1, &du1);
      dgv.v[k] = __floats2bfloat162_rn(dg0, dg1);
      duv.v[k] = __floats2bfloat162_rn(du0, du1);
    }
    reinterpret_cast<Bf16x8*>(dg)[j] = dgv;
    reinterpret_cast<Bf16x8*>(du)[j] = duv;
  }
  for (int64_t i = whole * kVec + first; i < n; i += stride) {
    float dgi, dui;
    backward_one(__bfloat162float(g[i]), __bfloat162float(u[i]), __bfloat162float(da[i]), &dgi, &dui);
    dg[i] = __float2bfloat16(dgi), du[i] = __float2bfloat16(dui);
  }
}

}  // namespace

Status swiglu_forward(const bf16_t* g, const bf16_t* u, bf16_t* a, int64_t n, void* stream) {
  if (n == 0) return Status::Ok();
  const bool vec = aligned16(g) && aligned16(u) && aligned16(a);
  forward<<<blocks_for((n + kVec - 1) / kVec), 256, 0, as_stream(stream)>>>(as_bf16(g), as_bf16(u), as_bf16(a), n, vec);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status swiglu_backward(const bf16_t* g, const bf16_t* u, const bf16_t* da, bf16_t* dg, bf16_t* du, int64_t n,
                       void* stream) {
  if (n == 0) return Status::Ok();
  const bool vec = aligned16(g) && aligned16(u) && aligned16(da) && aligned16(dg) && aligned16(du);
  backward<<<blocks_for((n + kVec - 1) / kVec), 256, 0, as_stream(stream)>>>(as_bf16(g), as_bf16(u), as_bf16(da), as_bf16(dg),
                                                                              as_bf16(du), n, vec);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace seqpar::model::cuda
