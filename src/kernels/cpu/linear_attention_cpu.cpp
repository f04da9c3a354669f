// The chunked CPU kernels of causal linear attention with per-head decay (fp32, fp64): inside a
// chunk, masked products on kTile x kTile score tiles (no larger score or mask block exists);
// between chunks, products with the running d_k x d_v state. OpenMP spreads (batch, head) tasks.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "linear_common.hpp"

namespace seqpar {
namespace {

using cpu::HeadRows;
using cpu::LinearDims;
using cpu::present;

constexpr int64_t kTile = 32;       // score tile edge inside a chunk

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

template <class T>
void axpy(T a, const T* x, T* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// y[0..DK) += S y_in: row a of S (d_k x d_v) dotted with x (d_v).
template <class T>
void add_state_times(T w, const T* S, const T* x, T* y, int64_t DK, int64_t DV) {
  for (int64_t a = 0; a < DK; ++a) y[a] += w * dot(&S[a * DV], x, DV);
}

// y[0..DV) += w S^T x: x (d_k) against the rows of S.
template <class T>
void add_state_transposed_times(T w, const T* S, const T* x, T* y, int64_t DK, int64_t DV) {
  for (int64_t a = 0; a < DK; ++a) axpy(w * x[a], &S[a * DV], y, DV);
}

// S (d_k x d_v) += w x y^T.
template <class T>
void add_outer(T w, const T* x, const T* y, T* S, int64_t DK, int64_t DV) {
  for (int64_t a = 0; a < DK; ++a) axpy(w * x[a], y, &S[a * DV], DV);
}

// lambda_h^t for t = 0..max_distance, each as its own exp (never a product of powers).
template <class T>
std::vector<T> decay_table(const LinearAttentionParams& params, int64_t h, int64_t max_distance) {
  std::vector<T> table(static_cast<size_t>(max_distance + 1));
  for (int64_t t = 0; t <= max_distance; ++t) table[t] = static_cast<T>(decay_power(params, h, t));
  return table;
}

// A state of one head, or zeros when the tensor is absent.
template <class T>
std::vector<T> load_state(const TensorView& t, int64_t b, int64_t h, const LinearDims& d) {
  std::vector<T> s(static_cast<size_t>(d.state_elems()), T(0));
  if (present(t)) {
    const T* src = t.as<T>() + (b * d.heads + h) * d.state_elems();
    std::copy(src, src + d.state_elems(), s.begin());
  }
  return s;
}

template <class T>
void store_state(const std::vector<T>& s, const TensorView& t, int64_t b, int64_t h, const LinearDims& d) {
  if (present(t)) std::copy(s.begin(), s.end(), t.as<T>() + (b * d.heads + h) * d.state_elems());
}

// S <- lambda^m S + sum_r lambda^(m-1-r) k_r v_r^T over chunk rows [c0, c0 + m).
template <class T>
void carry_state_over_chunk(std::vector<T>& S, const HeadRows<const T>& K, const HeadRows<const T>& V,
                            int64_t c0, int64_t m, const std::vector<T>& pw, const LinearDims& d) {
  for (T& x : S) x *= pw[m];
  for (int64_t r = 0; r < m; ++r) add_outer(pw[m - 1 - r], K[c0 + r], V[c0 + r], S.data(), d.dk, d.dv);
}

template <class T>
struct Args {
  LinearDims d;
  const LinearAttentionParams* params;
  TensorView q, k, v, state_in, o, state_out, dout, dstate_out, dq, dk, dv, dstate_in;
  int64_t dkv_head_of(int64_t h) const { return dk.shape[2] == d.heads ? h : h / d.group(); }
};

template <class T>
void forward_head(const Args<T>& a, int64_t b, int64_t h) {
  const LinearDims& d = a.d;
  const int64_t n = d.seq, C = std::min<int64_t>(a.params->chunk, std::max<int64_t>(n, 1));
  const int64_t g = h / d.group();
  const HeadRows<const T> Q(a.q, b, h), K(a.k, b, g), V(a.v, b, g);
  const std::vector<T> pw = decay_table<T>(*a.params, h, C);
  const T scale = static_cast<T>(a.params->scale);
  std::vector<T> S = load_state<T>(a.state_in, b, h, d);
  std::vector<T> score(kTile * kTile);
  for (int64_t c0 = 0; c0 < n; c0 += C) {
    const int64_t m = std::min(C, n - c0);
    if (present(a.o)) {
      const HeadRows<T> O(a.o, b, h);
      for (int64_t r = 0; r < m; ++r) {
        std::fill(O[c0 + r], O[c0 + r] + d.dv, T(0));
        add_state_transposed_times(scale * pw[r + 1], S.data(), Q[c0 + r], O[c0 + r], d.dk, d.dv);
      }
      for (int64_t i0 = c0; i0 < c0 + m; i0 += kTile) {
        const int64_t i1 = std::min(i0 + kTile, c0 + m);
        for (int64_t j0 = c0; j0 < i1; j0 += kTile) {
          const int64_t j1 = std::min(j0 + kTile, i1);
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = j0; j < std::min(j1, i + 1); ++j)
              score[(i - i0) * kTile + (j - j0)] = scale * pw[i - j] * dot(Q[i], K[j], d.dk);
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = j0; j < std::min(j1, i + 1); ++j) axpy(score[(i - i0) * kTile + (j - j0)], V[j], O[i], d.dv);
        }
      }
    }
    carry_state_over_chunk(S, K, V, c0, m, pw, d);
  }
  store_state(S, a.state_out, b, h, d);
}

// Writes dq of query head h, and dk, dv of head a.dkv_head_of(h) (its own rows: a scratch
// per query head under GQA, summed afterwards).
template <class T>
void backward_head(const Args<T>& a, int64_t b, int64_t h) {
  const LinearDims& d = a.d;
  const int64_t n = d.seq, C = std::min<int64_t>(a.params->chunk, std::max<int64_t>(n, 1));
  const int64_t g = h / d.group(), target = a.dkv_head_of(h);
  const HeadRows<const T> Q(a.q, b, h), K(a.k, b, g), V(a.v, b, g), dO(a.dout, b, h);
  const HeadRows<T> dQ(a.dq, b, h), dK(a.dk, b, target), dV(a.dv, b, target);
  const std::vector<T> pw = decay_table<T>(*a.params, h, C);
  const T scale = static_cast<T>(a.params->scale);
  // Sweep forward: dq's state term needs the state entering each chunk.
  std::vector<T> S = load_state<T>(a.state_in, b, h, d);
  for (int64_t c0 = 0; c0 < n; c0 += C) {
    const int64_t m = std::min(C, n - c0);
    for (int64_t r = 0; r < m; ++r) {
      std::fill(dQ[c0 + r], dQ[c0 + r] + d.dk, T(0));
      add_state_times(scale * pw[r + 1], S.data(), dO[c0 + r], dQ[c0 + r], d.dk, d.dv);
    }
    carry_state_over_chunk(S, K, V, c0, m, pw, d);
  }
  // Sweep backward: G = dL/d(state leaving the chunk).
  std::vector<T> G = load_state<T>(a.dstate_out, b, h, d);
  std::vector<T> score(kTile * kTile), dscore(kTile * kTile);
  for (int64_t c0 = (n - 1) / C * C; c0 >= 0 && n > 0; c0 -= C) {
    const int64_t m = std::min(C, n - c0);
    for (int64_t r = 0; r < m; ++r) {
      std::fill(dK[c0 + r], dK[c0 + r] + d.dk, T(0));
      std::fill(dV[c0 + r], dV[c0 + r] + d.dv, T(0));
      add_state_times(pw[m - 1 - r], G.data(), V[c0 + r], dK[c0 + r], d.dk, d.dv);
      add_state_transposed_times(pw[m - 1 - r], G.data(), K[c0 + r], dV[c0 + r], d.dk, d.dv);
    }
    for (int64_t i0 = c0; i0 < c0 + m; i0 += kTile) {
      const int64_t i1 = std::min(i0 + kTile, c0 + m);
      for (int64_t j0 = c0; j0 < i1; j0 += kTile) {
        const int64_t j1 = std::min(j0 + kTile, i1);
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t j = j0; j < std::min(j1, i + 1); ++j) {
            score[(i - i0) * kTile + (j - j0)] = scale * pw[i - j] * dot(Q[i], K[j], d.dk);
            dscore[(i - i0) * kTile + (j - j0)] = scale * pw[i - j] * dot(dO[i], V[j], d.dv);
          }
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t j = j0; j < std::min(j1, i + 1); ++j) {
            const T p = score[(i - i0) * kTile + (j - j0)], dp = dscore[(i - i0) * kTile + (j - j0)];
            axpy(dp, K[j], dQ[i], d.dk);
            axpy(dp, Q[i], dK[j], d.dk);
            axpy(p, dO[i], dV[j], d.dv);
          }
      }
    }
    for (T& x : G) x *= pw[m];
    for (int64_t r = 0; r < m; ++r) add_outer(scale * pw[r + 1], Q[c0 + r], dO[c0 + r], G.data(), d.dk, d.dv);
  }
  store_state(G, a.dstate_in, b, h, d);
}

