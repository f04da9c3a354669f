// The GPU executor of the ring-style schedules (see include/seqpar/gpu_ring.hpp): per head
// group, the ring forward (K/V travel, running O/LSE), the ring backward (K/V travel with the
// fp32 dK/dV accumulators) and the Burst backward (Q, dO, O, LSE travel ahead, the fp32 dQ one
// round behind), each step's local work planned into cuDNN calls or our own kernels. Two ranks
// take their own backward (two_rank_backward): what each computes for its peer returns once,
// and results are summed in place in the caller's outputs (Running, gpu_running.hpp).
#include "seqpar/gpu_ring.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "core/cuda_check.hpp"
#include "parallel/gpu_running.hpp"
#include "parallel/ring_common.hpp"
#include "seqpar/block_plan.hpp"
#include "seqpar/flash_cuda.hpp"
#include "seqpar/gpu.hpp"
#ifdef SEQPAR_HAVE_CUDNN
#include "seqpar/cudnn_attention.hpp"
#endif

namespace seqpar {

using parallel::Running;
using parallel::wrap;

struct GpuRingContext::Impl {
  std::map<std::string, DeviceBuffer> buffers;
  std::string plan_key;  // layout and mask the cached plans belong to
  std::map<std::pair<int, int>, BlockPlan> plans;
  std::map<std::pair<int, int>, bool> visible_pairs;
  std::map<int, std::vector<PositionRunSpan>> runs;  // arithmetic runs of each rank's positions
  cudaStream_t finish_stream = nullptr;  // finishes a group's result that travelled home
  cudaEvent_t finished = nullptr;        // recorded on finish_stream after those casts
  cudaEvent_t computed = nullptr;        // recorded on the caller's stream before them
  int device = 0;
  bool tracing = false;
  int64_t max_call_rows = 0;  // GpuRingOptions::max_call_rows
  std::vector<std::pair<std::string, cudaEvent_t>> marks;  // with GpuRingOptions::trace

  ~Impl() {
    drop_marks();
    if (finished) (void)cudaEventDestroy(finished);
    if (computed) (void)cudaEventDestroy(computed);
    if (finish_stream) (void)cudaStreamDestroy(finish_stream);
  }

  // Records a milestone of the schedule on `s` (tracing only).
  Status mark(cudaStream_t s, const char* phase, int group, int step, const char* what) {
    if (!tracing) return Status::Ok();
    cudaEvent_t e;
    SP_CUDA_CHECK(cudaEventCreate(&e));
    marks.emplace_back(std::string(phase) + " g" + std::to_string(group) +
                           (step >= 0 ? " s" + std::to_string(step) : std::string()) + ' ' + what,
                       e);
    SP_CUDA_CHECK(cudaEventRecord(e, s));
    return Status::Ok();
  }
  void drop_marks() {
    for (auto& m : marks) (void)cudaEventDestroy(m.second);
    marks.clear();
  }

  Status init() {
    if (finish_stream) return Status::Ok();
    SP_CUDA_CHECK(cudaGetDevice(&device));
    SP_CUDA_CHECK(cudaStreamCreateWithFlags(&finish_stream, cudaStreamNonBlocking));
    SP_CUDA_CHECK(cudaEventCreateWithFlags(&finished, cudaEventDisableTiming));
    SP_CUDA_CHECK(cudaEventCreateWithFlags(&computed, cudaEventDisableTiming));
    SP_CUDA_CHECK(cudaEventRecord(finished, finish_stream));
    return Status::Ok();
  }

  // Sizes the per-call scratch of a phase for its largest call up front, so no buffer grows
  // (and no block is retired) in the middle of a schedule. Buffers are named by role and
  // shared between the forward and the backwards: the workspace peak is the larger phase's.
  // accumulators: whether the schedule keeps fp32 running results (more than two ranks, or our
  // own kernels); with two, results are summed in place in the outputs.
  Status presize(int64_t B, int64_t rows, int64_t heads, int64_t kv_heads, int64_t D, DType t,
                 bool accumulators) {
    const size_t stats = B * heads * rows * sizeof(float);
    for (const char* name : {"lse_part", "lse_rows", "delta_rows", "delta"})
      SP_RETURN_IF_ERROR(buffers[name].reserve(stats));
    SP_RETURN_IF_ERROR(buffers["part_q"].reserve(B * rows * heads * D * dtype_size(t)));
    // The fp32 O of the forward, also Burst's first dQ accumulator: sized for the longest shard.
    if (accumulators) SP_RETURN_IF_ERROR(buffers["acc_q"].reserve(B * rows * heads * D * sizeof(float)));
    for (const char* name : {"part_k", "part_v"})
      SP_RETURN_IF_ERROR(buffers[name].reserve(B * rows * kv_heads * D * dtype_size(t)));
    return Status::Ok();
  }

  // A contiguous device view of `shape` in the buffer called `name` (grown as needed).
  StatusOr<TensorView> buffer(const std::string& name, DType dtype, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    SP_RETURN_IF_ERROR(buffers[name].reserve(std::max<size_t>(1, n * dtype_size(dtype))));
    return device_view(buffers[name].data(), dtype, shape);
  }

  TensorView device_view(void* data, DType dtype, const std::vector<int64_t>& shape) const {
    return TensorView::contiguous(data, dtype, shape, Device{DeviceKind::kCuda, device});
  }

  // Plans and visibility are cached per (query shard, K/V shard) of one layout and mask.
  void use_problem(const Layout& layout, const MaskSpec& mask) {
    std::string key = std::string(layout_name(layout.kind())) + ':' + std::to_string(layout.seq_len()) +
                      ':' + std::to_string(layout.ranks()) + ':' + std::to_string(mask.window_left) +
                      ',' + std::to_string(mask.window_right);
    for (int64_t d : mask.doc_offsets) key += ',' + std::to_string(d);
    if (key != plan_key) plans.clear(), visible_pairs.clear(), runs.clear(), plan_key = key;
  }

  const std::vector<PositionRunSpan>& position_runs(const Layout& layout, int rank) {
    auto it = runs.find(rank);
    if (it == runs.end()) it = runs.emplace(rank, arithmetic_runs(layout.positions(rank))).first;
    return it->second;
  }

  bool visible(const Layout& layout, const AttentionParams& params, int q_rank, int k_rank) {
    use_problem(layout, params.mask);
    auto it = visible_pairs.find({q_rank, k_rank});
    if (it == visible_pairs.end())
      it = visible_pairs.emplace(std::pair{q_rank, k_rank},
                                 params.mask.sees_any(layout.positions(q_rank), layout.positions(k_rank)))
               .first;
    return it->second;
  }

  // The backward auto would pick (the forward sizes its head groups for it). Its byte count
  // plans every pair of shards, host work the GPU would wait for at each forward's start, so
  // it is worked out once per problem.
  BackwardSchedule likely_backward(const Layout& layout, const AttentionParams& params, int64_t B,
                                   int64_t H, int64_t Hkv, int64_t D, DType t, bool own) {
    use_problem(layout, params.mask);
    std::string key = plan_key + '|' + std::to_string(B) + ',' + std::to_string(H) + ',' +
                      std::to_string(Hkv) + ',' + std::to_string(D) + ',' + dtype_name(t) + (own ? ",own" : "");
    if (key != likely_key) {
      likely_schedule = choose_gpu_backward(layout, params, B, H, Hkv, D, t, own);
      likely_key = std::move(key);
    }
    return likely_schedule;
  }
  std::string likely_key;
  BackwardSchedule likely_schedule = BackwardSchedule::kRing;

