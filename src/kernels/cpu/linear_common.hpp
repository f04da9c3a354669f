// Shared by the linear-attention oracle and kernels: shape checks of q, k, v, states and their
// gradients, and the BSHD row addressing of one (batch, head).
#pragma once

#include <cstdint>

#include "seqpar/linear_attention.hpp"

namespace seqpar::cpu {

struct LinearDims {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, dk = 0, dv = 0;
  int64_t group() const { return heads / kv_heads; }  // query heads per K/V head
  int64_t state_elems() const { return dk * dv; }     // one head's state
};

// Checks q [B,S,H,d_k], k [B,S,H_kv,d_k], v [B,S,H_kv,d_v] (CPU, one dtype, contiguous last
// dim, H divisible by H_kv) and the params; fills dims.
Status validate_linear_qkv(const TensorView& q, const TensorView& k, const TensorView& v,
                           const LinearAttentionParams& params, LinearDims* dims);
// Checks a CPU tensor of `dtype` and the given shape (4 dims) with a contiguous last dim;
// `contiguous` asks for a fully contiguous one. An empty view passes when `optional`.
Status validate_linear_tensor(const char* name, const TensorView& t, DType dtype, int64_t d0,
                              int64_t d1, int64_t d2, int64_t d3, bool optional,
                              bool contiguous = false);
// Checks a [B, H, d_k, d_v] contiguous state (or dState) of `dtype`; empty passes.
Status validate_linear_state(const char* name, const TensorView& t, DType dtype,
                             const LinearDims& dims);

inline bool present(const TensorView& t) { return t.data != nullptr; }

// Row s of head h, batch b, of a BSHD view: rows of one (b, h) are `stride` elements apart.
template <class T>
struct HeadRows {
  T* base = nullptr;
  int64_t stride = 0;
  HeadRows(const TensorView& t, int64_t b, int64_t h)
      : base(static_cast<T*>(t.data) + b * t.strides[0] + h * t.strides[2]), stride(t.strides[1]) {}
  T* operator[](int64_t s) const { return base + s * stride; }
};

}  // namespace seqpar::cpu
