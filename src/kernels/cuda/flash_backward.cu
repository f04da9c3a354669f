// Our flash-attention backward on tensor cores, against a given (global) LSE and
// D = rowsum(dO * O), adding into fp32 dQ, dK, dV. One CTA of 4 warps owns 64 keys of one K/V
// head and keeps their dK, dV in registers (16 keys per warp) while it walks the query heads
// of its GQA group and the query blocks that can see these keys (one run of blocks, found
// before the walk; each block's Q, dO, LSE and D arrive by cp.async while the one before is
// computed):
//   S = Q K^T and dP = dO V^T      (warps split the 64 query rows)
//   P = exp(S - LSE), dS = P (dP - D), staged in shared memory as [query][key]
//   dV += P^T dO, dK += dS^T Q     (warps split the 64 keys; ldmatrix.trans reads P^T, dS^T)
//   dQ += dS K                     (dS straight from registers; fp32 atomics into global)
#include <cuda_runtime.h>

#include <cmath>

#include "core/cuda_check.hpp"
#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/mma_utils.cuh"
#include "kernels/cuda/flash_cuda.hpp"

namespace seqpar {
namespace cuda {
namespace {

constexpr int kBlockM = 64, kBlockN = 64, kWarps = 4, kThreads = 32 * kWarps;

struct BackwardParams {
  const void* q;
  const void* k;
  const void* v;
  const void* dout;
  const float* lse;
  const float* delta;
  float* dq;
  float* dk;
  float* dv;
  int64_t q_strides[3], k_strides[3], v_strides[3], do_strides[3], dq_strides[3], dk_strides[3],
      dv_strides[3];
  int batch, heads, kv_heads, group, seq_q, seq_k;
  float scale, scale_log2;
  MaskRuns mask;
};

template <class Elem, int kDim>
__global__ void __launch_bounds__(kThreads) backward_kernel(const BackwardParams p) {
  using T = ElemTraits<Elem>;
  constexpr int kDimTiles = kDim / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Elem* k_smem = reinterpret_cast<Elem*>(smem_raw);  // [kBlockN][kDim]
  Elem* v_smem = k_smem + kBlockN * kDim;
  Elem* q_smem = v_smem + kBlockN * kDim;            // [2][kBlockM][kDim], double-buffered
  Elem* do_smem = q_smem + 2 * kBlockM * kDim;
  Elem* p_smem = do_smem + 2 * kBlockM * kDim;       // [kBlockM][kBlockN]
  Elem* ds_smem = p_smem + kBlockM * kBlockN;
  float* row_smem = reinterpret_cast<float*>(ds_smem + kBlockM * kBlockN);  // [2][LSE, D][kBlockM]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int key0 = blockIdx.x * kBlockN, kvh = blockIdx.y, b = blockIdx.z;
  const int valid_keys = min(kBlockN, p.seq_k - key0);
  const int64_t kp_first = p.mask.k_offset + p.mask.k_stride * int64_t(key0);
  const int64_t kp_last = p.mask.k_offset + p.mask.k_stride * int64_t(key0 + valid_keys - 1);

  const TileLoader<Elem, kDim, kThreads> loader(tid);
  // ldmatrix addresses (bytes) of the transposed products, as per-thread bases plus
  // immediates. For dO, Q and K (the B operands, read transposed) a lane reads row
  // lane % 8 + 8 ((lane / 8) % 2) of each 16-row block at chunk 2 d + lane / 16; those rows
  // have row & 7 = lane & 7, so the swizzle is a per-thread offset (sw_t). For P and dS (the
  // A operands) it reads row (lane / 16) 8 + lane % 8 at chunk 2 warp + (lane / 8) % 2.
  constexpr uint32_t kRowBytes = kDim * 2, kTileBytes = kBlockM * kRowBytes;
  const SwizzleOffsets sw_t(lane / 16, lane & 7);
  const uint32_t k_rows = smem_address(k_smem) + (lane % 8 + ((lane / 8) % 2) * 8) * kRowBytes;
  const uint32_t q_rows0 = k_rows + uint32_t(q_smem - k_smem) * 2;  // Q buffer 0; dO is kTileBytes * 2 on
  const uint32_t p_rows = smem_address(p_smem) + ((lane / 16) * 8 + lane % 8) * kBlockN * 2 +
                          (((warp * 2 + (lane / 8) % 2) ^ (lane & 7)) << 4);
  const uint32_t ds_rows = p_rows + kBlockM * kBlockN * 2;
  loader.template load<kBlockN>(k_smem, static_cast<const Elem*>(p.k) + b * p.k_strides[0] + kvh * p.k_strides[2], p.k_strides[1],
              key0, p.seq_k);
  loader.template load<kBlockN>(v_smem, static_cast<const Elem*>(p.v) + b * p.v_strides[0] + kvh * p.v_strides[2], p.v_strides[1],
              key0, p.seq_k);
  cp_async_commit();

  float dk_acc[kDimTiles][4], dv_acc[kDimTiles][4];
  for (int j = 0; j < kDimTiles; ++j)
    for (int e = 0; e < 4; ++e) dk_acc[j][e] = dv_acc[j][e] = 0.f;

  // The query rows that see some of these keys are one run, and so are those that see all of
  // them (rows_with), worked out once: the CTA walks the query blocks over the first run, in
  // each query head of its GQA group, with no per-block visibility test; a block inside the
  // second run needs no per-row mask.
  int seen_begin, seen_end, full_begin, full_end;
  rows_with(p.mask, p.seq_q, kp_first, kp_last, &seen_begin, &seen_end);
  rows_with(p.mask, p.seq_q, kp_last, kp_first, &full_begin, &full_end);
  const int qb_begin = seen_begin / kBlockM;
  const int qb_count = seen_end > seen_begin ? (seen_end + kBlockM - 1) / kBlockM - qb_begin : 0;

  // Each (query head, query block) pair's Q, dO, LSE and D go to one of two buffers by
  // cp.async; the next pair's are loaded while the current one is computed.
  auto load_q_block = [&](int hh, int qb, int buf) {
    const int h = kvh * p.group + hh, q0 = qb * kBlockM;
    loader.template load<kBlockM>(q_smem + buf * kBlockM * kDim, static_cast<const Elem*>(p.q) + b * p.q_strides[0] + h * p.q_strides[2],
                p.q_strides[1], q0, p.seq_q);
    loader.template load<kBlockM>(do_smem + buf * kBlockM * kDim,
                static_cast<const Elem*>(p.dout) + b * p.do_strides[0] + h * p.do_strides[2], p.do_strides[1], q0,
                p.seq_q);
    static_assert(kThreads == 2 * kBlockM, "one LSE or D value per thread");
    const int row = q0 + tid % kBlockM;
    const float* from = (tid < kBlockM ? p.lse : p.delta) + (int64_t(b) * p.heads + h) * p.seq_q;
    cp_async_4(row_smem + buf * 2 * kBlockM + tid, row < p.seq_q ? from + row : from, row < p.seq_q);
  };
  int cur_hh = 0, cur_qb = 0, buf = 0;
  if (qb_count > 0) load_q_block(0, qb_begin, 0);
  cp_async_commit();
  for (int step = 0; step < qb_count * p.group; ++step) {
    const int next_qb = cur_qb + 1 == qb_count ? 0 : cur_qb + 1;
    const int next_hh = next_qb == 0 ? cur_hh + 1 : cur_hh;
    if (next_hh < p.group) load_q_block(next_hh, qb_begin + next_qb, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // everything but the prefetch just issued has landed
    __syncthreads();
    const int h = kvh * p.group + cur_hh, q0 = (qb_begin + cur_qb) * kBlockM;
    const bool full = valid_keys == kBlockN && q0 >= full_begin && min(q0 + kBlockM, p.seq_q) <= full_end;
    Elem* const q_tile = q_smem + buf * kBlockM * kDim;
    Elem* const do_tile = do_smem + buf * kBlockM * kDim;
    const float* const lse_tile = row_smem + buf * 2 * kBlockM;
    const float* const delta_tile = lse_tile + kBlockM;
    // S and dP for this warp's 16 query rows.
    float s[kBlockN / 8][4], dp[kBlockN / 8][4];
    for (int j = 0; j < kBlockN / 8; ++j)
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
    for (int ks = 0; ks < kDim / 16; ++ks) {
      uint32_t qa[4], da[4];
      ldmatrix_x4(qa, q_tile + swizzled<kDim>(warp * 16 + (lane % 16), ks * 2 + lane / 16));
      ldmatrix_x4(da, do_tile + swizzled<kDim>(warp * 16 + (lane % 16), ks * 2 + lane / 16));
      for (int jp = 0; jp < kBlockN / 16; ++jp) {
        const int key = jp * 16 + (lane / 16) * 8 + (lane % 8);
        uint32_t kb[4], vb[4];
        ldmatrix_x4(kb, k_smem + swizzled<kDim>(key, ks * 2 + (lane / 8) % 2));
        ldmatrix_x4(vb, v_smem + swizzled<kDim>(key, ks * 2 + (lane / 8) % 2));
        mma_16816<Elem>(s[2 * jp], qa, kb[0], kb[1]);
        mma_16816<Elem>(s[2 * jp + 1], qa, kb[2], kb[3]);
        mma_16816<Elem>(dp[2 * jp], da, vb[0], vb[1]);
        mma_16816<Elem>(dp[2 * jp + 1], da, vb[2], vb[3]);
      }
    }
    // P = exp2(S scale log2e - LSE log2e) (0 outside the mask), dS = P (dP - D). Each of the
    // thread's two rows sees the columns [col_lo, col_hi] of these keys (none for a missing
    // row or one with LSE -inf), kept relative to the thread's first column 2 t4, so the
    // per-element mask is two compares with constants and a select: no branches.
    float lse2[2], delta_row[2];
    int col_lo[2], col_hi[2];
    for (int r = 0; r < 2; ++r) {
      const int row = q0 + warp * 16 + g + 8 * r;
      const float lse = lse_tile[warp * 16 + g + 8 * r];
      delta_row[r] = delta_tile[warp * 16 + g + 8 * r];  // zero past the last row
      col_lo[r] = 1, col_hi[r] = 0;
      if (row < p.seq_q && lse > -INFINITY) {
        if (full) col_lo[r] = 0, col_hi[r] = kBlockN - 1;
        else visible_columns(p.mask, kp_first, row_interval(p.mask, row, p.seq_q), valid_keys, &col_lo[r], &col_hi[r]);
      }
      lse2[r] = lse > -INFINITY ? lse * 1.4426950408889634f : 0.f;
      col_lo[r] -= 2 * t4;
      col_hi[r] -= 2 * t4;
    }
    auto p_and_ds = [&](auto visible) {  // visible(r, col): whether the element counts
      for (int j = 0; j < kBlockN / 8; ++j) {
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2, col = j * 8 + (e % 2);  // less 2 t4
          const float prob = exp2f(s[j][e] * p.scale_log2 - lse2[r]);
          s[j][e] = visible(r, col) ? prob : 0.f;
          dp[j][e] = s[j][e] * (dp[j][e] - delta_row[r]);
        }
        // Stage P and dS as [query][key] for the transposed products.
        for (int r = 0; r < 2; ++r) {
          const int row = warp * 16 + g + 8 * r;
          const int at = swizzled<kBlockN>(row, j) + 2 * t4;
          *reinterpret_cast<uint32_t*>(p_smem + at) = T::pack(s[j][2 * r], s[j][2 * r + 1]);
          *reinterpret_cast<uint32_t*>(ds_smem + at) = T::pack(dp[j][2 * r], dp[j][2 * r + 1]);
        }
      }
    };
    if (full) {  // a row sees every column or none: one select per row, not two compares each
      const bool row_sees[2] = {col_lo[0] <= col_hi[0], col_lo[1] <= col_hi[1]};
      p_and_ds([&](int r, int) { return row_sees[r]; });
    } else {
      p_and_ds([&](int r, int col) { return col >= col_lo[r] && col <= col_hi[r]; });
    }
    uint32_t ds_frag[kBlockN / 16][4];
    for (int ks = 0; ks < kBlockN / 16; ++ks) {
      ds_frag[ks][0] = T::pack(dp[2 * ks][0], dp[2 * ks][1]);
      ds_frag[ks][1] = T::pack(dp[2 * ks][2], dp[2 * ks][3]);
      ds_frag[ks][2] = T::pack(dp[2 * ks + 1][0], dp[2 * ks + 1][1]);
      ds_frag[ks][3] = T::pack(dp[2 * ks + 1][2], dp[2 * ks + 1][3]);
    }
    __syncthreads();

    // dV += P^T dO and dK += dS^T Q for this warp's 16 keys.
    const uint32_t q_rows = q_rows0 + buf * kTileBytes, do_rows = q_rows + 2 * kTileBytes;
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      uint32_t pa[4], dsa[4];
      ldmatrix_x4_trans_at(pa, p_rows + kk * 16 * kBlockN * 2);
      ldmatrix_x4_trans_at(dsa, ds_rows + kk * 16 * kBlockN * 2);
      for (int dpair = 0; dpair < kDimTiles / 2; ++dpair) {
        uint32_t ob[4], qb4[4];
        ldmatrix_x4_trans_at(ob, do_rows + kk * 16 * kRowBytes + sw_t.of(dpair));
        ldmatrix_x4_trans_at(qb4, q_rows + kk * 16 * kRowBytes + sw_t.of(dpair));
        mma_16816<Elem>(dv_acc[2 * dpair], pa, ob[0], ob[1]);
        mma_16816<Elem>(dv_acc[2 * dpair + 1], pa, ob[2], ob[3]);
        mma_16816<Elem>(dk_acc[2 * dpair], dsa, qb4[0], qb4[1]);
        mma_16816<Elem>(dk_acc[2 * dpair + 1], dsa, qb4[2], qb4[3]);
      }
    }

    // dQ += scale * dS K for this warp's 16 query rows, added into global fp32. Two d-pairs
    // at a time, so four accumulator chains are in flight (with two, each mma mostly waited
    // for the one before it).
    constexpr int kPairsAtOnce = 2;
    float* dq_rows[2];  // this thread's two rows of dQ (null past the last row)
    for (int r = 0; r < 2; ++r) {
      const int row = q0 + warp * 16 + g + 8 * r;
      dq_rows[r] = row < p.seq_q ? p.dq + b * p.dq_strides[0] + int64_t(row) * p.dq_strides[1] + h * p.dq_strides[2] + 2 * t4
                                 : nullptr;
    }
    for (int d0 = 0; d0 < kDimTiles / 2; d0 += kPairsAtOnce) {
      float dq[2 * kPairsAtOnce][4] = {};
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        for (int pp = 0; pp < kPairsAtOnce; ++pp) {
          uint32_t kb[4];
          ldmatrix_x4_trans_at(kb, k_rows + ks * 16 * kRowBytes + sw_t.of(d0 + pp));
          mma_16816<Elem>(dq[2 * pp], ds_frag[ks], kb[0], kb[1]);
          mma_16816<Elem>(dq[2 * pp + 1], ds_frag[ks], kb[2], kb[3]);
        }
      }
      for (int r = 0; r < 2; ++r) {
        float* const dq_row = dq_rows[r];
        if (!dq_row) continue;
        for (int n = 0; n < 2 * kPairsAtOnce; ++n) {
          const int col = d0 * 16 + n * 8;
#if __CUDA_ARCH__ >= 900  // one vector atomic for the adjacent pair
          atomicAdd(reinterpret_cast<float2*>(dq_row + col),
                    make_float2(p.scale * dq[n][2 * r], p.scale * dq[n][2 * r + 1]));
#else
          atomicAdd(dq_row + col, p.scale * dq[n][2 * r]);
          atomicAdd(dq_row + col + 1, p.scale * dq[n][2 * r + 1]);
#endif
        }
      }
    }
    __syncthreads();  // the next pair writes P and dS, and two pairs on, this Q/dO buffer
    cur_hh = next_hh, cur_qb = next_qb, buf ^= 1;
  }
  cp_async_wait<0>();