  const BlockPlan& plan(const Layout& layout, const MaskSpec& mask, int q_rank, int k_rank) {
    use_problem(layout, mask);
    auto it = plans.find({q_rank, k_rank});
    if (it == plans.end())
      it = plans.emplace(std::pair{q_rank, k_rank},
                         limit_call_rows(plan_block_pair(layout.positions(q_rank), layout.positions(k_rank), mask),
                                         max_call_rows))
               .first;
    return it->second;
  }
};

GpuRingContext::GpuRingContext(GpuRingOptions options)
    : options_(options), impl_(std::make_unique<Impl>()) {
  impl_->tracing = options.trace;
  impl_->max_call_rows = options.max_call_rows;
}
GpuRingContext::~GpuRingContext() = default;

StatusOr<std::vector<std::pair<std::string, double>>> GpuRingContext::take_trace() {
  Impl& I = *impl_;
  std::vector<std::pair<std::string, double>> out;
  if (I.marks.empty()) return out;
  SP_CUDA_CHECK(cudaEventSynchronize(I.marks.back().second));
  for (const auto& [label, e] : I.marks) {
    float ms = 0;
    SP_CUDA_CHECK(cudaEventElapsedTime(&ms, I.marks.front().second, e));
    out.emplace_back(label, ms);
  }
  I.drop_marks();
  return out;
}

namespace {

using Impl = GpuRingContext::Impl;


// Heads [first, first + count) of a [B, S, H, D] (dim 2) or [B, H, S] (dim 1) view.
TensorView heads_of(const TensorView& t, int dim, int64_t first, int64_t count) {
  return t.narrow(dim, first, first + count);
}

// The local work of one (query shard, K/V shard) pair.
struct Pair {
  const Layout& layout;
  const AttentionParams& params;
  int q_rank, k_rank;
  bool own_kernels;  // our kernels over position runs instead of planned cuDNN calls
};

bool cudnn_built() {
#ifdef SEQPAR_HAVE_CUDNN
  return true;
#else
  return false;
#endif
}

AttentionParams dense_params(const AttentionParams& params, bool causal) {
  AttentionParams p;
  p.scale = params.scale;
  p.mask = causal ? MaskSpec::causal() : MaskSpec::none();
  return p;
}

// Copies rows [begin, end) of a [B, H, S] fp32 view into the contiguous buffer `name`.
StatusOr<TensorView> stat_rows(Impl& I, const char* name, const TensorView& stats, int64_t begin,
                               int64_t end, cudaStream_t s) {
  SP_ASSIGN_OR_RETURN(TensorView out, I.buffer(name, DType::kF32, {stats.shape[0], stats.shape[1], end - begin}));
  SP_RETURN_IF_ERROR(flash_cast(stats.narrow(2, begin, end), out, s));
  return out;
}

FlashPositions run_positions(const PositionRunSpan& q, const PositionRunSpan& k) {
  FlashPositions p;
  p.q = {q.offset, q.stride};
  p.k = {k.offset, k.stride};
  return p;
}

// Our kernels' calls for a pair: one per (query run, key run) of the two shards' positions.
template <class Call>
Status for_each_run_pair(Impl& I, const Pair& pair, Call&& call) {
  I.use_problem(pair.layout, pair.params.mask);
  for (const PositionRunSpan& qr : I.position_runs(pair.layout, pair.q_rank))
    for (const PositionRunSpan& kr : I.position_runs(pair.layout, pair.k_rank))
      SP_RETURN_IF_ERROR(call(qr, kr));
  return Status::Ok();
}

// cuDNN's calls for a pair (dense blocks: full or top-left causal).
StatusOr<const BlockPlan*> dense_plan(Impl& I, const Pair& pair) {
  const BlockPlan& plan = I.plan(pair.layout, pair.params.mask, pair.q_rank, pair.k_rank);
  SP_CHECK_SUPPORTED(plan.dense, "internal: a planned pair needs positions");
  return &plan;
}

// Folds K/V shard `k, v` into the running output `out` (O [B, n, Hg, D], LSE [B, Hg, n]).
Status block_forward(Impl& I, const Pair& pair, const TensorView& q, const TensorView& k,
                     const TensorView& v, Running& out, cudaStream_t s, int64_t* calls) {
  const int64_t B = q.shape[0], H = q.shape[2], D = q.shape[3], n = q.shape[1];
  if (pair.own_kernels) {  // our forward continues from the running fp32 result itself
    SP_RETURN_IF_ERROR(out.materialize(s));
    return for_each_run_pair(I, pair, [&](const PositionRunSpan& qr, const PositionRunSpan& kr) -> Status {
      const bool whole = qr.begin == 0 && qr.end == n;
      TensorView lse_v = out.lse();
      if (!whole) {
        SP_ASSIGN_OR_RETURN(lse_v, stat_rows(I, "lse_rows", out.lse(), qr.begin, qr.end, s));
      }
      SP_RETURN_IF_ERROR(flash_attention_forward(
          q.narrow(1, qr.begin, qr.end), k.narrow(1, kr.begin, kr.end),
          v.narrow(1, kr.begin, kr.end), pair.params, run_positions(qr, kr),
          out.acc().narrow(1, qr.begin, qr.end), lse_v, /*accumulate=*/true, TensorView{}, s));
      if (!whole) SP_RETURN_IF_ERROR(flash_cast(lse_v, out.lse().narrow(2, qr.begin, qr.end), s));
      ++*calls;
      return Status::Ok();
    });
  }
#ifdef SEQPAR_HAVE_CUDNN
  SP_ASSIGN_OR_RETURN(const BlockPlan* plan, dense_plan(I, pair));
  for (const BlockCall& c : plan->calls) {
    const int64_t nq = c.q_end - c.q_begin;
    SP_RETURN_IF_ERROR(out.flush(s));  // the held part's buffer is about to be rewritten
    TensorView o_part = out.out(), lse_part = out.out_lse();
    if (!out.first_in_place(c.q_begin, c.q_end)) {
      SP_ASSIGN_OR_RETURN(o_part, I.buffer(out.part_buffer(), q.dtype, {B, nq, H, D}));
      SP_ASSIGN_OR_RETURN(lse_part, I.buffer("lse_part", DType::kF32, {B, H, nq}));
    }
    SP_RETURN_IF_ERROR(cudnn_attention_forward(
        q.narrow(1, c.q_begin, c.q_end), k.narrow(1, c.k_begin, c.k_end),
        v.narrow(1, c.k_begin, c.k_end), dense_params(pair.params, c.causal), o_part, lse_part, s));
    out.hold(o_part, lse_part, c.q_begin, c.q_end);
    ++*calls;
  }
  return Status::Ok();
#else
  (void)B, (void)H, (void)D;
  return SP_STATUS(StatusCode::kUnsupported, "built without cuDNN");
#endif
}

// Adds this pair's gradients into the running dq [B, n, Hg, D] and dk, dv [B, m, Hkg, D].
// lse, delta: [B, Hg, n] fp32 (delta only read by our own kernels).
Status block_backward(Impl& I, const Pair& pair, const TensorView& q, const TensorView& k,
                      const TensorView& v, const TensorView& o, const TensorView& dout,
                      const TensorView& lse, const TensorView& delta, Running& dq, Running& dk,
                      Running& dv, cudaStream_t s, int64_t* calls) {
  const int64_t B = q.shape[0], H = q.shape[2], D = q.shape[3], n = q.shape[1], Hkv = k.shape[2];
  if (pair.own_kernels) {  // our backward adds into the fp32 results itself
    for (Running* r : {&dq, &dk, &dv}) SP_RETURN_IF_ERROR(r->materialize(s));
    return for_each_run_pair(I, pair, [&](const PositionRunSpan& qr, const PositionRunSpan& kr) -> Status {
      const bool whole = qr.begin == 0 && qr.end == n;
      TensorView lse_v = lse, delta_v = delta;
      if (!whole) {
        SP_ASSIGN_OR_RETURN(lse_v, stat_rows(I, "lse_rows", lse, qr.begin, qr.end, s));
        SP_ASSIGN_OR_RETURN(delta_v, stat_rows(I, "delta_rows", delta, qr.begin, qr.end, s));
      }
      SP_RETURN_IF_ERROR(flash_attention_backward(
          q.narrow(1, qr.begin, qr.end), k.narrow(1, kr.begin, kr.end),
          v.narrow(1, kr.begin, kr.end), dout.narrow(1, qr.begin, qr.end), lse_v, delta_v,
          pair.params, run_positions(qr, kr), dq.acc().narrow(1, qr.begin, qr.end),
          dk.acc().narrow(1, kr.begin, kr.end), dv.acc().narrow(1, kr.begin, kr.end), s));
      ++*calls;
      return Status::Ok();
    });
  }
#ifdef SEQPAR_HAVE_CUDNN
  SP_ASSIGN_OR_RETURN(const BlockPlan* plan, dense_plan(I, pair));
  for (const BlockCall& c : plan->calls) {
    const int64_t nq = c.q_end - c.q_begin;
    TensorView lse_c = lse;
    if (nq != n) {
      SP_ASSIGN_OR_RETURN(lse_c, stat_rows(I, "lse_rows", lse, c.q_begin, c.q_end, s));
    }
    // Each gradient goes straight into its output when it is the first part and covers it.
    const auto part = [&](Running& r, int64_t begin, int64_t end, int64_t heads) -> StatusOr<TensorView> {
      SP_RETURN_IF_ERROR(r.flush(s));
      if (r.first_in_place(begin, end)) return r.out();
      return I.buffer(r.part_buffer(), q.dtype, {B, end - begin, heads, D});
    };
    SP_ASSIGN_OR_RETURN(const TensorView dq_part, part(dq, c.q_begin, c.q_end, H));
    SP_ASSIGN_OR_RETURN(const TensorView dk_part, part(dk, c.k_begin, c.k_end, Hkv));
    SP_ASSIGN_OR_RETURN(const TensorView dv_part, part(dv, c.k_begin, c.k_end, Hkv));
    SP_RETURN_IF_ERROR(cudnn_attention_backward(
        q.narrow(1, c.q_begin, c.q_end), k.narrow(1, c.k_begin, c.k_end),
        v.narrow(1, c.k_begin, c.k_end), o.narrow(1, c.q_begin, c.q_end),
        dout.narrow(1, c.q_begin, c.q_end), lse_c, dense_params(pair.params, c.causal), dq_part,
        dk_part, dv_part, s));
    dq.hold(dq_part, TensorView{}, c.q_begin, c.q_end);
    dk.hold(dk_part, TensorView{}, c.k_begin, c.k_end);
    dv.hold(dv_part, TensorView{}, c.k_begin, c.k_end);
    ++*calls;
  }
  return Status::Ok();
#else
  (void)I, (void)o, (void)B, (void)H, (void)D, (void)Hkv, (void)n;
  return SP_STATUS(StatusCode::kUnsupported, "built without cuDNN");
#endif
}

// What travels in one step: parts [B, rows, heads, D] (and stats [B, heads, rows]), one
// message each. Received packs lay their parts out one after another in a buffer.
struct Pack {
  std::vector<TensorView> parts;
};
Pack make_pack(const Impl& I, void* base, int64_t B, int64_t rows, int64_t heads, int64_t D,
               DType t, int tensors, bool with_stats) {
  Pack p;
  char* at = static_cast<char*>(base);
  for (int i = 0; i < tensors; ++i) {
    p.parts.push_back(I.device_view(at, t, {B, rows, heads, D}));
    at += B * rows * heads * D * dtype_size(t);
  }
  if (with_stats) p.parts.push_back(I.device_view(at, DType::kF32, {B, heads, rows}));
  return p;
}
size_t pack_bytes(int64_t B, int64_t rows, int64_t heads, int64_t D, DType t, int tensors,
                  bool with_stats) {
  return B * rows * heads * D * dtype_size(t) * tensors + (with_stats ? B * heads * rows * 4 : 0);
}
size_t view_bytes(const TensorView& t) { return t.numel() * dtype_size(t.dtype); }
void add_sends(const Pack& p, int peer, std::vector<SendSpec>* sends) {
  for (const TensorView& t : p.parts) sends->push_back({peer, t.data, view_bytes(t)});
}
void add_recvs(const Pack& p, int peer, std::vector<RecvSpec>* recvs) {
  for (const TensorView& t : p.parts) recvs->push_back({peer, t.data, view_bytes(t)});
}

// Whether a slice of the caller's tensors can go to NCCL and cuDNN as it is: contiguous, and
// 16-byte aligned (a later head group of an LSE slice may start at any multiple of 4 bytes).
bool usable_as_is(const TensorView& t) {
  return t.is_contiguous() && reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
}

// Whether some head group's home pack must be copied (into pack buffer 0).
template <class Slices>
bool home_needs_copies(int G, const Slices& slices_of_group) {
  for (int g = 0; g < G; ++g)
    for (const TensorView& t : slices_of_group(g))
      if (!usable_as_is(t)) return true;
  return false;
}

// The home pack of one head group: each slice of the caller's tensors as it is where it is
// contiguous (sent with no copy), else copied to its place in the pack laid out at `base`.
StatusOr<Pack> home_pack(const Impl& I, void* base, const std::vector<TensorView>& slices, cudaStream_t s) {
  Pack p;
  char* at = static_cast<char*>(base);
  for (const TensorView& t : slices) {
    if (usable_as_is(t)) {
      p.parts.push_back(t);
    } else {
      p.parts.push_back(I.device_view(at, t.dtype, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim)));
      SP_RETURN_IF_ERROR(flash_cast(t, p.parts.back(), s));
    }
    at += view_bytes(t);
  }
  return p;
}

// Heads [first, first + count) of the caller's [B, H, S] LSE, copied into a buffer when the
// slice is not contiguous (cuDNN wants it dense; [B, S, H, D] slices go to the calls as
// strided views).
StatusOr<TensorView> group_stats(Impl& I, const TensorView& lse, int64_t first, int64_t count,
                                 cudaStream_t s) {
  const TensorView slice = heads_of(lse, 1, first, count);
  if (usable_as_is(slice)) return slice;
  SP_ASSIGN_OR_RETURN(TensorView copy, I.buffer("lse_group", DType::kF32, {slice.shape[0], count, slice.shape[2]}));
  SP_RETURN_IF_ERROR(flash_cast(slice, copy, s));
  return copy;
}

// Starts an exchange after the work queued on `s` (host-driven communicators need the stream
// drained first).
StatusOr<std::unique_ptr<PendingExchange>> start_after(Communicator& comm, cudaStream_t s,
                                                       const std::vector<SendSpec>& sends,
                                                       const std::vector<RecvSpec>& recvs) {
  if (!comm.stream_ordered()) SP_RETURN_IF_ERROR(stream_synchronize(s));
  comm.set_stream(s);
  auto pending = comm.start_exchange(sends, recvs);
  comm.clear_stream();  // the caller's stream may not outlive this call
  return pending;
}

// Bytes of workspace a backward's buffers take with G head groups on P ranks (u_q, u_k: one
// rank's q and k shards in bf16). They also cover the forward's (fp32 O, a cuDNN part, the
// received K/V), which shares their names. Home-pack copies exist only for split heads or
// more than two ranks; cuDNN's own backward workspace (an fp32 dQ) is counted too. With two
// ranks, our own kernels (`own`) keep fp32 results where cuDNN's parts go in place.
int64_t workspace_estimate(int64_t B, int64_t rows, int64_t H, int64_t Hkv, int64_t D, int G, int P,
                           BackwardSchedule schedule, bool own) {
  const int64_t uq = B * rows * H * D * 2, uk = B * rows * Hkv * D * 2;
  const bool home_copies = G > 1 || P > 2, ring = P > 1;
  int64_t bytes = 0;
  if (P == 2 && schedule == BackwardSchedule::kBurst && own)  // query pack, fp32 dQ (home, peer), fp32 dK/dV
    bytes = 3 * uq + (home_copies ? 3 * uq : 0) + 4 * uq + 4 * uk;
  else if (P == 2 && schedule == BackwardSchedule::kBurst)  // query pack, returned dQ part, parts
    bytes = 3 * uq + (home_copies ? 3 * uq : 0) + uq + 2 * uk + 2 * uq;
  else if (P == 2 && own)  // K/V pack, fp32 dQ, fp32 dK/dV (home, peer's, received)
    bytes = 2 * uk + (home_copies ? 2 * uk : 0) + 2 * uq + 12 * uk;
  else if (P == 2)  // K/V pack, returned dK/dV parts, dQ part
    bytes = 2 * uk + (home_copies ? 2 * uk : 0) + 2 * uk + uq + 2 * uq;
  else if (schedule == BackwardSchedule::kBurst)  // query packs, three fp32 dQ, fp32 dK/dV, parts
    bytes = (ring ? 3 * uq : 0) + (home_copies ? 3 * uq : 0) + 6 * uq + 4 * uk + (uq + 2 * uk) + 2 * uq;
  else  // K/V packs, three fp32 dK/dV pairs, fp32 dQ, parts
    bytes = (ring ? 2 * uk : 0) + (home_copies ? 2 * uk : 0) + 12 * uk + 2 * uq + (uq + 2 * uk) + 2 * uq;
  return bytes / G;
}

Status check_gpu_args(const Communicator& comm, const Layout& layout, const AttentionParams& params,
                      const TensorView& q, const TensorView& k, const TensorView& v,
                      cpu::AttentionDims* dims) {
  SP_CHECK_ARG(layout.ranks() == comm.size(),
               "layout is for " + std::to_string(layout.ranks()) + " ranks but the communicator has " +
                   std::to_string(comm.size()));
  SP_CHECK_ARG(!params.q_positions && !params.k_positions,
               "ring attention takes positions from the layout; leave q/k_positions null");
  SP_CHECK_ARG(q.ndim == 4 && k.ndim == 4 && v.ndim == 4, "q, k, v must be [B, S, H, D]");
  SP_CHECK_SUPPORTED(q.dtype == DType::kBF16 || q.dtype == DType::kF16,
                     std::string("GPU ranks compute in bf16 or fp16, not ") + dtype_name(q.dtype));
  *dims = {q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]};
  const int64_t local = layout.local_len(comm.rank());
  SP_CHECK_ARG(dims->seq_q == local && dims->seq_k == local,
               "rank " + std::to_string(comm.rank()) + " holds " + std::to_string(local) +
                   " tokens under the " + layout_name(layout.kind()) + " layout, but q is " +
                   q.shape_string() + " and k is " + k.shape_string());
  SP_CHECK_ARG(dims->kv_heads > 0 && dims->heads % dims->kv_heads == 0,
               "query heads must be divisible by K/V heads");
  for (const TensorView* t : {&q, &k, &v})
    SP_CHECK_ARG(t->device.kind == DeviceKind::kCuda && t->dtype == q.dtype && t->strides[3] == 1 &&
                     t->shape[0] == dims->batch && t->shape[3] == dims->head_dim,
                 "q, k, v must be device tensors of one dtype with a contiguous last dim; got " +
                     t->shape_string());
  SP_CHECK_ARG(k.shape[2] == v.shape[2] && k.shape[1] == v.shape[1], "k and v must have one shape");
  return params.mask.validate(layout.seq_len());
}

