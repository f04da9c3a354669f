// The oracle: plain softmax attention in fp64, one query row (or key row) at a time. Slow and
// obvious on purpose; every other implementation is checked against it. Two forms: dense (every
// row, fp64 copies of every tensor) and, for checking a few rows of a million-token result,
// query-rows (those rows alone, keys streamed through each pass once).
#include <algorithm>
#include <cmath>
#include <string>

#include "attention_common.hpp"

namespace seqpar {
namespace {

// Dense fp64 copy [B, S, H, D] of an any-dtype BSHD view; with `rows`, of those rows alone,
// in list order ([B, rows, H, D]).
std::vector<double> to_dense_f64(const TensorView& t, const std::vector<int64_t>* rows = nullptr) {
  const int64_t B = t.shape[0], H = t.shape[2], D = t.shape[3];
  const int64_t S = rows ? static_cast<int64_t>(rows->size()) : t.shape[1];
  std::vector<double> out(static_cast<size_t>(B * S * H * D));
  const size_t es = dtype_size(t.dtype);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t row = rows ? (*rows)[s] : s;
        const char* src = static_cast<const char*>(t.data) + cpu::bshd_offset(t, b, row, h) * es;
        convert(src, t.dtype, &out[((b * S + s) * H + h) * D], DType::kF64, D);
      }
  return out;
}

// The arithmetic every form shares, out of line, so that the dense and the query-rows forms
// round alike (bit for bit) wherever the compiler would vectorise or fuse an inlined loop.
// A score is scaled inside (scale * (a . b)), never fused into the caller's next operation.
[[gnu::noinline]] double dot(const double* a, const double* b, int64_t n, double scale = 1.0) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return scale * acc;
}

// y += a x
[[gnu::noinline]] void axpy(double a, const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// O /= l, and the row's LSE from its max m and sum l; a row that sees no key (m = -inf) keeps
// O = 0 and gets LSE = -inf.
double finish_row(double* o, double m, double l, int64_t D) {
  if (m == cpu::kNegInf) return cpu::kNegInf;
  for (int64_t d = 0; d < D; ++d) o[d] /= l;
  return m + std::log(l);
}

// The oracle over a few query rows of a long sequence (query_side_only): O, LSE and dQ of
// q_rows, in list order. The keys are streamed: each (batch, head) converts a key row when it
// reads it, once per pass, and uses it for every chosen row that sees it. So the work is the
// rows' own O(rows x S_k) arithmetic plus O(S_k) conversions per pass, and no fp64 copy of K
// or V exists (32 GiB each at 1M tokens of 32 x 128). The passes are the dense oracle's, in
// the same order per row: the row maxima, then the sums and O, then dQ against the final LSE.
ReferenceResult query_rows_oracle(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const TensorView& dout, const std::vector<int64_t>& q_rows,
                                  const cpu::MaskEvaluator& mask, double scale, int64_t group) {
  const int64_t B = q.shape[0], H = q.shape[2], D = q.shape[3], Sk = k.shape[1];
  const int64_t R = static_cast<int64_t>(q_rows.size());
  const bool backward = dout.data != nullptr;
  const std::vector<double> Q = to_dense_f64(q, &q_rows);
  const std::vector<double> dO = backward ? to_dense_f64(dout, &q_rows) : std::vector<double>();
  ReferenceResult res{HostTensor(DType::kF64, {B, R, H, D}), HostTensor(DType::kF64, {B, H, R}), {}, {}, {}};
  if (backward) res.dq = HostTensor(DType::kF64, {B, R, H, D});
  double* const O = res.o.data<double>();
  double* const L = res.lse.data<double>();
  double* const dQ = backward ? res.dq.data<double>() : nullptr;

#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      auto at = [&](int64_t r) { return ((b * R + r) * H + h) * D; };  // row r of Q, dO, O, dQ
      double* const lse = &L[(b * H + h) * R];
      std::vector<double> kj(D), vj(D), m(R, cpu::kNegInf), l(R, 0.0), delta(R);
      std::vector<int64_t> seeing;  // the chosen rows that see key j
      // Key j's visible rows into `seeing`, and its K (and V) row converted; false if none.
      auto read_key = [&](int64_t j, bool with_v) {
        seeing.clear();
        for (int64_t r = 0; r < R; ++r)
          if (mask.allowed(q_rows[r], j)) seeing.push_back(r);
        if (seeing.empty()) return false;
        const auto read = [&](const TensorView& t, double* out) {
          convert(static_cast<const char*>(t.data) + cpu::bshd_offset(t, b, j, h / group) * dtype_size(t.dtype),
                  t.dtype, out, DType::kF64, D);
        };
        read(k, kj.data());
        if (with_v) read(v, vj.data());
        return true;
      };
      for (int64_t j = 0; j < Sk; ++j)  // pass 1: each row's maximum score
        if (read_key(j, false))
          for (const int64_t r : seeing) m[r] = std::max(m[r], dot(&Q[at(r)], kj.data(), D, scale));
      for (int64_t j = 0; j < Sk; ++j)  // pass 2: the sums and O
        if (read_key(j, true))
          for (const int64_t r : seeing) {
            const double score = dot(&Q[at(r)], kj.data(), D, scale);
            if (score == cpu::kNegInf) continue;  // as the dense form (only -inf inputs get here)
            const double p = std::exp(score - m[r]);
            l[r] += p;
            axpy(p, vj.data(), &O[at(r)], D);
          }
      for (int64_t r = 0; r < R; ++r) {
        lse[r] = finish_row(&O[at(r)], m[r], l[r], D);
        if (backward && lse[r] != cpu::kNegInf) delta[r] = dot(&dO[at(r)], &O[at(r)], D);
      }
      if (!backward) continue;
      for (int64_t j = 0; j < Sk; ++j)  // pass 3: dQ_r = scale * sum_j ds_rj k_j
        if (read_key(j, true))
          for (const int64_t r : seeing) {
            const double p = std::exp(dot(&Q[at(r)], kj.data(), D, scale) - lse[r]);
            const double ds = p * (dot(&dO[at(r)], vj.data(), D) - delta[r]);
            axpy(scale * ds, kj.data(), &dQ[at(r)], D);
          }
    }
  return res;
}

}  // namespace

