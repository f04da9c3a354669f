// The fast CPU attention kernels: blocked online-softmax forward (continuing from a running
// (O, LSE)) and backward against a given LSE and D. Never materialises an S x S matrix: work
// is done on 64 x 64 tiles held in per-thread buffers, tiles the mask empties are skipped, and
// the products run in the register-blocked micro-kernel of simd.hpp. OpenMP spreads tasks
// (query blocks in forward, key blocks in backward) over threads.
#include <omp.h>

#include <cmath>
#include <vector>

#include "attention_common.hpp"
#include "simd.hpp"

namespace seqpar {
namespace cpu {
namespace {

constexpr int64_t kBlockQ = 64;
constexpr int64_t kBlockK = 64;
constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2 = 0.6931471805599453;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

template <class T>
struct Problem {
  AttentionDims dims;
  int64_t padded_dim = 0;  // head dim rounded up to the vector width
  int64_t q_blocks = 0, k_blocks = 0;
  T scale_log2 = 0;  // softmax scale folded with log2(e): scores live in the exp2 domain
  T scale = 0;
};

template <class T>
Problem<T> make_problem(const AttentionDims& dims, double scale) {
  Problem<T> p;
  p.dims = dims;
  p.padded_dim = round_up(dims.head_dim, Simd<T>::kWidth);
  p.q_blocks = ceil_div(dims.seq_q, kBlockQ);
  p.k_blocks = ceil_div(dims.seq_k, kBlockK);
  const double s = scale != 0.0 ? scale : 1.0 / std::sqrt(double(dims.head_dim));
  p.scale = static_cast<T>(s);
  p.scale_log2 = static_cast<T>(s * kLog2e);
  return p;
}

// Copies rows [s0, s0 + n) of head h of a BSHD tensor into dst[rows][ld] (zero padding), or
// transposed into dst[D][ld] when `transpose`.
template <class T>
void pack_rows(const TensorView& t, int64_t b, int64_t h, int64_t s0, int64_t n, int64_t D,
               T* dst, int64_t ld, bool transpose) {
  const T* base = t.as<T>();
  for (int64_t r = 0; r < n; ++r) {
    const T* src = base + bshd_offset(t, b, s0 + r, h);
    if (transpose) {
      for (int64_t d = 0; d < D; ++d) dst[d * ld + r] = src[d];
    } else {
      for (int64_t d = 0; d < D; ++d) dst[r * ld + d] = src[d];
    }
  }
}

// Packs every block of K/V heads: kt/vt hold [Dp][kBlockK] (transposed), kr/vr [kBlockK][Dp].
template <class T>
struct PackedKV {
  AlignedVector<T> data;
  int64_t block_elems = 0;
  const T* block(int64_t b, int64_t g, int64_t kb, const Problem<T>& p) const {
    return data.data() + ((b * p.dims.kv_heads + g) * p.k_blocks + kb) * block_elems;
  }
};

template <class T>
PackedKV<T> pack_kv(const TensorView& t, const Problem<T>& p, bool transpose) {
  PackedKV<T> packed;
  packed.block_elems = p.padded_dim * kBlockK;
  const int64_t B = p.dims.batch, Hkv = p.dims.kv_heads, nkb = p.k_blocks;
  packed.data.assign(static_cast<size_t>(B * Hkv * nkb * packed.block_elems), T(0));
#pragma omp parallel for collapse(3) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < Hkv; ++g)
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t j0 = kb * kBlockK, n = std::min(kBlockK, p.dims.seq_k - j0);
        T* dst = packed.data.data() + ((b * Hkv + g) * nkb + kb) * packed.block_elems;
        pack_rows(t, b, g, j0, n, p.dims.head_dim, dst, transpose ? kBlockK : p.padded_dim,
                  transpose);
      }
  return packed;
}

// Sets scores outside the mask (and beyond the last key) to -inf.
template <class T>
void mask_scores(const MaskEvaluator& mask, int64_t i0, int64_t nq, int64_t j0, int64_t nk,
                 bool partial, T* s) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < nq; ++r) {
    T* row = s + r * kBlockK;
    if (partial)
      for (int64_t c = 0; c < nk; ++c)
        if (!mask.allowed(i0 + r, j0 + c)) row[c] = neg_inf;
    for (int64_t c = nk; c < kBlockK; ++c) row[c] = neg_inf;
  }
}

template <class T>
void transpose_block(const T* src, int64_t rows, T* dst) {  // [rows][kBlockK] -> [kBlockK][kBlockQ]
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < kBlockK; ++c) dst[c * kBlockQ + r] = src[r * kBlockK + c];
}

