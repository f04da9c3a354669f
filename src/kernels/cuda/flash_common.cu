// Host-side checks and mask packing for our CUDA attention kernels, plus the small kernels:
// D = rowsum(dO * O) and the -inf-safe merge of partial (O, LSE) pairs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/cuda_check.hpp"
#include "kernels/cuda/flash_common.cuh"

namespace seqpar {
namespace cuda {

Status check_device_tensor(const char* name, const TensorView& t, DType dtype,
                           const std::vector<int64_t>& shape) {
  bool ok = t.data && t.device.kind == DeviceKind::kCuda && t.dtype == dtype &&
            t.ndim == int(shape.size()) && t.strides[t.ndim - 1] == 1;
  for (int i = 0; ok && i < t.ndim; ++i) ok = t.shape[i] == shape[i];
  std::string want = "[";
  for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
  want += std::string("] ") + dtype_name(dtype);
  SP_CHECK_ARG(ok, std::string(name) + " must be a device tensor " + want +
                       " with a contiguous last dim; got " + t.shape_string() +
                       (t.device.kind == DeviceKind::kCuda ? "" : " in host memory"));
  return Status::Ok();
}

Status check_flash_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttentionParams& params, const FlashPositions& positions,
                          FlashProblem* prob) {
  SP_CHECK_ARG(q.ndim == 4 && k.ndim == 4 && v.ndim == 4, "q, k, v must be [B, S, H, D]");
  SP_CHECK_SUPPORTED(q.dtype == DType::kBF16 || q.dtype == DType::kF16,
                     std::string("our CUDA kernels take bf16 or fp16, not ") + dtype_name(q.dtype));
  *prob = {q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3], 0.0};
  prob->scale = params.scale != 0.0 ? params.scale : 1.0 / std::sqrt(double(prob->head_dim));
  // The kernels carry scale * log2(e) in fp32 with denormals flushed: past these bounds it
  // would be 0 or inf, and the masked scores' products NaN.
  const double scale_log2 = std::abs(prob->scale) * 1.4426950408889634;
  SP_CHECK_ARG(std::isfinite(prob->scale) && scale_log2 >= 1e-37 && scale_log2 <= 1e37,
               "our CUDA kernels take an attention scale of magnitude 1e-37 to 1e37, not " +
                   std::to_string(params.scale));
  SP_CHECK_SUPPORTED(prob->head_dim == 64 || prob->head_dim == 128,
                     "our CUDA kernels take head dim 64 or 128, not " + std::to_string(prob->head_dim));
  SP_CHECK_ARG(prob->kv_heads > 0 && prob->heads % prob->kv_heads == 0,
               "query heads must be divisible by K/V heads");
  SP_RETURN_IF_ERROR(check_device_tensor("q", q, q.dtype, {prob->batch, prob->seq_q, prob->heads, prob->head_dim}));
  SP_RETURN_IF_ERROR(check_device_tensor("k", k, q.dtype, {prob->batch, prob->seq_k, prob->kv_heads, prob->head_dim}));
  SP_RETURN_IF_ERROR(check_device_tensor("v", v, q.dtype, {prob->batch, prob->seq_k, prob->kv_heads, prob->head_dim}));
  for (const TensorView* t : {&q, &k, &v}) {
    bool aligned = reinterpret_cast<uintptr_t>(t->data) % 16 == 0;
    for (int i = 0; i < 3; ++i) aligned = aligned && t->strides[i] % 8 == 0;
    SP_CHECK_ARG(aligned, "q, k, v need 16-byte aligned rows (pointer and strides multiples of 8 elements)");
  }
  SP_CHECK_ARG(prob->seq_q < INT32_MAX && prob->seq_k < INT32_MAX && prob->batch < 65536 && prob->heads < 65536,
               "sequence lengths must stay below 2^31 and batch, heads below 65536");
  SP_CHECK_SUPPORTED(!params.q_positions && !params.k_positions,
                     "our CUDA kernels take positions as runs (FlashPositions), not per-row arrays");
  SP_CHECK_ARG(positions.q.stride > 0 && positions.k.stride > 0, "position strides must be positive");
  SP_CHECK_SUPPORTED(params.mask.doc_offsets.size() <= size_t(kMaxDocuments) + 1,
                     "our CUDA kernels take at most " + std::to_string(kMaxDocuments) + " documents");
  return params.mask.validate(0);
}

