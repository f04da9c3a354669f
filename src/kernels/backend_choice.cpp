// The per-call backend choice ("auto", make_auto_backend in include/seqpar/backend.hpp): one
// backend that holds cuDNN, our Hopper kernels and our mma.sync kernels and hands each forward
// and backward call to the fastest of them that takes it, by a small measured preference table
// (kPreferences), and counts which ran (calls_by_backend).
//
// One contract for both passes, so a step's forward and backward may run on different kernels:
// results as fp32 or input-dtype (O, LSE) parts that continue a running result (caps:
// writes_parts), and the backward against the global LSE and D (caps: takes_delta). Hopper and
// our kernels take D; cuDNN computes D from O itself and cannot take it. So the backward goes to
// cuDNN only in the variant made with backward_from_o, whose backward gets O (caps: !takes_delta;
// the schedules' query packs carry O) and makes D from it for the call's rows where another
// kernel runs it: that variant serves the head dims where the table puts cuDNN's backward first
// (auto_backward_from_o; none since the Hopper backward's 128-row query tiles at D = 64), the
// other one the rest (the Hopper backward is 1.04-1.18x cuDNN's at D = 128 with 80-row query
// tiles and 1.10-1.30x at D = 64, one H200; docs/RESULTS.md, dev/hopper_attention/README.md).
// Our kernels write fp32 only: where the executor hands this backend outputs in the inputs' dtype,
// their calls go through fp32 parts merged or added in (as the Hopper backend does).
#include "seqpar/backend.hpp"

#include <array>
#include <utility>

#ifdef SEQPAR_HAVE_HOPPER  // (which implies CUDA)
#include <algorithm>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/hopper/hopper_args.hpp"
#endif

