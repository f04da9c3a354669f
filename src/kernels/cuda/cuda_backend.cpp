// Our own CUDA kernels as a local-attention backend (cuda_backend.hpp): forward continues the
// running fp32 (O, LSE) and backward adds into fp32 dQ, dK, dV, one kernel call per pair of
// arithmetic position runs (one for contiguous and striped shards, up to four for zigzag).
#include "kernels/cuda/cuda_backend.hpp"

#include <cmath>
#include <numeric>

#include "kernels/cuda/mask_runs.hpp"
#include "kernels/cuda/flash_cuda.hpp"

namespace seqpar::cuda {

PairPositions pair_positions(const AttentionParams& params, int64_t seq_q, int64_t seq_k) {
  PairPositions p{std::vector<int64_t>(seq_q), std::vector<int64_t>(seq_k)};
  if (params.q_positions) std::copy(params.q_positions, params.q_positions + seq_q, p.q.begin());
  else std::iota(p.q.begin(), p.q.end(), params.mask.align == MaskAlign::kBottomRight ? seq_k - seq_q : 0);
  if (params.k_positions) std::copy(params.k_positions, params.k_positions + seq_k, p.k.begin());
  else std::iota(p.k.begin(), p.k.end(), 0);
  return p;
}

namespace {
// FNV-1a over the positions (null: the default positions, hashed as such).
uint64_t positions_hash(const int64_t* p, int64_t n) {
  uint64_t h = 1469598103934665603ull;
  if (!p) return h ^ 0x5eed;
  for (int64_t i = 0; i < n; ++i) h = (h ^ uint64_t(p[i])) * 1099511628211ull;
  return h;
}
}  // namespace

PairKey pair_key(const AttentionParams& params, int64_t seq_q, int64_t seq_k) {
  return {positions_hash(params.q_positions, seq_q), seq_q, positions_hash(params.k_positions, seq_k), seq_k,
          int(params.mask.align)};
}

BackendCaps CudaKernelBackend::caps() const {
  BackendCaps c;
  c.device = true;
  return c;
}

std::string CudaKernelBackend::supports(const TensorView& q, const AttentionParams& params) const {
  if (q.device.kind != DeviceKind::kCuda) return "our CUDA kernels take device tensors";
  if (q.dtype != DType::kBF16 && q.dtype != DType::kF16)
    return std::string("our CUDA kernels compute in bf16 or fp16, not ") + dtype_name(q.dtype);
  if (q.ndim == 4 && q.shape[3] != 64 && q.shape[3] != 128)
    return "our CUDA kernels take head dim 64 or 128, not " + std::to_string(q.shape[3]);
  if (params.mask.has_block_pattern()) return "our CUDA kernels do not take block-sparse masks yet";
  if (params.mask.doc_offsets.size() > size_t(kMaxDocuments) + 1)
    return "our CUDA kernels take at most " + std::to_string(kMaxDocuments) + " documents";
  return {};
}

const std::pair<std::vector<PositionRunSpan>, std::vector<PositionRunSpan>>& CudaKernelBackend::runs(
    const AttentionParams& params, int64_t seq_q, int64_t seq_k) const {
  const PairKey key = pair_key(params, seq_q, seq_k);
  auto it = runs_.find(key);
  if (it == runs_.end()) {
    const PairPositions p = pair_positions(params, seq_q, seq_k);
    it = runs_.emplace(key, std::pair{arithmetic_runs(p.q), arithmetic_runs(p.k)}).first;
  }
  return it->second;
}

StatusOr<TensorView> CudaKernelBackend::scratch(int slot, DType dtype, const std::vector<int64_t>& shape,
                                                const TensorView& like) const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  SP_RETURN_IF_ERROR(scratch_[slot].reserve(std::max<size_t>(1, n * dtype_size(dtype))));
  return TensorView::contiguous(scratch_[slot].data(), dtype, shape, like.device);
}

CudaKernelBackend::PartLease::~PartLease() {
  for (StreamBuffer& b : taken_) b.release(stream_);
}

StatusOr<TensorView> CudaKernelBackend::PartLease::take(DType dtype, const std::vector<int64_t>& shape,
                                                        const TensorView& like) {
  const TensorView view = TensorView::contiguous(nullptr, dtype, shape, like.device);
  SP_ASSIGN_OR_RETURN(StreamBuffer b, StreamBuffer::allocate(view.numel() * dtype_size(dtype), stream_));
  taken_.push_back(std::move(b));
  return TensorView::contiguous(taken_.back().data(), dtype, shape, like.device);
}

StatusOr<TensorView> CudaKernelBackend::stat_rows(int slot, const TensorView& stats, int64_t begin, int64_t end,
                                                  void* stream) const {
  SP_ASSIGN_OR_RETURN(TensorView out, scratch(slot, DType::kF32, {stats.shape[0], stats.shape[1], end - begin}, stats));
  SP_RETURN_IF_ERROR(flash_cast(stats.narrow(2, begin, end), out, stream));
  return out;
}

Status CudaKernelBackend::settle_forward(const TensorView& o_part, const TensorView& lse_part, const TensorView& o,
                                         const TensorView& lse, bool fresh, void* stream) const {
  if (!fresh) return flash_merge_partials(o, lse, o_part, lse_part, stream);
  SP_RETURN_IF_ERROR(flash_cast(o_part, o, stream));
  return flash_cast(lse_part, lse, stream);
}

