// The two CPU backends of include/seqpar/backend.hpp: the fast blocked kernels, and the fp64
// oracle as a backend (plain loops, obviously right; what the backend test holds every other
// backend to).
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_common.hpp"
#include "seqpar/backend.hpp"

namespace seqpar {
namespace {

std::string cpu_supports(const TensorView& q) {
  if (q.device.kind != DeviceKind::kCpu) return "the CPU backends take host tensors";
  if (q.dtype != DType::kF32 && q.dtype != DType::kF64)
    return std::string("the CPU backends compute in fp32 or fp64, not ") + dtype_name(q.dtype);
  return {};
}

Status add_into(const TensorView& acc, const TensorView& x) {
  SP_CHECK_ARG(acc.same_shape(x) && acc.dtype == x.dtype && acc.is_contiguous() && x.is_contiguous(),
               "accumulate needs two contiguous tensors of one shape and dtype: " + acc.shape_string() + " and " +
                   x.shape_string());
  const int64_t n = acc.numel();
  if (acc.dtype == DType::kF32) {
    for (int64_t i = 0; i < n; ++i) acc.as<float>()[i] += x.as<float>()[i];
  } else {
    SP_CHECK_SUPPORTED(acc.dtype == DType::kF64, "accumulate on CPU takes fp32 or fp64");
    for (int64_t i = 0; i < n; ++i) acc.as<double>()[i] += x.as<double>()[i];
  }
  return Status::Ok();
}

// A fresh output set to the empty result (the CPU executor's results are whole host tensors).
Status fill_host(const TensorView& t, double value) {
  SP_CHECK_ARG(t.is_contiguous(), "the CPU backends take fresh outputs as contiguous tensors; got " + t.shape_string());
  const int64_t n = t.numel();
  if (t.dtype == DType::kF32) std::fill_n(t.as<float>(), n, float(value));
  else if (t.dtype == DType::kF64) std::fill_n(t.as<double>(), n, value);
  else return SP_STATUS(StatusCode::kUnsupported, "the CPU backends' outputs are fp32 or fp64");
  return Status::Ok();
}
Status clear_fresh_forward(const TensorView& o, const TensorView& lse, FreshOutputs fresh) {
  if (!fresh.o) return Status::Ok();
  SP_RETURN_IF_ERROR(fill_host(o, 0));
  return fill_host(lse, -INFINITY);
}
Status clear_fresh_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, FreshOutputs fresh) {
  if (fresh.dq) SP_RETURN_IF_ERROR(fill_host(dq, 0));
  if (fresh.dkv) SP_RETURN_IF_ERROR(fill_host(dk, 0));
  if (fresh.dkv) SP_RETURN_IF_ERROR(fill_host(dv, 0));
  return Status::Ok();
}

class CpuKernelBackend : public AttentionBackend {
 public:
  const char* name() const override { return "cpu"; }
  BackendCaps caps() const override { return {}; }
  std::string supports(const TensorView& q, const AttentionParams&) const override { return cpu_supports(q); }
  Status forward(const TensorView& q, const TensorView& k, const TensorView& v, const AttentionParams& params,
                 const TensorView& o, const TensorView& lse, FreshOutputs fresh, void*) const override {
    SP_RETURN_IF_ERROR(clear_fresh_forward(o, lse, fresh));
    return cpu_attention_forward(q, k, v, params, o, lse, /*accumulate=*/true);
  }
  Status backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                  const TensorView& lse, const TensorView& delta, const AttentionParams& params,
                  const TensorView& dq, const TensorView& dk, const TensorView& dv, FreshOutputs fresh,
                  void*) const override {
    SP_RETURN_IF_ERROR(clear_fresh_backward(dq, dk, dv, fresh));
    return cpu_attention_backward(q, k, v, dout, lse, delta, params, dq, dk, dv);
  }
  Status delta(const TensorView& o, const TensorView& dout, const TensorView& d, void*) const override {
    return cpu_attention_delta(o, dout, d);
  }
  Status merge(const TensorView& o, const TensorView& lse, const TensorView& o_part, const TensorView& lse_part,
               void*) const override {
    return merge_attention_partials(o, lse, o_part, lse_part);
  }
  Status accumulate(const TensorView& acc, const TensorView& x, void*) const override { return add_into(acc, x); }
};