namespace seqpar {
namespace {

enum Which { kCudnn, kHopper, kCuda, kBackends, kNone = kBackends };
[[maybe_unused]] constexpr const char* kNames[kBackends] = {"cudnn", "hopper", "cuda"};

// The masks the table tells apart: dense (full, or a causal band: what cuDNN plans into dense
// calls) and the rest (documents, left-bounded windows, block patterns).
[[maybe_unused]] bool dense_mask(const MaskSpec& m) { return !m.has_documents() && !m.has_block_pattern() && m.window_left < 0; }

// The order of preference for a call, by pass, mask class and the call's longer side (rows).
// Measured (docs/RESULTS.md, "Issue 34"): the Hopper forward is 1.03-1.15x cuDNN's from 8K to 32K
// (one H200) and 1.01x / 1.18x at 32K / 128K causal (one H100); below 8K nothing was measured, so
// cuDNN keeps those calls as the default before this table did. cuDNN refuses documents, windows
// and block patterns; there the Hopper kernels run 3-5x ours. The backward: Hopper at D = 128
// (0.97-1.10x cuDNN's) and at D = 64 (1.10-1.30x cuDNN's with 128-row query tiles, 8K-32K, one
// H200; cuDNN led there before them, the 64-row tiles running 0.83-0.99x), cuDNN second at D = 64
// where the call has O; the Hopper backward is 2x ours and more. A backend whose supports() takes a call may still refuse it once it sees K/V
// (kUnsupported, having written nothing): the call then goes to the next.
struct Preference {
  bool backward, dense;
  int64_t min_rows;  // the row at which this line starts (the longest line that applies wins)
  int64_t head_dim;  // 0: any (a line for the call's head dim wins over those)
  std::array<Which, kBackends> order;
};
constexpr Preference kPreferences[] = {
    {false, true, 0, 0, {kCudnn, kHopper, kCuda}},
    {false, true, 8192, 0, {kHopper, kCudnn, kCuda}},
    {false, false, 0, 0, {kHopper, kCudnn, kCuda}},
    {true, true, 0, 0, {kHopper, kCuda, kNone}},
    {true, true, 0, 64, {kHopper, kCudnn, kCuda}},
    {true, false, 0, 0, {kHopper, kCuda, kNone}},
};
[[maybe_unused]] const Preference& preference(bool backward, const MaskSpec& mask, int64_t rows, int64_t head_dim) {
  const Preference* best = nullptr;
  const auto rank = [](const Preference& p) { return std::pair(p.head_dim != 0, p.min_rows); };
  for (const Preference& p : kPreferences)
    if (p.backward == backward && p.dense == dense_mask(mask) && rows >= p.min_rows &&
        (p.head_dim == 0 || p.head_dim == head_dim) && (!best || rank(p) > rank(*best)))
      best = &p;
  return *best;
}

}  // namespace

#ifdef SEQPAR_HAVE_HOPPER
namespace {

class ChoosingBackend : public cuda::CudaKernelBackend {
 public:
  ChoosingBackend(std::unique_ptr<AttentionBackend> cudnn, std::unique_ptr<AttentionBackend> hopper,
                  std::unique_ptr<AttentionBackend> own, bool backward_from_o)
      : from_o_(backward_from_o) {
    held_[kCudnn] = std::move(cudnn), held_[kHopper] = std::move(hopper), held_[kCuda] = std::move(own);
  }
  const char* name() const override { return "auto"; }
  BackendCaps caps() const override {
    BackendCaps c;
    c.takes_delta = !from_o_;
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
    // With O in `delta` (from_o_): cuDNN takes it as it is, the kernels that take D get it made
    // for these rows, once.
    PartLease lease(stream);
    TensorView d;
    return delegate(true, q, k, params, [&](const AttentionBackend& b) -> Status {
      const bool make_d = from_o_ && b.caps().takes_delta;
      if (make_d && !d.data) {
        SP_ASSIGN_OR_RETURN(d, lease.take(DType::kF32, {q.shape[0], q.shape[2], q.shape[1]}, q));
        SP_RETURN_IF_ERROR(CudaKernelBackend::delta(delta, dout, d, stream));
      }
      return backward_on(b, q, k, v, dout, lse, make_d ? d : delta, params, dq, dk, dv, fresh, stream);
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
  // Runs the call on the first backend of its preference order that takes it (cuDNN in the
  // backward only where the call has O) and counts it.
  template <class Call>
  Status delegate(bool backward, const TensorView& q, const TensorView& k, const AttentionParams& params,
                  const Call& call) const {
    const int64_t rows = std::max(q.ndim > 1 ? q.shape[1] : 0, k.ndim > 1 ? k.shape[1] : 0);
    std::string why = "no backend takes this call:";
    for (Which w : preference(backward, params.mask, rows, q.ndim > 3 ? q.shape[3] : 0).order) {
      if (w == kNone || !held_[w] || (backward && w == kCudnn && !from_o_)) continue;
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
  bool from_o_;  // the backward gets O (the packs carry it), so cuDNN may take backward calls
  mutable int64_t calls_[2][kBackends] = {};
};

}  // namespace
#endif

std::unique_ptr<AttentionBackend> make_auto_backend(int device, int64_t max_call_rows, bool backward_from_o) {
#ifdef SEQPAR_HAVE_HOPPER
  std::unique_ptr<AttentionBackend> hopper = make_hopper_backend();
  if (!hopper || *hopper::device_refusal(device) != 0) return nullptr;  // not an sm_90 device
  std::unique_ptr<AttentionBackend> cudnn = make_cudnn_backend(max_call_rows);
  const bool from_o = backward_from_o && cudnn;  // without cuDNN, O in the packs would buy nothing
  return std::make_unique<ChoosingBackend>(std::move(cudnn), std::move(hopper), make_cuda_backend(), from_o);
#else
  (void)device, (void)max_call_rows, (void)backward_from_o;
  return nullptr;
#endif
}

bool auto_backward_from_o(int64_t head_dim) {
  for (const Preference& p : kPreferences)
    if (p.backward && p.head_dim == head_dim && p.order[0] == kCudnn) return true;
  return false;
}

}  // namespace seqpar
