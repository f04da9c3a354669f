// Internal helpers shared by the ring-style schedules (ring, BurstAttention): shard-sized
// double buffers, BSHD copies, accumulation, argument checks and block-pair visibility.
#pragma once

#include <cstring>
#include <vector>

#include "kernels/cpu/attention_common.hpp"
#include "seqpar/comm.hpp"
#include "seqpar/layout.hpp"

namespace seqpar::parallel {

inline int wrap(int r, int p) { return ((r % p) + p) % p; }

// Two [B, rows, heads, D] contiguous parts (K and V, or dK and dV) in one buffer sized for
// the longest shard, so one message carries both.
struct ShardBuffer {
  std::vector<uint64_t> storage;  // 8-byte elements keep fp64 aligned
  DType dtype = DType::kF32;
  int64_t batch = 0, heads = 0, head_dim = 0;

  void allocate(DType t, int64_t b, int64_t max_rows, int64_t h, int64_t d) {
    dtype = t;
    batch = b;
    heads = h;
    head_dim = d;
    storage.assign((2 * b * max_rows * h * d * dtype_size(t) + 7) / 8, 0);  // two parts
  }
  TensorView view(int64_t rows, int part = 0) const {  // part 0/1: K and V halves
    char* base = reinterpret_cast<char*>(const_cast<uint64_t*>(storage.data()));
    return TensorView::contiguous(base + part * bytes(rows), dtype, {batch, rows, heads, head_dim});
  }
  size_t bytes(int64_t rows) const { return batch * rows * heads * head_dim * dtype_size(dtype); }
  void zero(int64_t rows, int parts) { std::memset(view(rows).data, 0, parts * bytes(rows)); }
};

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

template <class T>
inline void add_into(const TensorView& acc, const TensorView& x) {
  T* a = acc.as<T>();
  const T* y = x.as<T>();
  for (int64_t i = 0; i < acc.numel(); ++i) a[i] += y[i];
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

// Whether any (query, key) pair of these two shards is visible under the mask.
inline bool pair_visible(const AttentionParams& params, const std::vector<int64_t>& q_pos,
                  const std::vector<int64_t>& k_pos) {
  AttentionParams p = params;
  p.q_positions = q_pos.data();
  p.k_positions = k_pos.data();
  const cpu::MaskEvaluator mask(p, static_cast<int64_t>(q_pos.size()),
                                static_cast<int64_t>(k_pos.size()));
  return mask.classify(0, q_pos.size(), 0, k_pos.size()) != cpu::TileKind::kEmpty;
}

}  // namespace seqpar::parallel
