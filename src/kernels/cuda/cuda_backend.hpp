// The two GPU local-attention backends of include/seqpar/backend.hpp. `CudaKernelBackend` runs
// our own kernels (flash_cuda.hpp) over the arithmetic runs of the rows' positions; the cuDNN
// backend (src/kernels/cudnn/cudnn_backend.cpp) derives from it for the step kinds cuDNN has no call for (delta,
// merge, accumulate) and plans each shard pair into dense cuDNN calls itself. An instance
// keeps scratch buffers and cached plans, so each rank (thread) owns its own.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "seqpar/backend.hpp"
#include "parallel/block_plan.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar::cuda {

// Global positions of a pair's rows: params' explicit ones, else the alignment's defaults.
struct PairPositions {
  std::vector<int64_t> q, k;
};
PairPositions pair_positions(const AttentionParams& params, int64_t seq_q, int64_t seq_k);
// What the caches of a pair's plans are keyed by: the contents of its positions (a hash of each
// list and the lengths) and the alignment, never where the lists live, so a backend that
// outlives one plan cannot serve another layout's runs from a reused address.
using PairKey = std::tuple<uint64_t, int64_t, uint64_t, int64_t, int>;
PairKey pair_key(const AttentionParams& params, int64_t seq_q, int64_t seq_k);

class CudaKernelBackend : public AttentionBackend {
 public:
  const char* name() const override { return "cuda"; }
  BackendCaps caps() const override;
  std::string supports(const TensorView& q, const AttentionParams& params) const override;
  Status forward(const TensorView& q, const TensorView& k, const TensorView& v, const AttentionParams& params,
                 const TensorView& o, const TensorView& lse, FreshOutputs fresh, void* stream) const override;
  Status backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                  const TensorView& lse, const TensorView& delta, const AttentionParams& params,
                  const TensorView& dq, const TensorView& dk, const TensorView& dv, FreshOutputs fresh,
                  void* stream) const override;
  Status delta(const TensorView& o, const TensorView& dout, const TensorView& delta, void* stream) const override;
  Status merge(const TensorView& o, const TensorView& lse, const TensorView& o_part, const TensorView& lse_part,
               void* stream) const override;
  Status accumulate(const TensorView& acc, const TensorView& x, void* stream) const override;

 protected:
  // A contiguous device view of `shape` in the scratch buffer `slot` (grown as needed). The
  // scratch is reused by the next call queued on the same stream, so stream order protects it.
  StatusOr<TensorView> scratch(int slot, DType dtype, const std::vector<int64_t>& shape, const TensorView& like) const;
  // Rows [begin, end) of a [B, H, S] fp32 view copied into scratch `slot` (the kernels want
  // their row statistics contiguous).
  StatusOr<TensorView> stat_rows(int slot, const TensorView& stats, int64_t begin, int64_t end, void* stream) const;
  // A call's forward part into the running (O, LSE): cast in where the result is fresh (it held
  // nothing), else merged (-inf safe; O may be in the inputs' dtype).
  Status settle_forward(const TensorView& o_part, const TensorView& lse_part, const TensorView& o,
                        const TensorView& lse, bool fresh, void* stream) const;
  // A call's gradient part into its output: cast in where fresh, else added (accumulate).
  Status settle_gradient(const TensorView& part, const TensorView& out, bool fresh, void* stream) const;

  // Part buffers of one call (a forward's O part, a backward's dQ, dK, dV parts): stream
  // buffers (gpu.hpp) given back on the call's stream when the lease ends, so parts share memory
  // with the blocks and parts that are not live at the same time, where fixed slots would each
  // keep their own largest.
  class PartLease {
   public:
    explicit PartLease(void* stream) : stream_(stream) {}
    ~PartLease();
    PartLease(const PartLease&) = delete;
    PartLease& operator=(const PartLease&) = delete;
    // A contiguous device view of this shape in a buffer of its own.
    StatusOr<TensorView> take(DType dtype, const std::vector<int64_t>& shape, const TensorView& like);

   private:
    void* stream_;
    std::vector<StreamBuffer> taken_;
  };

 private:
  // Arithmetic runs of a pair's positions, cached by where the positions live (a layout's
  // position lists do not move while a plan runs).
  const std::pair<std::vector<PositionRunSpan>, std::vector<PositionRunSpan>>& runs(const AttentionParams& params,
                                                                                   int64_t seq_q, int64_t seq_k) const;
  mutable std::map<int, DeviceBuffer> scratch_;
  mutable std::map<PairKey, std::pair<std::vector<PositionRunSpan>, std::vector<PositionRunSpan>>> runs_;
};

// The cuDNN backend (nullptr when seqpar was built without cuDNN). max_call_rows > 0 tiles
// every dense call to at most that many query and key rows (limit_call_rows).
std::unique_ptr<AttentionBackend> make_cudnn_backend(int64_t max_call_rows, bool deterministic);

}  // namespace seqpar::cuda