MaskRuns make_mask_runs(const AttentionParams& params, const FlashPositions& positions) {
  MaskRuns m{};
  m.q_offset = positions.q.offset;
  m.q_stride = positions.q.stride;
  m.k_offset = positions.k.offset;
  m.k_stride = positions.k.stride;
  m.window_left = params.mask.window_left;
  m.window_right = params.mask.window_right;
  m.num_docs = params.mask.has_documents() ? int(params.mask.doc_offsets.size()) - 1 : 0;
  for (size_t i = 0; i < params.mask.doc_offsets.size(); ++i) m.doc_offsets[i] = params.mask.doc_offsets[i];
  return m;
}

namespace {

// Calls fn with a null pointer of the C++ element type of `dtype` (fp32, bf16 or fp16).
template <class Fn>
void with_elem_type(DType dtype, Fn&& fn) {
  if (dtype == DType::kF32) fn(static_cast<float*>(nullptr));
  else if (dtype == DType::kBF16) fn(static_cast<__nv_bfloat16*>(nullptr));
  else fn(static_cast<__half*>(nullptr));
}

template <class Out>
__device__ Out store_as_float(float x) {
  if constexpr (std::is_same_v<Out, float>) return x;
  else if constexpr (std::is_same_v<Out, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else return __float2half_rn(x);
}

template <class In>
__device__ float load_float(const In* p) {
  if constexpr (std::is_same_v<In, float>) return *p;
  else if constexpr (std::is_same_v<In, __nv_bfloat16>) return __bfloat162float(*p);
  else return __half2float(*p);
}

// The (b, s, h) row this warp handles: one warp per row, rows ordered b, s, h.
struct RowIndex {
  int64_t row, b;
  int s, h;
};
__device__ RowIndex warp_row(int heads, int seq) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  return {row, row / (int64_t(heads) * seq), int((row / heads) % seq), int(row % heads)};
}

// One warp per (b, s, h) row.
template <class In>
__global__ void delta_kernel(const In* o, const In* dout, float* delta, int64_t rows, int heads,
                             int seq, int dim, int64_t o_sb, int64_t o_ss, int64_t o_sh,
                             int64_t d_sb, int64_t d_ss, int64_t d_sh) {
  const RowIndex at = warp_row(heads, seq);
  if (at.row >= rows) return;
  const int lane = threadIdx.x % 32, h = at.h, s = at.s;
  const int64_t b = at.b;
  const In* x = o + b * o_sb + s * o_ss + h * o_sh;
  const In* y = dout + b * d_sb + s * d_ss + h * d_sh;
  float acc = 0.f;
  for (int d = lane; d < dim; d += 32) acc += load_float(x + d) * load_float(y + d);
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffff, acc, off);
  if (lane == 0) delta[(b * heads + h) * seq + s] = acc;
}

// Where the merge reads and writes: strides of o (b, s, h) and of lse (b, h).
struct MergeStrides {
  int64_t o_b, o_s, o_h, l_b, l_h;
  __device__ int64_t o(int64_t b, int s, int h) const { return b * o_b + s * o_s + h * o_h; }
  __device__ int64_t l(int64_t b, int s, int h) const { return b * l_b + h * l_h + s; }
};

// (o_out, lse_out) = merge((o, lse), (o_part, lse_part)), one warp per row; the outputs may be
// o and lse themselves (each lane reads an element before it writes it; lane 0 writes the LSE
// after the warp has read it). o is fp32 or of o_out's dtype.
template <class Acc, class Part, class Out>
__global__ void merge_kernel(const Acc* o, const float* lse, const Part* o_part,
                             const float* lse_part, Out* o_out, float* lse_out, int64_t rows,
                             int heads, int seq, int dim, MergeStrides in, MergeStrides part,
                             MergeStrides out) {
  const RowIndex at = warp_row(heads, seq);
  if (at.row >= rows) return;
  const int lane = threadIdx.x % 32, h = at.h, s = at.s;
  const int64_t b = at.b;
  auto clean = [](float x) { return (x > -INFINITY && x < INFINITY) ? x : -INFINITY; };
  const float a = clean(lse[in.l(b, s, h)]), c = clean(lse_part[part.l(b, s, h)]);
  const Acc* x = o + in.o(b, s, h);
  const Part* y = o_part + part.o(b, s, h);
  Out* z = o_out + out.o(b, s, h);
  float wa, wc, merged;
  if (c == -INFINITY) {
    wa = a == -INFINITY ? 0.f : 1.f, wc = 0.f, merged = a;
  } else if (a == -INFINITY) {
    wa = 0.f, wc = 1.f, merged = c;
  } else {
    merged = fmaxf(a, c) + log1pf(expf(-fabsf(a - c)));
    wa = expf(a - merged), wc = expf(c - merged);
  }
  for (int d = lane; d < dim; d += 32) z[d] = store_as_float<Out>(wa * load_float(x + d) + wc * load_float(y + d));
  __syncwarp();
  if (lane == 0) lse_out[out.l(b, s, h)] = merged;
}

