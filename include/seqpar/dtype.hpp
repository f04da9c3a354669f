// Element types (fp64, fp32, bf16, fp16) and their conversions to and from float on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "seqpar/status.hpp"

namespace seqpar {

enum class DType : uint8_t { kF64, kF32, kBF16, kF16 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// Parses "fp64"/"f64"/"float64", "fp32", "bf16", "fp16".
StatusOr<DType> parse_dtype(const std::string& name);

// bf16 as raw bits; round-to-nearest-even on the way in, NaN kept NaN.
struct bf16_t {
  uint16_t bits;
};
// IEEE binary16 as raw bits.
struct fp16_t {
  uint16_t bits;
};

inline float bf16_to_float(bf16_t x) {
  uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}

float fp16_to_float(fp16_t x);
fp16_t float_to_fp16(float f);

// Converts `count` contiguous elements between any two dtypes (through double when either
// side is fp64, through float otherwise).
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t count);

}  // namespace seqpar
