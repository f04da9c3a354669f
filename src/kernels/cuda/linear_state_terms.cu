// The linear-attention pieces LASP adds on the GPU once a state from another rank is known
// (seqpar/linear_cuda.hpp; the CPU versions and the math are in seqpar/linear_attention.hpp):
// the state term of the outputs, the dState terms of dk and dv, and the carried-state combine.
// They are small next to a rank's own pass (one d_k x d_v product per row and head), so they
// run on CUDA cores: one block per tile of rows and head, a thread per output column, the
// tile's input rows in shared memory, the state read from L2.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <tuple>

#include "core/cuda_check.hpp"
#include "kernels/cuda/linear_host.hpp"
#include "kernels/cuda/linear_state_terms.hpp"
#include "seqpar/linear_cuda.hpp"

namespace seqpar {
namespace {

constexpr int kRows = 32;  // rows of a block's tile
constexpr int kMaxDim = 128;

// log2(1 / lambda_h) per query head (cuda::fill_decays), as the linear kernels carry them.
struct HeadDecays {
  float log2_inv_decay[cuda::kLinearMaxHeads];
};

// out[b, i, g, x] += sum over the state heads h of group g: coef * lambda_h^dist(i) *
// sum_y M_h(x, y) in[b, i, g, y], M_h(x, y) = S_h[x, y] (row-major d_x x d_y) or, transposed,
// S_h[y, x]; dist(i) = i + 1 (forward: the state term of o) or n - 1 - i (dState terms).
struct RowsTimesStates {
  const void* in;
  void* out;
  const float* states;  // [B, H, d_k, d_v] contiguous
  int64_t in_strides[3], out_strides[3];
  int batch, rows, in_heads, group, heads, xdim, ydim;
  bool transposed, forward_distance;
  float coef;
  HeadDecays decays;
};

__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__host__ __device__ inline float to_float(__half x) { return __half2float(x); }
template <class Elem>
__host__ __device__ inline Elem from_float(float x);
template <>
__host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__host__ __device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }

// One block's work in two halves, shared by the kernel and its host replay: the tile of input
// rows [row0, row0 + kRows) of (b, g) into `tile` (elements first, first + step, ...), then
// output column x of those rows.
template <class Elem>
__host__ __device__ void load_tile(const RowsTimesStates& p, int b, int g, int row0, int first, int step,
                                   float (*tile)[kMaxDim]) {
  const Elem* in = static_cast<const Elem*>(p.in) + b * p.in_strides[0] + g * p.in_strides[2];
  for (int e = first; e < kRows * p.ydim; e += step) {
    const int r = e / p.ydim, y = e % p.ydim, i = row0 + r;
    tile[r][y] = i < p.rows ? to_float(in[int64_t(i) * p.in_strides[1] + y]) : 0.f;
  }
}

template <class Elem>
__host__ __device__ void update_column(const RowsTimesStates& p, int b, int g, int row0, int x,
                                       const float (*tile)[kMaxDim]) {
  float acc[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = 0.f;
  for (int h = g * p.group; h < (g + 1) * p.group; ++h) {
    const float* S = p.states + (int64_t(b) * p.heads + h) * p.xdim * p.ydim;
    float part[kRows];
    for (int r = 0; r < kRows; ++r) part[r] = 0.f;
    for (int y = 0; y < p.ydim; ++y) {
      const float m = p.transposed ? S[y * p.xdim + x] : S[x * p.ydim + y];
      for (int r = 0; r < kRows; ++r) part[r] += m * tile[r][y];
    }
    const float l2 = p.decays.log2_inv_decay[h];
    for (int r = 0; r < kRows && row0 + r < p.rows; ++r) {
      const int i = row0 + r;
      const float dist = p.forward_distance ? float(i + 1) : float(p.rows - 1 - i);
      acc[r] += p.coef * exp2f(-l2 * dist) * part[r];
    }
  }
  Elem* out = static_cast<Elem*>(p.out) + b * p.out_strides[0] + g * p.out_strides[2];
  for (int r = 0; r < kRows && row0 + r < p.rows; ++r) {
    Elem& o = out[int64_t(row0 + r) * p.out_strides[1] + x];
    o = from_float<Elem>(to_float(o) + acc[r]);
  }
}

template <class Elem>
__global__ void rows_times_states(const RowsTimesStates p) {
  __shared__ float tile[kRows][kMaxDim];
  const int row0 = blockIdx.x * kRows, b = blockIdx.y / p.in_heads, g = blockIdx.y % p.in_heads;
  load_tile<Elem>(p, b, g, row0, threadIdx.x, blockDim.x, tile);
  __syncthreads();
  if (int(threadIdx.x) < p.xdim) update_column<Elem>(p, b, g, row0, threadIdx.x, tile);
}

// The kernel's blocks one after another on the host, for tests on machines without a GPU.
template <class Elem>
void rows_times_states_on_host(const RowsTimesStates& p) {
  static float tile[kRows][kMaxDim];
  for (int by = 0; by < p.batch * p.in_heads; ++by)
    for (int row0 = 0; row0 < p.rows; row0 += kRows) {
      const int b = by / p.in_heads, g = by % p.in_heads;
      load_tile<Elem>(p, b, g, row0, 0, 1, tile);
      for (int x = 0; x < p.xdim; ++x) update_column<Elem>(p, b, g, row0, x, tile);
    }
}

// out = lambda_h^length carried + local, elementwise over [B, H, d_k, d_v].
__global__ void combine_states(const float* carried, const float* local, float* out, int64_t elems, int heads,
                               int64_t per_head, float length, const HeadDecays decays) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < elems; e += int64_t(gridDim.x) * blockDim.x) {
    const int h = int((e / per_head) % heads);
    out[e] = exp2f(-decays.log2_inv_decay[h] * length) * carried[e] + local[e];
  }
}