  // dK, dV rows of this CTA belong to it alone: read-add-write.
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + warp * 16 + g + 8 * r;
    if (key >= p.seq_k) continue;
    float* dk_row = p.dk + b * p.dk_strides[0] + int64_t(key) * p.dk_strides[1] + kvh * p.dk_strides[2];
    float* dv_row = p.dv + b * p.dv_strides[0] + int64_t(key) * p.dv_strides[1] + kvh * p.dv_strides[2];
    for (int j = 0; j < kDimTiles; ++j) {
      float2* k2 = reinterpret_cast<float2*>(dk_row + j * 8 + 2 * t4);
      float2* v2 = reinterpret_cast<float2*>(dv_row + j * 8 + 2 * t4);
      const float2 ko = *k2, vo = *v2;
      *k2 = make_float2(ko.x + p.scale * dk_acc[j][2 * r], ko.y + p.scale * dk_acc[j][2 * r + 1]);
      *v2 = make_float2(vo.x + dv_acc[j][2 * r], vo.y + dv_acc[j][2 * r + 1]);
    }
  }
}

template <class Elem, int kDim>
Status launch_backward(const BackwardParams& p, cudaStream_t stream) {
  const size_t smem = (size_t(2 * kBlockN + 4 * kBlockM) * kDim + 2 * kBlockM * kBlockN) * sizeof(Elem) +
                      2 * 2 * kBlockM * sizeof(float);
  auto kernel = backward_kernel<Elem, kDim>;
  SP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid((p.seq_k + kBlockN - 1) / kBlockN, p.kv_heads, p.batch);
  kernel<<<grid, kThreads, smem, stream>>>(p);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace
}  // namespace cuda

