// Running results of the GPU executor (src/parallel/gpu_ring.cpp): a sum (gradients) or an
// (O, LSE) merge over the rows of one head group, fed the local calls' low-precision parts with
// as few passes over memory (and as little workspace) as possible.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <functional>
#include <utility>

#include "core/cuda_check.hpp"
#include "seqpar/flash_cuda.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar::parallel {

// The running result of one head group takes the cuDNN calls' low-precision parts lazily, to
// save passes over memory (they cost most at small shards) and workspace:
// - the first part that covers every row may be written by its call straight into the
//   caller's output (when given, and cuDNN can write it); with one more part, the result is
//   summed (merged) in place there, with the same rounding as through fp32;
// - otherwise the first covering part is cast into the fp32 accumulator, with no zeroing;
// - the latest part is held back, so the pass that casts the result out (or adds it into a
//   travelling accumulator) adds it on the way.
// The fp32 accumulator is only made (by `make_acc`) when a third part or our own kernels need
// it. Parts live in buffers the next call reuses: flush() before a call writes them.
class Running {
 public:
  struct Views {
    TensorView acc, lse;  // [B, n, H, D] and, for merges, its [B, H, n] log-sum-exp
  };
  using MakeAcc = std::function<StatusOr<Views>()>;

  // rows: the result's rows; part_buffer: the name of the workspace buffer its calls write
  // their parts into; make_acc: the fp32 accumulator (and fp32 LSE for merges), made on first
  // need; out (and out_lse for merges): the caller's result, which the first part may be
  // written into.
  Running(int64_t rows, const char* part_buffer, MakeAcc make_acc, bool merging,
          const TensorView& out = TensorView{}, const TensorView& out_lse = TensorView{})
      : rows_(rows), part_buffer_(part_buffer), make_acc_(std::move(make_acc)), merging_(merging),
        out_(out), out_lse_(out_lse) {}

  const char* part_buffer() const { return part_buffer_; }
  // Whether the result so far lives in the output (no workspace holds it).
  bool in_place() const { return in_out_; }

  // Whether the call producing rows [begin, end) of `rows` should write its part into out() and
  // out_lse(): nothing is there yet, the part covers every row and cuDNN can write the views.
  bool first_in_place(int64_t begin, int64_t end) const {
    return out_.data && !in_out_ && !ready_ && !pending_.held && begin == 0 && end == rows_ &&
           writable(out_) && (!merging_ || (out_lse_.is_contiguous() && aligned(out_lse_.data)));
  }
  const TensorView& out() const { return out_; }
  const TensorView& out_lse() const { return out_lse_; }

  // The fp32 accumulator (own kernels add into it): call materialize() first.
  const TensorView& acc() const { return acc_.acc; }
  const TensorView& lse() const { return acc_.lse; }

  // Takes `part` (and `part_lse` for merges), the contribution to rows [begin, end); a part
  // written into out() by first_in_place's call is the result so far, else it is held.
  void hold(const TensorView& part, const TensorView& part_lse, int64_t begin, int64_t end) {
    if (out_.data && part.data == out_.data) in_out_ = true;
    else pending_ = {part, part_lse, begin, end, true};
  }

  // The held part alone, when it is all there is (nothing in the output or accumulator).
  const TensorView* only_part(int64_t* begin, int64_t* end) const {
    if (!pending_.held || ready_ || in_out_) return nullptr;
    *begin = pending_.begin, *end = pending_.end;
    return &pending_.part;
  }

  Status flush(cudaStream_t s) {
    if (!pending_.held) return Status::Ok();
    const Pending p = pending_;
    pending_.held = false;
    if (!ready_ && !in_out_ && covers_all(p)) {
      SP_RETURN_IF_ERROR(make());
      ready_ = true;
      return assign(p.part, p.part_lse, acc_.acc, acc_.lse, s);
    }
    SP_RETURN_IF_ERROR(materialize(s));
    return combine(acc_.acc, acc_.lse, p, acc_.acc, acc_.lse, s);
  }

  // Makes the fp32 accumulator hold the whole result, zero (-inf) where nothing was added.
  Status materialize(cudaStream_t s) {
    SP_RETURN_IF_ERROR(flush(s));
    if (ready_) return Status::Ok();
    SP_RETURN_IF_ERROR(make());
    ready_ = true;
    if (in_out_) {
      in_out_ = false;
      return assign(out_, out_lse_, acc_.acc, acc_.lse, s);
    }
    SP_CUDA_CHECK(cudaMemsetAsync(acc_.acc.data, 0, acc_.acc.numel() * sizeof(float), s));
    return merging_ ? flash_fill(acc_.lse, -INFINITY, s) : Status::Ok();
  }

