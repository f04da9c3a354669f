// The CUDA half of lm_head_loss.cpp: a chunk's logits by cuBLAS into scratch (fp32, or bf16 as
// Liger-Kernel keeps them), one block per row for its logsumexp (max and sum in one pass) and loss;
// in training the same block then turns its row in place into bf16 scale * (softmax - onehot),
// and the chunk is multiplied back at once (dx fp32 written, dw fp32 added): three products a
// row, the logits never remade. Scratch: chunk x vocab logits, nothing else.
#include <algorithm>
#include <type_traits>

#include "model/cuda_common.cuh"
#include "seqpar/gpu.hpp"

namespace seqpar::model::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread =
    4;  // elements a thread holds between the read and the write of a segment

__device__ float load(const float* p) {
  return *p;
}
__device__ float load(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}

// A running (max, sum of exp(x - max)); empty: (-inf, 0).
struct MaxSum {
  float m, s;
};
__device__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};  // both empty: no -inf - -inf
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

// The block's (max, sum), in a fixed order (the same bits every run), given to every thread.
__device__ MaxSum block_max_sum(MaxSum v) {
  __shared__ MaxSum partial[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1)
    v = combine(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  MaxSum total = partial[0];
  for (int w = 1; w < kThreads / 32; ++w) total = combine(total, partial[w]);
  __syncthreads();  // partial may be written again
  return total;
}

// Sixteen bytes of logits: 8 bf16 or 4 fp32 values, and their bf16 gradient (16 or 8 bytes).
template <class L>
struct Pack {
  static constexpr int n = int(16 / sizeof(L));
  using Out = std::conditional_t<sizeof(L) == 2, uint4, uint2>;
  __device__ static void unpack(uint4 raw, float* x) {
    if constexpr (sizeof(L) == 2) {
      const auto* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(h[k]);
        x[2 * k] = f.x, x[2 * k + 1] = f.y;
      }
    } else {
      x[0] = __uint_as_float(raw.x), x[1] = __uint_as_float(raw.y), x[2] = __uint_as_float(raw.z),
      x[3] = __uint_as_float(raw.w);
    }
  }
  __device__ static Out pack(const float* g) {
    Out o;
    auto* h = reinterpret_cast<__nv_bfloat162*>(&o);
    for (int k = 0; k < n / 2; ++k) h[k] = __floats2bfloat162_rn(g[2 * k], g[2 * k + 1]);
    return o;
  }
};

// acc joined with n values: one rescale for the group, not a branch per value.
template <int n>
__device__ MaxSum add_values(MaxSum acc, const float* x) {
  float m = acc.m;
#pragma unroll
  for (int k = 0; k < n; ++k) m = fmaxf(m, x[k]);
  if (m == -INFINITY) return acc;  // nothing but -inf so far
  float s = acc.s * __expf(acc.m - m);
#pragma unroll
  for (int k = 0; k < n; ++k) s += __expf(x[k] - m);
  return {m, s};
}

