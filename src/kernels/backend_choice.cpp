// The per-call backend choice ("auto", make_auto_backend in include/seqpar/backend.hpp): one
// backend that holds cuDNN, our Hopper kernels and our mma.sync kernels and hands each forward
// and backward call to the fastest of them that takes it, by a small measured preference table
// (kPreferences), and counts which ran (calls_by_backend).
//
// One contract for both passes, so a step's forward and backward may run on different kernels:
// results as fp32 or input-dtype (O, LSE) parts that continue a running result (caps:
// writes_parts), and the backward against the global LSE and D (caps: takes_delta). Hopper and
// our kernels take D; cuDNN computes D from O itself and cannot take it, so cuDNN runs forward
// calls only (measured, the Hopper backward is 0.97-1.10x cuDNN's at D = 128; docs/RESULTS.md).
// Our kernels write fp32 only: where the executor hands this backend outputs in the inputs' dtype,
// their calls go through fp32 parts merged or added in (as the Hopper backend does).
#include "seqpar/backend.hpp"

#ifdef SEQPAR_HAVE_HOPPER  // (which implies CUDA)
#include <algorithm>
#include <array>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/hopper/hopper_args.hpp"
#endif

namespace seqpar {
#ifdef SEQPAR_HAVE_HOPPER
namespace {

enum Which { kCudnn, kHopper, kCuda, kBackends, kNone = kBackends };
constexpr const char* kNames[kBackends] = {"cudnn", "hopper", "cuda"};

// The masks the table tells apart: dense (full, or a causal band: what cuDNN plans into dense
// calls) and the rest (documents, left-bounded windows, block patterns).
bool dense_mask(const MaskSpec& m) { return !m.has_documents() && !m.has_block_pattern() && m.window_left < 0; }

// The order of preference for a call, by pass, mask class and the call's longer side (rows).
// Measured (docs/RESULTS.md, "Issue 34"): the Hopper forward is 1.03-1.15x cuDNN's from 8K to 32K
// (one H200) and 1.01x / 1.18x at 32K / 128K causal (one H100); below 8K nothing was measured, so
// cuDNN keeps those calls as the default before this table did. cuDNN refuses documents, windows
// and block patterns; there the Hopper kernels run 3-5x ours. The backward never goes to cuDNN
// (see the top of the file); the Hopper backward is 2x ours and more. A backend whose supports()
// takes a call may still refuse it once it sees K/V (kUnsupported, having written nothing): the
// call then goes to the next.
struct Preference {
  bool backward, dense;
  int64_t min_rows;  // the row at which this line starts (the longest line that applies wins)
  std::array<Which, kBackends> order;
};
constexpr Preference kPreferences[] = {
    {false, true, 0, {kCudnn, kHopper, kCuda}},
    {false, true, 8192, {kHopper, kCudnn, kCuda}},
    {false, false, 0, {kHopper, kCudnn, kCuda}},
    {true, true, 0, {kHopper, kCuda, kNone}},
    {true, false, 0, {kHopper, kCuda, kNone}},
};
const Preference& preference(bool backward, const MaskSpec& mask, int64_t rows) {
  const Preference* best = nullptr;
  for (const Preference& p : kPreferences)
    if (p.backward == backward && p.dense == dense_mask(mask) && rows >= p.min_rows &&
        (!best || p.min_rows > best->min_rows))
      best = &p;
  return *best;
}

class ChoosingBackend : public cuda::CudaKernelBackend {
 public:
  ChoosingBackend(std::unique_ptr<AttentionBackend> cudnn, std::unique_ptr<AttentionBackend> hopper,
                  std::unique_ptr<AttentionBackend> own) {
    held_[kCudnn] = std::move(cudnn), held_[kHopper] = std::move(hopper), held_[kCuda] = std::move(own);
  }
  const char* name() const override { return "auto"; }
  BackendCaps caps() const override {
    BackendCaps c;
    c.takes_delta = true;
    c.writes_parts = true;
    c.device = true;
    return c;
  }
  // Empty for problems the Hopper kernels take (bf16, head dim 64 or 128: elsewhere cuDNN and ours
  // keep their old roles, cuDNN's backward included) whose positions the Hopper kernels or ours
  // take (every call's backward needs one of them); else why not.
  std::string supports(const TensorView& q, const AttentionParams& params) const override {
    AttentionParams problem = params;
    problem.q_positions = problem.k_positions = nullptr;
    if (std::string why = held_[kHopper]->supports(q, problem); !why.empty())
      return "auto takes the problems the Hopper kernels take: " + why;
    const std::string why_hopper = held_[kHopper]->supports(q, params);
    if (why_hopper.empty()) return {};
    const std::string why_cuda = held_[kCuda] ? held_[kCuda]->supports(q, params) : "no CUDA kernels";
    if (why_cuda.empty()) return {};
    return "neither the Hopper kernels (" + why_hopper + ") nor ours (" + why_cuda + ") take this problem";
  }

  Status forward(const TensorView& q, const TensorView& k, const TensorView& v, const AttentionParams& params,
                 const TensorView& o, const TensorView& lse, FreshOutputs fresh, void* stream) const override {
    return delegate(false, q, k, params, [&](const AttentionBackend& b) {
      return forward_on(b, q, k, v, params, o, lse, fresh, stream);
    });
  }