// Element access in fp64 through conversion (the oracle favours obviousness over speed).
double load(const TensorView& t, int64_t offset) {
  double x;
  convert(static_cast<const char*>(t.data) + offset * dtype_size(t.dtype), t.dtype, &x, DType::kF64, 1);
  return x;
}
void store_add(const TensorView& t, int64_t offset, double add) {
  char* at = static_cast<char*>(t.data) + offset * dtype_size(t.dtype);
  double x;
  convert(at, t.dtype, &x, DType::kF64, 1);
  x += add;
  convert(&x, DType::kF64, at, t.dtype, 1);
}

// The oracle shares the kernel backend's delta, merge and accumulate (already fp64-exact in
// fp64); forward and backward are its own.
class CpuOracleBackend final : public CpuKernelBackend {
 public:
  const char* name() const override { return "oracle"; }

  // The oracle's (O, LSE) of these keys alone, in o's dtype, merged into the running result.
  Status forward(const TensorView& q, const TensorView& k, const TensorView& v, const AttentionParams& params,
                 const TensorView& o, const TensorView& lse, FreshOutputs fresh, void*) const override {
    SP_RETURN_IF_ERROR(clear_fresh_forward(o, lse, fresh));
    SP_ASSIGN_OR_RETURN(const ReferenceResult part, reference_attention(q, k, v, TensorView{}, params));
    HostTensor o_part(o.dtype, {o.shape[0], o.shape[1], o.shape[2], o.shape[3]});
    HostTensor lse_part(o.dtype, {lse.shape[0], lse.shape[1], lse.shape[2]});
    convert(part.o.view().data, DType::kF64, o_part.view().data, o.dtype, o_part.numel());
    convert(part.lse.view().data, DType::kF64, lse_part.view().data, o.dtype, lse_part.numel());
    return merge_attention_partials(o, lse, o_part.view(), lse_part.view());
  }

  // Plain loops against the given LSE and D: P = exp(s - LSE), dS = P (dO . v - D).
  Status backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                  const TensorView& lse, const TensorView& delta, const AttentionParams& params,
                  const TensorView& dq, const TensorView& dk, const TensorView& dv, FreshOutputs fresh,
                  void*) const override {
    SP_RETURN_IF_ERROR(clear_fresh_backward(dq, dk, dv, fresh));
    cpu::AttentionDims d;
    SP_RETURN_IF_ERROR(cpu::validate_qkv(q, k, v, &d));
    const cpu::MaskEvaluator mask(params, d.seq_q, d.seq_k);
    const double scale = params.scale != 0 ? params.scale : 1.0 / std::sqrt(double(d.head_dim));
    const int64_t D = d.head_dim;
    for (int64_t b = 0; b < d.batch; ++b)
      for (int64_t h = 0; h < d.heads; ++h) {
        const int64_t hk = h / d.group();
        for (int64_t i = 0; i < d.seq_q; ++i) {
          const double L = load(lse, cpu::bhs_offset(lse, b, h, i)), Di = load(delta, cpu::bhs_offset(delta, b, h, i));
          if (!std::isfinite(L)) continue;  // a row that sees no key has no gradient
          for (int64_t j = 0; j < d.seq_k; ++j) {
            if (!mask.allowed(i, j)) continue;
            const int64_t qi = cpu::bshd_offset(q, b, i, h), kj = cpu::bshd_offset(k, b, j, hk),
                          vj = cpu::bshd_offset(v, b, j, hk), oi = cpu::bshd_offset(dout, b, i, h);
            double s = 0, dp = 0;
            for (int64_t e = 0; e < D; ++e) {
              s += load(q, qi + e) * load(k, kj + e);
              dp += load(dout, oi + e) * load(v, vj + e);
            }
            const double p = std::exp(scale * s - L), ds = p * (dp - Di);
            for (int64_t e = 0; e < D; ++e) {
              store_add(dv, cpu::bshd_offset(dv, b, j, hk) + e, p * load(dout, oi + e));
              store_add(dq, cpu::bshd_offset(dq, b, i, h) + e, scale * ds * load(k, kj + e));
              store_add(dk, cpu::bshd_offset(dk, b, j, hk) + e, scale * ds * load(q, qi + e));
            }
          }
        }
      }
    return Status::Ok();
  }
};

}  // namespace

const AttentionBackend& cpu_kernel_backend() {
  static const CpuKernelBackend backend;
  return backend;
}

const AttentionBackend& cpu_oracle_backend() {
  static const CpuOracleBackend backend;
  return backend;
}

}  // namespace seqpar