// Outputs are written while inputs are still read (the first part goes straight into the
// output), so no output may share memory with an input. Checked on the bytes each view spans.
Status check_no_overlap(std::initializer_list<std::pair<const char*, const TensorView*>> outputs,
                        std::initializer_list<std::pair<const char*, const TensorView*>> inputs) {
  const auto span = [](const TensorView& t) {
    const auto begin = reinterpret_cast<uintptr_t>(t.data);
    return std::pair{begin, begin + uintptr_t(t.span_elements()) * dtype_size(t.dtype)};
  };
  for (const auto& [out_name, out] : outputs)
    for (const auto& [in_name, in] : inputs) {
      if (out->numel() == 0 || in->numel() == 0) continue;
      const auto [ob, oe] = span(*out);
      const auto [ib, ie] = span(*in);
      SP_CHECK_ARG(oe <= ib || ie <= ob, std::string("output ") + out_name + " overlaps input " + in_name +
                                             " in memory; the GPU schedules need them apart");
    }
  return Status::Ok();
}

Status check_like(const char* name, const TensorView& t, DType dtype, std::vector<int64_t> shape) {
  bool ok = t.device.kind == DeviceKind::kCuda && t.dtype == dtype && t.ndim == int(shape.size()) &&
            t.strides[t.ndim - 1] == 1;
  for (int i = 0; ok && i < t.ndim; ++i) ok = t.shape[i] == shape[i];
  SP_CHECK_ARG(ok, std::string(name) + " must be a device " + dtype_name(dtype) +
                       " tensor shaped like the layout asks (contiguous last dim); got " + t.shape_string());
  return Status::Ok();
}

}  // namespace

