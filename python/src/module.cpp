// seqpar._core: the nanobind module behind the `seqpar` Python package. Distributed attention
// over thread ranks on full-sequence host arrays (attention.cpp), the layout helpers, the
// algorithm list, and attention over local shards for seqpar.torch (shard_api.cpp). Arguments are checked here so that a Python caller gets ValueError/TypeError
// with the reason.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "attention.hpp"
#include "shard_api.hpp"
#include "seqpar/algorithm.hpp"

namespace seqpar::py {
namespace {

AttentionCall make_call(const InArray& q, const InArray& k, const InArray& v, int64_t window_left,
                        int64_t window_right, const std::string& algo, int ranks, const std::string& layout,
                        double scale, const std::vector<int64_t>& doc_offsets, const std::string& mask) {
  AttentionCall c;
  c.doc_offsets = doc_offsets;
  c.mask = mask;
  c.q = view_of(q, "q");
  c.k = view_of(k, "k");
  c.v = view_of(v, "v");
  c.window_left = window_left;
  c.window_right = window_right;
  c.algo = algo;
  c.ranks = ranks;
  c.layout = layout;
  c.scale = scale;
  return c;
}

// Forward (and backward when dout is given) on full arrays: a dict of o, lse (dq, dk, dv).
nb::dict attention(const InArray& q, const InArray& k, const InArray& v, const std::optional<InArray>& dout,
                   int64_t window_left, int64_t window_right, const std::string& algo, int ranks,
                   const std::string& layout, double scale, const std::vector<int64_t>& doc_offsets,
                   const std::string& mask) {
  AttentionCall c = make_call(q, k, v, window_left, window_right, algo, ranks, layout, scale, doc_offsets, mask);
  if (dout) c.dout = view_of(*dout, "dout");
  return run_attention(c);
}

// The backward alone against a forward's o and lse: a dict of dq, dk, dv.
nb::dict attention_backward(const InArray& q, const InArray& k, const InArray& v, const InArray& o,
                            const InArray& lse, const InArray& dout, int64_t window_left, int64_t window_right,
                            const std::string& algo, int ranks, const std::string& layout, double scale,
                            const std::vector<int64_t>& doc_offsets, const std::string& mask) {
  AttentionCall c = make_call(q, k, v, window_left, window_right, algo, ranks, layout, scale, doc_offsets, mask);
  c.o = view_of(o, "o");
  c.lse = view_of(lse, "lse");
  c.dout = view_of(dout, "dout");
  return run_attention(c);
}

int normalized_dim(int64_t dim, int ndim) {
  require(dim >= -ndim && dim < ndim, "seq_dim " + std::to_string(dim) + " is out of range for " +
                                          std::to_string(ndim) + " dimensions");
  return static_cast<int>(dim < 0 ? dim + ndim : dim);
}

// Rank `rank`'s rows of x (sequence along seq_dim), in local order.
OutArray shard(const InArray& x_in, const std::string& layout_name, int ranks, int rank, int64_t seq_dim,
               const std::vector<int64_t>& doc_offsets) {
  const TensorView x = view_of(x_in, "x");
  require(x.ndim >= 1, "x must have a sequence dimension");
  const int dim = normalized_dim(seq_dim, x.ndim);
  const Layout layout = make_layout(layout_name, x.shape[dim], ranks, doc_offsets);
  require(rank >= 0 && rank < ranks, "rank must be in [0, " + std::to_string(ranks) + "); got " + std::to_string(rank));
  std::vector<int64_t> shape(x.shape.begin(), x.shape.begin() + x.ndim);
  shape[dim] = layout.local_len(rank);
  HostTensor local(x.dtype, shape);
  throw_if_error(layout.shard(x, dim, rank, local.view()));
  return to_numpy(std::move(local));
}

// The global array from every rank's shard (shards[r] is rank r's, as shard() returns it).
OutArray unshard(const std::vector<InArray>& shards_in, const std::string& layout_name, int64_t seq_dim,
                 const std::vector<int64_t>& doc_offsets) {
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
  const Layout layout = make_layout(layout_name, seq_len, ranks, doc_offsets);
  std::vector<int64_t> shape(first.shape.begin(), first.shape.begin() + first.ndim);
  shape[dim] = seq_len;
  HostTensor global(first.dtype, shape);
  for (int r = 0; r < ranks; ++r) throw_if_error(layout.unshard(shards[r], dim, r, global.view()));
  return to_numpy(std::move(global));
}

std::vector<int64_t> positions(const std::string& layout_name, int64_t seq_len, int ranks, int rank,
                               const std::vector<int64_t>& doc_offsets) {
  const Layout layout = make_layout(layout_name, seq_len, ranks, doc_offsets);
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
        nb::arg("scale"), nb::arg("doc_offsets") = std::vector<int64_t>{}, nb::arg("mask") = "");
  m.def("attention_backward", &attention_backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"),
        nb::arg("lse"), nb::arg("dout"), nb::arg("window_left"), nb::arg("window_right"), nb::arg("algo"),
        nb::arg("ranks"), nb::arg("layout"), nb::arg("scale"), nb::arg("doc_offsets") = std::vector<int64_t>{},
        nb::arg("mask") = "");
  m.def("shard", &shard, nb::arg("x"), nb::arg("layout"), nb::arg("ranks"), nb::arg("rank"), nb::arg("seq_dim"),
        nb::arg("doc_offsets") = std::vector<int64_t>{});
  m.def("unshard", &unshard, nb::arg("shards"), nb::arg("layout"), nb::arg("seq_dim"),
        nb::arg("doc_offsets") = std::vector<int64_t>{});
  m.def("positions", &positions, nb::arg("layout"), nb::arg("seq_len"), nb::arg("ranks"), nb::arg("rank"),
        nb::arg("doc_offsets") = std::vector<int64_t>{});
  m.def("algorithms", &algorithms);
  register_shard_api(m);
}