  // out (any float dtype, and lse_out for merges) = the result. When the result so far lives
  // in the output, `out` must be that output.
  Status finish_into(const TensorView& out, const TensorView& lse_out, cudaStream_t s) {
    const Pending p = pending_;
    if (in_out_) {
      SP_CHECK_ARG(out.data == out_.data, "internal: a running result kept in place finishes there");
      pending_.held = false;
      return p.held ? combine(out_, out_lse_, p, out_, out_lse_, s) : Status::Ok();
    }
    if (!p.held || (!ready_ && !covers_all(p))) {
      SP_RETURN_IF_ERROR(materialize(s));
      return assign(acc_.acc, acc_.lse, out, lse_out, s);
    }
    pending_.held = false;
    if (!ready_) return assign(p.part, p.part_lse, out, lse_out, s);
    // Rows the held part reaches are combined on the way out; the rest are cast.
    SP_RETURN_IF_ERROR(combine(acc_.acc, acc_.lse, p, out, lse_out, s));
    for (const auto& [b, e] : {std::pair{int64_t(0), p.begin}, std::pair{p.end, rows_}})
      if (b < e)
        SP_RETURN_IF_ERROR(assign(rows(acc_.acc, b, e), stat_rows(acc_.lse, b, e), rows(out, b, e),
                                  stat_rows(lse_out, b, e), s));
    return Status::Ok();
  }

  // target (fp32, shaped like the result) += the result (sums only).
  Status add_into(const TensorView& target, cudaStream_t s) {
    if (ready_) SP_RETURN_IF_ERROR(flash_accumulate(acc_.acc, target, s));
    if (in_out_) SP_RETURN_IF_ERROR(flash_accumulate(out_, target, s));
    if (pending_.held)
      SP_RETURN_IF_ERROR(flash_accumulate(pending_.part, rows(target, pending_.begin, pending_.end), s));
    pending_.held = false;
    ready_ = in_out_ = false;
    return Status::Ok();
  }

 private:
  struct Pending {
    TensorView part, part_lse;
    int64_t begin = 0, end = 0;
    bool held = false;
  };
  static bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
  // cuDNN writes [B, n, H, D] views with a contiguous last dim from a 16-byte aligned start.
  static bool writable(const TensorView& t) {
    return t.ndim == 4 && t.strides[3] == 1 && aligned(t.data) && t.strides[2] % 8 == 0 &&
           t.strides[1] % 8 == 0 && t.strides[0] % 8 == 0;
  }
  Status make() {
    if (acc_.acc.data) return Status::Ok();
    SP_ASSIGN_OR_RETURN(acc_, make_acc_());
    return Status::Ok();
  }
  bool covers_all(const Pending& p) const { return p.begin == 0 && p.end == rows_; }
  static TensorView rows(const TensorView& t, int64_t b, int64_t e) { return t.narrow(1, b, e); }
  TensorView stat_rows(const TensorView& t, int64_t b, int64_t e) const { return merging_ ? t.narrow(2, b, e) : t; }
  // to (, to_lse) = from (, from_lse), cast.
  Status assign(const TensorView& from, const TensorView& from_lse, const TensorView& to,
                const TensorView& to_lse, cudaStream_t s) const {
    SP_RETURN_IF_ERROR(flash_cast(from, to, s));
    return merging_ ? flash_cast(from_lse, to_lse, s) : Status::Ok();
  }
  // Rows of the held part: to (, to_lse) = base (, base_lse) combined with it (base may be to).
  Status combine(const TensorView& base, const TensorView& base_lse, const Pending& p,
                 const TensorView& to, const TensorView& to_lse, cudaStream_t s) const {
    const TensorView a = rows(base, p.begin, p.end), t = rows(to, p.begin, p.end);
    if (!merging_) return flash_add_cast(p.part, a, t, s);
    return flash_merge_partials_into(a, stat_rows(base_lse, p.begin, p.end), p.part, p.part_lse, t,
                                     stat_rows(to_lse, p.begin, p.end), s);
  }

  int64_t rows_;
  const char* part_buffer_;
  MakeAcc make_acc_;
  bool merging_;
  TensorView out_, out_lse_;
  Views acc_;
  Pending pending_;
  bool ready_ = false;   // the accumulator holds the result so far
  bool in_out_ = false;  // the output holds the result so far
};

}  // namespace seqpar::parallel