Status CudaKernelBackend::settle_gradient(const TensorView& part, const TensorView& out, bool fresh,
                                          void* stream) const {
  return fresh ? flash_cast(part, out, stream) : accumulate(out, part, stream);
}

namespace {
FlashPositions run_positions(const PositionRunSpan& q, const PositionRunSpan& k) {
  FlashPositions p;
  p.q = {q.offset, q.stride};
  p.k = {k.offset, k.stride};
  return p;
}
// The kernels read positions from the runs alone.
AttentionParams without_positions(const AttentionParams& params) {
  AttentionParams p = params;
  p.q_positions = p.k_positions = nullptr;
  return p;
}
enum Slot { kLseRows, kDeltaRows };
}  // namespace

Status CudaKernelBackend::forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const AttentionParams& params, const TensorView& o, const TensorView& lse,
                                  FreshOutputs fresh, void* stream) const {
  // Our kernels add into the fp32 result as they go: a fresh one is cleared first.
  if (fresh.o) {
    SP_RETURN_IF_ERROR(flash_fill(o, 0.0f, stream));
    SP_RETURN_IF_ERROR(flash_fill(lse, -INFINITY, stream));
  }
  const int64_t n = q.shape[1];
  const AttentionParams plain = without_positions(params);
  const auto& [q_runs, k_runs] = runs(params, n, k.shape[1]);
  for (const PositionRunSpan& qr : q_runs) {
    // The kernels take contiguous row stats: a run's rows, or a caller's strided view, are staged.
    const bool staged = !(qr.begin == 0 && qr.end == n) || !lse.is_contiguous();
    TensorView lse_rows = lse;
    if (staged) {
      SP_ASSIGN_OR_RETURN(lse_rows, stat_rows(kLseRows, lse, qr.begin, qr.end, stream));
    }
    for (const PositionRunSpan& kr : k_runs)
      SP_RETURN_IF_ERROR(flash_attention_forward(q.narrow(1, qr.begin, qr.end), k.narrow(1, kr.begin, kr.end),
                                                 v.narrow(1, kr.begin, kr.end), plain, run_positions(qr, kr),
                                                 o.narrow(1, qr.begin, qr.end), lse_rows, /*accumulate=*/true,
                                                 TensorView{}, stream));
    if (staged) SP_RETURN_IF_ERROR(flash_cast(lse_rows, lse.narrow(2, qr.begin, qr.end), stream));
  }
  return Status::Ok();
}

Status CudaKernelBackend::backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& dout, const TensorView& lse, const TensorView& delta,
                                   const AttentionParams& params, const TensorView& dq, const TensorView& dk,
                                   const TensorView& dv, FreshOutputs fresh, void* stream) const {
  if (fresh.dq) SP_RETURN_IF_ERROR(flash_fill(dq, 0.0f, stream));
  if (fresh.dkv) SP_RETURN_IF_ERROR(flash_fill(dk, 0.0f, stream));
  if (fresh.dkv) SP_RETURN_IF_ERROR(flash_fill(dv, 0.0f, stream));
  const int64_t n = q.shape[1];
  const AttentionParams plain = without_positions(params);
  const auto& [q_runs, k_runs] = runs(params, n, k.shape[1]);
  for (const PositionRunSpan& qr : q_runs) {
    const bool staged = !(qr.begin == 0 && qr.end == n) || !lse.is_contiguous() || !delta.is_contiguous();
    TensorView lse_rows = lse, delta_rows = delta;
    if (staged) {
      SP_ASSIGN_OR_RETURN(lse_rows, stat_rows(kLseRows, lse, qr.begin, qr.end, stream));
      SP_ASSIGN_OR_RETURN(delta_rows, stat_rows(kDeltaRows, delta, qr.begin, qr.end, stream));
    }
    for (const PositionRunSpan& kr : k_runs)
      SP_RETURN_IF_ERROR(flash_attention_backward(
          q.narrow(1, qr.begin, qr.end), k.narrow(1, kr.begin, kr.end), v.narrow(1, kr.begin, kr.end),
          dout.narrow(1, qr.begin, qr.end), lse_rows, delta_rows, plain, run_positions(qr, kr),
          dq.narrow(1, qr.begin, qr.end), dk.narrow(1, kr.begin, kr.end), dv.narrow(1, kr.begin, kr.end), stream));
  }
  return Status::Ok();
}

Status CudaKernelBackend::delta(const TensorView& o, const TensorView& dout, const TensorView& d, void* stream) const {
  return flash_attention_delta(o, dout, d, stream);
}

Status CudaKernelBackend::merge(const TensorView& o, const TensorView& lse, const TensorView& o_part,
                                const TensorView& lse_part, void* stream) const {
  return flash_merge_partials(o, lse, o_part, lse_part, stream);
}

// Targets in the inputs' dtype (results held rounded) are summed in fp32 and rounded once.
Status CudaKernelBackend::accumulate(const TensorView& acc, const TensorView& x, void* stream) const {
  return acc.dtype == DType::kF32 ? flash_accumulate(x, acc, stream) : flash_add_cast(x, acc, acc, stream);
}

}  // namespace seqpar::cuda