// dstate_in alone (dq, dk, dv not asked): backward_head's dState sweep without the rest, the
// same operations in the same order, so it equals the full backward's dstate_in bit for bit.
template <class T>
void dstate_head(const Args<T>& a, int64_t b, int64_t h) {
  const LinearDims& d = a.d;
  const int64_t n = d.seq, C = std::min<int64_t>(a.params->chunk, std::max<int64_t>(n, 1));
  const HeadRows<const T> Q(a.q, b, h), dO(a.dout, b, h);
  const std::vector<T> pw = decay_table<T>(*a.params, h, C);
  const T scale = static_cast<T>(a.params->scale);
  std::vector<T> G = load_state<T>(a.dstate_out, b, h, d);
  for (int64_t c0 = (n - 1) / C * C; c0 >= 0 && n > 0; c0 -= C) {
    const int64_t m = std::min(C, n - c0);
    for (T& x : G) x *= pw[m];
    for (int64_t r = 0; r < m; ++r) add_outer(scale * pw[r + 1], Q[c0 + r], dO[c0 + r], G.data(), d.dk, d.dv);
  }
  store_state(G, a.dstate_in, b, h, d);
}

template <class T>
void forward_all(const Args<T>& a) {
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < a.d.batch; ++b)
    for (int64_t h = 0; h < a.d.heads; ++h) forward_head(a, b, h);
}