bool gpu_ring_uses_own_kernels(const GpuRingOptions& options, DType dtype, int64_t head_dim,
                               const AttentionParams& params) {
  if (!options.use_cudnn || !cudnn_built()) return true;
  if (params.mask.has_documents() || params.mask.window_left >= 0) return true;
#ifdef SEQPAR_HAVE_CUDNN
  // cuDNN's refusals that depend on the tensors: dtype and head dim (device tensors here).
  const TensorView q = TensorView::contiguous(nullptr, dtype, std::vector<int64_t>{1, 1, 1, head_dim},
                                              Device{DeviceKind::kCuda, 0});
  AttentionParams plain;
  plain.scale = params.scale;
  if (!cudnn_attention_unsupported_reason(q, plain).empty()) return true;
#endif
  (void)dtype, (void)head_dim;
  return false;
}

StatusOr<int> gpu_ring_head_groups(const GpuRingOptions& o, int P, int64_t batch, int64_t rows,
                                   int64_t heads, int64_t kv_heads, int64_t head_dim,
                                   BackwardSchedule schedule, bool own_kernels) {
  if (o.head_groups > 0) {
    SP_CHECK_ARG(kv_heads % o.head_groups == 0, "head groups (" + std::to_string(o.head_groups) +
                                                    ") must divide the K/V heads (" + std::to_string(kv_heads) + ")");
    return o.head_groups;
  }
  // Fewer groups run faster (each cuDNN call sees more heads); more groups hold less memory.
  const double shard = double(batch * rows * heads * head_dim * 2);
  const double limit = std::min(double(o.workspace_limit_bytes),
                                std::max(double(o.workspace_floor_bytes), o.workspace_limit_shards * shard));
  for (int g = 1; g <= kv_heads; ++g)
    if (kv_heads % g == 0 &&
        double(workspace_estimate(batch, rows, heads, kv_heads, head_dim, g, P, schedule, own_kernels)) <= limit)
      return g;
  return static_cast<int>(kv_heads);
}

Status gpu_ring_attention_forward(Communicator& comm, const Layout& layout,
                                  const AttentionParams& params, const TensorView& q,
                                  const TensorView& k, const TensorView& v, const TensorView& o,
                                  const TensorView& lse, GpuRingContext& ctx, void* stream,
                                  RingStats* stats) {
  cpu::AttentionDims dims;
  SP_RETURN_IF_ERROR(check_gpu_args(comm, layout, params, q, k, v, &dims));
  const int64_t B = dims.batch, S = dims.seq_q, H = dims.heads, Hkv = dims.kv_heads, D = dims.head_dim;
  const DType t = q.dtype;
  SP_RETURN_IF_ERROR(check_like("o", o, t, {B, S, H, D}));
  SP_RETURN_IF_ERROR(check_like("lse", lse, DType::kF32, {B, H, S}));
  SP_RETURN_IF_ERROR(check_no_overlap({{"o", &o}, {"lse", &lse}}, {{"q", &q}, {"k", &k}, {"v", &v}}));
  Impl& I = ctx.impl();
  SP_RETURN_IF_ERROR(I.init());
  const auto s = static_cast<cudaStream_t>(stream);
  const int P = comm.size(), me = comm.rank();
  const PhaseScope phase(comm, Phase::kForward);
  const int64_t max_rows = layout.max_local_len();
  // The forward takes the group count of the backward that auto would pick (the backward needs
  // more workspace): the phases share their buffers, so the peak is one phase's, not both.
  const bool own = gpu_ring_uses_own_kernels(ctx.options(), t, D, params);
  const BackwardSchedule likely = I.likely_backward(layout, params, B, H, Hkv, D, t, own);
  SP_ASSIGN_OR_RETURN(const int G, gpu_ring_head_groups(ctx.options(), P, B, max_rows, H, Hkv, D, likely, own));
  const int64_t Hg = H / G, Hkg = Hkv / G;
  SP_RETURN_IF_ERROR(I.presize(B, max_rows, Hg, Hkg, D, t, P > 2 || own));
  RingStats local_stats;
  int64_t cudnn_calls = 0, own_calls = 0;

  // K/V of one group: the home pack, then the shards received in turn into kv1, kv0, kv1, ...
  // kv0 holds the home pack's copies when the heads are split; one group's own K/V is sent
  // as it is.
  const auto kv_slices = [&](int g) { return std::vector{heads_of(k, 2, g * Hkg, Hkg), heads_of(v, 2, g * Hkg, Hkg)}; };
  const size_t kv_max = pack_bytes(B, max_rows, Hkg, D, t, 2, false);
  if (P > 1) SP_RETURN_IF_ERROR(I.buffers["kv1"].reserve(kv_max));
  if (P > 2 || home_needs_copies(G, kv_slices)) SP_RETURN_IF_ERROR(I.buffers["kv0"].reserve(kv_max));
  void* kv_base[2] = {I.buffers["kv0"].data(), I.buffers["kv1"].data()};
  for (int g = 0; g < G; ++g) {
    const TensorView qg = heads_of(q, 2, g * Hg, Hg);
    SP_ASSIGN_OR_RETURN(const Pack home, home_pack(I, kv_base[0], kv_slices(g), s));
    const TensorView og = heads_of(o, 2, g * Hg, Hg), lseg = heads_of(lse, 1, g * Hg, Hg);
    Running out(S, "part_q", [&]() -> StatusOr<Running::Views> {
      SP_ASSIGN_OR_RETURN(const TensorView o_acc, I.buffer("acc_q", DType::kF32, {B, S, Hg, D}));
      SP_ASSIGN_OR_RETURN(const TensorView lse_acc, I.buffer("lse_acc", DType::kF32, {B, Hg, S}));
      return Running::Views{o_acc, lse_acc};
    }, /*merging=*/true, og, lseg);

    for (int step = 0; step < P; ++step) {
      const int held = wrap(me - step, P), incoming = wrap(me - step - 1, P);
      const Pack cur = step == 0 ? home : make_pack(I, kv_base[step % 2], B, layout.local_len(held), Hkg, D, t, 2, false);
      std::unique_ptr<PendingExchange> pending;
      if (step < P - 1) {
        const Pack next = make_pack(I, kv_base[(step + 1) % 2], B, layout.local_len(incoming), Hkg, D, t, 2, false);
        std::vector<SendSpec> sends;
        std::vector<RecvSpec> recvs;
        add_sends(cur, wrap(me + 1, P), &sends);
        add_recvs(next, wrap(me - 1, P), &recvs);
        SP_ASSIGN_OR_RETURN(pending, start_after(comm, s, sends, recvs));
      }
      SP_RETURN_IF_ERROR(I.mark(s, "fwd", g, step, "sent"));
      if (I.visible(layout, params, me, held)) {
        const Pair pair{layout, params, me, held, own};
        SP_RETURN_IF_ERROR(block_forward(I, pair, qg, cur.parts[0], cur.parts[1], out, s,
                                         own ? &own_calls : &cudnn_calls));
        if (g == 0) ++local_stats.pairs_computed;
      } else if (g == 0) {
        ++local_stats.pairs_skipped;
      }
      SP_RETURN_IF_ERROR(I.mark(s, "fwd", g, step, "computed"));
      if (pending) SP_RETURN_IF_ERROR(pending->wait_on_stream(s));
      SP_RETURN_IF_ERROR(I.mark(s, "fwd", g, step, "arrived"));
    }
    SP_RETURN_IF_ERROR(out.finish_into(og, lseg, s));
    SP_RETURN_IF_ERROR(I.mark(s, "fwd", g, -1, "out"));
  }
  ctx.counters.head_groups = G;
  ctx.counters.cudnn_calls += cudnn_calls;
  ctx.counters.own_kernel_calls += own_calls;
  if (stats) *stats = local_stats;
  return Status::Ok();
}

