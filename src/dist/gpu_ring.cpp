// The GPU executor of the ring-style schedules (see include/seqpar/gpu_ring.hpp): per head
// group, the ring forward (K/V travel, fp32 running O/LSE), the ring backward (K/V travel with
// the fp32 dK/dV accumulators) and the Burst backward (Q, dO, O, LSE travel ahead, the fp32 dQ
// one round behind), each step's local work planned into cuDNN calls or our own kernels.
#include "seqpar/gpu_ring.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "core/cuda_check.hpp"
#include "dist/ring_common.hpp"
#include "seqpar/block_plan.hpp"
#include "seqpar/flash_cuda.hpp"
#include "seqpar/gpu.hpp"
#ifdef SEQPAR_HAVE_CUDNN
#include "seqpar/cudnn_attention.hpp"
#endif

namespace seqpar {

using dist::wrap;

struct GpuRingContext::Impl {
  std::map<std::string, DeviceBuffer> buffers;
  std::string plan_key;  // layout and mask the cached plans belong to
  std::map<std::pair<int, int>, BlockPlan> plans;
  std::map<std::pair<int, int>, bool> visible_pairs;
  std::map<int, std::vector<PositionRunSpan>> runs;  // arithmetic runs of each rank's positions
  cudaStream_t finish_stream = nullptr;  // casts a group's travelled result home
  cudaEvent_t finished = nullptr;        // recorded on finish_stream after those casts
  int device = 0;

  ~Impl() {
    if (finished) (void)cudaEventDestroy(finished);
    if (finish_stream) (void)cudaStreamDestroy(finish_stream);
  }

  Status init() {
    if (finish_stream) return Status::Ok();
    SP_CUDA_CHECK(cudaGetDevice(&device));
    SP_CUDA_CHECK(cudaStreamCreateWithFlags(&finish_stream, cudaStreamNonBlocking));
    SP_CUDA_CHECK(cudaEventCreateWithFlags(&finished, cudaEventDisableTiming));
    SP_CUDA_CHECK(cudaEventRecord(finished, finish_stream));
    return Status::Ok();
  }

  // Sizes the per-call scratch of a phase for its largest call up front, so no buffer grows
  // (and no block is retired) in the middle of a schedule. Buffers are named by role and
  // shared between the forward and the backwards: the workspace peak is the larger phase's.
  Status presize(int64_t B, int64_t rows, int64_t heads, int64_t kv_heads, int64_t D, DType t) {
    const size_t stats = B * heads * rows * sizeof(float);
    for (const char* name : {"lse_part", "lse_rows", "delta_rows", "delta"})
      SP_RETURN_IF_ERROR(buffers[name].reserve(stats));
    SP_RETURN_IF_ERROR(buffers["part_q"].reserve(B * rows * heads * D * dtype_size(t)));
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
    TensorView v;
    v.data = data;
    v.dtype = dtype;
    v.device = Device{DeviceKind::kCuda, device};
    v.ndim = static_cast<int>(shape.size());
    int64_t stride = 1;
    for (int i = v.ndim - 1; i >= 0; --i) {
      v.shape[i] = shape[i];
      v.strides[i] = stride;
      stride *= shape[i];
    }
    return v;
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
                                 dist::pair_visible(params, layout.positions(q_rank),
                                                    layout.positions(k_rank)))
               .first;
    return it->second;
  }

  const BlockPlan& plan(const Layout& layout, const MaskSpec& mask, int q_rank, int k_rank) {
    use_problem(layout, mask);
    auto it = plans.find({q_rank, k_rank});
    if (it == plans.end())
      it = plans.emplace(std::pair{q_rank, k_rank},
                         plan_block_pair(layout.positions(q_rank), layout.positions(k_rank), mask))
               .first;
    return it->second;
  }
};

GpuRingContext::GpuRingContext(GpuRingOptions options)
    : options_(options), impl_(std::make_unique<Impl>()) {}
GpuRingContext::~GpuRingContext() = default;