template <class T>
void forward_impl(const TensorView& q, const TensorView& k, const TensorView& v,
                  const AttentionParams& params, const AttentionDims& dims, const TensorView& o,
                  const TensorView& lse, bool accumulate) {
  const Problem<T> p = make_problem<T>(dims, params.scale);
  const MaskEvaluator mask(params, dims.seq_q, dims.seq_k);
  const PackedKV<T> kt = pack_kv<T>(k, p, /*transpose=*/true);
  const PackedKV<T> vr = pack_kv<T>(v, p, /*transpose=*/false);
  const int64_t Dp = p.padded_dim, D = dims.head_dim, G = dims.group();
  const T neg_inf = -std::numeric_limits<T>::infinity();

#pragma omp parallel
  {
    AlignedVector<T> q_tile(kBlockQ * Dp), acc(kBlockQ * Dp), s(kBlockQ * kBlockK);
    AlignedVector<T> m(kBlockQ), l(kBlockQ);
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < dims.batch; ++b)
      for (int64_t h = 0; h < dims.heads; ++h)
        for (int64_t qb = 0; qb < p.q_blocks; ++qb) {
          const int64_t i0 = qb * kBlockQ, nq = std::min(kBlockQ, dims.seq_q - i0);
          std::fill(q_tile.begin(), q_tile.end(), T(0));
          pack_rows(q, b, h, i0, nq, D, q_tile.data(), Dp, false);
          for (T& x : q_tile) x *= p.scale_log2;  // scores come out in the exp2 domain
          std::fill(acc.begin(), acc.end(), T(0));
          for (int64_t r = 0; r < nq; ++r) {
            const T prev_lse = accumulate ? lse.as<T>()[bhs_offset(lse, b, h, i0 + r)] : neg_inf;
            // A running result with no mass yet (or a +inf/NaN LSE from elsewhere) is empty.
            if (!(prev_lse > neg_inf && prev_lse < -neg_inf)) {
              m[r] = neg_inf;
              l[r] = 0;
              continue;
            }
            m[r] = prev_lse * T(kLog2e);
            l[r] = 1;
            const T* o_row = o.as<T>() + bshd_offset(o, b, i0 + r, h);
            for (int64_t d = 0; d < D; ++d) acc[r * Dp + d] = o_row[d];
          }
          for (int64_t kb = 0; kb < p.k_blocks; ++kb) {
            const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, dims.seq_k - j0);
            const TileKind kind = mask.classify(i0, i0 + nq, j0, j0 + nk);
            if (kind == TileKind::kEmpty) continue;
            gemm<T, false>(nq, kBlockK, D, q_tile.data(), Dp, kt.block(b, h / G, kb, p), kBlockK,
                           s.data(), kBlockK);
            mask_scores(mask, i0, nq, j0, nk, kind == TileKind::kPartial, s.data());
            for (int64_t r = 0; r < nq; ++r) {
              T* row = s.data() + r * kBlockK;
              T row_max = neg_inf;
#pragma omp simd reduction(max : row_max)
              for (int64_t c = 0; c < kBlockK; ++c) row_max = std::max(row_max, row[c]);
              const T m_new = std::max(m[r], row_max);
              if (m_new == neg_inf) {  // nothing visible yet in this row
                std::fill(row, row + kBlockK, T(0));
                continue;
              }
              exp2_shifted(row, kBlockK, m_new);
              T row_sum = 0;
#pragma omp simd reduction(+ : row_sum)
              for (int64_t c = 0; c < kBlockK; ++c) row_sum += row[c];
              const T alpha = m[r] == neg_inf ? T(0) : std::exp2(m[r] - m_new);
              if (alpha != T(1))
                for (int64_t d = 0; d < Dp; ++d) acc[r * Dp + d] *= alpha;
              l[r] = alpha * l[r] + row_sum;
              m[r] = m_new;
            }
            gemm<T, true>(nq, Dp, nk, s.data(), kBlockK, vr.block(b, h / G, kb, p), Dp,
                          acc.data(), Dp);
          }
          for (int64_t r = 0; r < nq; ++r) {
            T* o_row = o.as<T>() + bshd_offset(o, b, i0 + r, h);
            T* lse_out = lse.as<T>() + bhs_offset(lse, b, h, i0 + r);
            if (l[r] == T(0)) {
              std::fill(o_row, o_row + D, T(0));
              *lse_out = neg_inf;
              continue;
            }
            const T inv = T(1) / l[r];
            for (int64_t d = 0; d < D; ++d) o_row[d] = acc[r * Dp + d] * inv;
            *lse_out = (m[r] + std::log2(l[r])) * T(kLn2);
          }
        }
  }
}