// dk/dv per K/V head: [B, S, H, d] scratch rows per query head when a group has several,
// reduced over the group afterwards.
template <class T>
void backward_all(Args<T> a) {
  const LinearDims& d = a.d;
  if (!present(a.dq) && !present(a.dk) && !present(a.dv)) {
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < d.batch; ++b)
      for (int64_t h = 0; h < d.heads; ++h) dstate_head(a, b, h);
    return;
  }
  const TensorView dk = a.dk, dv = a.dv;
  HostTensor dk_heads, dv_heads;
  if (d.group() > 1) {
    dk_heads = HostTensor(a.q.dtype, {d.batch, d.seq, d.heads, d.dk});
    dv_heads = HostTensor(a.q.dtype, {d.batch, d.seq, d.heads, d.dv});
    a.dk = dk_heads.view(), a.dv = dv_heads.view();
  }
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) backward_head(a, b, h);
  if (d.group() == 1) return;
#pragma omp parallel for collapse(3) schedule(static)
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t s = 0; s < d.seq; ++s)
      for (int64_t g = 0; g < d.kv_heads; ++g) {
        T* dk_row = HeadRows<T>(dk, b, g)[s];
        T* dv_row = HeadRows<T>(dv, b, g)[s];
        std::fill(dk_row, dk_row + d.dk, T(0));
        std::fill(dv_row, dv_row + d.dv, T(0));
        for (int64_t h = g * d.group(); h < (g + 1) * d.group(); ++h) {
          axpy(T(1), HeadRows<T>(a.dk, b, h)[s], dk_row, d.dk);
          axpy(T(1), HeadRows<T>(a.dv, b, h)[s], dv_row, d.dv);
        }
      }
}

Status check_float_dtype(DType dtype) {
  SP_CHECK_SUPPORTED(dtype == DType::kF32 || dtype == DType::kF64,
                     std::string("the CPU linear-attention kernels compute in fp32 or fp64, not ") +
                         dtype_name(dtype));
  return Status::Ok();
}

}  // namespace