namespace {

struct BackwardArgs {
  const Layout& layout;
  const AttentionParams& params;
  const TensorView &q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv;
  int64_t B, S, H, Hkv, D;
  int G;
  bool own;
};

// What a ring-style backward rotates: the travelling pack (K/V, or Burst's query side) in two
// buffers, and three fp32 accumulators (this step's part, the arriving one, the one leaving).
// The names are shared with the forward, so the phases reuse one workspace. pack[0] holds the
// home pack's copies, so it is only needed for split heads or more than two ranks.
struct TravelBuffers {
  void* pack[2];
  void *part, *in, *out;
};
StatusOr<TravelBuffers> travel_buffers(Impl& I, int P, bool home_copies, size_t pack_bytes,
                                       size_t accumulator_bytes, const char* first_accumulator) {
  TravelBuffers b{};
  const char* packs[2] = {"kv0", "kv1"};
  const char* accumulators[3] = {first_accumulator, "grad_b", "grad_c"};
  const bool needed[2] = {P > 2 || home_copies, P > 1};
  for (int i = 0; i < 2; ++i) {
    if (needed[i]) SP_RETURN_IF_ERROR(I.buffers[packs[i]].reserve(pack_bytes));
    b.pack[i] = I.buffers[packs[i]].data();
  }
  void** acc[3] = {&b.part, &b.in, &b.out};
  for (int i = 0; i < 3; ++i) {
    SP_RETURN_IF_ERROR(I.buffers[accumulators[i]].reserve(accumulator_bytes));
    *acc[i] = I.buffers[accumulators[i]].data();
  }
  return b;
}

struct Span {
  void* data;
  size_t bytes;
};

// A running sum into the fp32 accumulator `acc`, made already.
Running summing(int64_t rows, const char* part_buffer, const TensorView& acc) {
  return Running(rows, part_buffer, [acc]() -> StatusOr<Running::Views> { return Running::Views{acc, {}}; }, false);
}

// Posts the exchange of backward step `step`: the pack for the next step goes on ahead
// (step < P - 1) and, from step 1, the accumulator finished last step goes on while the one of
// the shard held now arrives. The arriving accumulator's buffer may still hold the previous
// head group's result, being cast on the side stream: wait for that first.
StatusOr<std::unique_ptr<PendingExchange>> post_backward_step(Communicator& comm, Impl& I, cudaStream_t s,
                                                              int step, const Pack& cur, const Pack& next,
                                                              Span acc_out, Span acc_in) {
  const int P = comm.size(), me = comm.rank();
  std::vector<SendSpec> sends;
  std::vector<RecvSpec> recvs;
  if (step < P - 1) {
    add_sends(cur, wrap(me + 1, P), &sends);
    add_recvs(next, wrap(me - 1, P), &recvs);
  }
  if (step >= 1) {
    SP_CUDA_CHECK(cudaStreamWaitEvent(s, I.finished, 0));
    sends.push_back({wrap(me + 1, P), acc_out.data, acc_out.bytes});
    recvs.push_back({wrap(me - 1, P), acc_in.data, acc_in.bytes});
  }
  if (sends.empty()) return std::unique_ptr<PendingExchange>();
  return start_after(comm, s, sends, recvs);
}

// The frame of one backward step shared by both schedules: posts the step's exchange, runs
// `compute` when the (q_rank, k_rank) pair sees anything (counting pairs in the first group),
// and makes `s` wait for the exchange, marking each milestone.
template <class Compute>
Status backward_step(Communicator& comm, Impl& I, cudaStream_t s, const BackwardArgs& a, int g,
                     int step, const Pack& cur, const Pack& next, Span acc_out, Span acc_in,
                     int q_rank, int k_rank, RingStats* stats, Compute&& compute) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<PendingExchange> pending,
                      post_backward_step(comm, I, s, step, cur, next, acc_out, acc_in));
  SP_RETURN_IF_ERROR(I.mark(s, "bwd", g, step, "sent"));
  const bool visible = I.visible(a.layout, a.params, q_rank, k_rank);
  if (visible) SP_RETURN_IF_ERROR(compute(Pair{a.layout, a.params, q_rank, k_rank, a.own}));
  if (g == 0) ++(visible ? stats->pairs_computed : stats->pairs_skipped);
  SP_RETURN_IF_ERROR(I.mark(s, "bwd", g, step, "computed"));
  if (pending) SP_RETURN_IF_ERROR(pending->wait_on_stream(s));
  return I.mark(s, "bwd", g, step, "arrived");
}

// The last accumulator (shard me+1, in `acc_out`) takes its hop home while ours arrives from
// me-1 into `acc_in`: `home` is where our result lies (acc_out itself for one rank, which
// sends nothing).
struct FinalHop {
  void* home;
  std::unique_ptr<PendingExchange> pending;
};
StatusOr<FinalHop> post_final_hop(Communicator& comm, Impl& I, cudaStream_t s, int group, Span acc_out,
                                  Span acc_in) {
  const int P = comm.size(), me = comm.rank();
  FinalHop hop{P > 1 ? acc_in.data : acc_out.data, nullptr};
  if (P > 1) {
    SP_CUDA_CHECK(cudaStreamWaitEvent(s, I.finished, 0));
    SP_ASSIGN_OR_RETURN(hop.pending, start_after(comm, s, {{wrap(me + 1, P), acc_out.data, acc_out.bytes}},
                                                 {{wrap(me - 1, P), acc_in.data, acc_in.bytes}}));
  }
  SP_RETURN_IF_ERROR(I.mark(s, "bwd", group, -1, "hop"));
  return hop;
}

// The result that travelled home is written into the caller's tensors (`finish` on a stream)
// on the side stream, so the next head group starts computing at once; what it reads must not
// be written before I.finished.
template <class Finish>
Status finish_on_side_stream(Impl& I, PendingExchange* pending, cudaStream_t s, Finish&& finish) {
  if (!pending) return finish(s);  // nothing travelled, and the buffers are reused at once
  SP_RETURN_IF_ERROR(pending->wait_on_stream(I.finish_stream));
  // The side stream also waits for the compute that produced what it reads (the wait takes
  // the event's state when queued, so one event serves every group).
  SP_CUDA_CHECK(cudaEventRecord(I.computed, s));
  SP_CUDA_CHECK(cudaStreamWaitEvent(I.finish_stream, I.computed, 0));
  SP_RETURN_IF_ERROR(finish(I.finish_stream));
  SP_CUDA_CHECK(cudaEventRecord(I.finished, I.finish_stream));
  return Status::Ok();
}
// The casts of fp32 results that travelled home.
auto casts(std::vector<std::pair<TensorView, TensorView>> from_to) {
  return [from_to = std::move(from_to)](cudaStream_t st) -> Status {
    for (const auto& [from, to] : from_to) SP_RETURN_IF_ERROR(flash_cast(from, to, st));
    return Status::Ok();
  };
}

// Makes `s` wait for the side stream's casts however the backward returns (an early error
// must not leave casts into the caller's tensors running unordered).
struct JoinSideStream {
  Impl& I;
  cudaStream_t s;
  ~JoinSideStream() { (void)cudaStreamWaitEvent(s, I.finished, 0); }
};

