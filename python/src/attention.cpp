// seqpar.attention's work (attention.hpp): argument checks that a Python caller can read, then
// forward and/or backward of the planned schedule on thread ranks over the full arrays, each rank
// through a Session.
#include "attention.hpp"

#include <nanobind/stl/string.h>  // the "algo" entry of the result
#include <omp.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "seqpar/session.hpp"

namespace seqpar::py {

// Thread ranks beyond this are a mistake, not a plan (each is an OS thread with its buffers).
constexpr int kMaxRanks = 256;

std::string shape_text(const TensorView& t) {
  std::string s = "(";
  for (int d = 0; d < t.ndim; ++d) s += (d ? ", " : "") + std::to_string(t.shape[d]);
  return s + (t.ndim == 1 ? ",)" : ")");
}

void require(bool cond, const std::string& message) {
  if (!cond) throw nb::value_error(message.c_str());
}

Layout make_layout(const std::string& name, int64_t seq_len, int ranks, const std::vector<int64_t>& doc_offsets) {
  require(ranks >= 1 && ranks <= kMaxRanks,
          "ranks must be between 1 and " + std::to_string(kMaxRanks) + "; got " + std::to_string(ranks));
  const LayoutKind kind = value_or_throw(parse_layout(name));
  return value_or_throw(Layout::create(kind, seq_len, ranks, doc_offsets));
}

namespace {

// q, k, v, o, dout: [B, S, H, D] and [B, S, H_kv, D] of one float dtype, H divisible by H_kv;
// lse: [B, H, S].
void check_problem(const AttentionCall& c) {
  const TensorView& q = c.q;
  const TensorView* o = c.o ? &*c.o : nullptr;
  const TensorView* lse = c.lse ? &*c.lse : nullptr;
  const TensorView* dout = c.dout ? &*c.dout : nullptr;
  for (auto [t, name] : {std::pair{&q, "q"}, {&c.k, "k"}, {&c.v, "v"}, {o, "o"}, {lse, "lse"}, {dout, "dout"}}) {
    if (t == nullptr) continue;
    if (t->dtype != DType::kF32 && t->dtype != DType::kF64)
      throw nb::type_error((std::string(name) + ": attention on CPU ranks takes float32 or float64, not " +
                            dtype_text(t->dtype)).c_str());
    if (t->dtype != q.dtype)
      throw nb::type_error(("q, k, v, o, lse and dout must share one dtype; q is " + dtype_text(q.dtype) + ", " +
                            name + " is " + dtype_text(t->dtype)).c_str());
    if (t != lse)
      require(t->ndim == 4, std::string(name) + " must be 4-D [batch, seq, heads, head_dim]; got shape " +
                                shape_text(*t));
  }
  const TensorView &k = c.k, &v = c.v;
  require(k.same_shape(v), "k and v must have one shape; got " + shape_text(k) + " and " + shape_text(v));
  require(k.shape[0] == q.shape[0] && k.shape[1] == q.shape[1] && k.shape[3] == q.shape[3],
          "k must be [batch, seq, kv_heads, head_dim] with q's batch, seq and head_dim; q is " + shape_text(q) +
              ", k is " + shape_text(k));
  require(q.shape[3] > 0 && k.shape[2] > 0,
          "head_dim and heads must be positive; q is " + shape_text(q) + ", k is " + shape_text(k));
  require(q.shape[2] % k.shape[2] == 0, "query heads (" + std::to_string(q.shape[2]) +
                                            ") must be divisible by key/value heads (" +
                                            std::to_string(k.shape[2]) + ")");
  for (auto [t, name] : {std::pair{o, "o"}, {dout, "dout"}})
    if (t) require(t->same_shape(q), std::string(name) + " must have q's shape " + shape_text(q) + "; got " + shape_text(*t));
  if (lse)
    require(lse->ndim == 3 && lse->shape[0] == q.shape[0] && lse->shape[1] == q.shape[2] && lse->shape[2] == q.shape[1],
            "lse must be [batch, heads, seq] = (" + std::to_string(q.shape[0]) + ", " + std::to_string(q.shape[2]) +
                ", " + std::to_string(q.shape[1]) + "); got " + shape_text(*lse));
  const auto spec = plan_options_from_spec(c.algo);
  require(spec.ok(), spec.ok() ? "" : spec.status().message());
  check_mask_args(c.window_left, c.window_right, c.mask, c.doc_offsets, q.shape[1]);
}

}  // namespace

void check_mask_args(int64_t window_left, int64_t window_right, const std::string& mask_text,
                     const std::vector<int64_t>& doc_offsets, int64_t seq_len) {
  require(window_left >= -1 && window_right >= -1, "window bounds must be >= -1 (-1 unbounded); got (" +
                                                       std::to_string(window_left) + ", " +
                                                       std::to_string(window_right) + ")");
  require(mask_text.empty() || (window_left == -1 && window_right == -1),
          "give the mask either as a window (window_size, causal) or as text (mask=" + mask_text + "), not both");
  if (doc_offsets.empty()) return;
  const std::vector<int64_t>& d = doc_offsets;
  bool increasing = d.front() == 0;
  for (size_t i = 1; increasing && i < d.size(); ++i) increasing = d[i] >= d[i - 1];
  require(d.size() >= 2 && increasing && d.back() == seq_len,
          "cu_seqlens must be the documents' global start offsets and the total length: start at 0, never "
          "decrease and end at the sequence's " + std::to_string(seq_len) + " tokens; got " +
              std::to_string(d.size()) + " offsets from " + std::to_string(d.front()) + " to " +
              std::to_string(d.back()));
}

StatusOr<MaskSpec> with_documents(MaskSpec mask, const std::vector<int64_t>& doc_offsets) {
  if (doc_offsets.empty()) return mask;
  SP_CHECK_ARG(!mask.has_documents(), "the mask text (" + mask.describe() + ") has documents already; cu_seqlens too");
  mask.doc_offsets = doc_offsets;
  return mask;
}

nb::dict run_attention(const AttentionCall& c) {
  check_problem(c);
  AttentionParams params;
  params.scale = c.scale;
  params.mask = value_or_throw(with_documents(c.mask.empty() ? MaskSpec::window(c.window_left, c.window_right)
                                                              : value_or_throw(parse_mask(c.mask, c.q.shape[1])),
                                               c.doc_offsets));
  const Layout layout = make_layout(c.layout, c.q.shape[1], c.ranks, params.mask.doc_offsets);
  const int64_t B = c.q.shape[0], S = c.q.shape[1], H = c.q.shape[2], H_kv = c.k.shape[2], D = c.q.shape[3];
  const DType t = c.q.dtype;
  const bool forward = !c.o.has_value(), backward = c.dout.has_value();
  require(forward || backward, "o and lse are given: the backward needs dout");
  require(c.o.has_value() == c.lse.has_value(), "give o and lse together");
  HostTensor o, lse, dq, dk, dv;
  if (forward) {
    o = HostTensor(t, {B, S, H, D});
    lse = HostTensor(t, {B, H, S});
  }
  if (backward) {
    dq = HostTensor(t, {B, S, H, D});
    dk = HostTensor(t, {B, S, H_kv, D});
    dv = HostTensor(t, {B, S, H_kv, D});
  }
  std::string algo_run;
  const int threads_per_rank = std::max(1, omp_get_max_threads() / c.ranks);

  // One rank: shard the inputs, plan, run, write its rows of the results (rows are disjoint,
  // so the ranks write the shared outputs without a lock). No Python objects are touched.
  auto rank_fn = [&](Communicator& comm) -> Status {
    try {
      omp_set_num_threads(threads_per_rank);
      const int r = comm.rank();
      const int64_t n = layout.local_len(r);
      SessionOptions options;
      SP_ASSIGN_OR_RETURN(options.plan, plan_options_from_spec(c.algo));
      Session session(comm, options);
      HostTensor lq(t, {B, n, H, D}), lk(t, {B, n, H_kv, D}), lv(t, {B, n, H_kv, D}), lo(t, {B, n, H, D});
      HostTensor llse(t, {B, H, n}), ldo, ldq, ldk, ldv;
      SP_RETURN_IF_ERROR(layout.shard(c.q, 1, r, lq.view()));
      SP_RETURN_IF_ERROR(layout.shard(c.k, 1, r, lk.view()));
      SP_RETURN_IF_ERROR(layout.shard(c.v, 1, r, lv.view()));
      if (!forward) {
        SP_RETURN_IF_ERROR(layout.shard(*c.o, 1, r, lo.view()));
        SP_RETURN_IF_ERROR(layout.shard(*c.lse, 2, r, llse.view()));
      }
      if (backward) {
        ldo = HostTensor(t, {B, n, H, D});
        ldq = HostTensor(t, {B, n, H, D});
        ldk = HostTensor(t, {B, n, H_kv, D});
        ldv = HostTensor(t, {B, n, H_kv, D});
        SP_RETURN_IF_ERROR(layout.shard(*c.dout, 1, r, ldo.view()));
      }
      const ShardTensors st{lq.view(), lk.view(), lv.view(), lo.view(), llse.view(),
                            ldo.view(), ldq.view(), ldk.view(), ldv.view()};
      SP_ASSIGN_OR_RETURN(const AttentionPlan* plan, session.plan(layout, params, lq.view(), lk.view()));
      if (r == 0) algo_run = plan->algorithm->name;
      if (forward) {
        SP_RETURN_IF_ERROR(session.run(*plan, Pass::kForward, st));
        SP_RETURN_IF_ERROR(layout.unshard(lo.view(), 1, r, o.view()));
        SP_RETURN_IF_ERROR(layout.unshard(llse.view(), 2, r, lse.view()));
      }
      if (backward) {
        SP_RETURN_IF_ERROR(session.run(*plan, Pass::kBackward, st));
        SP_RETURN_IF_ERROR(layout.unshard(ldq.view(), 1, r, dq.view()));
        SP_RETURN_IF_ERROR(layout.unshard(ldk.view(), 1, r, dk.view()));
        SP_RETURN_IF_ERROR(layout.unshard(ldv.view(), 1, r, dv.view()));
      }
      return Status::Ok();
    } catch (const std::exception& e) {  // e.g. bad_alloc: an exception must not leave a thread
      return Status(StatusCode::kInternal, std::string("rank failed: ") + e.what());
    }
  };
  Status status;
  {
    nb::gil_scoped_release no_gil;  // the ranks run in C++ threads; let other Python threads go on
    status = run_local_ranks(c.ranks, rank_fn);
  }
  throw_if_error(status);

  nb::dict out;
  if (forward) {
    out["o"] = to_numpy(std::move(o));
    out["lse"] = to_numpy(std::move(lse));
  }
  if (backward) {
    out["dq"] = to_numpy(std::move(dq));
    out["dk"] = to_numpy(std::move(dk));
    out["dv"] = to_numpy(std::move(dv));
  }
  out["algo"] = algo_run;
  return out;
}

}  // namespace seqpar::py