template <class T>
void backward_impl(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& dout, const TensorView& lse, const TensorView& delta,
                   const AttentionParams& params, const AttentionDims& dims, const TensorView& dq,
                   const TensorView& dk, const TensorView& dv) {
  const Problem<T> p = make_problem<T>(dims, params.scale);
  const MaskEvaluator mask(params, dims.seq_q, dims.seq_k);
  const int64_t Dp = p.padded_dim, D = dims.head_dim, G = dims.group();
  const int64_t B = dims.batch, H = dims.heads, Hkv = dims.kv_heads, nqb = p.q_blocks;
  const PackedKV<T> kt = pack_kv<T>(k, p, /*transpose=*/true);
  const PackedKV<T> kr = pack_kv<T>(k, p, /*transpose=*/false);
  const PackedKV<T> vt = pack_kv<T>(v, p, /*transpose=*/true);
  // Q and dO packed per (b, h, query block) as [kBlockQ][Dp]; reused by every key block.
  const int64_t q_block_elems = kBlockQ * Dp;
  AlignedVector<T> q_packed(static_cast<size_t>(B * H * nqb * q_block_elems), T(0));
  AlignedVector<T> do_packed(q_packed.size(), T(0));
  AlignedVector<T> lse2(static_cast<size_t>(B * H * nqb * kBlockQ), T(0));
  AlignedVector<T> delta_rows(lse2.size(), T(0));
#pragma omp parallel for collapse(3) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t qb = 0; qb < nqb; ++qb) {
        const int64_t i0 = qb * kBlockQ, nq = std::min(kBlockQ, dims.seq_q - i0);
        const int64_t block = (b * H + h) * nqb + qb;
        pack_rows(q, b, h, i0, nq, D, &q_packed[block * q_block_elems], Dp, false);
        pack_rows(dout, b, h, i0, nq, D, &do_packed[block * q_block_elems], Dp, false);
        for (int64_t r = 0; r < nq; ++r) {
          lse2[block * kBlockQ + r] = lse.as<T>()[bhs_offset(lse, b, h, i0 + r)] * T(kLog2e);
          delta_rows[block * kBlockQ + r] = delta.as<T>()[bhs_offset(delta, b, h, i0 + r)];
        }
      }

  // dQ gathers contributions from every key block, which different threads own: each thread
  // sums into its own copy and the copies are added at the end.
  const int threads = omp_get_max_threads();
  std::vector<AlignedVector<T>> dq_private(threads);
  const T neg_inf = -std::numeric_limits<T>::infinity();