Status ring_backward(Communicator& comm, GpuRingContext& ctx, const BackwardArgs& a, cudaStream_t s,
                     RingStats* stats, int64_t* calls) {
  Impl& I = ctx.impl();
  const JoinSideStream join{I, s};
  const int P = comm.size(), me = comm.rank();
  const int64_t B = a.B, S = a.S, D = a.D, Hg = a.H / a.G, Hkg = a.Hkv / a.G;
  const DType t = a.q.dtype;
  const int64_t max_rows = a.layout.max_local_len();
  const auto kv_slices = [&](int g) { return std::vector{heads_of(a.k, 2, g * Hkg, Hkg), heads_of(a.v, 2, g * Hkg, Hkg)}; };
  SP_ASSIGN_OR_RETURN(TravelBuffers tb, travel_buffers(I, P, home_needs_copies(a.G, kv_slices),
                                                     pack_bytes(B, max_rows, Hkg, D, t, 2, false),
                                                     pack_bytes(B, max_rows, Hkg, D, DType::kF32, 2, false),
                                                     "grad_a"));
  void* kv_base[2] = {tb.pack[0], tb.pack[1]};
  // grad_part: this step's contribution; grad_in: the arriving accumulator; grad_out: the
  // accumulator finished last step, on its way to the next rank. They rotate across groups.
  void *grad_part = tb.part, *grad_in = tb.in, *grad_out = tb.out;
  const auto grads = [&](void* base, int64_t rows) { return make_pack(I, base, B, rows, Hkg, D, DType::kF32, 2, false); };
  const auto grad_bytes = [&](int64_t rows) { return pack_bytes(B, rows, Hkg, D, DType::kF32, 2, false); };

  for (int g = 0; g < a.G; ++g) {
    const TensorView qg = heads_of(a.q, 2, g * Hg, Hg), og = heads_of(a.o, 2, g * Hg, Hg);
    const TensorView dog = heads_of(a.dout, 2, g * Hg, Hg);
    SP_ASSIGN_OR_RETURN(const TensorView lseg, group_stats(I, a.lse, g * Hg, Hg, s));
    TensorView delta;
    if (a.own) {
      SP_ASSIGN_OR_RETURN(delta, I.buffer("delta", DType::kF32, {B, Hg, S}));
      SP_RETURN_IF_ERROR(flash_attention_delta(og, dog, delta, s));
    }
    SP_ASSIGN_OR_RETURN(const TensorView dq_acc, I.buffer("acc_q", DType::kF32, {B, S, Hg, D}));
    Running dq = summing(S, "part_q", dq_acc);
    SP_ASSIGN_OR_RETURN(const Pack home, home_pack(I, kv_base[0], kv_slices(g), s));
    for (int step = 0; step < P; ++step) {
      const int held = wrap(me - step, P), incoming = wrap(me - step - 1, P);
      const int64_t rows = a.layout.local_len(held);
      const Pack cur = step == 0 ? home : make_pack(I, kv_base[step % 2], B, rows, Hkg, D, t, 2, false);
      const Pack next = make_pack(I, kv_base[(step + 1) % 2], B, a.layout.local_len(incoming), Hkg, D, t, 2, false);
      const Pack part = grads(grad_part, rows);
      Running dk = summing(rows, "part_k", part.parts[0]), dv = summing(rows, "part_v", part.parts[1]);
      SP_RETURN_IF_ERROR(backward_step(
          comm, I, s, a, g, step, cur, next, {grad_out, grad_bytes(a.layout.local_len(wrap(held + 1, P)))},
          {grad_in, grad_bytes(rows)}, me, held, stats, [&](const Pair& pair) {
            return block_backward(I, pair, qg, cur.parts[0], cur.parts[1], og, dog, lseg, delta, dq, dk,
                                  dv, s, calls);
          }));
      if (step == 0) {  // the first accumulator of this shard: this step's part, made whole
        for (Running* r : {&dk, &dv}) SP_RETURN_IF_ERROR(r->materialize(s));
        std::swap(grad_out, grad_part);
      } else {  // the arriving accumulator takes this step's part and goes on
        const Pack in = grads(grad_in, rows);
        SP_RETURN_IF_ERROR(dk.add_into(in.parts[0], s));
        SP_RETURN_IF_ERROR(dv.add_into(in.parts[1], s));
        std::swap(grad_out, grad_in);
      }
      SP_RETURN_IF_ERROR(I.mark(s, "bwd", g, step, "added"));
    }
    SP_RETURN_IF_ERROR(dq.finish_into(heads_of(a.dq, 2, g * Hg, Hg), TensorView{}, s));
    SP_ASSIGN_OR_RETURN(const FinalHop hop,
                        post_final_hop(comm, I, s, g, {grad_out, grad_bytes(a.layout.local_len(wrap(me + 1, P)))},
                                       {grad_in, grad_bytes(S)}));
    const Pack result = grads(hop.home, S);
    SP_RETURN_IF_ERROR(finish_on_side_stream(I, hop.pending.get(), s,
                                             casts({{result.parts[0], heads_of(a.dk, 2, g * Hkg, Hkg)},
                                                    {result.parts[1], heads_of(a.dv, 2, g * Hkg, Hkg)}})));
    // grad_in (holding the result) and grad_out (being sent home) are written again only
    // from step 1 of the next group, after its wait for I.finished; grad_part is free.
  }
  return Status::Ok();
}

Status burst_backward(Communicator& comm, GpuRingContext& ctx, const BackwardArgs& a,
                      cudaStream_t s, RingStats* stats, int64_t* calls) {
  Impl& I = ctx.impl();
  const JoinSideStream join{I, s};
  const int P = comm.size(), me = comm.rank();
  const int64_t B = a.B, S = a.S, D = a.D, Hg = a.H / a.G, Hkg = a.Hkv / a.G;
  const DType t = a.q.dtype;
  const int64_t max_rows = a.layout.max_local_len();
  // The travelling pack: Q, dO, O (dtype) and LSE (fp32) of one query shard.
  const auto query_slices = [&](int g) {
    return std::vector{heads_of(a.q, 2, g * Hg, Hg), heads_of(a.dout, 2, g * Hg, Hg),
                       heads_of(a.o, 2, g * Hg, Hg), heads_of(a.lse, 1, g * Hg, Hg)};
  };
  SP_ASSIGN_OR_RETURN(TravelBuffers tb, travel_buffers(I, P, home_needs_copies(a.G, query_slices),
                                                     pack_bytes(B, max_rows, Hg, D, t, 3, true),
                                                     pack_bytes(B, max_rows, Hg, D, DType::kF32, 1, false),
                                                     "acc_q"));  // the forward's fp32 O: same size
  void* pack_base[2] = {tb.pack[0], tb.pack[1]};
  // As in the ring backward, with dQ instead of dK/dV; they rotate across groups.
  void *dq_part = tb.part, *dq_in = tb.in, *dq_out = tb.out;
  const auto dq_view = [&](void* base, int64_t rows) { return I.device_view(base, DType::kF32, {B, rows, Hg, D}); };
  const auto dq_bytes = [&](int64_t rows) { return pack_bytes(B, rows, Hg, D, DType::kF32, 1, false); };

  for (int g = 0; g < a.G; ++g) {
    const TensorView kg = heads_of(a.k, 2, g * Hkg, Hkg), vg = heads_of(a.v, 2, g * Hkg, Hkg);
    SP_ASSIGN_OR_RETURN(const Pack home, home_pack(I, pack_base[0], query_slices(g), s));
    SP_ASSIGN_OR_RETURN(const TensorView dk_acc, I.buffer("acc_k", DType::kF32, {B, S, Hkg, D}));
    SP_ASSIGN_OR_RETURN(const TensorView dv_acc, I.buffer("acc_v", DType::kF32, {B, S, Hkg, D}));
    Running dk = summing(S, "part_k", dk_acc), dv = summing(S, "part_v", dv_acc);
    for (int step = 0; step < P; ++step) {
      const int held = wrap(me - step, P), incoming = wrap(me - step - 1, P);
      const int64_t rows = a.layout.local_len(held);
      const Pack cur = step == 0 ? home : make_pack(I, pack_base[step % 2], B, rows, Hg, D, t, 3, true);
      const Pack next = make_pack(I, pack_base[(step + 1) % 2], B, a.layout.local_len(incoming), Hg, D, t, 3, true);
      Running dq = summing(rows, "part_q", dq_view(dq_part, rows));
      SP_RETURN_IF_ERROR(backward_step(
          comm, I, s, a, g, step, cur, next, {dq_out, dq_bytes(a.layout.local_len(wrap(held + 1, P)))},
          {dq_in, dq_bytes(rows)}, held, me, stats, [&](const Pair& pair) -> Status {
            TensorView delta;
            if (a.own) {
              SP_ASSIGN_OR_RETURN(delta, I.buffer("delta", DType::kF32, {B, Hg, rows}));
              SP_RETURN_IF_ERROR(flash_attention_delta(cur.parts[2], cur.parts[1], delta, s));
            }
            return block_backward(I, pair, cur.parts[0], kg, vg, cur.parts[2], cur.parts[1], cur.parts[3],
                                  delta, dq, dk, dv, s, calls);
          }));
      if (step == 0) {  // the first dQ accumulator of this shard: this step's part, made whole
        SP_RETURN_IF_ERROR(dq.materialize(s));
        std::swap(dq_out, dq_part);
      } else {  // the arriving dQ takes this step's part and goes on
        SP_RETURN_IF_ERROR(dq.add_into(dq_view(dq_in, rows), s));
        std::swap(dq_out, dq_in);
      }
      SP_RETURN_IF_ERROR(I.mark(s, "bwd", g, step, "added"));
    }
    SP_RETURN_IF_ERROR(dk.finish_into(heads_of(a.dk, 2, g * Hkg, Hkg), TensorView{}, s));
    SP_RETURN_IF_ERROR(dv.finish_into(heads_of(a.dv, 2, g * Hkg, Hkg), TensorView{}, s));
    SP_ASSIGN_OR_RETURN(const FinalHop hop,
                        post_final_hop(comm, I, s, g, {dq_out, dq_bytes(a.layout.local_len(wrap(me + 1, P)))},
                                       {dq_in, dq_bytes(S)}));
    SP_RETURN_IF_ERROR(finish_on_side_stream(I, hop.pending.get(), s,
                                             casts({{dq_view(hop.home, S), heads_of(a.dq, 2, g * Hg, Hg)}})));
  }
  return Status::Ok();
}

