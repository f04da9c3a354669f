// The oracle: plain softmax attention in fp64, one query row (or key row) at a time. Slow and
// obvious on purpose; every other implementation is checked against it.
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

// Rows of K or V in fp64. Dense: one copy of the whole tensor, read many times (every query
// row visits every key). Streamed (query_side_only: a few query rows of a long sequence): a
// row is converted when read, into the caller's scratch, so no fp64 copy of the whole K or V
// exists (32 GiB each at 1M tokens of 32 x 128).
class KeyRows {
 public:
  KeyRows(const TensorView& t, bool dense) : t_(t), es_(dtype_size(t.dtype)) {
    if (dense) dense_ = to_dense_f64(t);
  }
  // Row j of K/V head g in batch b; `scratch` holds D doubles.
  const double* row(int64_t b, int64_t j, int64_t g, double* scratch) const {
    if (!dense_.empty()) return &dense_[((b * t_.shape[1] + j) * t_.shape[2] + g) * t_.shape[3]];
    convert(static_cast<const char*>(t_.data) + cpu::bshd_offset(t_, b, j, g) * es_, t_.dtype, scratch,
            DType::kF64, t_.shape[3]);
    return scratch;
  }

 private:
  TensorView t_;
  size_t es_;
  std::vector<double> dense_;
};

double dot(const double* a, const double* b, int64_t n) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
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
  const std::vector<int64_t> forward_rows = rows.query_side_only ? q_rows : all_rows(Sq, {});
  // Query-side storage (Q, dO, O, LSE, D, dQ): every row, or with query_side_only the chosen
  // rows alone, in list order (R of them); slot(i) is where query row i is kept.
  const bool compact = rows.query_side_only;
  const int64_t R = compact ? static_cast<int64_t>(q_rows.size()) : Sq;
  std::vector<int64_t> slot_of;
  if (compact) {
    slot_of.assign(Sq, -1);
    for (int64_t r = 0; r < R; ++r) slot_of[q_rows[r]] = r;
  }
  auto slot = [&](int64_t i) { return compact ? slot_of[i] : i; };

  const std::vector<double> Q = to_dense_f64(q, compact ? &q_rows : nullptr);
  const KeyRows K(k, !compact), V(v, !compact);
  auto qrow = [&](const std::vector<double>& t, int64_t b, int64_t i, int64_t h) {
    return &t[((b * R + slot(i)) * H + h) * D];
  };
  auto stat = [&](int64_t b, int64_t h, int64_t i) { return (b * H + h) * R + slot(i); };

  ReferenceResult res{HostTensor(DType::kF64, {B, R, H, D}), HostTensor(DType::kF64, {B, H, R}),
                      {}, {}, {}};
  double* O = res.o.data<double>();
  double* L = res.lse.data<double>();

  // Forward: scores, max, sum, output.
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> s(Sk), scratch(D);
      for (const int64_t i : forward_rows) {
        double m = cpu::kNegInf;
        for (int64_t j = 0; j < Sk; ++j) {
          s[j] = mask.allowed(i, j) ? scale * dot(qrow(Q, b, i, h), K.row(b, j, h / G, scratch.data()), D)
                                    : cpu::kNegInf;
          m = std::max(m, s[j]);
        }
        double* o = &O[((b * R + slot(i)) * H + h) * D];
        if (m == cpu::kNegInf) {  // no visible key: O = 0, LSE = -inf
          L[stat(b, h, i)] = cpu::kNegInf;
          continue;
        }
        double l = 0;
        for (int64_t j = 0; j < Sk; ++j) {
          if (s[j] == cpu::kNegInf) continue;
          const double p = std::exp(s[j] - m);
          l += p;
          const double* vj = V.row(b, j, h / G, scratch.data());
          for (int64_t d = 0; d < D; ++d) o[d] += p * vj[d];
        }
        for (int64_t d = 0; d < D; ++d) o[d] /= l;
        L[stat(b, h, i)] = m + std::log(l);
      }
    }
  if (!backward) return res;

  const std::vector<double> dO = to_dense_f64(dout, compact ? &q_rows : nullptr);
  std::vector<double> delta(static_cast<size_t>(B * H * R));
  for (int64_t b = 0; b < B; ++b)
    for (const int64_t i : forward_rows)
      for (int64_t h = 0; h < H; ++h)
        delta[stat(b, h, i)] = dot(qrow(dO, b, i, h), &O[((b * R + slot(i)) * H + h) * D], D);

  res.dq = HostTensor(DType::kF64, {B, R, H, D});
  double* dQ = res.dq.data<double>();
  // p_ij and ds_ij = p_ij * (dO_i . v_j - D_i), for a visible pair (k_j, v_j its key rows).
  auto prob_and_ds = [&](int64_t b, int64_t h, int64_t i, const double* kj, const double* vj, double* ds) {
    const double lse = L[stat(b, h, i)];
    const double p = std::exp(scale * dot(qrow(Q, b, i, h), kj, D) - lse);
    *ds = p * (dot(qrow(dO, b, i, h), vj, D) - delta[stat(b, h, i)]);
    return p;
  };

  // dQ_i = scale * sum_j ds_ij k_j, for each requested query row.
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b)
    for (size_t r = 0; r < q_rows.size(); ++r) {
      const int64_t i = q_rows[r];
      std::vector<double> k_scratch(D), v_scratch(D);
      for (int64_t h = 0; h < H; ++h) {
        double* dq = &dQ[((b * R + slot(i)) * H + h) * D];
        for (int64_t j = 0; j < Sk; ++j) {
          if (!mask.allowed(i, j)) continue;
          const double* kj = K.row(b, j, h / G, k_scratch.data());
          double ds;
          prob_and_ds(b, h, i, kj, V.row(b, j, h / G, v_scratch.data()), &ds);
          for (int64_t d = 0; d < D; ++d) dq[d] += scale * ds * kj[d];
        }
      }
    }
  if (rows.query_side_only) return res;
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
      std::vector<double> k_scratch(D), v_scratch(D);
      for (int64_t g = 0; g < Hkv; ++g) {
        double* dk = &dK[((b * Sk + j) * Hkv + g) * D];
        double* dv = &dV[((b * Sk + j) * Hkv + g) * D];
        const double* kj = K.row(b, j, g, k_scratch.data());
        const double* vj = V.row(b, j, g, v_scratch.data());
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
