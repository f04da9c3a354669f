// Our flash-attention forward on tensor cores (see src/kernels/cuda/flash_cuda.hpp): one CTA of
// 4 warps takes 128 query rows of one head (32 per warp, two m-tiles sharing each K/V
// fragment); K/V tiles of 64 keys (32 at D = 128) stream through double-buffered shared
// memory (cp.async); scores, the online softmax and the output accumulator stay in
// registers; P, packed to the input dtype in registers, is the A operand of the P*V product.
// Each query row has an interval [lo, hi] of visible key positions (band and document), so
// whole tiles outside every row's interval are skipped and tiles inside every row's interval
// run unmasked.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "core/cuda_check.hpp"
#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/mma_utils.cuh"
#include "kernels/cuda/flash_cuda.hpp"

namespace seqpar {
namespace cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
// Keys per tile: 64 at D = 64; 32 at D = 128 so scores and the 32 x 128 accumulator of each
// warp fit in registers.
template <int kDim>
constexpr int kBlockNFor = kDim >= 128 ? 32 : 64;
constexpr float kRescaleSlack = 8.f;  // log2 units a row max may outgrow its reference by
constexpr int kMTiles = 2;                      // 16-row m-tiles per warp: each K/V fragment
constexpr int kBlockM = 16 * kMTiles * kWarps;  // read from shared memory feeds two mmas

struct ForwardParams {
  const void* q;
  const void* k;
  const void* v;
  float* o_acc;
  float* lse;
  void* o_out;
  int64_t q_strides[3], k_strides[3], v_strides[3], o_strides[3], out_strides[3];  // b, s, h
  int batch, heads, group, seq_q, seq_k;
  float scale_log2;
  MaskRuns mask;
  bool accumulate;
};

template <class Elem, int kDim>
__global__ void __launch_bounds__(kThreads) forward_kernel(const ForwardParams p) {
  using T = ElemTraits<Elem>;
  constexpr int kBlockN = kBlockNFor<kDim>;
  constexpr int kDimTiles = kDim / 8;    // n-tiles of the output
  constexpr int kKeySteps = kBlockN / 16;
  constexpr int kRows = 2 * kMTiles;     // rows each thread holds
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Elem* q_smem = reinterpret_cast<Elem*>(smem_raw);
  Elem* k_smem = q_smem + kBlockM * kDim;   // [2][kBlockN * kDim]
  Elem* v_smem = k_smem + 2 * kBlockN * kDim;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int q0 = blockIdx.x * kBlockM, h = blockIdx.y, b = blockIdx.z, kvh = h / p.group;
  const Elem* q_base = static_cast<const Elem*>(p.q) + b * p.q_strides[0] + h * p.q_strides[2];
  const Elem* k_base = static_cast<const Elem*>(p.k) + b * p.k_strides[0] + kvh * p.k_strides[2];
  const Elem* v_base = static_cast<const Elem*>(p.v) + b * p.v_strides[0] + kvh * p.v_strides[2];

  // Row x = 2 mt + r of this thread: m-tile mt, upper (r = 0) or lower (r = 1) half.
  auto tile_row = [&](int x) { return warp * 16 * kMTiles + (x / 2) * 16 + g + 8 * (x % 2); };
  __shared__ TileBounds bounds_smem[kWarps];
  TileBounds cta;
  {  // row intervals are recomputed where a partial tile needs them: registers are scarce
    RowInterval rows[kRows];
    for (int x = 0; x < kRows; ++x) rows[x] = row_interval(p.mask, q0 + tile_row(x), p.seq_q);
    cta = cta_bounds<kWarps, kRows>(rows, bounds_smem);
  }

  // Key rows to visit: those whose positions can fall in some row's interval.
  int key_begin = 0, key_end = 0;
  visible_key_range(p.mask, cta, p.seq_k, &key_begin, &key_end);
  const int tile_begin = key_begin / kBlockN;
  const int tile_end = key_end > key_begin ? (key_end + kBlockN - 1) / kBlockN : tile_begin;

  const TileLoader<Elem, kDim, kThreads> loader(tid);
  loader.template load<kBlockM>(q_smem, q_base, p.q_strides[1], q0, p.seq_q);
  if (tile_begin < tile_end) {
    loader.template load<kBlockN>(k_smem, k_base, p.k_strides[1], tile_begin * kBlockN, p.seq_k);
    loader.template load<kBlockN>(v_smem, v_base, p.v_strides[1], tile_begin * kBlockN, p.seq_k);
  }
  cp_async_commit();

  // Running state: m (exp2 domain); partial sums of P (summed over the quad at the end): l of
  // P as computed (for the LSE), l_mma of P as rounded for the P V product (to normalise O, so
  // that O stays a convex combination of V rows even when a row's largest P is not exactly 1
  // under a stale reference); the accumulator.
  float m[kRows], l[kRows], l_mma[kRows], acc[kMTiles][kDimTiles][4];
  for (int x = 0; x < kRows; ++x) {
    m[x] = -INFINITY;
    l[x] = l_mma[x] = 0.f;
  }
  for (int mt = 0; mt < kMTiles; ++mt)
    for (int j = 0; j < kDimTiles; ++j)
      for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.f;
  if (p.accumulate) {
    for (int x = 0; x < kRows; ++x) {
      const int row = q0 + tile_row(x);
      if (row >= p.seq_q) continue;
      const float prev = p.lse[(int64_t(b) * p.heads + h) * p.seq_q + row];
      if (!(prev > -INFINITY && prev < INFINITY)) continue;  // empty so far
      m[x] = prev * 1.4426950408889634f;
      l[x] = l_mma[x] = t4 == 0 ? 1.f : 0.f;  // the earlier mass counts once per row
      const float* o_row = p.o_acc + b * p.o_strides[0] + int64_t(row) * p.o_strides[1] + h * p.o_strides[2];
      for (int j = 0; j < kDimTiles; ++j) {
        const float2 o2 = *reinterpret_cast<const float2*>(o_row + j * 8 + 2 * t4);
        acc[x / 2][j][2 * (x % 2)] = o2.x;
        acc[x / 2][j][2 * (x % 2) + 1] = o2.y;
      }
    }
  }

  // ldmatrix addresses (bytes): each lane's row within its 16-row block and the swizzle
  // offsets of the chunks it reads. Every such row is 8-aligned plus lane % 8, so row & 7 =
  // lane & 7. Q (and V, transposed) read chunk 2 ks + lane / 16; K reads chunk 2 ks + lane / 8 % 2.
  const SwizzleOffsets sw_a(lane / 16, lane & 7), sw_b((lane / 8) % 2, lane & 7);
  const uint32_t q_rows = smem_address(q_smem) + (warp * 16 * kMTiles + lane % 16) * kDim * 2;
  const int k_lane_row = (lane / 16) * 8 + lane % 8, v_lane_row = lane % 8 + ((lane / 8) % 2) * 8;

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int buf = (tile - tile_begin) & 1;
    Elem* k_tile = k_smem + buf * kBlockN * kDim;
    Elem* v_tile = v_smem + buf * kBlockN * kDim;
    if (tile + 1 < tile_end) {  // prefetch the next tile into the other buffer
      loader.template load<kBlockN>(k_smem + (buf ^ 1) * kBlockN * kDim, k_base, p.k_strides[1], (tile + 1) * kBlockN, p.seq_k);
      loader.template load<kBlockN>(v_smem + (buf ^ 1) * kBlockN * kDim, v_base, p.v_strides[1], (tile + 1) * kBlockN, p.seq_k);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    // S = Q K^T for this warp's rows and the tile's 64 keys; one K fragment, kMTiles mmas.
    float s[kMTiles][kBlockN / 8][4];
    for (int mt = 0; mt < kMTiles; ++mt)
      for (int j = 0; j < kBlockN / 8; ++j)
        for (int e = 0; e < 4; ++e) s[mt][j][e] = 0.f;
    const uint32_t k_rows = smem_address(k_tile) + k_lane_row * kDim * 2;
    for (int ks = 0; ks < kDim / 16; ++ks) {
      uint32_t qa[kMTiles][4];
      for (int mt = 0; mt < kMTiles; ++mt) ldmatrix_x4_at(qa[mt], q_rows + mt * 16 * kDim * 2 + sw_a.of(ks));
      for (int jp = 0; jp < kBlockN / 16; ++jp) {
        uint32_t kb[4];
        ldmatrix_x4_at(kb, k_rows + jp * 16 * kDim * 2 + sw_b.of(ks));
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816<Elem>(s[mt][2 * jp], qa[mt], kb[0], kb[1]);
          mma_16816<Elem>(s[mt][2 * jp + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }

    const int key0 = tile * kBlockN;
    const int valid_keys = min(kBlockN, p.seq_k - key0);
    // Scores stay unscaled: the scale goes into the row maxima (one multiply per row) and
    // into the exponent's fma. With a negative scale the largest scaled score is the smallest
    // raw one, so the "maximum" below is then a minimum and masked scores are +inf.
    const bool scale_up = p.scale_log2 > 0.f;
    const float masked = scale_up ? -INFINITY : INFINITY;
    const bool full = valid_keys == kBlockN && tile_fully_visible(p.mask, cta, key0, kBlockN);
    if (!full) {
      for (int x = 0; x < kRows; ++x) {
        const RowInterval row = row_interval(p.mask, q0 + tile_row(x), p.seq_q);
        const int mt = x / 2, e0 = 2 * (x % 2);
        for (int j = 0; j < kBlockN / 8; ++j)
          for (int e = e0; e < e0 + 2; ++e) {
            const int col = j * 8 + 2 * t4 + (e % 2);
            const int64_t kp = p.mask.k_offset + p.mask.k_stride * int64_t(key0 + col);
            const bool visible = col < valid_keys && kp >= row.lo && kp <= row.hi;
            if (!visible) s[mt][j][e] = masked;
          }
      }
    }

    // Online softmax (each row lives in one quad of lanes) with a lazy reference max: a row
    // keeps its reference m while its tile maxima stay within kRescaleSlack (log2 units) of
    // it, so P reaches at most 2^8 (exact enough in bf16 P and fp32 sums; O = acc / l and
    // LSE = m + log2 l hold for any reference). The accumulator is rescaled only when some
    // row of the warp needs a new reference, which after the first tiles is rare.
    float row_max[kRows];
    bool grows = false;
    for (int x = 0; x < kRows; ++x) {
      const int mt = x / 2, e0 = 2 * (x % 2);
      auto top = [&](float a, float c) { return scale_up ? fmaxf(a, c) : fminf(a, c); };
      float mx = masked;
      for (int j = 0; j < kBlockN / 8; ++j) mx = top(mx, top(s[mt][j][e0], s[mt][j][e0 + 1]));
      mx = top(mx, __shfl_xor_sync(0xffffffff, mx, 1));
      row_max[x] = top(mx, __shfl_xor_sync(0xffffffff, mx, 2)) * p.scale_log2;
      grows = grows || row_max[x] > m[x] + kRescaleSlack;  // also when m is -inf and a key is visible
    }
    if (__any_sync(0xffffffff, grows)) {
      for (int x = 0; x < kRows; ++x) {
        const int mt = x / 2, e0 = 2 * (x % 2);
        const float m_new = fmaxf(m[x], row_max[x]);
        if (m_new == -INFINITY) continue;  // nothing visible in this row yet
        const float alpha = exp2f(m[x] - m_new);  // 0 when m was -inf
        l[x] *= alpha;
        l_mma[x] *= alpha;
        m[x] = m_new;
        for (int j = 0; j < kDimTiles; ++j) {
          acc[mt][j][e0] *= alpha;
          acc[mt][j][e0 + 1] *= alpha;
        }
      }
    }
    // P packed in pairs as the P V product takes it: pk[mt][j][x % 2] holds the P of row x at
    // columns (j 8 + 2 t4, + 1); the rounded sum is taken from the packed values.
    uint32_t pk[kMTiles][kBlockN / 8][2];
    for (int x = 0; x < kRows; ++x) {
      const int mt = x / 2, e0 = 2 * (x % 2);
      if (m[x] == -INFINITY) {  // nothing visible in this row yet
        for (int j = 0; j < kBlockN / 8; ++j) pk[mt][j][x % 2] = 0u;
        continue;
      }
      float row_sum = 0.f, row_sum_mma = 0.f;
      for (int j = 0; j < kBlockN / 8; ++j) {
        const float p0 = exp2f(fmaf(s[mt][j][e0], p.scale_log2, -m[x]));
        const float p1 = exp2f(fmaf(s[mt][j][e0 + 1], p.scale_log2, -m[x]));
        pk[mt][j][x % 2] = T::pack(p0, p1);
        const float2 rounded = T::unpack(pk[mt][j][x % 2]);
        row_sum += p0 + p1;
        row_sum_mma += rounded.x + rounded.y;
      }
      l[x] += row_sum;
      l_mma[x] += row_sum_mma;
    }

    // O += P V, with the packed P as the A operand; one V fragment, kMTiles mmas.
    const uint32_t v_rows = smem_address(v_tile) + v_lane_row * kDim * 2;
    for (int ks = 0; ks < kKeySteps; ++ks) {
      uint32_t pa[kMTiles][4];
      for (int mt = 0; mt < kMTiles; ++mt) {
        pa[mt][0] = pk[mt][2 * ks][0];
        pa[mt][1] = pk[mt][2 * ks][1];
        pa[mt][2] = pk[mt][2 * ks + 1][0];
        pa[mt][3] = pk[mt][2 * ks + 1][1];
      }
      for (int dp = 0; dp < kDimTiles / 2; ++dp) {
        uint32_t vb[4];
        ldmatrix_x4_trans_at(vb, v_rows + ks * 16 * kDim * 2 + sw_a.of(dp));
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816<Elem>(acc[mt][2 * dp], pa[mt], vb[0], vb[1]);
          mma_16816<Elem>(acc[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // this buffer is refilled two tiles from now
  }
  cp_async_wait<0>();  // nothing may be in flight when the CTA ends (Q only, with no tiles)

  // Normalise and write fp32 O, LSE, and optionally O in the input dtype.
  for (int x = 0; x < kRows; ++x) {
    const int mt = x / 2, e0 = 2 * (x % 2);
    const int row = q0 + tile_row(x);
    float total = l[x], total_mma = l_mma[x];
    total += __shfl_xor_sync(0xffffffff, total, 1);
    total += __shfl_xor_sync(0xffffffff, total, 2);
    total_mma += __shfl_xor_sync(0xffffffff, total_mma, 1);
    total_mma += __shfl_xor_sync(0xffffffff, total_mma, 2);
    if (row >= p.seq_q) continue;
    const float inv = total_mma > 0.f ? 1.f / total_mma : 0.f;
    float* o_row = p.o_acc + b * p.o_strides[0] + int64_t(row) * p.o_strides[1] + h * p.o_strides[2];
    Elem* out_row = p.o_out ? static_cast<Elem*>(p.o_out) + b * p.out_strides[0] +
                                  int64_t(row) * p.out_strides[1] + h * p.out_strides[2]
                            : nullptr;
    for (int j = 0; j < kDimTiles; ++j) {
      const float a = acc[mt][j][e0] * inv, c = acc[mt][j][e0 + 1] * inv;
      *reinterpret_cast<float2*>(o_row + j * 8 + 2 * t4) = make_float2(a, c);
      if (out_row) *reinterpret_cast<uint32_t*>(out_row + j * 8 + 2 * t4) = T::pack(a, c);
    }
    if (t4 == 0)
      p.lse[(int64_t(b) * p.heads + h) * p.seq_q + row] =
          total > 0.f ? (m[x] + log2f(total)) * 0.6931471805599453f : -INFINITY;
  }
}

template <class Elem, int kDim>
Status launch_forward(const ForwardParams& p, cudaStream_t stream) {
  const size_t smem = size_t(kBlockM + 4 * kBlockNFor<kDim>) * kDim * sizeof(Elem);
  auto kernel = forward_kernel<Elem, kDim>;
  SP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid((p.seq_q + kBlockM - 1) / kBlockM, p.heads, p.batch);
  kernel<<<grid, kThreads, smem, stream>>>(p);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace
}  // namespace cuda

FlashPositions FlashPositions::defaults(const AttentionParams& params, int64_t seq_q, int64_t seq_k) {
  FlashPositions pos;
  pos.q.offset = params.mask.align == MaskAlign::kBottomRight ? seq_k - seq_q : 0;
  return pos;
}

Status flash_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const AttentionParams& params, const FlashPositions& positions,
                               const TensorView& o_acc, const TensorView& lse, bool accumulate,
                               const TensorView& o_out, void* stream) {
  cuda::FlashProblem prob;
  SP_RETURN_IF_ERROR(cuda::check_flash_inputs(q, k, v, params, positions, &prob));
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("o_acc", o_acc, DType::kF32, {prob.batch, prob.seq_q, prob.heads, prob.head_dim}));
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("lse", lse, DType::kF32, {prob.batch, prob.heads, prob.seq_q}));
  SP_CHECK_ARG(lse.is_contiguous(), "lse must be contiguous");
  if (o_out.data)
    SP_RETURN_IF_ERROR(cuda::check_device_tensor("o_out", o_out, q.dtype, {prob.batch, prob.seq_q, prob.heads, prob.head_dim}));
  if (prob.seq_q == 0) return Status::Ok();
  cuda::ForwardParams p{};
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o_acc = static_cast<float*>(o_acc.data);
  p.lse = static_cast<float*>(lse.data);
  p.o_out = o_out.data;
  for (int i = 0; i < 3; ++i) {
    p.q_strides[i] = q.strides[i];
    p.k_strides[i] = k.strides[i];
    p.v_strides[i] = v.strides[i];
    p.o_strides[i] = o_acc.strides[i];
    p.out_strides[i] = o_out.data ? o_out.strides[i] : 0;
  }
  p.batch = int(prob.batch);
  p.heads = int(prob.heads);
  p.group = int(prob.heads / prob.kv_heads);
  p.seq_q = int(prob.seq_q);
  p.seq_k = int(prob.seq_k);
  p.scale_log2 = float(prob.scale * 1.4426950408889634);
  p.accumulate = accumulate;
  p.mask = cuda::make_mask_runs(params, positions);
  const auto s = static_cast<cudaStream_t>(stream);
  const bool bf16 = q.dtype == DType::kBF16;
  if (prob.head_dim == 64)
    return bf16 ? cuda::launch_forward<__nv_bfloat16, 64>(p, s) : cuda::launch_forward<__half, 64>(p, s);
  return bf16 ? cuda::launch_forward<__nv_bfloat16, 128>(p, s) : cuda::launch_forward<__half, 128>(p, s);
}

}  // namespace seqpar