#pragma omp parallel
  {
    AlignedVector<T>& dq_acc = dq_private[omp_get_thread_num()];
    dq_acc.assign(q_packed.size(), T(0));
    AlignedVector<T> s(kBlockQ * kBlockK), dp(kBlockQ * kBlockK), st(kBlockK * kBlockQ);
    AlignedVector<T> dk_acc(kBlockK * Dp), dv_acc(kBlockK * Dp);
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t g = 0; g < Hkv; ++g)
        for (int64_t kb = 0; kb < p.k_blocks; ++kb) {
          const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, dims.seq_k - j0);
          std::fill(dk_acc.begin(), dk_acc.end(), T(0));
          std::fill(dv_acc.begin(), dv_acc.end(), T(0));
          bool touched = false;
          for (int64_t h = g * G; h < (g + 1) * G; ++h)
            for (int64_t qb = 0; qb < nqb; ++qb) {
              const int64_t i0 = qb * kBlockQ, nq = std::min(kBlockQ, dims.seq_q - i0);
              const TileKind kind = mask.classify(i0, i0 + nq, j0, j0 + nk);
              if (kind == TileKind::kEmpty) continue;
              touched = true;
              const int64_t block = (b * H + h) * nqb + qb;
              const T* q_tile = &q_packed[block * q_block_elems];
              const T* do_tile = &do_packed[block * q_block_elems];
              // P = exp2(S * scale log2e - lse log2e), zero outside the mask.
              gemm<T, false>(nq, kBlockK, D, q_tile, Dp, kt.block(b, g, kb, p), kBlockK, s.data(),
                             kBlockK);
              for (int64_t x = 0; x < nq * kBlockK; ++x) s[x] *= p.scale_log2;
              mask_scores(mask, i0, nq, j0, nk, kind == TileKind::kPartial, s.data());
              for (int64_t r = 0; r < nq; ++r) {
                const T row_lse = lse2[block * kBlockQ + r];
                T* row = s.data() + r * kBlockK;
                if (row_lse == neg_inf) std::fill(row, row + kBlockK, T(0));
                else exp2_shifted(row, kBlockK, row_lse);
              }
              // dS = P * (dO V^T - D)
              gemm<T, false>(nq, kBlockK, D, do_tile, Dp, vt.block(b, g, kb, p), kBlockK,
                             dp.data(), kBlockK);
              for (int64_t r = 0; r < nq; ++r) {
                const T d_row = delta_rows[block * kBlockQ + r];
#pragma omp simd
                for (int64_t c = 0; c < kBlockK; ++c)
                  dp[r * kBlockK + c] = s[r * kBlockK + c] * (dp[r * kBlockK + c] - d_row);
              }
              // dV += P^T dO ;  dK += dS^T Q ;  dQ += dS K   (scale applied at the end)
              transpose_block(s.data(), nq, st.data());
              gemm<T, true>(nk, Dp, nq, st.data(), kBlockQ, do_tile, Dp, dv_acc.data(), Dp);
              transpose_block(dp.data(), nq, st.data());
              gemm<T, true>(nk, Dp, nq, st.data(), kBlockQ, q_tile, Dp, dk_acc.data(), Dp);
              gemm<T, true>(nq, Dp, nk, dp.data(), kBlockK, kr.block(b, g, kb, p), Dp,
                            &dq_acc[block * q_block_elems], Dp);
            }
          if (!touched) continue;
          for (int64_t r = 0; r < nk; ++r) {
            T* dk_row = dk.as<T>() + bshd_offset(dk, b, j0 + r, g);
            T* dv_row = dv.as<T>() + bshd_offset(dv, b, j0 + r, g);
            for (int64_t d = 0; d < D; ++d) {
              dk_row[d] += p.scale * dk_acc[r * Dp + d];
              dv_row[d] += dv_acc[r * Dp + d];
            }
          }
        }
  }
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < dims.seq_q; ++i) {
        const int64_t offset = ((b * H + h) * nqb + i / kBlockQ) * q_block_elems +
                               (i % kBlockQ) * Dp;
        T* dq_row = dq.as<T>() + bshd_offset(dq, b, i, h);
        for (int64_t d = 0; d < D; ++d) {
          T sum = 0;
          for (const auto& part : dq_private) sum += part[offset + d];
          dq_row[d] += p.scale * sum;
        }
      }
}

Status check_compute_dtype(DType dtype) {
  SP_CHECK_SUPPORTED(dtype == DType::kF32 || dtype == DType::kF64,
                     std::string("the CPU backend computes in fp32 or fp64, not ") +
                         dtype_name(dtype) + " (bf16/fp16 run on the CUDA backend)");
  return Status::Ok();
}

}  // namespace
}  // namespace cpu

Status cpu_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                             const AttentionParams& params, const TensorView& o,
                             const TensorView& lse, bool accumulate) {
  cpu::AttentionDims d;
  SP_RETURN_IF_ERROR(cpu::validate_qkv(q, k, v, &d));
  SP_RETURN_IF_ERROR(cpu::check_compute_dtype(q.dtype));
  SP_RETURN_IF_ERROR(cpu::validate_like("o", o, q.dtype, d.batch, d.seq_q, d.heads, d.head_dim));
  SP_RETURN_IF_ERROR(cpu::validate_like("lse", lse, q.dtype, d.batch, d.heads, d.seq_q));
  SP_RETURN_IF_ERROR(cpu::validate_mask_positions(params, d.seq_q, d.seq_k));
  if (d.seq_q == 0) return Status::Ok();
  if (q.dtype == DType::kF32) cpu::forward_impl<float>(q, k, v, params, d, o, lse, accumulate);
  else cpu::forward_impl<double>(q, k, v, params, d, o, lse, accumulate);
  return Status::Ok();
}

Status cpu_attention_delta(const TensorView& o, const TensorView& dout, const TensorView& delta) {
  SP_CHECK_ARG(o.ndim == 4, "o must be [B, S, H, D], got " + o.shape_string());
  SP_RETURN_IF_ERROR(cpu::check_compute_dtype(o.dtype));
  const int64_t B = o.shape[0], S = o.shape[1], H = o.shape[2], D = o.shape[3];
  SP_RETURN_IF_ERROR(cpu::validate_like("o", o, o.dtype, B, S, H, D));
  SP_RETURN_IF_ERROR(cpu::validate_like("dout", dout, o.dtype, B, S, H, D));
  SP_RETURN_IF_ERROR(cpu::validate_like("delta", delta, o.dtype, B, H, S));
  auto run = [&](auto zero) {
    using T = decltype(zero);
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t h = 0; h < H; ++h) {
          const T* x = o.as<T>() + cpu::bshd_offset(o, b, s, h);
          const T* y = dout.as<T>() + cpu::bshd_offset(dout, b, s, h);
          T acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += x[d] * y[d];
          delta.as<T>()[cpu::bhs_offset(delta, b, h, s)] = acc;
        }
  };
  if (o.dtype == DType::kF32) run(0.0f);
  else run(0.0);
  return Status::Ok();
}