namespace {

using Impl = GpuRingContext::Impl;

// Rows [begin, end) along `dim` of a view.
TensorView rows_of(TensorView t, int dim, int64_t begin, int64_t end) {
  t.data = static_cast<char*>(t.data) + begin * t.strides[dim] * int64_t(dtype_size(t.dtype));
  t.shape[dim] = end - begin;
  return t;
}

// Heads [first, first + count) of a [B, S, H, D] (dim 2) or [B, H, S] (dim 1) view.
TensorView heads_of(const TensorView& t, int dim, int64_t first, int64_t count) {
  return rows_of(t, dim, first, first + count);
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

// Whether this problem's steps go to our own kernels (cuDNN missing, refused, or the mask
// needs positions).
bool use_own_kernels(const GpuRingContext& ctx, const TensorView& q, const AttentionParams& params) {
  if (!ctx.options().use_cudnn || !cudnn_built()) return true;
  if (params.mask.has_documents() || params.mask.window_left >= 0) return true;
#ifdef SEQPAR_HAVE_CUDNN
  AttentionParams plain;
  plain.scale = params.scale;
  if (!cudnn_attention_unsupported_reason(q, plain).empty()) return true;
#endif
  (void)q;
  return false;
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
  SP_RETURN_IF_ERROR(flash_cast(rows_of(stats, 2, begin, end), out, s));
  return out;
}

FlashPositions run_positions(const PositionRunSpan& q, const PositionRunSpan& k) {
  FlashPositions p;
  p.q = {q.offset, q.stride};
  p.k = {k.offset, k.stride};
  return p;
}

// Folds K/V shard `k, v` into the running (o_acc [B, n, Hg, D] fp32, lse_acc [B, Hg, n] fp32).
Status block_forward(Impl& I, const Pair& pair, const TensorView& q,
                     const TensorView& k, const TensorView& v, const TensorView& o_acc,
                     const TensorView& lse_acc, cudaStream_t s, int64_t* calls) {
  const int64_t B = q.shape[0], H = q.shape[2], D = q.shape[3], n = q.shape[1];
  if (pair.own_kernels) {
    I.use_problem(pair.layout, pair.params.mask);
    for (const PositionRunSpan& qr : I.position_runs(pair.layout, pair.q_rank))
      for (const PositionRunSpan& kr : I.position_runs(pair.layout, pair.k_rank)) {
        const bool whole = qr.begin == 0 && qr.end == n;
        TensorView lse_v = lse_acc;
        if (!whole) {
          SP_ASSIGN_OR_RETURN(lse_v, stat_rows(I, "lse_rows", lse_acc, qr.begin, qr.end, s));
        }
        SP_RETURN_IF_ERROR(flash_attention_forward(
            rows_of(q, 1, qr.begin, qr.end), rows_of(k, 1, kr.begin, kr.end),
            rows_of(v, 1, kr.begin, kr.end), pair.params, run_positions(qr, kr),
            rows_of(o_acc, 1, qr.begin, qr.end), lse_v, /*accumulate=*/true, TensorView{}, s));
        if (!whole) SP_RETURN_IF_ERROR(flash_cast(lse_v, rows_of(lse_acc, 2, qr.begin, qr.end), s));
        ++*calls;
      }
    return Status::Ok();
  }
#ifdef SEQPAR_HAVE_CUDNN
  const BlockPlan& plan = I.plan(pair.layout, pair.params.mask, pair.q_rank, pair.k_rank);
  SP_CHECK_SUPPORTED(plan.dense, "internal: a planned pair needs positions");
  for (const BlockCall& c : plan.calls) {
    const int64_t nq = c.q_end - c.q_begin;
    SP_ASSIGN_OR_RETURN(TensorView o_part, I.buffer("part_q", q.dtype, {B, nq, H, D}));
    SP_ASSIGN_OR_RETURN(TensorView lse_part, I.buffer("lse_part", DType::kF32, {B, H, nq}));
    SP_RETURN_IF_ERROR(cudnn_attention_forward(
        rows_of(q, 1, c.q_begin, c.q_end), rows_of(k, 1, c.k_begin, c.k_end),
        rows_of(v, 1, c.k_begin, c.k_end), dense_params(pair.params, c.causal), o_part, lse_part, s));
    SP_RETURN_IF_ERROR(flash_merge_partials(rows_of(o_acc, 1, c.q_begin, c.q_end),
                                            rows_of(lse_acc, 2, c.q_begin, c.q_end), o_part,
                                            lse_part, s));
    ++*calls;
  }
  return Status::Ok();
#else
  (void)B, (void)H, (void)D;
  return SP_STATUS(StatusCode::kUnsupported, "built without cuDNN");
#endif
}

// Adds this pair's gradients into dq_acc [B, n, Hg, D] and dk_acc, dv_acc [B, m, Hkg, D]
// (fp32). lse, delta: [B, Hg, n] fp32 (delta only read by our own kernels).
Status block_backward(Impl& I, const Pair& pair, const TensorView& q, const TensorView& k,
                      const TensorView& v, const TensorView& o, const TensorView& dout,
                      const TensorView& lse, const TensorView& delta, const TensorView& dq_acc,
                      const TensorView& dk_acc, const TensorView& dv_acc, cudaStream_t s,
                      int64_t* calls) {
  const int64_t B = q.shape[0], H = q.shape[2], D = q.shape[3], n = q.shape[1], Hkv = k.shape[2];
  if (pair.own_kernels) {
    I.use_problem(pair.layout, pair.params.mask);
    for (const PositionRunSpan& qr : I.position_runs(pair.layout, pair.q_rank))
      for (const PositionRunSpan& kr : I.position_runs(pair.layout, pair.k_rank)) {
        const bool whole = qr.begin == 0 && qr.end == n;
        TensorView lse_v = lse, delta_v = delta;
        if (!whole) {
          SP_ASSIGN_OR_RETURN(lse_v, stat_rows(I, "lse_rows", lse, qr.begin, qr.end, s));
          SP_ASSIGN_OR_RETURN(delta_v, stat_rows(I, "delta_rows", delta, qr.begin, qr.end, s));
        }
        SP_RETURN_IF_ERROR(flash_attention_backward(
            rows_of(q, 1, qr.begin, qr.end), rows_of(k, 1, kr.begin, kr.end),
            rows_of(v, 1, kr.begin, kr.end), rows_of(dout, 1, qr.begin, qr.end), lse_v, delta_v,
            pair.params, run_positions(qr, kr), rows_of(dq_acc, 1, qr.begin, qr.end),
            rows_of(dk_acc, 1, kr.begin, kr.end), rows_of(dv_acc, 1, kr.begin, kr.end), s));
        ++*calls;
      }
    return Status::Ok();
  }
#ifdef SEQPAR_HAVE_CUDNN
  const BlockPlan& plan = I.plan(pair.layout, pair.params.mask, pair.q_rank, pair.k_rank);
  SP_CHECK_SUPPORTED(plan.dense, "internal: a planned pair needs positions");
  for (const BlockCall& c : plan.calls) {
    const int64_t nq = c.q_end - c.q_begin, nk = c.k_end - c.k_begin;
    TensorView lse_c = lse;
    if (nq != n) {
      SP_ASSIGN_OR_RETURN(lse_c, stat_rows(I, "lse_rows", lse, c.q_begin, c.q_end, s));
    }
    SP_ASSIGN_OR_RETURN(TensorView dq_part, I.buffer("part_q", q.dtype, {B, nq, H, D}));
    SP_ASSIGN_OR_RETURN(TensorView dk_part, I.buffer("part_k", q.dtype, {B, nk, Hkv, D}));
    SP_ASSIGN_OR_RETURN(TensorView dv_part, I.buffer("part_v", q.dtype, {B, nk, Hkv, D}));
    SP_RETURN_IF_ERROR(cudnn_attention_backward(
        rows_of(q, 1, c.q_begin, c.q_end), rows_of(k, 1, c.k_begin, c.k_end),
        rows_of(v, 1, c.k_begin, c.k_end), rows_of(o, 1, c.q_begin, c.q_end),
        rows_of(dout, 1, c.q_begin, c.q_end), lse_c, dense_params(pair.params, c.causal), dq_part,
        dk_part, dv_part, s));
    SP_RETURN_IF_ERROR(flash_accumulate(dq_part, rows_of(dq_acc, 1, c.q_begin, c.q_end), s));
    SP_RETURN_IF_ERROR(flash_accumulate(dk_part, rows_of(dk_acc, 1, c.k_begin, c.k_end), s));
    SP_RETURN_IF_ERROR(flash_accumulate(dv_part, rows_of(dv_acc, 1, c.k_begin, c.k_end), s));
    ++*calls;
  }
  return Status::Ok();
#else
  (void)I;
  (void)o;
  return SP_STATUS(StatusCode::kUnsupported, "built without cuDNN");
#endif
}

// Two or more equal-shaped parts laid out one after another for `rows` rows, so that one
// message carries them all: parts[i] = [B, rows, heads, D] (or stats [B, heads, rows]).
struct Pack {
  std::vector<TensorView> parts;
  void* data = nullptr;
  size_t bytes = 0;
};
Pack make_pack(const Impl& I, void* base, int64_t B, int64_t rows, int64_t heads, int64_t D,
               DType t, int tensors, bool with_stats) {
  Pack p;
  p.data = base;
  char* at = static_cast<char*>(base);
  for (int i = 0; i < tensors; ++i) {
    p.parts.push_back(I.device_view(at, t, {B, rows, heads, D}));
    at += B * rows * heads * D * dtype_size(t);
  }
  if (with_stats) {
    p.parts.push_back(I.device_view(at, DType::kF32, {B, heads, rows}));
    at += B * heads * rows * sizeof(float);
  }
  p.bytes = static_cast<size_t>(at - static_cast<char*>(base));
  return p;
}
size_t pack_bytes(int64_t B, int64_t rows, int64_t heads, int64_t D, DType t, int tensors,
                  bool with_stats) {
  return B * rows * heads * D * dtype_size(t) * tensors + (with_stats ? B * heads * rows * 4 : 0);
}

Status zero(const Pack& p, cudaStream_t s) {
  SP_CUDA_CHECK(cudaMemsetAsync(p.data, 0, p.bytes, s));
  return Status::Ok();
}

// Copies heads [first, first + count) of a caller's view into buffer `name` when the heads are
// split, or returns the view itself.
StatusOr<TensorView> group_input(Impl& I, const char* name, const TensorView& t, int dim,
                                 int64_t first, int64_t count, int G, cudaStream_t s) {
  TensorView slice = heads_of(t, dim, first, count);
  if (G == 1 && slice.is_contiguous()) return slice;
  std::vector<int64_t> shape(slice.shape.begin(), slice.shape.begin() + slice.ndim);
  SP_ASSIGN_OR_RETURN(TensorView copy, I.buffer(name, slice.dtype, shape));
  SP_RETURN_IF_ERROR(flash_cast(slice, copy, s));
  return copy;
}

// Fills the K/V pack at `base` with K/V heads [first, first + count) of the caller's k and v.
Status load_kv_home(const Impl& I, void* base, const TensorView& k, const TensorView& v,
                    int64_t first, int64_t count, cudaStream_t s) {
  const Pack home = make_pack(I, base, k.shape[0], k.shape[1], count, k.shape[3], k.dtype, 2, false);
  SP_RETURN_IF_ERROR(flash_cast(heads_of(k, 2, first, count), home.parts[0], s));
  return flash_cast(heads_of(v, 2, first, count), home.parts[1], s);
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

// Bytes of workspace per head group count, for choosing the group count.
int64_t workspace_estimate(int64_t B, int64_t rows, int64_t H, int64_t Hkv, int64_t D,
                           bool backward, BackwardSchedule schedule) {
  const int64_t uq = B * rows * H * D * 2, uk = B * rows * Hkv * D * 2;  // bf16 shard sizes
  if (!backward) return 4 * uq + 4 * uk;
  return schedule == BackwardSchedule::kRing ? 6 * uq + 18 * uk : 13 * uq + 8 * uk;
}

StatusOr<int> head_groups(GpuRingContext& ctx, int64_t B, int64_t rows, int64_t H, int64_t Hkv,
                          int64_t D, bool backward, BackwardSchedule schedule) {
  const int requested = ctx.options().head_groups;
  if (requested > 0) {
    SP_CHECK_ARG(Hkv % requested == 0, "head groups (" + std::to_string(requested) +
                                           ") must divide the K/V heads (" + std::to_string(Hkv) + ")");
    return requested;
  }
  const int64_t need = workspace_estimate(B, rows, H, Hkv, D, backward, schedule);
  for (int g = 1; g <= Hkv; ++g)
    if (Hkv % g == 0 && need / g <= ctx.options().workspace_limit_bytes) return g;
  return static_cast<int>(Hkv);
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

Status check_like(const char* name, const TensorView& t, DType dtype, std::vector<int64_t> shape) {
  bool ok = t.device.kind == DeviceKind::kCuda && t.dtype == dtype && t.ndim == int(shape.size()) &&
            t.strides[t.ndim - 1] == 1;
  for (int i = 0; ok && i < t.ndim; ++i) ok = t.shape[i] == shape[i];
  SP_CHECK_ARG(ok, std::string(name) + " must be a device " + dtype_name(dtype) +
                       " tensor shaped like the layout asks (contiguous last dim); got " + t.shape_string());
  return Status::Ok();
}

}  // namespace

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
  Impl& I = ctx.impl();
  SP_RETURN_IF_ERROR(I.init());
  const auto s = static_cast<cudaStream_t>(stream);
  const int P = comm.size(), me = comm.rank();
  const PhaseScope phase(comm, Phase::kForward);
  const int64_t max_rows = layout.max_local_len();
  SP_ASSIGN_OR_RETURN(const int G, head_groups(ctx, B, max_rows, H, Hkv, D, false, BackwardSchedule::kRing));
  const int64_t Hg = H / G, Hkg = Hkv / G;
  const bool own = use_own_kernels(ctx, q, params);
  SP_RETURN_IF_ERROR(I.presize(B, max_rows, Hg, Hkg, D, t));
  RingStats local_stats;
  int64_t cudnn_calls = 0, own_calls = 0;

  const size_t kv_max = pack_bytes(B, max_rows, Hkg, D, t, 2, false);
  for (const char* name : {"kv0", "kv1"}) SP_RETURN_IF_ERROR(I.buffers[name].reserve(kv_max));
  void* kv_base[2] = {I.buffers["kv0"].data(), I.buffers["kv1"].data()};
  for (int g = 0; g < G; ++g) {
    // Group inputs: contiguous copies when the heads are split (so every call sees a small,
    // dense tensor), the caller's views otherwise.
    SP_ASSIGN_OR_RETURN(const TensorView qg, group_input(I, "q_group", q, 2, g * Hg, Hg, G, s));
    SP_RETURN_IF_ERROR(load_kv_home(I, kv_base[0], k, v, g * Hkg, Hkg, s));
    SP_ASSIGN_OR_RETURN(TensorView o_acc, I.buffer("acc_q", DType::kF32, {B, S, Hg, D}));
    SP_CUDA_CHECK(cudaMemsetAsync(o_acc.data, 0, o_acc.numel() * sizeof(float), s));
    SP_ASSIGN_OR_RETURN(TensorView lse_acc, I.buffer("lse_acc", DType::kF32, {B, Hg, S}));
    SP_RETURN_IF_ERROR(flash_fill(lse_acc, -INFINITY, s));

    for (int step = 0; step < P; ++step) {
      const int held = wrap(me - step, P), incoming = wrap(me - step - 1, P);
      const Pack cur = make_pack(I, kv_base[step % 2], B, layout.local_len(held), Hkg, D, t, 2, false);
      std::unique_ptr<PendingExchange> pending;
      if (step < P - 1) {
        const Pack next = make_pack(I, kv_base[(step + 1) % 2], B, layout.local_len(incoming), Hkg, D, t, 2, false);
        SP_ASSIGN_OR_RETURN(pending, start_after(comm, s, {{wrap(me + 1, P), cur.data, cur.bytes}},
                                                 {{wrap(me - 1, P), next.data, next.bytes}}));
      }
      if (I.visible(layout, params, me, held)) {
        const Pair pair{layout, params, me, held, own};
        SP_RETURN_IF_ERROR(block_forward(I, pair, qg, cur.parts[0], cur.parts[1], o_acc, lse_acc,
                                         s, own ? &own_calls : &cudnn_calls));
        if (g == 0) ++local_stats.pairs_computed;
      } else if (g == 0) {
        ++local_stats.pairs_skipped;
      }
      if (pending) SP_RETURN_IF_ERROR(pending->wait_on_stream(s));
    }
    SP_RETURN_IF_ERROR(flash_cast(o_acc, heads_of(o, 2, g * Hg, Hg), s));
    SP_RETURN_IF_ERROR(flash_cast(lse_acc, heads_of(lse, 1, g * Hg, Hg), s));
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
// The names are shared with the forward, so the phases reuse one workspace.
struct TravelBuffers {
  void* pack[2];
  void *part, *in, *out;
};
StatusOr<TravelBuffers> travel_buffers(Impl& I, size_t pack_bytes, size_t accumulator_bytes) {
  TravelBuffers b{};
  const char* packs[2] = {"kv0", "kv1"};
  const char* accumulators[3] = {"grad_a", "grad_b", "grad_c"};
  for (int i = 0; i < 2; ++i) {
    SP_RETURN_IF_ERROR(I.buffers[packs[i]].reserve(pack_bytes));
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
    sends.push_back({wrap(me + 1, P), cur.data, cur.bytes});
    recvs.push_back({wrap(me - 1, P), next.data, next.bytes});
  }
  if (step >= 1) {
    SP_CUDA_CHECK(cudaStreamWaitEvent(s, I.finished, 0));
    sends.push_back({wrap(me + 1, P), acc_out.data, acc_out.bytes});
    recvs.push_back({wrap(me - 1, P), acc_in.data, acc_in.bytes});
  }
  if (sends.empty()) return std::unique_ptr<PendingExchange>();
  return start_after(comm, s, sends, recvs);
}

// The last accumulator's hop home (none for one rank).
StatusOr<std::unique_ptr<PendingExchange>> post_final_hop(Communicator& comm, Impl& I, cudaStream_t s,
                                                          Span acc_out, Span acc_in) {
  const int P = comm.size(), me = comm.rank();
  if (P == 1) return std::unique_ptr<PendingExchange>();
  SP_CUDA_CHECK(cudaStreamWaitEvent(s, I.finished, 0));
  return start_after(comm, s, {{wrap(me + 1, P), acc_out.data, acc_out.bytes}},
                     {{wrap(me - 1, P), acc_in.data, acc_in.bytes}});
}

// The result that travelled home is cast into the caller's tensors on the side stream, so the
// next head group starts computing at once; `home` must not be written before I.finished.
Status finish_on_side_stream(Impl& I, PendingExchange* pending, cudaStream_t s,
                             const std::vector<std::pair<TensorView, TensorView>>& casts) {
  if (!pending) {  // one rank: nothing travelled, and the buffers are reused at once
    for (const auto& [from, to] : casts) SP_RETURN_IF_ERROR(flash_cast(from, to, s));
    return Status::Ok();
  }
  SP_RETURN_IF_ERROR(pending->wait_on_stream(I.finish_stream));
  // The side stream also waits for the compute that produced what it casts.
  cudaEvent_t computed;
  SP_CUDA_CHECK(cudaEventCreateWithFlags(&computed, cudaEventDisableTiming));
  SP_CUDA_CHECK(cudaEventRecord(computed, s));
  SP_CUDA_CHECK(cudaStreamWaitEvent(I.finish_stream, computed, 0));
  SP_CUDA_CHECK(cudaEventDestroy(computed));
  for (const auto& [from, to] : casts) SP_RETURN_IF_ERROR(flash_cast(from, to, I.finish_stream));
  SP_CUDA_CHECK(cudaEventRecord(I.finished, I.finish_stream));
  return Status::Ok();
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
  SP_ASSIGN_OR_RETURN(TravelBuffers tb, travel_buffers(I, pack_bytes(B, max_rows, Hkg, D, t, 2, false),
                                                     pack_bytes(B, max_rows, Hkg, D, DType::kF32, 2, false)));
  void* kv_base[2] = {tb.pack[0], tb.pack[1]};
  // grad_part: this step's contribution; grad_in: the arriving accumulator; grad_out: the
  // accumulator finished last step, on its way to the next rank. They rotate across groups.
  void *grad_part = tb.part, *grad_in = tb.in, *grad_out = tb.out;

  for (int g = 0; g < a.G; ++g) {
    SP_ASSIGN_OR_RETURN(const TensorView qg, group_input(I, "q_group", a.q, 2, g * Hg, Hg, a.G, s));
    SP_ASSIGN_OR_RETURN(const TensorView og, group_input(I, "o_group", a.o, 2, g * Hg, Hg, a.G, s));
    SP_ASSIGN_OR_RETURN(const TensorView dog, group_input(I, "do_group", a.dout, 2, g * Hg, Hg, a.G, s));
    SP_ASSIGN_OR_RETURN(const TensorView lseg, group_input(I, "lse_group", a.lse, 1, g * Hg, Hg, a.G, s));
    TensorView delta;
    if (a.own) {
      SP_ASSIGN_OR_RETURN(delta, I.buffer("delta", DType::kF32, {B, Hg, S}));
      SP_RETURN_IF_ERROR(flash_attention_delta(og, dog, delta, s));
    }
    SP_ASSIGN_OR_RETURN(TensorView dq_acc, I.buffer("acc_q", DType::kF32, {B, S, Hg, D}));
    SP_CUDA_CHECK(cudaMemsetAsync(dq_acc.data, 0, dq_acc.numel() * sizeof(float), s));
    SP_RETURN_IF_ERROR(load_kv_home(I, kv_base[0], a.k, a.v, g * Hkg, Hkg, s));
    for (int step = 0; step < P; ++step) {
      const int held = wrap(me - step, P), incoming = wrap(me - step - 1, P);
      const int64_t rows = a.layout.local_len(held);
      const Pack cur = make_pack(I, kv_base[step % 2], B, rows, Hkg, D, t, 2, false);
      const Pack next = make_pack(I, kv_base[(step + 1) % 2], B, a.layout.local_len(incoming), Hkg, D, t, 2, false);
      SP_ASSIGN_OR_RETURN(
          std::unique_ptr<PendingExchange> pending,
          post_backward_step(comm, I, s, step, cur, next,
                             {grad_out, pack_bytes(B, a.layout.local_len(wrap(held + 1, P)), Hkg, D, DType::kF32, 2, false)},
                             {grad_in, pack_bytes(B, rows, Hkg, D, DType::kF32, 2, false)}));
      const Pack part = make_pack(I, grad_part, B, rows, Hkg, D, DType::kF32, 2, false);
      SP_RETURN_IF_ERROR(zero(part, s));
      if (I.visible(a.layout, a.params, me, held)) {
        const Pair pair{a.layout, a.params, me, held, a.own};
        SP_RETURN_IF_ERROR(block_backward(I, pair, qg, cur.parts[0], cur.parts[1], og, dog, lseg, delta,
                                          dq_acc, part.parts[0], part.parts[1], s, calls));
        if (g == 0) ++stats->pairs_computed;
      } else if (g == 0) {
        ++stats->pairs_skipped;
      }
      if (pending) SP_RETURN_IF_ERROR(pending->wait_on_stream(s));
      if (step >= 1) {
        const Pack in = make_pack(I, grad_in, B, rows, Hkg, D, DType::kF32, 2, false);
        const int64_t n = int64_t(in.bytes / 4);
        SP_RETURN_IF_ERROR(flash_accumulate(I.device_view(grad_in, DType::kF32, {n}),
                                            I.device_view(grad_part, DType::kF32, {n}), s));
      }
      std::swap(grad_out, grad_part);
    }
    SP_RETURN_IF_ERROR(flash_cast(dq_acc, heads_of(a.dq, 2, g * Hg, Hg), s));
    // The last accumulator (shard me+1) takes its final hop home; ours arrives from me-1.
    // The last accumulator (shard me+1) takes its final hop home; ours arrives from me-1.
    void* home = P > 1 ? grad_in : grad_out;
    SP_ASSIGN_OR_RETURN(
        std::unique_ptr<PendingExchange> pending,
        post_final_hop(comm, I, s, {grad_out, pack_bytes(B, a.layout.local_len(wrap(me + 1, P)), Hkg, D, DType::kF32, 2, false)},
                       {grad_in, pack_bytes(B, S, Hkg, D, DType::kF32, 2, false)}));
    const Pack result = make_pack(I, home, B, S, Hkg, D, DType::kF32, 2, false);
    SP_RETURN_IF_ERROR(finish_on_side_stream(I, pending.get(), s,
                                             {{result.parts[0], heads_of(a.dk, 2, g * Hkg, Hkg)},
                                              {result.parts[1], heads_of(a.dv, 2, g * Hkg, Hkg)}}));
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
  SP_ASSIGN_OR_RETURN(TravelBuffers tb, travel_buffers(I, pack_bytes(B, max_rows, Hg, D, t, 3, true),
                                                     pack_bytes(B, max_rows, Hg, D, DType::kF32, 1, false)));
  void* pack_base[2] = {tb.pack[0], tb.pack[1]};
  // As in the ring backward, with dQ instead of dK/dV; they rotate across groups.
  void *dq_part = tb.part, *dq_in = tb.in, *dq_out = tb.out;

  for (int g = 0; g < a.G; ++g) {
    SP_ASSIGN_OR_RETURN(const TensorView kg, group_input(I, "k_group", a.k, 2, g * Hkg, Hkg, a.G, s));
    SP_ASSIGN_OR_RETURN(const TensorView vg, group_input(I, "v_group", a.v, 2, g * Hkg, Hkg, a.G, s));
    {
      const Pack home = make_pack(I, pack_base[0], B, S, Hg, D, t, 3, true);
      SP_RETURN_IF_ERROR(flash_cast(heads_of(a.q, 2, g * Hg, Hg), home.parts[0], s));
      SP_RETURN_IF_ERROR(flash_cast(heads_of(a.dout, 2, g * Hg, Hg), home.parts[1], s));
      SP_RETURN_IF_ERROR(flash_cast(heads_of(a.o, 2, g * Hg, Hg), home.parts[2], s));
      SP_RETURN_IF_ERROR(flash_cast(heads_of(a.lse, 1, g * Hg, Hg), home.parts[3], s));
    }
    SP_ASSIGN_OR_RETURN(TensorView dk_acc, I.buffer("acc_k", DType::kF32, {B, S, Hkg, D}));
    SP_ASSIGN_OR_RETURN(TensorView dv_acc, I.buffer("acc_v", DType::kF32, {B, S, Hkg, D}));
    SP_CUDA_CHECK(cudaMemsetAsync(dk_acc.data, 0, dk_acc.numel() * sizeof(float), s));
    SP_CUDA_CHECK(cudaMemsetAsync(dv_acc.data, 0, dv_acc.numel() * sizeof(float), s));
    for (int step = 0; step < P; ++step) {
      const int held = wrap(me - step, P), incoming = wrap(me - step - 1, P);
      const int64_t rows = a.layout.local_len(held);
      const Pack cur = make_pack(I, pack_base[step % 2], B, rows, Hg, D, t, 3, true);
      const Pack next = make_pack(I, pack_base[(step + 1) % 2], B, a.layout.local_len(incoming), Hg, D, t, 3, true);
      SP_ASSIGN_OR_RETURN(
          std::unique_ptr<PendingExchange> pending,
          post_backward_step(comm, I, s, step, cur, next,
                             {dq_out, pack_bytes(B, a.layout.local_len(wrap(held + 1, P)), Hg, D, DType::kF32, 1, false)},
                             {dq_in, pack_bytes(B, rows, Hg, D, DType::kF32, 1, false)}));
      const TensorView part = I.device_view(dq_part, DType::kF32, {B, rows, Hg, D});
      SP_CUDA_CHECK(cudaMemsetAsync(dq_part, 0, part.numel() * sizeof(float), s));
      if (I.visible(a.layout, a.params, held, me)) {
        TensorView delta;
        if (a.own) {
          SP_ASSIGN_OR_RETURN(delta, I.buffer("delta", DType::kF32, {B, Hg, rows}));
          SP_RETURN_IF_ERROR(flash_attention_delta(cur.parts[2], cur.parts[1], delta, s));
        }
        const Pair pair{a.layout, a.params, held, me, a.own};
        SP_RETURN_IF_ERROR(block_backward(I, pair, cur.parts[0], kg, vg, cur.parts[2], cur.parts[1],
                                          cur.parts[3], delta, part, dk_acc, dv_acc, s, calls));
        if (g == 0) ++stats->pairs_computed;
      } else if (g == 0) {
        ++stats->pairs_skipped;
      }
      if (pending) SP_RETURN_IF_ERROR(pending->wait_on_stream(s));
      if (step >= 1)
        SP_RETURN_IF_ERROR(flash_accumulate(I.device_view(dq_in, DType::kF32, {B, rows, Hg, D}), part, s));
      std::swap(dq_out, dq_part);
    }
    SP_RETURN_IF_ERROR(flash_cast(dk_acc, heads_of(a.dk, 2, g * Hkg, Hkg), s));
    SP_RETURN_IF_ERROR(flash_cast(dv_acc, heads_of(a.dv, 2, g * Hkg, Hkg), s));
    // The last dQ (shard me+1) takes its hop home; ours arrives from me-1.
    void* home = P > 1 ? dq_in : dq_out;
    SP_ASSIGN_OR_RETURN(
        std::unique_ptr<PendingExchange> pending,
        post_final_hop(comm, I, s, {dq_out, pack_bytes(B, a.layout.local_len(wrap(me + 1, P)), Hg, D, DType::kF32, 1, false)},
                       {dq_in, pack_bytes(B, S, Hg, D, DType::kF32, 1, false)}));
    SP_RETURN_IF_ERROR(finish_on_side_stream(
        I, pending.get(), s,
        {{I.device_view(home, DType::kF32, {B, S, Hg, D}), heads_of(a.dq, 2, g * Hg, Hg)}}));
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
  Impl& I = ctx.impl();
  SP_RETURN_IF_ERROR(I.init());
  const PhaseScope phase(comm, Phase::kBackward);
  SP_ASSIGN_OR_RETURN(const int G, head_groups(ctx, B, layout.max_local_len(), H, Hkv, D, true, schedule));
  const BackwardArgs args{layout, params, q, k, v, o, lse, dout, dq, dk, dv,
                          B, S, H, Hkv, D, G, use_own_kernels(ctx, q, params)};
  SP_RETURN_IF_ERROR(I.presize(B, layout.max_local_len(), H / G, Hkv / G, D, t));
  RingStats local_stats;
  int64_t calls = 0;
  const auto s = static_cast<cudaStream_t>(stream);
  SP_RETURN_IF_ERROR(schedule == BackwardSchedule::kRing
                         ? ring_backward(comm, ctx, args, s, &local_stats, &calls)
                         : burst_backward(comm, ctx, args, s, &local_stats, &calls));
  ctx.counters.head_groups = G;
  (args.own ? ctx.counters.own_kernel_calls : ctx.counters.cudnn_calls) += calls;
  if (stats) *stats = local_stats;
  return Status::Ok();
}


}  // namespace seqpar
