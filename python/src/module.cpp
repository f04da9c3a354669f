// seqpar._core: the nanobind module behind the `seqpar` Python package. Distributed attention
// over thread ranks on full-sequence host arrays (shard with a layout, run the planned schedule
// on P ranks through run_local_ranks, unshard), the layout helpers, and the algorithm list.
// Arguments are checked here so that a Python caller gets ValueError/TypeError with the reason.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <omp.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "seqpar/distributed_attention.hpp"

namespace seqpar::py {
namespace {

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

void check_ranks(int ranks) {
  require(ranks >= 1 && ranks <= kMaxRanks,
          "ranks must be between 1 and " + std::to_string(kMaxRanks) + "; got " + std::to_string(ranks));
}

Layout make_layout(const std::string& name, int64_t seq_len, int ranks) {
  check_ranks(ranks);
  const LayoutKind kind = value_or_throw(parse_layout(name));
  return value_or_throw(Layout::create(kind, seq_len, ranks));
}

// Checks q, k, v (and dout) as one attention problem: [B, S, H, D] and [B, S, H_kv, D] of one
// float dtype, H divisible by H_kv.
void check_problem(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* dout) {
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {dout, "dout"}}) {
    if (t == nullptr) continue;
    if (t->dtype != DType::kF32 && t->dtype != DType::kF64)
      throw nb::type_error((std::string(name) + ": attention on CPU ranks takes float32 or float64, not " +
                            dtype_text(t->dtype)).c_str());
    if (t->dtype != q.dtype)
      throw nb::type_error(("q, k, v and dout must share one dtype; q is " + dtype_text(q.dtype) + ", " + name +
                            " is " + dtype_text(t->dtype)).c_str());
    require(t->ndim == 4, std::string(name) + " must be 4-D [batch, seq, heads, head_dim]; got shape " +
                              shape_text(*t));
  }
  require(k.same_shape(v), "k and v must have one shape; got " + shape_text(k) + " and " + shape_text(v));
  require(k.shape[0] == q.shape[0] && k.shape[1] == q.shape[1] && k.shape[3] == q.shape[3],
          "k must be [batch, seq, kv_heads, head_dim] with q's batch, seq and head_dim; q is " + shape_text(q) +
              ", k is " + shape_text(k));
  require(q.shape[3] > 0 && k.shape[2] > 0, "head_dim and heads must be positive; q is " + shape_text(q) +
                                                ", k is " + shape_text(k));
  require(q.shape[2] % k.shape[2] == 0, "query heads (" + std::to_string(q.shape[2]) +
                                            ") must be divisible by key/value heads (" +
                                            std::to_string(k.shape[2]) + ")");
  if (dout) require(dout->same_shape(q), "dout must have q's shape " + shape_text(q) + "; got " + shape_text(*dout));
}