Status cpu_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& dout, const TensorView& lse,
                              const TensorView& delta, const AttentionParams& params,
                              const TensorView& dq, const TensorView& dk, const TensorView& dv) {
  cpu::AttentionDims d;
  SP_RETURN_IF_ERROR(cpu::validate_qkv(q, k, v, &d));
  SP_RETURN_IF_ERROR(cpu::check_compute_dtype(q.dtype));
  const DType t = q.dtype;
  SP_RETURN_IF_ERROR(cpu::validate_like("dout", dout, t, d.batch, d.seq_q, d.heads, d.head_dim));
  SP_RETURN_IF_ERROR(cpu::validate_like("lse", lse, t, d.batch, d.heads, d.seq_q));
  SP_RETURN_IF_ERROR(cpu::validate_like("delta", delta, t, d.batch, d.heads, d.seq_q));
  SP_RETURN_IF_ERROR(cpu::validate_like("dq", dq, t, d.batch, d.seq_q, d.heads, d.head_dim));
  SP_RETURN_IF_ERROR(cpu::validate_like("dk", dk, t, d.batch, d.seq_k, d.kv_heads, d.head_dim));
  SP_RETURN_IF_ERROR(cpu::validate_like("dv", dv, t, d.batch, d.seq_k, d.kv_heads, d.head_dim));
  SP_RETURN_IF_ERROR(cpu::validate_mask_positions(params, d.seq_q, d.seq_k));
  if (d.seq_q == 0 || d.seq_k == 0) return Status::Ok();
  if (t == DType::kF32) cpu::backward_impl<float>(q, k, v, dout, lse, delta, params, d, dq, dk, dv);
  else cpu::backward_impl<double>(q, k, v, dout, lse, delta, params, d, dq, dk, dv);
  return Status::Ok();
}

Status merge_attention_partials(const TensorView& o, const TensorView& lse,
                                const TensorView& o_part, const TensorView& lse_part) {
  SP_CHECK_ARG(o.ndim == 4, "o must be [B, S, H, D], got " + o.shape_string());
  SP_RETURN_IF_ERROR(cpu::check_compute_dtype(o.dtype));
  const int64_t B = o.shape[0], S = o.shape[1], H = o.shape[2], D = o.shape[3];
  SP_RETURN_IF_ERROR(cpu::validate_like("o", o, o.dtype, B, S, H, D));
  SP_RETURN_IF_ERROR(cpu::validate_like("o_part", o_part, o.dtype, B, S, H, D));
  SP_RETURN_IF_ERROR(cpu::validate_like("lse", lse, o.dtype, B, H, S));
  SP_RETURN_IF_ERROR(cpu::validate_like("lse_part", lse_part, o.dtype, B, H, S));
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const T inf = std::numeric_limits<T>::infinity();
    // +inf or NaN stands for "no visible key" here, like -inf.
    auto clean = [inf](T x) { return (x > -inf && x < inf) ? x : -inf; };
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t s = 0; s < S; ++s) {
          T& a = lse.as<T>()[cpu::bhs_offset(lse, b, h, s)];
          const T c = clean(lse_part.as<T>()[cpu::bhs_offset(lse_part, b, h, s)]);
          a = clean(a);
          T* x = o.as<T>() + cpu::bshd_offset(o, b, s, h);
          const T* y = o_part.as<T>() + cpu::bshd_offset(o_part, b, s, h);
          if (c == -inf) {
            if (a == -inf) std::fill(x, x + D, T(0));
            continue;
          }
          if (a == -inf) {
            std::copy(y, y + D, x);
            a = c;
            continue;
          }
          const T hi = std::max(a, c);
          const T merged = hi + std::log1p(std::exp(-std::abs(a - c)));
          const T wa = std::exp(a - merged), wc = std::exp(c - merged);
          for (int64_t d = 0; d < D; ++d) x[d] = wa * x[d] + wc * y[d];
          a = merged;
        }
  };
  if (o.dtype == DType::kF32) run(0.0f);
  else run(0.0);
  return Status::Ok();
}

}  // namespace seqpar