// The heads (<= the kernels' maximum) and their decays.
Status decays_of(const LinearAttentionParams& params, int64_t heads, HeadDecays* d) {
  SP_CHECK_SUPPORTED(heads <= cuda::kLinearMaxHeads, "at most " + std::to_string(cuda::kLinearMaxHeads) + " query heads");
  SP_RETURN_IF_ERROR(validate_linear_params(params, heads));
  cuda::fill_decays(params, heads, d->log2_inv_decay);
  return Status::Ok();
}

// A present state, checked as the linear kernels check theirs.
Status check_state(const char* name, const TensorView& t, const cuda::LinearCudaDims& d, bool on_device) {
  SP_CHECK_ARG(t.data != nullptr, std::string(name) + " is null");
  return cuda::check_linear_cuda_state(name, t, d, on_device);
}

// On the device, asynchronous on `stream`; else the host replay.
Status launch(const RowsTimesStates& p, DType dtype, void* stream, bool on_device) {
  SP_CHECK_SUPPORTED(p.xdim <= kMaxDim && p.ydim <= kMaxDim, "head dims up to " + std::to_string(kMaxDim));
  if (p.rows == 0 || p.batch == 0) return Status::Ok();
  if (!on_device) {
    if (dtype == DType::kBF16) rows_times_states_on_host<__nv_bfloat16>(p);
    else rows_times_states_on_host<__half>(p);
    return Status::Ok();
  }
  const dim3 grid(unsigned((p.rows + kRows - 1) / kRows), unsigned(p.batch * p.in_heads));
  const int threads = ((std::max(p.xdim, 32) + 31) / 32) * 32;
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::kBF16) rows_times_states<__nv_bfloat16><<<grid, threads, 0, s>>>(p);
  else rows_times_states<__half><<<grid, threads, 0, s>>>(p);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

void set_strides(const TensorView& t, int64_t* s) {
  for (int i = 0; i < 3; ++i) s[i] = t.strides[i];
}

Status add_state_term(const TensorView& q, const TensorView& state_in, const LinearAttentionParams& params,
                      const TensorView& o, void* stream, bool on_device) {
  SP_CHECK_ARG(q.ndim == 4 && o.ndim == 4, "q and o must be [B, S, H, D]");
  SP_CHECK_SUPPORTED(q.dtype == DType::kBF16 || q.dtype == DType::kF16, "bf16 or fp16 rows");
  const int64_t B = q.shape[0], n = q.shape[1], H = q.shape[2], dk = q.shape[3], dv = o.shape[3];
  const cuda::LinearCudaDims d{B, n, H, H, dk, dv, q.dtype};
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_rows("q", q, d, H, dk, on_device));
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda_rows("o", o, d, H, dv, on_device));
  SP_RETURN_IF_ERROR(check_state("state_in", state_in, d, on_device));
  RowsTimesStates p{};
  SP_RETURN_IF_ERROR(decays_of(params, H, &p.decays));
  p.in = q.data, p.out = o.data, p.states = static_cast<const float*>(state_in.data);
  set_strides(q, p.in_strides), set_strides(o, p.out_strides);
  p.batch = int(B), p.rows = int(n), p.in_heads = int(H), p.group = 1, p.heads = int(H);
  p.xdim = int(dv), p.ydim = int(dk), p.transposed = true, p.forward_distance = true;  // S[y = a, x = c]
  p.coef = float(params.scale);
  return launch(p, q.dtype, stream, on_device);
}

