// Our own CUDA attention kernels (tensor cores through mma.sync, any sm_80+ GPU):
//   forward  continues from a running fp32 (O, LSE) so ring steps accumulate without extra
//            passes, and can also write the final bf16/fp16 O;
//   backward takes the global LSE and D directly (BurstAttention's backward needs this;
//            cuDNN cannot take D) and adds into fp32 dQ, dK, dV;
//   delta    D = rowsum(dO * O);
//   cast     fp32 <-> bf16/fp16;
//   merge    -inf-safe merge of partial (O, LSE) pairs.
// Positions are arithmetic runs: local row i sits at global position offset + stride * i
// (a contiguous shard, one run of a zigzag shard, or a striped shard). The runs alone place
// the rows: params.mask.align is not read here; FlashPositions::defaults turns a top-left or
// bottom-right alignment into runs. Masks are the band
// (window_left, window_right) and documents of params.mask, in those global positions; tiles
// the mask empties are skipped whole.
//
// Shapes (device memory, BSHD with contiguous last dim):
//   q: [B, S_q, H, D] bf16|fp16   k, v: [B, S_k, H_kv, D] same dtype   D in {64, 128}
//   o_acc: [B, S_q, H, D] fp32    lse: [B, H, S_q] fp32 contiguous     o_out: like q
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "seqpar/attention.hpp"
#include "seqpar/status.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar {

struct PositionRun {
  int64_t offset = 0;
  int64_t stride = 1;  // > 0
};

struct FlashPositions {
  PositionRun q, k;
  // Defaults: q from 0 (or S_k - S_q for a bottom-right mask), k from 0, stride 1.
  static FlashPositions defaults(const AttentionParams& params, int64_t seq_q, int64_t seq_k);
};

// With accumulate = false, (o_acc, lse) are overwritten; with accumulate = true they hold a
// running normalised result (lse = -inf for none) and are updated to include these keys.
// o_out (data == nullptr to skip) receives o_acc converted to q's dtype.
Status flash_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const AttentionParams& params, const FlashPositions& positions,
                               const TensorView& o_acc, const TensorView& lse, bool accumulate,
                               const TensorView& o_out, void* stream = nullptr);

// Backward against a given (global) lse and delta = rowsum(dO * O): *adds* into fp32 dq
// [B, S_q, H, D], dk and dv [B, S_k, H_kv, D] (dq through atomics, so its summation order,
// and the last bits, vary from run to run).
Status flash_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& dout, const TensorView& lse,
                                const TensorView& delta, const AttentionParams& params,
                                const FlashPositions& positions, const TensorView& dq,
                                const TensorView& dk, const TensorView& dv, void* stream = nullptr);

// delta[b, h, i] = sum_d dout[b, i, h, d] * o[b, i, h, d]; o and dout of one dtype (any of
// bf16, fp16, fp32), delta fp32 [B, H, S].
Status flash_attention_delta(const TensorView& o, const TensorView& dout, const TensorView& delta,
                             void* stream = nullptr);

// Element-wise dtype conversion between device tensors of one shape (fp32, bf16, fp16; any
// strides with a contiguous last dim), e.g. the fp32 gradients to the model's bf16.
Status flash_cast(const TensorView& src, const TensorView& dst, void* stream = nullptr);

// dst = src for each pair, in one launch where the pairs are device views of one dtype that
// flatten to rows at one pitch (copy_many.cu); others go through flash_cast one by one. No
// pair's destination may overlap another pair's source or destination.
Status flash_copy_many(std::span<const std::pair<TensorView, TensorView>> pairs, void* stream = nullptr);

// dst (fp32) += src (fp32, bf16 or fp16), views of one shape (contiguous last dim).
Status flash_accumulate(const TensorView& src, const TensorView& dst, void* stream = nullptr);

// dst (fp32, bf16 or fp16) = src (fp32, bf16 or fp16) + acc (fp32 or dst's dtype), views of one
// shape: the last contribution added and the result cast in one pass. acc may be dst itself.
Status flash_add_cast(const TensorView& src, const TensorView& acc, const TensorView& dst,
                      void* stream = nullptr);

// Sets every element of a device view (fp32, bf16 or fp16; up to 4 dims, any strides with a
// contiguous last dim) to `value`: a fresh result's rows no part reaches, LSE to -inf.
Status flash_fill(const TensorView& dst, float value, void* stream = nullptr);

// (o, lse) <- merge((o, lse), (o_part, lse_part)); o and both LSEs fp32 (any strides with a
// contiguous last dim), o_part fp32, bf16 or fp16; -inf (or +inf/NaN) is "no key".
Status flash_merge_partials(const TensorView& o, const TensorView& lse, const TensorView& o_part,
                            const TensorView& lse_part, void* stream = nullptr);
// (o_out, lse_out) <- merge((o, lse), (o_part, lse_part)) with o and lse only read: the last
// merge of a ring step written straight into the result (o_out fp32, bf16 or fp16; o fp32 or
// o_out's dtype; the outputs may be o and lse themselves).
Status flash_merge_partials_into(const TensorView& o, const TensorView& lse, const TensorView& o_part,
                                 const TensorView& lse_part, const TensorView& o_out,
                                 const TensorView& lse_out, void* stream = nullptr);

}  // namespace seqpar