// The strides of the three leading dims of a 4-D view (the last one is contiguous).
struct Strides3 {
  int64_t s0, s1, s2;
  __device__ int64_t at(int64_t i0, int64_t i1, int64_t i2) const { return i0 * s0 + i1 * s1 + i2 * s2; }
};

// dst[e] = src[e] (+ add[e]) over contiguous buffers; In -> Out through float, add fp32 or
// of Out's type (it may be dst itself: each element is read before it is written).
template <class In, class AddT, class Out, bool Add>
__global__ void flat_cast_kernel(const In* src, const AddT* add, Out* dst, int64_t n) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    float x = load_float(src + e);
    if constexpr (Add) x += load_float(add + e);
    dst[e] = store_as_float<Out>(x);
  }
}

// Eight consecutive elements as floats, with 16-byte loads and stores (pointers 16-byte aligned).
template <class T>
__device__ void load8(const T* p, float (&x)[8]) {
  if constexpr (std::is_same_v<T, float>) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = load_float(h + i);
  }
}
template <class T>
__device__ void store8(T* p, const float (&x)[8]) {
  if constexpr (std::is_same_v<T, float>) {
    reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
  } else {
    uint4 v;
    T* h = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = store_as_float<T>(x[i]);
    *reinterpret_cast<uint4*>(p) = v;
  }
}

// cast_kernel eight elements at a time: a [d0, d1, d2, 8 * c3] view whose strides are
// multiples of 8 (the head slices and row ranges the GPU schedules copy).
template <class In, class AddT, class Out, bool Add>
__global__ void chunk_cast_kernel(const In* src, const AddT* add, Out* dst, int64_t chunks,
                                  int64_t d1, int64_t d2, int64_t c3, Strides3 s, Strides3 a,
                                  Strides3 t) {
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = c / c3, col = (c - row * c3) * 8;
    const int64_t i2 = row % d2, r1 = row / d2, i1 = r1 % d1, i0 = r1 / d1;
    float x[8];
    load8(src + s.at(i0, i1, i2) + col, x);
    if constexpr (Add) {
      float y[8];
      load8(add + a.at(i0, i1, i2) + col, y);
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] += y[i];
    }
    store8(dst + t.at(i0, i1, i2) + col, x);
  }
}

// fill_kernel eight elements at a time with 16-byte stores (as chunk_cast_kernel's views).
template <class Out>
__global__ void chunk_fill_kernel(Out* dst, int64_t chunks, int64_t d1, int64_t d2, int64_t c3, Strides3 t,
                                  float value) {
  float x[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = value;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = c / c3, col = (c - row * c3) * 8;
    const int64_t i2 = row % d2, r1 = row / d2, i1 = r1 % d1, i0 = r1 / d1;
    store8(dst + t.at(i0, i1, i2) + col, x);
  }
}

// One thread per element of a [d0, d1, d2, d3] view (contiguous last dim).
template <class Out>
__global__ void fill_kernel(Out* dst, int64_t n, int64_t d1, int64_t d2, int64_t d3, Strides3 t, float value) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i3 = e % d3, i2 = (e / d3) % d2, i1 = (e / (d3 * d2)) % d1, i0 = e / (d3 * d2 * d1);
    dst[t.at(i0, i1, i2) + i3] = store_as_float<Out>(value);
  }
}