Status flash_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& dout, const TensorView& lse,
                                const TensorView& delta, const AttentionParams& params,
                                const FlashPositions& positions, const TensorView& dq,
                                const TensorView& dk, const TensorView& dv, void* stream) {
  cuda::FlashProblem prob;
  SP_RETURN_IF_ERROR(cuda::check_flash_inputs(q, k, v, params, positions, &prob));
  const int64_t B = prob.batch, Sq = prob.seq_q, Sk = prob.seq_k, H = prob.heads,
                Hkv = prob.kv_heads, D = prob.head_dim;
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("dout", dout, q.dtype, {B, Sq, H, D}));
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("lse", lse, DType::kF32, {B, H, Sq}));
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("delta", delta, DType::kF32, {B, H, Sq}));
  SP_CHECK_ARG(lse.is_contiguous() && delta.is_contiguous(), "lse and delta must be contiguous");
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("dq", dq, DType::kF32, {B, Sq, H, D}));
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("dk", dk, DType::kF32, {B, Sk, Hkv, D}));
  SP_RETURN_IF_ERROR(cuda::check_device_tensor("dv", dv, DType::kF32, {B, Sk, Hkv, D}));
  bool aligned = reinterpret_cast<uintptr_t>(dout.data) % 16 == 0;
  for (int i = 0; i < 3; ++i) aligned = aligned && dout.strides[i] % 8 == 0;
  SP_CHECK_ARG(aligned, "dout needs 16-byte aligned rows");
  if (Sq == 0 || Sk == 0) return Status::Ok();
  cuda::BackwardParams p{};
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.dout = dout.data;
  p.lse = static_cast<const float*>(lse.data);
  p.delta = static_cast<const float*>(delta.data);
  p.dq = static_cast<float*>(dq.data);
  p.dk = static_cast<float*>(dk.data);
  p.dv = static_cast<float*>(dv.data);
  for (int i = 0; i < 3; ++i) {
    p.q_strides[i] = q.strides[i];
    p.k_strides[i] = k.strides[i];
    p.v_strides[i] = v.strides[i];
    p.do_strides[i] = dout.strides[i];
    p.dq_strides[i] = dq.strides[i];
    p.dk_strides[i] = dk.strides[i];
    p.dv_strides[i] = dv.strides[i];
  }
  p.batch = int(B);
  p.heads = int(H);
  p.kv_heads = int(Hkv);
  p.group = int(H / Hkv);
  p.seq_q = int(Sq);
  p.seq_k = int(Sk);
  p.scale = float(prob.scale);
  p.scale_log2 = float(prob.scale * 1.4426950408889634);
  p.mask = cuda::make_mask_runs(params, positions);
  const auto s = static_cast<cudaStream_t>(stream);
  const bool bf16 = q.dtype == DType::kBF16;
  if (D == 64)
    return bf16 ? cuda::launch_backward<__nv_bfloat16, 64>(p, s) : cuda::launch_backward<__half, 64>(p, s);
  return bf16 ? cuda::launch_backward<__nv_bfloat16, 128>(p, s) : cuda::launch_backward<__half, 128>(p, s);
}

}  // namespace seqpar