Status add_dstate_term(const TensorView& k, const TensorView& v, const TensorView& dstate_out,
                       const LinearAttentionParams& params, const TensorView& dk, const TensorView& dv, void* stream,
                       bool on_device) {
  SP_CHECK_ARG(k.ndim == 4 && v.ndim == 4 && dstate_out.ndim == 4,
               "k, v must be [B, S, H_kv, D] and dstate_out [B, H, d_k, d_v]");
  SP_CHECK_SUPPORTED(k.dtype == DType::kBF16 || k.dtype == DType::kF16, "bf16 or fp16 rows");
  const int64_t B = k.shape[0], n = k.shape[1], Hkv = k.shape[2], Dk = k.shape[3], Dv = v.shape[3],
                H = dstate_out.shape[1];
  SP_CHECK_ARG(Hkv >= 1 && H % Hkv == 0, "dstate_out's heads must be a multiple of the K/V heads");
  const cuda::LinearCudaDims d{B, n, H, Hkv, Dk, Dv, k.dtype};
  for (const auto& [name, t, dim] : {std::tuple{"k", &k, Dk}, {"v", &v, Dv}, {"dk", &dk, Dk}, {"dv", &dv, Dv}})
    SP_RETURN_IF_ERROR(cuda::check_linear_cuda_rows(name, *t, d, Hkv, dim, on_device));
  SP_RETURN_IF_ERROR(check_state("dstate_out", dstate_out, d, on_device));
  RowsTimesStates p{};
  SP_RETURN_IF_ERROR(decays_of(params, H, &p.decays));
  p.states = static_cast<const float*>(dstate_out.data);
  p.batch = int(B), p.rows = int(n), p.in_heads = int(Hkv), p.group = int(H / Hkv), p.heads = int(H);
  p.forward_distance = false, p.coef = 1.f;
  // dk_j[a] += w sum_c G[a, c] v_j[c]: x = a, y = c, M = G[x, y].
  p.in = v.data, p.out = dk.data, p.xdim = int(Dk), p.ydim = int(Dv), p.transposed = false;
  set_strides(v, p.in_strides), set_strides(dk, p.out_strides);
  SP_RETURN_IF_ERROR(launch(p, k.dtype, stream, on_device));
  // dv_j[c] += w sum_a G[a, c] k_j[a]: x = c, y = a, M = G[y, x].
  p.in = k.data, p.out = dv.data, p.xdim = int(Dv), p.ydim = int(Dk), p.transposed = true;
  set_strides(k, p.in_strides), set_strides(dv, p.out_strides);
  return launch(p, k.dtype, stream, on_device);
}

}  // namespace

Status linear_add_state_term_cuda(const TensorView& q, const TensorView& state_in,
                                  const LinearAttentionParams& params, const TensorView& o, void* stream) {
  return add_state_term(q, state_in, params, o, stream, true);
}

Status linear_add_dstate_term_cuda(const TensorView& k, const TensorView& v, const TensorView& dstate_out,
                                   const LinearAttentionParams& params, const TensorView& dk,
                                   const TensorView& dv, void* stream) {
  return add_dstate_term(k, v, dstate_out, params, dk, dv, stream, true);
}

Status linear_add_state_term_host_replay(const TensorView& q, const TensorView& state_in,
                                         const LinearAttentionParams& params, const TensorView& o) {
  return add_state_term(q, state_in, params, o, nullptr, false);
}

Status linear_add_dstate_term_host_replay(const TensorView& k, const TensorView& v, const TensorView& dstate_out,
                                          const LinearAttentionParams& params, const TensorView& dk,
                                          const TensorView& dv) {
  return add_dstate_term(k, v, dstate_out, params, dk, dv, nullptr, false);
}

Status linear_state_combine_cuda(const TensorView& carried, const TensorView& local, int64_t length,
                                 const LinearAttentionParams& params, const TensorView& out, void* stream) {
  SP_CHECK_ARG(carried.ndim == 4 && length >= 0, "states must be [B, H, d_k, d_v] and the length non-negative");
  const int64_t B = carried.shape[0], H = carried.shape[1], Dk = carried.shape[2], Dv = carried.shape[3];
  const cuda::LinearCudaDims d{B, 0, H, H, Dk, Dv, DType::kF32};
  for (const auto& [name, t] : {std::pair{"carried", &carried}, {"local", &local}, {"out", &out}})
    SP_RETURN_IF_ERROR(check_state(name, *t, d, true));
  HeadDecays decays{};
  SP_RETURN_IF_ERROR(decays_of(params, H, &decays));
  const int64_t elems = B * H * Dk * Dv;
  if (elems == 0) return Status::Ok();
  const unsigned blocks = unsigned(std::min<int64_t>((elems + 255) / 256, 4096));
  combine_states<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const float*>(carried.data), static_cast<const float*>(local.data), static_cast<float*>(out.data),
      elems, int(H), Dk * Dv, float(length), decays);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace seqpar