// One thread per element of a [d0, d1, d2, d3] view (last dim contiguous on every side).
template <class In, class AddT, class Out, bool Add>
__global__ void cast_kernel(const In* src, const AddT* add, Out* dst, int64_t n, int64_t d1,
                            int64_t d2, int64_t d3, Strides3 s, Strides3 a, Strides3 t) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i3 = e % d3, i2 = (e / d3) % d2, i1 = (e / (d3 * d2)) % d1, i0 = e / (d3 * d2 * d1);
    float x = load_float(src + s.at(i0, i1, i2) + i3);
    if constexpr (Add) x += load_float(add + a.at(i0, i1, i2) + i3);
    dst[t.at(i0, i1, i2) + i3] = store_as_float<Out>(x);
  }
}

}  // namespace
}  // namespace cuda

namespace {

// dst = src (+ add, a view of the same shape in fp32 or dst's dtype, when add.data is set).
// add may be dst itself (an in-place sum): every element is read before it is written.
Status cast_add(const TensorView& src, const TensorView& add, const TensorView& dst, void* stream) {
  SP_CHECK_ARG(src.ndim >= 1 && src.ndim <= 4 && src.same_shape(dst),
               "cast needs two views of one shape (up to 4 dims); got " + src.shape_string() +
                   " and " + dst.shape_string());
  const bool adding = add.data != nullptr;
  SP_CHECK_ARG(!adding || (add.same_shape(src) && (add.dtype == DType::kF32 || add.dtype == dst.dtype) &&
                           add.device.kind == DeviceKind::kCuda && add.strides[add.ndim - 1] == 1),
               "the addend must be a device view shaped like the source, fp32 or of the result's dtype; got " +
                   add.shape_string());
  SP_CHECK_ARG(src.device.kind == DeviceKind::kCuda && dst.device.kind == DeviceKind::kCuda,
               "cast takes device tensors");
  SP_CHECK_ARG(src.strides[src.ndim - 1] == 1 && dst.strides[dst.ndim - 1] == 1,
               "cast needs a contiguous last dim");
  SP_CHECK_SUPPORTED(src.dtype != DType::kF64 && dst.dtype != DType::kF64, "cast takes fp32, bf16, fp16");
  const int64_t n = src.numel();
  if (n == 0) return Status::Ok();
  const auto s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, 65535));
  const bool flat = src.is_contiguous() && dst.is_contiguous() && (!adding || add.is_contiguous());
  // View as 4-D: pad leading dims with size 1.
  int64_t shape[4] = {1, 1, 1, 1}, ss[4] = {0, 0, 0, 1}, as[4] = {0, 0, 0, 1}, ts[4] = {0, 0, 0, 1};
  for (int i = 0; i < src.ndim; ++i) {
    shape[4 - src.ndim + i] = src.shape[i];
    ss[4 - src.ndim + i] = src.strides[i];
    as[4 - src.ndim + i] = adding ? add.strides[i] : 0;
    ts[4 - src.ndim + i] = dst.strides[i];
  }
  // Eight elements per thread when every row starts 16-byte aligned.
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  bool chunked = shape[3] % 8 == 0 && aligned(src.data) && aligned(dst.data) && aligned(add.data);
  for (int i = 0; i < 3; ++i) chunked = chunked && ss[i] % 8 == 0 && as[i] % 8 == 0 && ts[i] % 8 == 0;
  const cuda::Strides3 s3{ss[0], ss[1], ss[2]}, a3{as[0], as[1], as[2]}, t3{ts[0], ts[1], ts[2]};
  auto go = [&](auto* in_tag, auto* out_tag, auto* add_tag) {
    using In = std::remove_pointer_t<decltype(in_tag)>;
    using Out = std::remove_pointer_t<decltype(out_tag)>;
    using AddT = std::remove_pointer_t<decltype(add_tag)>;
    constexpr bool Add = !std::is_void_v<AddT>;
    using AddElem = std::conditional_t<Add, AddT, float>;
    const In* in = static_cast<const In*>(src.data);
    const AddElem* addend = static_cast<const AddElem*>(add.data);
    Out* out = static_cast<Out*>(dst.data);
    if (chunked) {
      const int64_t chunks = n / 8;
      cuda::chunk_cast_kernel<In, AddElem, Out, Add><<<unsigned(std::min<int64_t>((chunks + 255) / 256, 65535)), 256, 0, s>>>(
          in, addend, out, chunks, shape[1], shape[2], shape[3] / 8, s3, a3, t3);
    } else if (flat) {
      cuda::flat_cast_kernel<In, AddElem, Out, Add><<<blocks, 256, 0, s>>>(in, addend, out, n);
    } else {
      cuda::cast_kernel<In, AddElem, Out, Add><<<blocks, 256, 0, s>>>(in, addend, out, n, shape[1], shape[2],
                                                             shape[3], s3, a3, t3);
    }
  };
  cuda::with_elem_type(src.dtype, [&](auto* in_tag) {
    cuda::with_elem_type(dst.dtype, [&](auto* out_tag) {
      using Out = std::remove_pointer_t<decltype(out_tag)>;
      if (!adding) go(in_tag, out_tag, static_cast<void*>(nullptr));
      else if (add.dtype == DType::kF32) go(in_tag, out_tag, static_cast<float*>(nullptr));
      else go(in_tag, out_tag, static_cast<Out*>(nullptr));
    });
  });
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace

