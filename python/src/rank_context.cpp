// A rank's attention over its local shard (rank_context.hpp): the argument checks a Python
// caller reads, the mask of a call (window, documents, or parse_mask's text), and the pass run
// through the rank's Session for the call's algorithm; thread ranks run in threads of their own.
#include "rank_context.hpp"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <thread>
#include <utility>

#include "attention.hpp"
#include "cuda_streams.hpp"

namespace seqpar::py {
namespace {

// Masks parsed from text kept per context; beyond this many the cache starts over.
constexpr size_t kMaxMasks = 16;

void require_type(bool cond, const std::string& message) {
  if (!cond) throw nb::type_error(message.c_str());
}

std::string dims(std::initializer_list<int64_t> shape) {
  std::string s = "(";
  size_t i = 0;
  for (int64_t d : shape) s += (i++ ? ", " : "") + std::to_string(d);
  return s + ")";
}

bool has_shape(const TensorView& t, std::initializer_list<int64_t> shape) {
  if (t.ndim != static_cast<int>(shape.size())) return false;
  int d = 0;
  for (int64_t n : shape)
    if (t.shape[d++] != n) return false;
  return true;
}

}  // namespace

void check_shard_call(ShardCall& c, int rank, int ranks) {
  const TensorView& q = c.q.view;
  const bool on_gpu = c.q.device_id >= 0;
  const char* where = on_gpu ? "on CUDA" : "on the host";
  require(q.ndim == 4 && c.k.view.ndim == 4 && c.v.view.ndim == 4,
          "q, k and v must be 4-D [batch, seq, heads, head_dim]; got q " + shape_text(q) + ", k " +
              shape_text(c.k.view) + ", v " + shape_text(c.v.view));
  const int64_t B = q.shape[0], S = q.shape[1], H = q.shape[2], D = q.shape[3], Hkv = c.k.view.shape[2];
  require(c.k.view.same_shape(c.v.view),
          "k and v must have one shape; got " + shape_text(c.k.view) + " and " + shape_text(c.v.view));
  require(c.k.view.shape[0] == B && c.k.view.shape[1] == S && c.k.view.shape[3] == D,
          "k must be [batch, seq, kv_heads, head_dim] with q's batch, seq and head_dim; q is " + shape_text(q) +
              ", k is " + shape_text(c.k.view));
  require(D > 0 && Hkv > 0 && S > 0, "seq, heads and head_dim must be positive; q is " + shape_text(q) + ", k is " +
                                         shape_text(c.k.view));
  require(H % Hkv == 0, "query heads (" + std::to_string(H) + ") must be divisible by key/value heads (" +
                            std::to_string(Hkv) + ")");
  if (on_gpu)
    require_type(q.dtype == DType::kBF16 || q.dtype == DType::kF16,
                 "q: attention on CUDA takes bfloat16 or float16, not " + dtype_text(q.dtype));
  else
    require_type(q.dtype == DType::kF32 || q.dtype == DType::kF64,
                 "q: attention on the host takes float32 or float64, not " + dtype_text(q.dtype));
  const DType stats = on_gpu ? DType::kF32 : q.dtype;
  struct Expect {
    const ArrayView* a;
    const char* name;
    DType dtype;
    bool is_kv, is_lse;
  };
  std::vector<Expect> all{{&c.k, "k", q.dtype, true, false}, {&c.v, "v", q.dtype, true, false},
                          {&c.o, "o", q.dtype, false, false}, {&c.lse, "lse", stats, false, true}};
  if (c.backward)
    all.insert(all.end(), {{&c.dout, "dout", q.dtype, false, false}, {&c.dq, "dq", q.dtype, false, false},
                           {&c.dk, "dk", q.dtype, true, false}, {&c.dv, "dv", q.dtype, true, false}});
  for (const Expect& e : all) {
    require_type(e.a->device_id == c.q.device_id,
                 std::string(e.name) + " is on another device than q; seqpar computes each rank's shard on one device");
    require_type(e.a->view.dtype == e.dtype, std::string(e.name) + " must be " + dtype_text(e.dtype) + " " + where +
                                                 " (q is " + dtype_text(q.dtype) + "); got " +
                                                 dtype_text(e.a->view.dtype));
    if (e.is_lse)
      require(has_shape(e.a->view, {B, H, S}),
              "lse must be [batch, heads, seq] = " + dims({B, H, S}) + "; got " + shape_text(e.a->view));
    else if (e.is_kv)
      require(has_shape(e.a->view, {B, S, Hkv, D}), std::string(e.name) + " must have k's shape " +
                                                        dims({B, S, Hkv, D}) + "; got " + shape_text(e.a->view));
    else
      require(has_shape(e.a->view, {B, S, H, D}),
              std::string(e.name) + " must have q's shape " + dims({B, S, H, D}) + "; got " + shape_text(e.a->view));
  }
  const auto spec = plan_options_from_spec(c.algo);
  require(spec.ok(), spec.ok() ? "" : spec.status().message());
  require(c.scale >= 0.0, "scale must be positive");
  if (c.seq_len == 0) c.seq_len = S * ranks;
  check_mask_args(c.window_left, c.window_right, c.mask, c.doc_offsets, c.seq_len);
  const Layout layout = make_layout(c.layout, c.seq_len, ranks, c.doc_offsets);
  require(layout.local_len(rank) == S,
          "rank " + std::to_string(rank) + " of " + std::to_string(ranks) + " holds " +
              std::to_string(layout.local_len(rank)) + " of the " + std::to_string(c.seq_len) + " tokens under the " +
              c.layout + " layout, but its q has " + std::to_string(S) +
              " (pass seq_len= the global length when the shards are of unequal length)");
}

RankContext::RankContext(std::unique_ptr<Communicator> comm, bool own_stream)
    : comm_(std::move(comm)), own_stream_(own_stream) {}

RankContext::~RankContext() {
  if (device_ >= 0) {
    DeviceGuard guard(device_);
    sessions_.clear();
    destroy_stream(stream_);
  }
}

// The call's mask: parse_mask's text (cached: a block pattern is read once, and its identity
// keys the plans), or the window; documents ANDed with it.
StatusOr<AttentionParams> RankContext::params_for(const ShardCall& c) {
  AttentionParams params;
  params.scale = c.scale;
  MaskSpec mask = MaskSpec::window(c.window_left, c.window_right);
  if (!c.mask.empty()) {
    const std::string key = c.mask + "@" + std::to_string(c.seq_len);
    auto found = masks_.find(key);
    if (found == masks_.end()) {
      SP_ASSIGN_OR_RETURN(MaskSpec parsed, parse_mask(c.mask, c.seq_len));
      if (masks_.size() >= kMaxMasks) masks_.clear();
      found = masks_.emplace(key, std::move(parsed)).first;
    }
    mask = found->second;
  }
  SP_ASSIGN_OR_RETURN(params.mask, with_documents(std::move(mask), c.doc_offsets));
  return params;
}

StatusOr<Session*> RankContext::session_for(const std::string& algo) {
  auto found = sessions_.find(algo);
  if (found != sessions_.end()) return found->second.get();
  SessionOptions options;
  SP_ASSIGN_OR_RETURN(options.plan, plan_options_from_spec(algo));
  return sessions_.emplace(algo, std::make_unique<Session>(*comm_, std::move(options))).first->second.get();
}

Status RankContext::run(const ShardCall& c, void* stream, std::string* algo_run) {
  try {
    // A thread rank starts on GPU 0: the backends, plans and buffers belong on the tensors' GPU.
    std::optional<DeviceGuard> guard;
    if (c.q.device_id >= 0) {
      SP_CHECK_ARG(device_ < 0 || device_ == c.q.device_id,
                   "this rank's state lives on GPU " + std::to_string(device_) + "; its tensors are now on GPU " +
                       std::to_string(c.q.device_id));
      device_ = c.q.device_id;
      guard.emplace(c.q.device_id);
      SP_RETURN_IF_ERROR(guard->status());
    }
    SP_ASSIGN_OR_RETURN(const AttentionParams params, params_for(c));
    SP_ASSIGN_OR_RETURN(const LayoutKind kind, parse_layout(c.layout));
    // The documents layout balances cu_seqlens' documents, which the caller's shards were cut by
    // too (seqpar.torch.shard(..., cu_seqlens=)); not documents of mask text.
    SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(kind, c.seq_len, comm_->size(), c.doc_offsets));
    SP_ASSIGN_OR_RETURN(Session* session, session_for(c.algo));
    SP_ASSIGN_OR_RETURN(const AttentionPlan* plan, session->plan(layout, params, c.q.view, c.k.view));
    if (algo_run) *algo_run = plan->algorithm->name;
    const ShardTensors st{c.q.view,    c.k.view,  c.v.view,  c.o.view, c.lse.view,
                          c.dout.view, c.dq.view, c.dk.view, c.dv.view};
    const Pass pass = c.backward ? Pass::kBackward : Pass::kForward;
    if (c.q.device_id < 0) return session->run(*plan, pass, st);
    // Thread ranks on a GPU queue on a stream each, ordered after the caller's inputs and
    // before the caller's later work.
    void* s = stream;
    if (own_stream_) {
      if (!stream_) {
        SP_ASSIGN_OR_RETURN(stream_, create_stream());
      }
      s = stream_;
      SP_RETURN_IF_ERROR(stream_wait(s, stream));
    }
    SP_RETURN_IF_ERROR(session->run(*plan, pass, st, {s}));
    if (own_stream_) SP_RETURN_IF_ERROR(stream_wait(stream, s));
    return Status::Ok();
  } catch (const std::exception& e) {  // e.g. bad_alloc: no exception leaves a rank
    return Status(StatusCode::kInternal, std::string("rank failed: ") + e.what());
  }
}

Status run_thread_ranks(const std::vector<RankContext*>& contexts, const std::vector<ShardCall>& calls, void* stream,
                        std::string* algo_run) {
  const int P = static_cast<int>(contexts.size());
  const int threads_per_rank = std::max(1, omp_get_max_threads() / std::max(1, P));
  std::vector<Status> results(P);
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      omp_set_num_threads(threads_per_rank);
      results[r] = contexts[r]->run(calls[r], stream, r == 0 ? algo_run : nullptr);
      if (!results[r].ok()) contexts[r]->comm().abort("rank " + std::to_string(r) + " failed: " + results[r].message());
    });
  for (std::thread& t : threads) t.join();
  return first_root_cause(results);
}

}  // namespace seqpar::py
