// dtype names, sizes and CPU conversions (bf16/fp16 bit manipulation, rounding to nearest even).
#include "seqpar/dtype.hpp"

#include <cmath>

namespace seqpar {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF64: return 8;
    case DType::kF32: return 4;
    case DType::kBF16:
    case DType::kF16: return 2;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF64: return "fp64";
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
  }
  return "?";
}

StatusOr<DType> parse_dtype(const std::string& name) {
  if (name == "fp64" || name == "f64" || name == "float64" || name == "double") return DType::kF64;
  if (name == "fp32" || name == "f32" || name == "float32" || name == "float") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "fp16" || name == "f16" || name == "float16" || name == "half") return DType::kF16;
  return SP_STATUS(StatusCode::kInvalidArgument,
                   "unknown dtype '" + name + "' (expected fp64, fp32, bf16 or fp16)");
}

float fp16_to_float(fp16_t x) {
  const uint32_t sign = (x.bits >> 15) & 1u;
  const int32_t exponent = (x.bits >> 10) & 0x1f;
  const uint32_t mantissa = x.bits & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

fp16_t float_to_fp16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return fp16_t{static_cast<uint16_t>(sign | 0x7e00u)};  // NaN
  if (abs >= 0x477ff000u) return fp16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24, rounded to nearest even.
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;  // 2^24
    const uint16_t m = static_cast<uint16_t>(std::nearbyint(scaled));
    return fp16_t{static_cast<uint16_t>(sign | m)};
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even
  const uint32_t half = ((rounded >> 13) - (112u << 10)) & 0x7fffu;
  return fp16_t{static_cast<uint16_t>(sign | half)};
}

namespace {
template <class T>
double load(const void* p, size_t i) {
  return static_cast<double>(static_cast<const T*>(p)[i]);
}
double load_any(const void* p, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kF64: return load<double>(p, i);
    case DType::kF32: return load<float>(p, i);
    case DType::kBF16: return bf16_to_float(static_cast<const bf16_t*>(p)[i]);
    case DType::kF16: return fp16_to_float(static_cast<const fp16_t*>(p)[i]);
  }
  return 0;
}
void store_any(void* p, DType dtype, size_t i, double v) {
  switch (dtype) {
    case DType::kF64: static_cast<double*>(p)[i] = v; break;
    case DType::kF32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::kBF16: static_cast<bf16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::kF16: static_cast<fp16_t*>(p)[i] = float_to_fp16(static_cast<float>(v)); break;
  }
}
}  // namespace

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t count) {
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, count * dtype_size(src_dtype));
    return;
  }
  // Million-token tensors hold billions of elements: split large conversions over the cores
  // (small ones, often called from inside parallel loops, stay on the calling thread).
  const int64_t n = static_cast<int64_t>(count);
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 22))
  for (int64_t i = 0; i < n; ++i) store_any(dst, dst_dtype, size_t(i), load_any(src, src_dtype, size_t(i)));
}

}  // namespace seqpar