// Runs forward (and backward when dout is given) of `algo` over `ranks` thread ranks on the
// full arrays; returns a dict of numpy arrays: o, lse (and dq, dk, dv), plus the algorithm run.
nb::dict attention(const InArray& q_in, const InArray& k_in, const InArray& v_in,
                   const std::optional<InArray>& dout_in, int64_t window_left, int64_t window_right,
                   const std::string& algo, int ranks, const std::string& layout_name, double scale) {
  const TensorView q = view_of(q_in, "q"), k = view_of(k_in, "k"), v = view_of(v_in, "v");
  std::optional<TensorView> dout;
  if (dout_in) dout = view_of(*dout_in, "dout");
  check_problem(q, k, v, dout ? &*dout : nullptr);
  require(algo == "auto" || find_algorithm(algo) != nullptr,
          "unknown algo '" + algo + "'; one of auto|" + algorithm_names());
  require(window_left >= -1 && window_right >= -1,
          "window bounds must be >= -1 (-1 unbounded); got (" + std::to_string(window_left) + ", " +
              std::to_string(window_right) + ")");
  const Layout layout = make_layout(layout_name, q.shape[1], ranks);

  AttentionParams params;
  params.scale = scale;
  params.mask = MaskSpec::window(window_left, window_right);
  const int64_t B = q.shape[0], S = q.shape[1], H = q.shape[2], H_kv = k.shape[2], D = q.shape[3];
  const DType t = q.dtype;
  const BlockBytes bytes{B, H, H_kv, D, t, t, t, true};
  const bool backward = dout.has_value();
  HostTensor o(t, {B, S, H, D}), lse(t, {B, H, S}), dq, dk, dv;
  if (backward) {
    dq = HostTensor(t, {B, S, H, D});
    dk = HostTensor(t, {B, S, H_kv, D});
    dv = HostTensor(t, {B, S, H_kv, D});
  }
  std::string algo_run;
  const int threads_per_rank = std::max(1, omp_get_max_threads() / ranks);

  // One rank: shard the inputs, plan, run, write its rows of the results (rows are disjoint,
  // so the ranks write the shared outputs without a lock). No Python objects are touched.
  auto rank_fn = [&](Communicator& comm) -> Status {
    try {
      omp_set_num_threads(threads_per_rank);
      const int r = comm.rank();
      const int64_t n = layout.local_len(r);
      SP_ASSIGN_OR_RETURN(const AttentionPlan plan,
                          plan_attention(PlanOptions(algo), layout, params, bytes, r, cpu_kernel_backend()));
      if (r == 0) algo_run = plan.algorithm->name;
      HostTensor lq(t, {B, n, H, D}), lk(t, {B, n, H_kv, D}), lv(t, {B, n, H_kv, D}), lo(t, {B, n, H, D});
      HostTensor llse(t, {B, H, n}), ldo, ldq, ldk, ldv;
      SP_RETURN_IF_ERROR(layout.shard(q, 1, r, lq.view()));
      SP_RETURN_IF_ERROR(layout.shard(k, 1, r, lk.view()));
      SP_RETURN_IF_ERROR(layout.shard(v, 1, r, lv.view()));
      if (backward) {
        ldo = lq, ldq = lq, ldk = lk, ldv = lk;
        SP_RETURN_IF_ERROR(layout.shard(*dout, 1, r, ldo.view()));
      }
      const ShardTensors st{lq.view(), lk.view(), lv.view(), lo.view(), llse.view(),
                            ldo.view(), ldq.view(), ldk.view(), ldv.view()};
      SP_RETURN_IF_ERROR(run_forward_cpu(comm, plan, st));
      if (backward) SP_RETURN_IF_ERROR(run_backward_cpu(comm, plan, st));
      SP_RETURN_IF_ERROR(layout.unshard(lo.view(), 1, r, o.view()));
      SP_RETURN_IF_ERROR(layout.unshard(llse.view(), 2, r, lse.view()));
      if (backward) {
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
    status = run_local_ranks(ranks, rank_fn);
  }
  throw_if_error(status);

  nb::dict out;
  out["o"] = to_numpy(std::move(o));
  out["lse"] = to_numpy(std::move(lse));
  if (backward) {
    out["dq"] = to_numpy(std::move(dq));
    out["dk"] = to_numpy(std::move(dk));
    out["dv"] = to_numpy(std::move(dv));
  }
  out["algo"] = algo_run;
  return out;
}

int normalized_dim(int64_t dim, int ndim) {
  require(dim >= -ndim && dim < ndim, "seq_dim " + std::to_string(dim) + " is out of range for " +
                                          std::to_string(ndim) + " dimensions");
  return static_cast<int>(dim < 0 ? dim + ndim : dim);
}

// Rank `rank`'s rows of x (sequence along seq_dim), in local order.
OutArray shard(const InArray& x_in, const std::string& layout_name, int ranks, int rank, int64_t seq_dim) {
  const TensorView x = view_of(x_in, "x");
  require(x.ndim >= 1, "x must have a sequence dimension");
  const int dim = normalized_dim(seq_dim, x.ndim);
  const Layout layout = make_layout(layout_name, x.shape[dim], ranks);
  require(rank >= 0 && rank < ranks, "rank must be in [0, " + std::to_string(ranks) + "); got " + std::to_string(rank));
  std::vector<int64_t> shape(x.shape.begin(), x.shape.begin() + x.ndim);
  shape[dim] = layout.local_len(rank);
  HostTensor local(x.dtype, shape);
  throw_if_error(layout.shard(x, dim, rank, local.view()));
  return to_numpy(std::move(local));
}

// The global array from every rank's shard (shards[r] is rank r's, as shard() returns it).
OutArray unshard(const std::vector<InArray>& shards_in, const std::string& layout_name, int64_t seq_dim) {
  require(!shards_in.empty(), "unshard needs one shard per rank; got none");
  std::vector<TensorView> shards;
  for (size_t r = 0; r < shards_in.size(); ++r)
    shards.push_back(view_of(shards_in[r], ("shards[" + std::to_string(r) + "]").c_str()));
  const TensorView& first = shards[0];
  require(first.ndim >= 1, "shards must have a sequence dimension");
  const int dim = normalized_dim(seq_dim, first.ndim);
  int64_t seq_len = 0;
  for (size_t r = 0; r < shards.size(); ++r) {
    const TensorView& s = shards[r];
    if (s.dtype != first.dtype) throw nb::type_error("shards must share one dtype");
    bool same = s.ndim == first.ndim;
    for (int d = 0; same && d < s.ndim; ++d) same = d == dim || s.shape[d] == first.shape[d];
    require(same, "shards must agree in every dimension but seq_dim; shards[0] is " + shape_text(first) +
                      ", shards[" + std::to_string(r) + "] is " + shape_text(s));
    seq_len += s.shape[dim];
  }
  const int ranks = static_cast<int>(shards.size());
  const Layout layout = make_layout(layout_name, seq_len, ranks);
  std::vector<int64_t> shape(first.shape.begin(), first.shape.begin() + first.ndim);
  shape[dim] = seq_len;
  HostTensor global(first.dtype, shape);
  for (int r = 0; r < ranks; ++r) throw_if_error(layout.unshard(shards[r], dim, r, global.view()));
  return to_numpy(std::move(global));
}

std::vector<int64_t> positions(const std::string& layout_name, int64_t seq_len, int ranks, int rank) {
  const Layout layout = make_layout(layout_name, seq_len, ranks);
  require(rank >= 0 && rank < ranks, "rank must be in [0, " + std::to_string(ranks) + "); got " + std::to_string(rank));
  return layout.positions(rank);
}

nb::dict algorithms() {
  nb::dict out;
  for (const Algorithm* a : all_algorithms()) out[a->name] = a->summary;
  return out;
}

}  // namespace
}  // namespace seqpar::py

NB_MODULE(_core, m) {
  namespace nb = nanobind;
  using namespace seqpar::py;
  m.doc() = "seqpar's C++ core (use the seqpar package, which wraps this module)";
  m.attr("__version__") = SEQPAR_VERSION;
  m.def("attention", &attention, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("dout").none(),
        nb::arg("window_left"), nb::arg("window_right"), nb::arg("algo"), nb::arg("ranks"), nb::arg("layout"),
        nb::arg("scale"));
  m.def("shard", &shard, nb::arg("x"), nb::arg("layout"), nb::arg("ranks"), nb::arg("rank"), nb::arg("seq_dim"));
  m.def("unshard", &unshard, nb::arg("shards"), nb::arg("layout"), nb::arg("seq_dim"));
  m.def("positions", &positions, nb::arg("layout"), nb::arg("seq_len"), nb::arg("ranks"), nb::arg("rank"));
  m.def("algorithms", &algorithms);
}
