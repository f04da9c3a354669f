// Linear attention: parameter and shape checks, and the per-head decay powers.
#include "linear_common.hpp"

#include <cmath>
#include <cstdio>
#include <string>

namespace seqpar {

Status validate_linear_params(const LinearAttentionParams& params, int64_t heads) {
  const int64_t n = static_cast<int64_t>(params.decay.size());
  SP_CHECK_ARG(n == 1 || n == heads, "decay needs one value or one per query head (" +
                                         std::to_string(heads) + "), got " + std::to_string(n));
  for (double lambda : params.decay) {
    char shown[32];
    std::snprintf(shown, sizeof(shown), "%.17g", lambda);
    SP_CHECK_ARG(lambda > 0.0 && lambda <= 1.0,  // false for NaN too
                 std::string("every decay must lie in (0, 1], got ") + shown);
  }
  SP_CHECK_ARG(std::isfinite(params.scale), "the scale must be finite");
  SP_CHECK_ARG(params.chunk >= 1, "the chunk length must be at least 1, got " +
                                      std::to_string(params.chunk));
  return Status::Ok();
}

double head_decay(const LinearAttentionParams& params, int64_t h) {
  return params.decay.size() == 1 ? params.decay[0] : params.decay[h];
}

double decay_power(const LinearAttentionParams& params, int64_t h, int64_t k) {
  return std::exp(-std::log(1.0 / head_decay(params, h)) * static_cast<double>(k));
}

namespace cpu {

Status validate_linear_tensor(const char* name, const TensorView& t, DType dtype, int64_t d0,
                              int64_t d1, int64_t d2, int64_t d3, bool optional, bool contiguous) {
  if (!present(t)) {
    SP_CHECK_ARG(optional, std::string(name) + " is null");
    return Status::Ok();
  }
  SP_CHECK_SUPPORTED(t.device.kind == DeviceKind::kCpu,
                     std::string(name) + " is not in host memory (CPU kernels)");
  const int64_t want[4] = {d0, d1, d2, d3};
  bool ok = t.ndim == 4 && t.dtype == dtype && t.strides[3] == 1;
  for (int i = 0; ok && i < 4; ++i) ok = t.shape[i] == want[i];
  ok = ok && (!contiguous || t.is_contiguous());
  SP_CHECK_ARG(ok, std::string(name) + " is " + t.shape_string() + ", expected [" +
                       std::to_string(d0) + ", " + std::to_string(d1) + ", " + std::to_string(d2) +
                       ", " + std::to_string(d3) + "] " + dtype_name(dtype) +
                       (contiguous ? ", contiguous" : " with a contiguous last dimension"));
  return Status::Ok();
}

Status validate_linear_qkv(const TensorView& q, const TensorView& k, const TensorView& v,
                           const LinearAttentionParams& params, LinearDims* dims) {
  SP_CHECK_ARG(q.ndim == 4 && k.ndim == 4 && v.ndim == 4,
               "q, k, v must be [B, S, H, D]; got q " + q.shape_string() + ", k " +
                   k.shape_string() + ", v " + v.shape_string());
  *dims = {q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3]};
  SP_CHECK_ARG(dims->kv_heads >= 1 && dims->heads % dims->kv_heads == 0,
               "query heads (" + std::to_string(dims->heads) + ") must be divisible by K/V heads (" +
                   std::to_string(dims->kv_heads) + ")");
  SP_RETURN_IF_ERROR(validate_linear_params(params, dims->heads));
  const LinearDims& d = *dims;
  SP_RETURN_IF_ERROR(validate_linear_tensor("q", q, q.dtype, d.batch, d.seq, d.heads, d.dk, false));
  SP_RETURN_IF_ERROR(validate_linear_tensor("k", k, q.dtype, d.batch, d.seq, d.kv_heads, d.dk, false));
  return validate_linear_tensor("v", v, q.dtype, d.batch, d.seq, d.kv_heads, d.dv, false);
}

Status validate_linear_state(const char* name, const TensorView& t, DType dtype,
                             const LinearDims& dims) {
  return validate_linear_tensor(name, t, dtype, dims.batch, dims.heads, dims.dk, dims.dv, true,
                                true);
}

}  // namespace cpu
}  // namespace seqpar