// Two ranks, either schedule. What a rank computes for its peer (Burst: the dQ of the peer's
// queries; ring: the dK/dV of the peer's keys) comes only from the second step, so it goes
// straight home as the calls left it (the one call's low-precision part, or fp32 when several
// calls summed into it) and is summed into its owner's result in place: it crosses once
// instead of twice, no fp32 accumulator travels, and the first step's parts are written into
// the caller's outputs. The sums round like the accumulating schedules' (two bf16 parts added
// in fp32, rounded once).
struct Return {  // the form of a result returned to its owner
  bool part;             // one call's part over rows [begin, end), in the inputs' dtype
  int64_t begin, end;    // else fp32 over every row
};
Return return_form(Impl& I, const Pair& pair, bool burst, int64_t rows) {
  if (!pair.own_kernels) {
    const BlockPlan& plan = I.plan(pair.layout, pair.params.mask, pair.q_rank, pair.k_rank);
    if (plan.dense && plan.calls.size() == 1) {
      const BlockCall& c = plan.calls[0];
      return burst ? Return{true, c.q_begin, c.q_end} : Return{true, c.k_begin, c.k_end};
    }
  }
  return {false, 0, rows};
}

Status two_rank_backward(Communicator& comm, GpuRingContext& ctx, const BackwardArgs& a,
                         bool burst, cudaStream_t s, RingStats* stats, int64_t* calls) {
  Impl& I = ctx.impl();
  const JoinSideStream join{I, s};
  const int me = comm.rank(), peer = 1 - me;
  const int64_t B = a.B, S = a.S, D = a.D, Hg = a.H / a.G, Hkg = a.Hkv / a.G;
  const int64_t peer_rows = a.layout.local_len(peer), max_rows = a.layout.max_local_len();
  const DType t = a.q.dtype;
  // What travels: Burst's query side (Q, dO, O, LSE) or the ring's K/V, of one head group.
  const auto slices = [&](int g) {
    if (burst)
      return std::vector{heads_of(a.q, 2, g * Hg, Hg), heads_of(a.dout, 2, g * Hg, Hg),
                         heads_of(a.o, 2, g * Hg, Hg), heads_of(a.lse, 1, g * Hg, Hg)};
    return std::vector{heads_of(a.k, 2, g * Hkg, Hkg), heads_of(a.v, 2, g * Hkg, Hkg)};
  };
  const int64_t pack_heads = burst ? Hg : Hkg;
  const int pack_tensors = burst ? 3 : 2;
  const size_t pack_max = pack_bytes(B, max_rows, pack_heads, D, t, pack_tensors, burst);
  SP_RETURN_IF_ERROR(I.buffers["kv1"].reserve(pack_max));
  if (home_needs_copies(a.G, slices)) SP_RETURN_IF_ERROR(I.buffers["kv0"].reserve(pack_max));
  // The results returned: Burst's dQ (query heads) or the ring's dK, dV (K/V heads). Once the
  // second step has read the received pack, its buffer takes them when they fit.
  const int ret_tensors = burst ? 1 : 2;
  const int64_t ret_heads = burst ? Hg : Hkg;
  const Pair to_peer{a.layout, a.params, burst ? peer : me, burst ? me : peer, a.own};
  const Pair from_peer{a.layout, a.params, burst ? me : peer, burst ? peer : me, a.own};
  const bool sends = I.visible(a.layout, a.params, to_peer.q_rank, to_peer.k_rank);
  const bool receives = I.visible(a.layout, a.params, from_peer.q_rank, from_peer.k_rank);
  const Return out_form = return_form(I, to_peer, burst, peer_rows), in_form = return_form(I, from_peer, burst, S);
  const size_t in_bytes = pack_bytes(B, in_form.end - in_form.begin, ret_heads, D, in_form.part ? t : DType::kF32,
                                     ret_tensors, false);
  const bool ret_in_pack = in_bytes <= pack_max;
  if (receives && !ret_in_pack) SP_RETURN_IF_ERROR(I.buffers["ret_in"].reserve(in_bytes));
  const auto acc = [&](const char* name, int64_t rows, int64_t heads) {
    return [&I, name, B, rows, heads, D]() -> StatusOr<Running::Views> {
      SP_ASSIGN_OR_RETURN(const TensorView v, I.buffer(name, DType::kF32, {B, rows, heads, D}));
      return Running::Views{v, {}};
    };
  };

  bool wait_for_last_group = false;
  for (int g = 0; g < a.G; ++g) {
    // A result kept in an accumulator (not in place) is finished on the side stream from
    // buffers this group would write.
    if (wait_for_last_group) SP_CUDA_CHECK(cudaStreamWaitEvent(s, I.finished, 0));
    const TensorView qg = heads_of(a.q, 2, g * Hg, Hg), og = heads_of(a.o, 2, g * Hg, Hg);
    const TensorView dog = heads_of(a.dout, 2, g * Hg, Hg), kg = heads_of(a.k, 2, g * Hkg, Hkg);
    const TensorView vg = heads_of(a.v, 2, g * Hkg, Hkg);
    const TensorView dqg = heads_of(a.dq, 2, g * Hg, Hg), dkg = heads_of(a.dk, 2, g * Hkg, Hkg);
    const TensorView dvg = heads_of(a.dv, 2, g * Hkg, Hkg);
    SP_ASSIGN_OR_RETURN(const Pack home, home_pack(I, I.buffers["kv0"].data(), slices(g), s));
    const Pack received = make_pack(I, I.buffers["kv1"].data(), B, peer_rows, pack_heads, D, t, pack_tensors, burst);
    TensorView lseg, delta;
    if (!burst) {
      SP_ASSIGN_OR_RETURN(lseg, group_stats(I, a.lse, g * Hg, Hg, s));
    }
    // This rank's results (each summed in place in its output) and the ones for the peer.
    Running dq(S, burst ? "home_q" : "part_q", acc("acc_q", S, Hg), false, dqg);
    Running dk(S, burst ? "part_k" : "home_k", acc("acc_k", S, Hkg), false, dkg);
    Running dv(S, burst ? "part_v" : "home_v", acc("acc_v", S, Hkg), false, dvg);
    // For the peer: Burst's dQ (in `travelling[0]`) or the ring's dK and dV.
    Running peer_first(peer_rows, burst ? "part_q" : "part_k", acc("grad_b", peer_rows, ret_heads), false);
    Running peer_dv(peer_rows, "part_v", acc("grad_c", peer_rows, Hkg), false);
    Running* travelling[2] = {&peer_first, &peer_dv};
    Running* awaiting[2] = {burst ? &dq : &dk, &dv};

    // Step 0 (own shard) while the pack goes to the peer; the exchange also waits for the side
    // stream, whose last group's finish may still read the buffer the pack arrives in.
    std::vector<SendSpec> pack_sends;
    std::vector<RecvSpec> pack_recvs;
    add_sends(home, peer, &pack_sends);
    add_recvs(received, peer, &pack_recvs);
    SP_CUDA_CHECK(cudaEventRecord(I.computed, s));
    SP_CUDA_CHECK(cudaStreamWaitEvent(I.finish_stream, I.computed, 0));
    SP_ASSIGN_OR_RETURN(std::unique_ptr<PendingExchange> pending,
                        start_after(comm, I.finish_stream, pack_sends, pack_recvs));
    for (int step = 0; step < 2; ++step) {
      const Pack& cur = step == 0 ? home : received;
      const int q_rank = step == 0 ? me : to_peer.q_rank, k_rank = step == 0 ? me : to_peer.k_rank;
      SP_RETURN_IF_ERROR(I.mark(s, "bwd", g, step, "sent"));
      const bool visible = I.visible(a.layout, a.params, q_rank, k_rank);
      if (visible) {
        const Pair pair{a.layout, a.params, q_rank, k_rank, a.own};
        if (burst) {
          if (a.own) {
            SP_ASSIGN_OR_RETURN(delta, I.buffer("delta", DType::kF32, {B, Hg, cur.parts[0].shape[1]}));
            SP_RETURN_IF_ERROR(flash_attention_delta(cur.parts[2], cur.parts[1], delta, s));
          }
          SP_RETURN_IF_ERROR(block_backward(I, pair, cur.parts[0], kg, vg, cur.parts[2], cur.parts[1],
                                            cur.parts[3], delta, step == 0 ? dq : peer_first, dk, dv, s, calls));
        } else {
          if (a.own && step == 0) {
            SP_ASSIGN_OR_RETURN(delta, I.buffer("delta", DType::kF32, {B, Hg, S}));
            SP_RETURN_IF_ERROR(flash_attention_delta(og, dog, delta, s));
          }
          SP_RETURN_IF_ERROR(block_backward(I, pair, qg, cur.parts[0], cur.parts[1], og, dog, lseg, delta, dq,
                                            step == 0 ? dk : peer_first, step == 0 ? dv : peer_dv, s, calls));
        }
      }
      if (g == 0) ++(visible ? stats->pairs_computed : stats->pairs_skipped);
      SP_RETURN_IF_ERROR(I.mark(s, "bwd", g, step, "computed"));
      if (step == 0) {
        SP_RETURN_IF_ERROR(pending->wait_on_stream(s));
        // The next calls write the part buffers the awaiting results may hold.
        for (int i = 0; i < ret_tensors; ++i) SP_RETURN_IF_ERROR(awaiting[i]->flush(s));
      }
      SP_RETURN_IF_ERROR(I.mark(s, "bwd", g, step, "arrived"));
      if (step == 0) SP_RETURN_IF_ERROR(I.mark(s, "bwd", g, step, "added"));
    }

    // The peer's results go home as they are, ours arrive in the received pack's buffer.
    std::vector<SendSpec> ret_sends;
    std::vector<RecvSpec> ret_recvs;
    for (int i = 0; sends && i < ret_tensors; ++i) {
      Running& r = *travelling[i];
      int64_t begin = 0, end = 0;
      const TensorView* part = r.only_part(&begin, &end);
      if (out_form.part) {
        SP_CHECK_ARG(part && begin == out_form.begin && end == out_form.end,
                     "internal: the returned part is not the one planned");
        ret_sends.push_back({peer, part->data, view_bytes(*part)});
      } else {
        SP_RETURN_IF_ERROR(r.materialize(s));
        ret_sends.push_back({peer, r.acc().data, view_bytes(r.acc())});
      }
    }
    void* in_base = ret_in_pack ? I.buffers["kv1"].data() : I.buffers["ret_in"].data();
    const Pack in = make_pack(I, in_base, B, in_form.end - in_form.begin, ret_heads, D,
                              in_form.part ? t : DType::kF32, ret_tensors, false);
    if (receives) add_recvs(in, peer, &ret_recvs);
    std::unique_ptr<PendingExchange> ret;
    if (!ret_sends.empty() || !ret_recvs.empty()) {
      SP_ASSIGN_OR_RETURN(ret, start_after(comm, s, ret_sends, ret_recvs));
    }
    // The results that stay home are finished while the returns travel.
    if (burst) {
      SP_RETURN_IF_ERROR(dk.finish_into(dkg, TensorView{}, s));
      SP_RETURN_IF_ERROR(dv.finish_into(dvg, TensorView{}, s));
    } else {
      SP_RETURN_IF_ERROR(dq.finish_into(dqg, TensorView{}, s));
    }
    SP_RETURN_IF_ERROR(I.mark(s, "bwd", g, 1, "added"));
    SP_RETURN_IF_ERROR(I.mark(s, "bwd", g, -1, "hop"));
    const TensorView outs[2] = {burst ? dqg : dkg, dvg};
    wait_for_last_group = false;
    SP_RETURN_IF_ERROR(finish_on_side_stream(I, ret.get(), s, [&](cudaStream_t st) -> Status {
      for (int i = 0; i < ret_tensors; ++i) {
        Running& r = *awaiting[i];
        if (receives) r.hold(in.parts[i], TensorView{}, in_form.begin, in_form.end);
        SP_RETURN_IF_ERROR(r.finish_into(outs[i], TensorView{}, st));
        wait_for_last_group = wait_for_last_group || !r.in_place();
      }
      return Status::Ok();
    }));
  }
  return Status::Ok();
}

}  // namespace

