// Internal helpers of the executors: BSHD copies and the argument checks of CPU ranks.
#pragma once

#include <cstring>

#include "kernels/cpu/attention_common.hpp"
#include "seqpar/comm.hpp"
#include "seqpar/layout.hpp"

namespace seqpar::parallel {

inline int wrap(int r, int p) { return ((r % p) + p) % p; }

// Copies a [B, S, H, D] view (any strides, contiguous last dim) into a contiguous one.
inline void copy_bshd(const TensorView& src, const TensorView& dst) {
  const size_t row = src.shape[3] * dtype_size(src.dtype);
  for (int64_t b = 0; b < src.shape[0]; ++b)
    for (int64_t s = 0; s < src.shape[1]; ++s)
      for (int64_t h = 0; h < src.shape[2]; ++h)
        std::memcpy(static_cast<char*>(dst.data) + cpu::bshd_offset(dst, b, s, h) * dtype_size(dst.dtype),
                    static_cast<const char*>(src.data) + cpu::bshd_offset(src, b, s, h) * dtype_size(src.dtype),
                    row);
}

inline Status check_ring_args(const Communicator& comm, const Layout& layout,
                       const AttentionParams& params, const TensorView& q, const TensorView& k,
                       const TensorView& v, cpu::AttentionDims* dims) {
  SP_CHECK_ARG(layout.ranks() == comm.size(),
               "layout is for " + std::to_string(layout.ranks()) + " ranks but the communicator has " +
                   std::to_string(comm.size()));
  SP_CHECK_ARG(!params.q_positions && !params.k_positions,
               "ring attention takes positions from the layout; leave q/k_positions null");
  SP_RETURN_IF_ERROR(cpu::validate_qkv(q, k, v, dims));
  const int64_t local = layout.local_len(comm.rank());
  SP_CHECK_ARG(dims->seq_q == local && dims->seq_k == local,
               "rank " + std::to_string(comm.rank()) + " holds " + std::to_string(local) +
                   " tokens under the " + layout_name(layout.kind()) + " layout, but q is " +
                   q.shape_string() + " and k is " + k.shape_string());
  SP_CHECK_SUPPORTED(q.dtype == DType::kF32 || q.dtype == DType::kF64,
                     std::string("ring attention on CPU ranks computes in fp32 or fp64, not ") +
                         dtype_name(q.dtype));
  return params.mask.validate(layout.seq_len());
}

// check_ring_args plus the backward's tensors: o, dout, dq like q; lse [B, H, S]; dk, dv like k.
inline Status check_backward_args(const Communicator& comm, const Layout& layout,
                                  const AttentionParams& params, const TensorView& q,
                                  const TensorView& k, const TensorView& v, const TensorView& o,
                                  const TensorView& lse, const TensorView& dout,
                                  const TensorView& dq, const TensorView& dk,
                                  const TensorView& dv, cpu::AttentionDims* dims) {
  SP_RETURN_IF_ERROR(check_ring_args(comm, layout, params, q, k, v, dims));
  const DType t = q.dtype;
  const int64_t B = dims->batch, S = dims->seq_q, H = dims->heads, Hkv = dims->kv_heads,
                D = dims->head_dim;
  SP_RETURN_IF_ERROR(cpu::validate_like("o", o, t, B, S, H, D));
  SP_RETURN_IF_ERROR(cpu::validate_like("lse", lse, t, B, H, S));
  SP_RETURN_IF_ERROR(cpu::validate_like("dout", dout, t, B, S, H, D));
  SP_RETURN_IF_ERROR(cpu::validate_like("dq", dq, t, B, S, H, D));
  SP_RETURN_IF_ERROR(cpu::validate_like("dk", dk, t, B, S, Hkv, D));
  return cpu::validate_like("dv", dv, t, B, S, Hkv, D);
}

}  // namespace seqpar::parallel