Status flash_cast(const TensorView& src, const TensorView& dst, void* stream) {
  return cast_add(src, TensorView{}, dst, stream);
}

Status flash_accumulate(const TensorView& src, const TensorView& dst, void* stream) {
  SP_CHECK_ARG(dst.dtype == DType::kF32, "accumulate adds into fp32, not " + dst.shape_string());
  return cast_add(src, dst, dst, stream);
}

Status flash_add_cast(const TensorView& src, const TensorView& acc, const TensorView& dst, void* stream) {
  SP_CHECK_ARG(acc.data != nullptr, "add_cast needs an addend");
  return cast_add(src, acc, dst, stream);
}

Status flash_fill(const TensorView& dst, float value, void* stream) {
  SP_CHECK_ARG(dst.ndim >= 1 && dst.ndim <= 4 && dst.strides[dst.ndim - 1] == 1 && dst.device.kind == DeviceKind::kCuda,
               "fill takes a device view of up to 4 dims with a contiguous last dim; got " + dst.shape_string());
  SP_CHECK_SUPPORTED(dst.dtype != DType::kF64, "fill takes fp32, bf16, fp16");
  const int64_t n = dst.numel();
  if (n == 0) return Status::Ok();
  const auto s = static_cast<cudaStream_t>(stream);
  // Zeros are all-zero bytes in every dtype here: a contiguous view is one memset.
  if (value == 0.0f && !std::signbit(value) && dst.is_contiguous()) {
    SP_CUDA_CHECK(cudaMemsetAsync(dst.data, 0, size_t(n) * dtype_size(dst.dtype), s));
    return Status::Ok();
  }
  int64_t shape[4] = {1, 1, 1, 1}, ts[4] = {0, 0, 0, 1};
  for (int i = 0; i < dst.ndim; ++i) shape[4 - dst.ndim + i] = dst.shape[i], ts[4 - dst.ndim + i] = dst.strides[i];
  // Eight elements a thread where every row starts 16-byte aligned: the per-element index
  // arithmetic (64-bit divisions) made a fill of a few million elements cost tenths of a ms.
  bool chunked = shape[3] % 8 == 0 && reinterpret_cast<uintptr_t>(dst.data) % 16 == 0;
  for (int i = 0; i < 3; ++i) chunked = chunked && ts[i] % 8 == 0;
  const cuda::Strides3 t3{ts[0], ts[1], ts[2]};
  cuda::with_elem_type(dst.dtype, [&](auto* tag) {
    using Out = std::remove_pointer_t<decltype(tag)>;
    Out* out = static_cast<Out*>(dst.data);
    if (chunked) {
      const int64_t chunks = n / 8;
      cuda::chunk_fill_kernel<Out><<<unsigned(std::min<int64_t>((chunks + 255) / 256, 65535)), 256, 0, s>>>(
          out, chunks, shape[1], shape[2], shape[3] / 8, t3, value);
    } else {
      cuda::fill_kernel<Out><<<unsigned(std::min<int64_t>((n + 255) / 256, 65535)), 256, 0, s>>>(
          out, n, shape[1], shape[2], shape[3], t3, value);
    }
  });
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status flash_attention_delta(const TensorView& o, const TensorView& dout, const TensorView& delta,
                             void* stream) {
  SP_CHECK_ARG(o.ndim == 4, "o must be [B, S, H, D]");
  const int64_t B = o.shape[0], S = o.shape[1], H = o.shape[2], D = o.shape[3];
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("o", o, o.dtype, {B, S, H, D}));
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("dout", dout, o.dtype, {B, S, H, D}));
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("delta", delta, DType::kF32, {B, H, S}));
  SP_CHECK_ARG(delta.is_contiguous(), "delta must be contiguous");
  SP_CHECK_SUPPORTED(o.dtype != DType::kF64, "delta takes bf16, fp16 or fp32");
  const int64_t rows = B * S * H;
  if (rows == 0) return Status::Ok();
  const int threads = 256;
  const unsigned blocks = unsigned((rows * 32 + threads - 1) / threads);
  const auto s = static_cast<cudaStream_t>(stream);
  auto go = [&](auto* tag) {
    using In = std::remove_pointer_t<decltype(tag)>;
    cuda::delta_kernel<In><<<blocks, threads, 0, s>>>(
        static_cast<const In*>(o.data), static_cast<const In*>(dout.data), static_cast<float*>(delta.data),
        rows, int(H), int(S), int(D), o.strides[0], o.strides[1], o.strides[2], dout.strides[0],
        dout.strides[1], dout.strides[2]);
  };
  cuda::with_elem_type(o.dtype, go);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status flash_merge_partials_into(const TensorView& o, const TensorView& lse, const TensorView& o_part,
                                 const TensorView& lse_part, const TensorView& o_out,
                                 const TensorView& lse_out, void* stream) {
  SP_CHECK_ARG(o.ndim == 4, "o must be [B, S, H, D]");
  const int64_t B = o.shape[0], S = o.shape[1], H = o.shape[2], D = o.shape[3];
  SP_CHECK_SUPPORTED(o_part.dtype != DType::kF64 && o_out.dtype != DType::kF64,
                     "o_part and o_out must be fp32, bf16 or fp16");
  SP_CHECK_ARG(o.dtype == DType::kF32 || o.dtype == o_out.dtype, "o must be fp32 or of o_out's dtype");
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("o", o, o.dtype, {B, S, H, D}));
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("o_part", o_part, o_part.dtype, {B, S, H, D}));
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("o_out", o_out, o_out.dtype, {B, S, H, D}));
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("lse", lse, DType::kF32, {B, H, S}));
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("lse_part", lse_part, DType::kF32, {B, H, S}));
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("lse_out", lse_out, DType::kF32, {B, H, S}));
  const int64_t rows = B * S * H;
  if (rows == 0) return Status::Ok();
  const auto strides = [](const TensorView& ov, const TensorView& lv) {
    return cuda::MergeStrides{ov.strides[0], ov.strides[1], ov.strides[2], lv.strides[0], lv.strides[1]};
  };
  const int threads = 256;
  auto go = [&](auto* acc_tag, auto* part_tag, auto* out_tag) {
    using Acc = std::remove_pointer_t<decltype(acc_tag)>;
    using Part = std::remove_pointer_t<decltype(part_tag)>;
    using Out = std::remove_pointer_t<decltype(out_tag)>;
    cuda::merge_kernel<Acc, Part, Out><<<unsigned((rows * 32 + threads - 1) / threads), threads, 0,
                                         static_cast<cudaStream_t>(stream)>>>(
        static_cast<const Acc*>(o.data), static_cast<const float*>(lse.data),
        static_cast<const Part*>(o_part.data), static_cast<const float*>(lse_part.data),
        static_cast<Out*>(o_out.data), static_cast<float*>(lse_out.data), rows, int(H), int(S),
        int(D), strides(o, lse), strides(o_part, lse_part), strides(o_out, lse_out));
  };
  cuda::with_elem_type(o_part.dtype, [&](auto* part_tag) {
    cuda::with_elem_type(o_out.dtype, [&](auto* out_tag) {
      if (o.dtype == DType::kF32) go(static_cast<float*>(nullptr), part_tag, out_tag);
      else go(out_tag, part_tag, out_tag);
    });
  });
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status flash_merge_partials(const TensorView& o, const TensorView& lse, const TensorView& o_part,
                            const TensorView& lse_part, void* stream) {
  return flash_merge_partials_into(o, lse, o_part, lse_part, o, lse, stream);
}

}  // namespace seqpar