StatusOr<ReferenceResult> reference_attention(const TensorView& q, const TensorView& k,
                                              const TensorView& v, const TensorView& dout,
                                              const AttentionParams& params,
                                              const ReferenceRows& rows) {
  cpu::AttentionDims dims;
  SP_RETURN_IF_ERROR(cpu::validate_qkv(q, k, v, &dims));
  const bool backward = dout.data != nullptr;
  const int64_t B = dims.batch, Sq = dims.seq_q, Sk = dims.seq_k, H = dims.heads,
                Hkv = dims.kv_heads, D = dims.head_dim, G = dims.group();
  if (backward) SP_RETURN_IF_ERROR(cpu::validate_like("dout", dout, dout.dtype, B, Sq, H, D));
  SP_RETURN_IF_ERROR(cpu::validate_mask_positions(params, Sq, Sk));
  for (int64_t r : rows.query_rows) SP_CHECK_ARG(r >= 0 && r < Sq, "query row out of range");
  for (int64_t r : rows.key_rows) SP_CHECK_ARG(r >= 0 && r < Sk, "key row out of range");
  SP_CHECK_ARG(!rows.query_side_only || (!rows.query_rows.empty() && rows.key_rows.empty()),
               "query_side_only needs query rows and no key rows");
  for (const auto* list : {&rows.query_rows, &rows.key_rows}) {  // a repeated row would add twice
    std::vector<int64_t> sorted = *list;
    std::sort(sorted.begin(), sorted.end());
    SP_CHECK_ARG(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), "repeated oracle row");
  }

  const double scale = params.scale != 0.0 ? params.scale : 1.0 / std::sqrt(double(D));
  const cpu::MaskEvaluator mask(params, Sq, Sk);
  auto all_rows = [](int64_t n, const std::vector<int64_t>& chosen) {
    if (!chosen.empty()) return chosen;
    std::vector<int64_t> r(n);
    for (int64_t i = 0; i < n; ++i) r[i] = i;
    return r;
  };
  const std::vector<int64_t> q_rows = all_rows(Sq, rows.query_rows);
  if (rows.query_side_only) return query_rows_oracle(q, k, v, dout, q_rows, mask, scale, G);

  // Every row: dense fp64 copies, row-major [B, S, heads, D] like the views.
  const std::vector<double> Q = to_dense_f64(q), K = to_dense_f64(k), V = to_dense_f64(v);
  auto qrow = [&](const std::vector<double>& t, int64_t b, int64_t i, int64_t h) { return &t[((b * Sq + i) * H + h) * D]; };
  auto krow = [&](const std::vector<double>& t, int64_t b, int64_t j, int64_t g) { return &t[((b * Sk + j) * Hkv + g) * D]; };
  auto stat = [&](int64_t b, int64_t h, int64_t i) { return (b * H + h) * Sq + i; };

  ReferenceResult res{HostTensor(DType::kF64, {B, Sq, H, D}), HostTensor(DType::kF64, {B, H, Sq}),
                      {}, {}, {}};
  double* O = res.o.data<double>();
  double* L = res.lse.data<double>();

  // Forward: scores, max, sum, output.
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> s(Sk);
      for (int64_t i = 0; i < Sq; ++i) {
        double m = cpu::kNegInf;
        for (int64_t j = 0; j < Sk; ++j) {
          s[j] = mask.allowed(i, j) ? dot(qrow(Q, b, i, h), krow(K, b, j, h / G), D, scale)
                                    : cpu::kNegInf;
          m = std::max(m, s[j]);
        }
        double* o = &O[((b * Sq + i) * H + h) * D];
        double l = 0;
        for (int64_t j = 0; j < Sk; ++j) {
          if (s[j] == cpu::kNegInf) continue;
          const double p = std::exp(s[j] - m);
          l += p;
          axpy(p, krow(V, b, j, h / G), o, D);
        }
        L[stat(b, h, i)] = finish_row(o, m, l, D);
      }
    }
  if (!backward) return res;

  const std::vector<double> dO = to_dense_f64(dout);
  std::vector<double> delta(static_cast<size_t>(B * H * Sq));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Sq; ++i)
      for (int64_t h = 0; h < H; ++h)
        delta[stat(b, h, i)] = dot(qrow(dO, b, i, h), &O[((b * Sq + i) * H + h) * D], D);

  res.dq = HostTensor(DType::kF64, {B, Sq, H, D});
  double* dQ = res.dq.data<double>();
  // p_ij and ds_ij = p_ij * (dO_i . v_j - D_i), for a visible pair (k_j, v_j its key rows).
  auto prob_and_ds = [&](int64_t b, int64_t h, int64_t i, const double* kj, const double* vj, double* ds) {
    const double lse = L[stat(b, h, i)];
    const double p = std::exp(dot(qrow(Q, b, i, h), kj, D, scale) - lse);
    *ds = p * (dot(qrow(dO, b, i, h), vj, D) - delta[stat(b, h, i)]);
    return p;
  };

  // dQ_i = scale * sum_j ds_ij k_j, for each requested query row.
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b)
    for (size_t r = 0; r < q_rows.size(); ++r) {
      const int64_t i = q_rows[r];
      for (int64_t h = 0; h < H; ++h) {
        double* dq = &dQ[((b * Sq + i) * H + h) * D];
        for (int64_t j = 0; j < Sk; ++j) {
          if (!mask.allowed(i, j)) continue;
          const double* kj = krow(K, b, j, h / G);
          double ds;
          prob_and_ds(b, h, i, kj, krow(V, b, j, h / G), &ds);
          axpy(scale * ds, kj, dq, D);
        }
      }
    }
  // dK_j = scale * sum_{h in group, i} ds_ij q_i;  dV_j = sum p_ij dO_i.
  res.dk = HostTensor(DType::kF64, {B, Sk, Hkv, D});
  res.dv = HostTensor(DType::kF64, {B, Sk, Hkv, D});
  double* dK = res.dk.data<double>();
  double* dV = res.dv.data<double>();
  const std::vector<int64_t> k_rows = all_rows(Sk, rows.key_rows);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b)
    for (size_t r = 0; r < k_rows.size(); ++r) {
      const int64_t j = k_rows[r];
      for (int64_t g = 0; g < Hkv; ++g) {
        double* dk = &dK[((b * Sk + j) * Hkv + g) * D];
        double* dv = &dV[((b * Sk + j) * Hkv + g) * D];
        const double* kj = krow(K, b, j, g);
        const double* vj = krow(V, b, j, g);
        for (int64_t h = g * G; h < (g + 1) * G; ++h)
          for (int64_t i = 0; i < Sq; ++i) {
            if (!mask.allowed(i, j)) continue;
            double ds;
            const double p = prob_and_ds(b, h, i, kj, vj, &ds);
            const double* qi = qrow(Q, b, i, h);
            const double* doi = qrow(dO, b, i, h);
            for (int64_t d = 0; d < D; ++d) {
              dk[d] += scale * ds * qi[d];
              dv[d] += p * doi[d];
            }
          }
      }
    }
  return res;
}

}  // namespace seqpar