Status gpu_attention_backward(Communicator& comm, const Layout& layout,
                              const AttentionParams& params, BackwardSchedule schedule,
                              const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& o, const TensorView& lse, const TensorView& dout,
                              const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              GpuRingContext& ctx, void* stream, RingStats* stats) {
  cpu::AttentionDims dims;
  SP_RETURN_IF_ERROR(check_gpu_args(comm, layout, params, q, k, v, &dims));
  const int64_t B = dims.batch, S = dims.seq_q, H = dims.heads, Hkv = dims.kv_heads, D = dims.head_dim;
  const DType t = q.dtype;
  SP_RETURN_IF_ERROR(check_like("o", o, t, {B, S, H, D}));
  SP_RETURN_IF_ERROR(check_like("dout", dout, t, {B, S, H, D}));
  SP_RETURN_IF_ERROR(check_like("dq", dq, t, {B, S, H, D}));
  SP_RETURN_IF_ERROR(check_like("dk", dk, t, {B, S, Hkv, D}));
  SP_RETURN_IF_ERROR(check_like("dv", dv, t, {B, S, Hkv, D}));
  SP_RETURN_IF_ERROR(check_like("lse", lse, DType::kF32, {B, H, S}));
  SP_RETURN_IF_ERROR(check_no_overlap({{"dq", &dq}, {"dk", &dk}, {"dv", &dv}},
                                       {{"q", &q}, {"k", &k}, {"v", &v}, {"o", &o}, {"lse", &lse}, {"dout", &dout}}));
  Impl& I = ctx.impl();
  SP_RETURN_IF_ERROR(I.init());
  const PhaseScope phase(comm, Phase::kBackward);
  const bool own = gpu_ring_uses_own_kernels(ctx.options(), t, D, params);
  SP_ASSIGN_OR_RETURN(const int G, gpu_ring_head_groups(ctx.options(), comm.size(), B, layout.max_local_len(),
                                                        H, Hkv, D, schedule, own));
  const BackwardArgs args{layout, params, q, k, v, o, lse, dout, dq, dk, dv, B, S, H, Hkv, D, G, own};
  SP_RETURN_IF_ERROR(I.presize(B, layout.max_local_len(), H / G, Hkv / G, D, t, comm.size() > 2 || own));
  RingStats local_stats;
  int64_t calls = 0;
  const auto s = static_cast<cudaStream_t>(stream);
  const bool burst = schedule == BackwardSchedule::kBurst;
  if (comm.size() == 2) SP_RETURN_IF_ERROR(two_rank_backward(comm, ctx, args, burst, s, &local_stats, &calls));
  else if (burst) SP_RETURN_IF_ERROR(burst_backward(comm, ctx, args, s, &local_stats, &calls));
  else SP_RETURN_IF_ERROR(ring_backward(comm, ctx, args, s, &local_stats, &calls));
  SP_RETURN_IF_ERROR(I.mark(s, "bwd", G - 1, -1, "joined"));  // the side stream's last casts done
  ctx.counters.head_groups = G;
  (own ? ctx.counters.own_kernel_calls : ctx.counters.cudnn_calls) += calls;
  if (stats) *stats = local_stats;
  return Status::Ok();
}


}  // namespace seqpar