Status linear_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& state_in, const LinearAttentionParams& params,
                                const TensorView& o, const TensorView& state_out) {
  LinearDims d;
  SP_RETURN_IF_ERROR(cpu::validate_linear_qkv(q, k, v, params, &d));
  SP_RETURN_IF_ERROR(check_float_dtype(q.dtype));
  SP_RETURN_IF_ERROR(cpu::validate_linear_state("state_in", state_in, q.dtype, d));
  SP_RETURN_IF_ERROR(cpu::validate_linear_state("state_out", state_out, q.dtype, d));
  SP_RETURN_IF_ERROR(cpu::validate_linear_tensor("o", o, q.dtype, d.batch, d.seq, d.heads, d.dv, true));
  if (q.dtype == DType::kF64)
    forward_all(Args<double>{d, &params, q, k, v, state_in, o, state_out, {}, {}, {}, {}, {}, {}});
  else
    forward_all(Args<float>{d, &params, q, k, v, state_in, o, state_out, {}, {}, {}, {}, {}, {}});
  return Status::Ok();
}

Status linear_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& state_in, const TensorView& dout,
                                 const TensorView& dstate_out, const LinearAttentionParams& params,
                                 const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                 const TensorView& dstate_in) {
  LinearDims d;
  SP_RETURN_IF_ERROR(cpu::validate_linear_qkv(q, k, v, params, &d));
  SP_RETURN_IF_ERROR(check_float_dtype(q.dtype));
  SP_RETURN_IF_ERROR(cpu::validate_linear_state("state_in", state_in, q.dtype, d));
  SP_RETURN_IF_ERROR(cpu::validate_linear_state("dstate_out", dstate_out, q.dtype, d));
  SP_RETURN_IF_ERROR(cpu::validate_linear_state("dstate_in", dstate_in, q.dtype, d));
  SP_RETURN_IF_ERROR(cpu::validate_linear_tensor("dout", dout, q.dtype, d.batch, d.seq, d.heads, d.dv, false));
  // dq, dk, dv all absent: dstate_in alone (what a sequence-parallel rank passes on first).
  const bool dstate_only = !present(dq) && !present(dk) && !present(dv);
  SP_CHECK_ARG(!dstate_only || present(dstate_in), "the backward has nothing to write");
  SP_RETURN_IF_ERROR(cpu::validate_linear_tensor("dq", dq, q.dtype, d.batch, d.seq, d.heads, d.dk, dstate_only));
  SP_RETURN_IF_ERROR(cpu::validate_linear_tensor("dk", dk, q.dtype, d.batch, d.seq, d.kv_heads, d.dk, dstate_only));
  SP_RETURN_IF_ERROR(cpu::validate_linear_tensor("dv", dv, q.dtype, d.batch, d.seq, d.kv_heads, d.dv, dstate_only));
  if (q.dtype == DType::kF64)
    backward_all(Args<double>{d, &params, q, k, v, state_in, {}, {}, dout, dstate_out, dq, dk, dv, dstate_in});
  else
    backward_all(Args<float>{d, &params, q, k, v, state_in, {}, {}, dout, dstate_out, dq, dk, dv, dstate_in});
  return Status::Ok();
}

namespace {

template <class T>
void combine(const TensorView& carried, const TensorView& local, int64_t length,
             const LinearAttentionParams& params, const TensorView& out, int64_t batch, int64_t heads) {
  const int64_t E = carried.shape[2] * carried.shape[3];
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      const T w = static_cast<T>(decay_power(params, h, length));
      const int64_t at = (b * heads + h) * E;
      for (int64_t e = 0; e < E; ++e) out.as<T>()[at + e] = w * carried.as<T>()[at + e] + local.as<T>()[at + e];
    }
}

}  // namespace

Status linear_state_combine(const TensorView& carried, const TensorView& local, int64_t length,
                            const LinearAttentionParams& params, const TensorView& out) {
  SP_CHECK_ARG(carried.ndim == 4, "states must be [B, H, d_k, d_v]");
  SP_CHECK_ARG(length >= 0, "a negative length");
  const LinearDims d{carried.shape[0], 0, carried.shape[1], carried.shape[1], carried.shape[2], carried.shape[3]};
  SP_RETURN_IF_ERROR(check_float_dtype(carried.dtype));
  SP_RETURN_IF_ERROR(validate_linear_params(params, d.heads));
  for (const auto& [name, t] : {std::pair{"carried", &carried}, {"local", &local}, {"out", &out}}) {
    SP_CHECK_ARG(present(*t), std::string(name) + " is null");
    SP_RETURN_IF_ERROR(cpu::validate_linear_state(name, *t, carried.dtype, d));
  }
  if (carried.dtype == DType::kF64)
    combine<double>(carried, local, length, params, out, d.batch, d.heads);
  else
    combine<float>(carried, local, length, params, out, d.batch, d.heads);
  return Status::Ok();
}

}  // namespace seqpar
