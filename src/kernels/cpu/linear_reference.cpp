// The linear-attention oracle in fp64, in two independent forms that must agree: the direct
// masked sums over positions (quadratic) and the token recurrence with its reverse-time
// adjoint (recurrent). Slow and obvious on purpose; the chunked kernels and LASP are checked
// against it.
#include <string>
#include <vector>

#include "linear_common.hpp"

namespace seqpar {
namespace {

using cpu::LinearDims;

// Dense fp64 copy of a 4-dim view (row-major over its shape); zeros when the view is empty.
std::vector<double> to_f64(const TensorView& t, const std::vector<int64_t>& shape) {
  std::vector<double> out(static_cast<size_t>(shape[0] * shape[1] * shape[2] * shape[3]), 0.0);
  if (!cpu::present(t)) return out;
  const size_t es = dtype_size(t.dtype);
  for (int64_t a = 0; a < shape[0]; ++a)
    for (int64_t b = 0; b < shape[1]; ++b)
      for (int64_t c = 0; c < shape[2]; ++c) {
        const char* src = static_cast<const char*>(t.data) +
                          (a * t.strides[0] + b * t.strides[1] + c * t.strides[2]) * es;
        convert(src, t.dtype, &out[((a * shape[1] + b) * shape[2] + c) * shape[3]], DType::kF64,
                shape[3]);
      }
  return out;
}

double dot(const double* a, const double* b, int64_t n) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

void axpy(double a, const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// The problem in fp64, BSHD rows addressed per (b, s, head).
struct Problem {
  LinearDims d;
  const LinearAttentionParams* params;
  std::vector<double> q, k, v, s_in, dout, ds_out;
  bool backward = false;
  const double* q_row(int64_t b, int64_t s, int64_t h) const { return &q[((b * d.seq + s) * d.heads + h) * d.dk]; }
  const double* k_row(int64_t b, int64_t s, int64_t g) const { return &k[((b * d.seq + s) * d.kv_heads + g) * d.dk]; }
  const double* v_row(int64_t b, int64_t s, int64_t g) const { return &v[((b * d.seq + s) * d.kv_heads + g) * d.dv]; }
  const double* do_row(int64_t b, int64_t s, int64_t h) const { return &dout[((b * d.seq + s) * d.heads + h) * d.dv]; }
  int64_t state_at(int64_t b, int64_t h) const { return (b * d.heads + h) * d.state_elems(); }
};

struct Outputs {
  double *o, *s_out, *dq, *dk, *dv, *ds_in;
};

// Direct sums for query head h of batch b; dk, dv accumulate (the caller loops over the group).
void quadratic_head(const Problem& p, int64_t b, int64_t h, const Outputs& out) {
  const LinearDims& d = p.d;
  const int64_t n = d.seq, g = h / d.group(), DK = d.dk, DV = d.dv;
  const double scale = p.params->scale;
  auto pw = [&](int64_t dist) { return decay_power(*p.params, h, dist); };
  const double* S_in = &p.s_in[p.state_at(b, h)];
  for (int64_t i = 0; i < n; ++i) {
    double* o = &out.o[((b * n + i) * d.heads + h) * DV];
    for (int64_t j = 0; j <= i; ++j) axpy(scale * pw(i - j) * dot(p.q_row(b, i, h), p.k_row(b, j, g), DK), p.v_row(b, j, g), o, DV);
    for (int64_t a = 0; a < DK; ++a) axpy(scale * pw(i + 1) * p.q_row(b, i, h)[a], &S_in[a * DV], o, DV);
  }
  double* S_out = &out.s_out[p.state_at(b, h)];
  for (int64_t e = 0; e < DK * DV; ++e) S_out[e] = pw(n) * S_in[e];
  for (int64_t j = 0; j < n; ++j)
    for (int64_t a = 0; a < DK; ++a) axpy(pw(n - 1 - j) * p.k_row(b, j, g)[a], p.v_row(b, j, g), &S_out[a * DV], DV);
  if (!p.backward) return;
  const double* dS_out = &p.ds_out[p.state_at(b, h)];
  for (int64_t i = 0; i < n; ++i) {
    double* dq = &out.dq[((b * n + i) * d.heads + h) * DK];
    for (int64_t j = 0; j <= i; ++j) axpy(scale * pw(i - j) * dot(p.do_row(b, i, h), p.v_row(b, j, g), DV), p.k_row(b, j, g), dq, DK);
    for (int64_t a = 0; a < DK; ++a) dq[a] += scale * pw(i + 1) * dot(&S_in[a * DV], p.do_row(b, i, h), DV);
  }
  for (int64_t j = 0; j < n; ++j) {
    double* dk = &out.dk[((b * n + j) * d.kv_heads + g) * DK];
    double* dv = &out.dv[((b * n + j) * d.kv_heads + g) * DV];
    for (int64_t i = j; i < n; ++i) {
      axpy(scale * pw(i - j) * dot(p.do_row(b, i, h), p.v_row(b, j, g), DV), p.q_row(b, i, h), dk, DK);
      axpy(scale * pw(i - j) * dot(p.q_row(b, i, h), p.k_row(b, j, g), DK), p.do_row(b, i, h), dv, DV);
    }
    for (int64_t a = 0; a < DK; ++a) {
      dk[a] += pw(n - 1 - j) * dot(&dS_out[a * DV], p.v_row(b, j, g), DV);
      axpy(pw(n - 1 - j) * p.k_row(b, j, g)[a], &dS_out[a * DV], dv, DV);
    }
  }
  double* dS_in = &out.ds_in[p.state_at(b, h)];
  for (int64_t e = 0; e < DK * DV; ++e) dS_in[e] = pw(n) * dS_out[e];
  for (int64_t i = 0; i < n; ++i)
    for (int64_t a = 0; a < DK; ++a) axpy(scale * pw(i + 1) * p.q_row(b, i, h)[a], p.do_row(b, i, h), &dS_in[a * DV], DV);
}

// S_i = lambda S_{i-1} + k_i v_i^T, o_i = scale S_i^T q_i; the adjoint walks back keeping
// G = dL/dS_i, every S_i kept from the forward.
void recurrent_head(const Problem& p, int64_t b, int64_t h, const Outputs& out) {
  const LinearDims& d = p.d;
  const int64_t n = d.seq, g = h / d.group(), DK = d.dk, DV = d.dv, E = DK * DV;
  const double scale = p.params->scale, lambda = head_decay(*p.params, h);
  std::vector<double> states(static_cast<size_t>((n + 1) * E));  // states[i + 1] = S_i
  std::copy(&p.s_in[p.state_at(b, h)], &p.s_in[p.state_at(b, h)] + E, states.begin());
  for (int64_t i = 0; i < n; ++i) {
    const double* prev = &states[i * E];
    double* S = &states[(i + 1) * E];
    for (int64_t e = 0; e < E; ++e) S[e] = lambda * prev[e];
    for (int64_t a = 0; a < DK; ++a) axpy(p.k_row(b, i, g)[a], p.v_row(b, i, g), &S[a * DV], DV);
    double* o = &out.o[((b * n + i) * d.heads + h) * DV];
    for (int64_t a = 0; a < DK; ++a) axpy(scale * p.q_row(b, i, h)[a], &S[a * DV], o, DV);
  }
  std::copy(&states[n * E], &states[n * E] + E, &out.s_out[p.state_at(b, h)]);
  if (!p.backward) return;
  std::vector<double> G(&p.ds_out[p.state_at(b, h)], &p.ds_out[p.state_at(b, h)] + E);
  for (int64_t i = n - 1; i >= 0; --i) {
    for (int64_t a = 0; a < DK; ++a) axpy(scale * p.q_row(b, i, h)[a], p.do_row(b, i, h), &G[a * DV], DV);
    const double* S = &states[(i + 1) * E];
    double* dq = &out.dq[((b * n + i) * d.heads + h) * DK];
    double* dk = &out.dk[((b * n + i) * d.kv_heads + g) * DK];
    double* dv = &out.dv[((b * n + i) * d.kv_heads + g) * DV];
    for (int64_t a = 0; a < DK; ++a) {
      dq[a] += scale * dot(&S[a * DV], p.do_row(b, i, h), DV);
      dk[a] += dot(&G[a * DV], p.v_row(b, i, g), DV);
      axpy(p.k_row(b, i, g)[a], &G[a * DV], dv, DV);
    }
    for (double& x : G) x *= lambda;
  }
  std::copy(G.begin(), G.end(), &out.ds_in[p.state_at(b, h)]);
}

}  // namespace

StatusOr<LinearReferenceResult> linear_attention_reference(
    const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& state_in,
    const TensorView& dout, const TensorView& dstate_out, const LinearAttentionParams& params,
    LinearOracleForm form) {
  Problem p;
  SP_RETURN_IF_ERROR(cpu::validate_linear_qkv(q, k, v, params, &p.d));
  const LinearDims& d = p.d;
  SP_RETURN_IF_ERROR(cpu::validate_linear_tensor("state_in", state_in, state_in.dtype, d.batch, d.heads, d.dk, d.dv, true));
  SP_RETURN_IF_ERROR(cpu::validate_linear_tensor("dout", dout, dout.dtype, d.batch, d.seq, d.heads, d.dv, true));
  SP_RETURN_IF_ERROR(cpu::validate_linear_tensor("dstate_out", dstate_out, dstate_out.dtype, d.batch, d.heads, d.dk, d.dv, true));
  p.params = &params;
  p.backward = cpu::present(dout);
  p.q = to_f64(q, {d.batch, d.seq, d.heads, d.dk});
  p.k = to_f64(k, {d.batch, d.seq, d.kv_heads, d.dk});
  p.v = to_f64(v, {d.batch, d.seq, d.kv_heads, d.dv});
  p.s_in = to_f64(state_in, {d.batch, d.heads, d.dk, d.dv});
  if (p.backward) {
    p.dout = to_f64(dout, {d.batch, d.seq, d.heads, d.dv});
    p.ds_out = to_f64(dstate_out, {d.batch, d.heads, d.dk, d.dv});
  }
  LinearReferenceResult res;
  // HostTensor storage starts zeroed: the head loops accumulate into it.
  res.o = HostTensor(DType::kF64, {d.batch, d.seq, d.heads, d.dv});
  res.state_out = HostTensor(DType::kF64, {d.batch, d.heads, d.dk, d.dv});
  if (p.backward) {
    res.dq = HostTensor(DType::kF64, {d.batch, d.seq, d.heads, d.dk});
    res.dk = HostTensor(DType::kF64, {d.batch, d.seq, d.kv_heads, d.dk});
    res.dv = HostTensor(DType::kF64, {d.batch, d.seq, d.kv_heads, d.dv});
    res.dstate_in = HostTensor(DType::kF64, {d.batch, d.heads, d.dk, d.dv});
  }
  const Outputs out{res.o.data<double>(), res.state_out.data<double>(),
                    p.backward ? res.dq.data<double>() : nullptr, p.backward ? res.dk.data<double>() : nullptr,
                    p.backward ? res.dv.data<double>() : nullptr, p.backward ? res.dstate_in.data<double>() : nullptr};
  // One task per (batch, K/V head): the query heads of a group add into the same dk, dv.
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t g = 0; g < d.kv_heads; ++g)
      for (int64_t h = g * d.group(); h < (g + 1) * d.group(); ++h) {
        if (form == LinearOracleForm::kQuadratic)
          quadratic_head(p, b, h, out);
        else
          recurrent_head(p, b, h, out);
      }
  return res;
}

}  // namespace seqpar
