// Running results of the GPU executor (src/dist/gpu_ring.cpp): an fp32 sum (gradients) or an
// fp32 (O, LSE) merge over the rows of one head group, fed the local calls' low-precision
// parts with as few passes over memory as possible.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <utility>

#include "core/cuda_check.hpp"
#include "seqpar/flash_cuda.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar::dist {

// The running fp32 results of one head group take the cuDNN calls' low-precision parts lazily,
// to save passes over memory (they cost most at small shards): the first part that covers
// every row is cast in, with no zeroing first, and the latest part is held back, so the pass
// that casts the result out (or adds it into a travelling accumulator) adds it on the way.
// Parts live in buffers the next call reuses: flush() before a call writes them.
class Running {
 public:
  // acc: the fp32 result [B, n, H, D]; lse (merges only): its fp32 [B, H, n] log-sum-exp.
  Running(const TensorView& acc, const TensorView& lse = TensorView{}) : acc_(acc), lse_(lse) {}

  const TensorView& acc() const { return acc_; }
  const TensorView& lse() const { return lse_; }

  // Holds `part` (and `part_lse` for merges), the contribution to rows [begin, end).
  void hold(const TensorView& part, const TensorView& part_lse, int64_t begin, int64_t end) {
    pending_ = {part, part_lse, begin, end, true};
  }

  Status flush(cudaStream_t s) {
    if (!pending_.held) return Status::Ok();
    const Pending p = pending_;
    pending_.held = false;
    if (!ready_ && covers_all(p)) {
      ready_ = true;
      return assign(p.part, p.part_lse, acc_, lse_, s);
    }
    SP_RETURN_IF_ERROR(materialize(s));
    return combine(p, acc_, lse_, s);
  }

  // Makes acc (and lse) hold the whole result, zero (-inf) where nothing was added.
  Status materialize(cudaStream_t s) {
    SP_RETURN_IF_ERROR(flush(s));
    if (ready_) return Status::Ok();
    ready_ = true;
    SP_CUDA_CHECK(cudaMemsetAsync(acc_.data, 0, acc_.numel() * sizeof(float), s));
    return merging() ? flash_fill(lse_, -INFINITY, s) : Status::Ok();
  }

  // out (any float dtype, and lse_out for merges) = the result.
  Status finish_into(const TensorView& out, const TensorView& lse_out, cudaStream_t s) {
    const Pending p = pending_;
    if (!p.held || (!ready_ && !covers_all(p))) {
      SP_RETURN_IF_ERROR(materialize(s));
      return assign(acc_, lse_, out, lse_out, s);
    }
    pending_.held = false;
    if (!ready_) return assign(p.part, p.part_lse, out, lse_out, s);
    // Rows the held part reaches are combined on the way out; the rest are cast.
    SP_RETURN_IF_ERROR(combine(p, out, lse_out, s));
    const int64_t n = acc_.shape[1];
    for (const auto& [b, e] : {std::pair{int64_t(0), p.begin}, std::pair{p.end, n}})
      if (b < e) SP_RETURN_IF_ERROR(assign(rows(acc_, b, e), stat_rows(lse_, b, e), rows(out, b, e),
                                           stat_rows(lse_out, b, e), s));
    return Status::Ok();
  }

  // target (fp32, shaped like acc) += the result (sums only).
  Status add_into(const TensorView& target, cudaStream_t s) {
    if (ready_) SP_RETURN_IF_ERROR(flash_accumulate(acc_, target, s));
    if (pending_.held)
      SP_RETURN_IF_ERROR(flash_accumulate(pending_.part, rows(target, pending_.begin, pending_.end), s));
    pending_.held = false;
    ready_ = false;
    return Status::Ok();
  }

 private:
  struct Pending {
    TensorView part, part_lse;
    int64_t begin = 0, end = 0;
    bool held = false;
  };
  bool merging() const { return lse_.data != nullptr; }
  bool covers_all(const Pending& p) const { return p.begin == 0 && p.end == acc_.shape[1]; }
  static TensorView rows(TensorView t, int64_t b, int64_t e) {
    t.data = static_cast<char*>(t.data) + b * t.strides[1] * int64_t(dtype_size(t.dtype));
    t.shape[1] = e - b;
    return t;
  }
  TensorView stat_rows(TensorView t, int64_t b, int64_t e) const {
    if (!merging()) return t;
    t.data = static_cast<char*>(t.data) + b * t.strides[2] * int64_t(dtype_size(t.dtype));
    t.shape[2] = e - b;
    return t;
  }
  // to (, to_lse) = from (, from_lse), cast.
  Status assign(const TensorView& from, const TensorView& from_lse, const TensorView& to,
                const TensorView& to_lse, cudaStream_t s) const {
    SP_RETURN_IF_ERROR(flash_cast(from, to, s));
    return merging() ? flash_cast(from_lse, to_lse, s) : Status::Ok();
  }
  // to (, to_lse) = acc (, lse) combined with the held part over its rows.
  Status combine(const Pending& p, const TensorView& to, const TensorView& to_lse, cudaStream_t s) const {
    const TensorView a = rows(acc_, p.begin, p.end), t = rows(to, p.begin, p.end);
    if (!merging()) return flash_add_cast(p.part, a, t, s);
    return flash_merge_partials_into(a, stat_rows(lse_, p.begin, p.end), p.part, p.part_lse, t,
                                     stat_rows(to_lse, p.begin, p.end), s);
  }

  TensorView acc_, lse_;
  Pending pending_;
  bool ready_ = false;  // acc (and lse) hold the result so far
};

}  // namespace seqpar::dist