// One block per row of logits (row stride vocab): row_loss = lse - logit[target] (0 for rows not
// counted), and with `gradient` the row overwritten by bf16 scale (softmax - onehot) from its
// first byte on (bf16 row stride: vocab * sizeof(L) / 2 elements). `vec`: every row starts
// 16-byte aligned and holds whole 16-byte packs, so the row moves 16 bytes a load, four loads in
// flight a thread (the row's passes are bound by memory: 0.26-0.5 GB a 1,024-row chunk at vocab
// 128256); else one element at a time.
template <class L>
__global__ void __launch_bounds__(kThreads)
    loss_kernel(L* logits, const int32_t* targets, int64_t vocab, float scale, bool gradient,
                bool vec, float* row_loss) {
  using P = Pack<L>;
  constexpr int kUnroll = 4;
  L* row = logits + blockIdx.x * vocab;
  const int32_t t = targets[blockIdx.x];
  const float target_logit =
      t >= 0 ? load(row + t) : 0.0f;  // read before any write (barriers below)
  const int64_t packs = vec ? vocab / P::n : 0;
  const auto* in = reinterpret_cast<const uint4*>(row);
  MaxSum acc{-INFINITY, 0.0f};
  int64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < packs; i += kUnroll * kThreads) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) raw[u] = in[i + u * kThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float x[P::n];
      P::unpack(raw[u], x);
      acc = add_values<P::n>(acc, x);
    }
  }
  for (; i < packs; i += kThreads) {
    float x[P::n];
    P::unpack(in[i], x);
    acc = add_values<P::n>(acc, x);
  }
  for (int64_t v = packs * P::n + threadIdx.x; v < vocab; v += kThreads) {
    const float x = load(row + v);
    acc = add_values<1>(acc, &x);
  }
  acc = block_max_sum(acc);
  const float lse = acc.m + logf(acc.s);
  if (threadIdx.x == 0) row_loss[blockIdx.x] = t >= 0 ? lse - target_logit : 0.0f;
  if (!gradient) return;
  const auto grad = [&](float x, int64_t v) {
    return t >= 0 ? scale * (__expf(x - lse) - (v == t ? 1.0f : 0.0f)) : 0.0f;
  };
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(row);
  if (vec) {
    // In place, a segment of kUnroll packs a thread at a time: a segment's bf16 values land on
    // fp32 elements of this or earlier segments, which every thread has read once the barrier is
    // passed (bf16 logits: each thread its own packs, no barrier needed).
    auto* out_packs = reinterpret_cast<typename P::Out*>(row);
    for (int64_t base = 0; base < packs; base += int64_t(kUnroll) * kThreads) {
      uint4 raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = base + u * kThreads + threadIdx.x;
        if (j < packs) raw[u] = in[j];
      }
      if constexpr (sizeof(L) > 2) __syncthreads();
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = base + u * kThreads + threadIdx.x;
        if (j >= packs) continue;
        float x[P::n];
        P::unpack(raw[u], x);
#pragma unroll
        for (int k = 0; k < P::n; ++k) x[k] = grad(x[k], j * P::n + k);
        out_packs[j] = P::pack(x);
      }
    }
    return;
  }
  for (int64_t base = 0; base < vocab; base += int64_t(kThreads) * kPerThread) {
    float x[kPerThread];
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t v = base + k * kThreads + threadIdx.x;
      x[k] = v < vocab ? load(row + v) : 0.0f;
    }
    if constexpr (sizeof(L) > 2) __syncthreads();
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t v = base + k * kThreads + threadIdx.x;
      if (v < vocab) out[v] = __float2bfloat16(grad(x[k], v));
    }
  }
}

// One chunk's logits, per thread (a rank is a thread).
StatusOr<void*> scratch(size_t bytes) {
  thread_local DeviceBuffer s;
  SP_RETURN_IF_ERROR(s.reserve(bytes));
  return s.data();
}

}  // namespace

Status lm_head_loss(const bf16_t* x, const bf16_t* w, const int32_t* targets, int64_t rows,
                    int64_t dim, int64_t vocab, int64_t chunk, float* row_loss, double scale,
                    float* dx, float* dw, void* stream, Logits logits) {
  SP_CHECK_ARG(rows >= 0 && dim > 0 && vocab > 0 && chunk > 0,
               "the LM head needs dim, vocab and chunk > 0");
  SP_CHECK_ARG((dx == nullptr) == (dw == nullptr), "the LM head's gradient needs both dx and dw");
  const bool f32 = logits == Logits::kF32;
  const int64_t elem = f32 ? 4 : 2;
  SP_ASSIGN_OR_RETURN(void* buf, scratch(size_t(std::min(chunk, rows) * vocab * elem)));
  const int64_t grad_ld = vocab * elem / 2;  // the in-place gradient's row stride, bf16 elements
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    SP_RETURN_IF_ERROR(gemm_bf16(false, true, n, vocab, dim, 1.0f, x + r0 * dim, w, 0.0f, buf,
                                 f32 ? CUDA_R_32F : CUDA_R_16BF, stream));
    // The scratch is 256-byte aligned (DeviceBuffer), so rows are 16-byte aligned where vocab is
    // a whole number of 16-byte packs.
    const bool vec = aligned16(buf) && (vocab * elem) % 16 == 0;
    if (f32)
      loss_kernel<<<unsigned(n), kThreads, 0, as_stream(stream)>>>(
          static_cast<float*>(buf), targets + r0, vocab, float(scale), dx != nullptr, vec,
          row_loss + r0);
    else
      loss_kernel<<<unsigned(n), kThreads, 0, as_stream(stream)>>>(
          static_cast<__nv_bfloat16*>(buf), targets + r0, vocab, float(scale), dx != nullptr, vec,
          row_loss + r0);
    SP_CUDA_CHECK(cudaGetLastError());
    if (!dx) continue;
    const auto* g = static_cast<const bf16_t*>(buf);
    SP_RETURN_IF_ERROR(gemm_bf16(false, false, n, dim, vocab, 1.0f, g, w, 0.0f, dx + r0 * dim,
                                 CUDA_R_32F, stream, grad_ld));
    SP_RETURN_IF_ERROR(gemm_bf16(true, false, vocab, dim, n, 1.0f, g, x + r0 * dim, 1.0f, dw,
                                 CUDA_R_32F, stream, grad_ld));
  }
  return Status::Ok();
}

}  // namespace seqpar::model::cuda