  Status backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                  const TensorView& lse, const TensorView& delta, const AttentionParams& params, const TensorView& dq,
                  const TensorView& dk, const TensorView& dv, FreshOutputs fresh, void* stream) const override {
    return delegate(true, q, k, params, [&](const AttentionBackend& b) {
      return backward_on(b, q, k, v, dout, lse, delta, params, dq, dk, dv, fresh, stream);
    });
  }

  std::vector<std::pair<std::string, int64_t>> calls_by_backend() const override {
    std::vector<std::pair<std::string, int64_t>> out;
    for (int pass = 0; pass < 2; ++pass)
      for (int w = 0; w < kBackends; ++w)
        if (calls_[pass][w] > 0) out.emplace_back(std::string(pass ? "backward " : "forward ") + kNames[w], calls_[pass][w]);
    return out;
  }

 private:
  // Runs the call on the first backend of its preference order that takes it (cuDNN never in
  // the backward) and counts it.
  template <class Call>
  Status delegate(bool backward, const TensorView& q, const TensorView& k, const AttentionParams& params,
                  const Call& call) const {
    const int64_t rows = std::max(q.ndim > 1 ? q.shape[1] : 0, k.ndim > 1 ? k.shape[1] : 0);
    std::string why = "no backend takes this call:";
    for (Which w : preference(backward, params.mask, rows).order) {
      if (w == kNone || !held_[w] || (backward && w == kCudnn)) continue;
      std::string no = held_[w]->supports(q, params);
      if (no.empty()) {
        Status s = call(*held_[w]);
        if (s.code() != StatusCode::kUnsupported) {
          if (s.ok()) ++calls_[backward][w];
          return s;
        }
        no = s.message();
      }
      why += std::string(" ") + kNames[w] + ": " + no + ";";
    }
    return Status(StatusCode::kUnsupported, why);
  }

  Status forward_on(const AttentionBackend& b, const TensorView& q, const TensorView& k, const TensorView& v,
                    const AttentionParams& params, const TensorView& o, const TensorView& lse, FreshOutputs fresh,
                    void* stream) const {
    if (b.caps().writes_parts || (o.dtype == DType::kF32 && lse.dtype == DType::kF32))
      return b.forward(q, k, v, params, o, lse, fresh, stream);
    // Our kernels add into fp32 results: this call's part, then cast or merged in.
    PartLease lease(stream);
    SP_ASSIGN_OR_RETURN(const TensorView o_part, lease.take(DType::kF32, {q.shape[0], q.shape[1], q.shape[2], q.shape[3]}, q));
    SP_ASSIGN_OR_RETURN(const TensorView lse_part, lease.take(DType::kF32, {q.shape[0], q.shape[2], q.shape[1]}, q));
    SP_RETURN_IF_ERROR(b.forward(q, k, v, params, o_part, lse_part, FreshOutputs{true, false, false}, stream));
    return settle_forward(o_part, lse_part, o, lse, fresh.o, stream);
  }

  Status backward_on(const AttentionBackend& b, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& dout, const TensorView& lse, const TensorView& delta,
                     const AttentionParams& params, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                     FreshOutputs fresh, void* stream) const {
    const bool q_f32 = dq.dtype == DType::kF32, kv_f32 = dk.dtype == DType::kF32 && dv.dtype == DType::kF32;
    if (b.caps().writes_parts || (q_f32 && kv_f32))
      return b.backward(q, k, v, dout, lse, delta, params, dq, dk, dv, fresh, stream);
    // Our kernels add into fp32 gradients: fp32 parts where the outputs are not, then cast or added in.
    PartLease lease(stream);
    TensorView dq_to = dq, dk_to = dk, dv_to = dv;
    FreshOutputs to_fresh = fresh;
    if (!q_f32) {
      SP_ASSIGN_OR_RETURN(dq_to, lease.take(DType::kF32, {q.shape[0], q.shape[1], q.shape[2], q.shape[3]}, q));
      to_fresh.dq = true;
    }
    if (!kv_f32) {
      const std::vector<int64_t> shape{k.shape[0], k.shape[1], k.shape[2], k.shape[3]};
      SP_ASSIGN_OR_RETURN(dk_to, lease.take(DType::kF32, shape, q));
      SP_ASSIGN_OR_RETURN(dv_to, lease.take(DType::kF32, shape, q));
      to_fresh.dkv = true;
    }
    SP_RETURN_IF_ERROR(b.backward(q, k, v, dout, lse, delta, params, dq_to, dk_to, dv_to, to_fresh, stream));
    if (!q_f32) SP_RETURN_IF_ERROR(settle_gradient(dq_to, dq, fresh.dq, stream));
    if (!kv_f32) SP_RETURN_IF_ERROR(settle_gradient(dk_to, dk, fresh.dkv, stream));
    if (!kv_f32) SP_RETURN_IF_ERROR(settle_gradient(dv_to, dv, fresh.dkv, stream));
    return Status::Ok();
  }


  std::unique_ptr<AttentionBackend> held_[kBackends];
  mutable int64_t calls_[2][kBackends] = {};
};

}  // namespace
#endif

std::unique_ptr<AttentionBackend> make_auto_backend(int device, int64_t max_call_rows) {
#ifdef SEQPAR_HAVE_HOPPER
  std::unique_ptr<AttentionBackend> hopper = make_hopper_backend();
  if (!hopper || *hopper::device_refusal(device) != 0) return nullptr;  // not an sm_90 device
  return std::make_unique<ChoosingBackend>(make_cudnn_backend(max_call_rows), std::move(hopper), make_cuda_backend());
#else
  (void)device, (void)max_call_rows;
  return nullptr;
#endif
}

}  // namespace seqpar
