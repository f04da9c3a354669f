// seqpar._core's shard-level API (shard_api.hpp): Rank objects wrap a RankContext; calls check
// their arguments with the GIL held, then run with it released.
#include "shard_api.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attention.hpp"
#include "py_transport_comm.hpp"
#include "rank_context.hpp"
#include "seqpar/gpu.hpp"
#include "seqpar/nccl_comm.hpp"

namespace seqpar::py {
namespace {

using Array = nb::ndarray<>;

struct Options {
  int64_t window_left, window_right;
  double scale;
  std::string algo, layout;
  int64_t seq_len;
  std::vector<int64_t> doc_offsets;
  std::string mask;
};

ShardCall make_call(const Array& q, const Array& k, const Array& v, const Array& o, const Array& lse,
                    const std::optional<Array>& dout, const std::optional<Array>& dq, const std::optional<Array>& dk,
                    const std::optional<Array>& dv, const Options& opt) {
  ShardCall c;
  c.q = any_view(q, "q");
  c.k = any_view(k, "k");
  c.v = any_view(v, "v");
  c.o = any_view(o, "o");
  c.lse = any_view(lse, "lse");
  c.backward = dout.has_value();
  if (c.backward) {
    require(dq && dk && dv, "the backward needs dq, dk and dv to write");
    c.dout = any_view(*dout, "dout");
    c.dq = any_view(*dq, "dq");
    c.dk = any_view(*dk, "dk");
    c.dv = any_view(*dv, "dv");
  }
  c.window_left = opt.window_left;
  c.window_right = opt.window_right;
  c.scale = opt.scale;
  c.algo = opt.algo;
  c.layout = opt.layout;
  c.seq_len = opt.seq_len;
  c.doc_offsets = opt.doc_offsets;
  c.mask = opt.mask;
  return c;
}

void* as_stream(uintptr_t stream) { return reinterpret_cast<void*>(stream); }

nb::dict counters(RankContext& ctx) {
  nb::dict out;
  const CommCounters& c = ctx.comm().counters();
  for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kOther}) {
    nb::dict phase;
    phase["sent"] = c.sent(p);
    phase["received"] = c.received(p);
    out[phase_name(p)] = phase;
  }
  return out;
}

// One rank's forward (dout absent) or backward into the given outputs; returns the algorithm.
std::string shard_attention(RankContext& ctx, const Array& q, const Array& k, const Array& v, const Array& o,
                            const Array& lse, const std::optional<Array>& dout, const std::optional<Array>& dq,
                            const std::optional<Array>& dk, const std::optional<Array>& dv, int64_t window_left,
                            int64_t window_right, double scale, const std::string& algo, const std::string& layout,
                            int64_t seq_len, const std::vector<int64_t>& doc_offsets, const std::string& mask,
                            uintptr_t stream) {
  ShardCall c = make_call(q, k, v, o, lse, dout, dq, dk, dv,
                          {window_left, window_right, scale, algo, layout, seq_len, doc_offsets, mask});
  check_shard_call(c, ctx.comm().rank(), ctx.comm().size());
  std::string algo_run;
  Status status;
  {
    nb::gil_scoped_release no_gil;
    status = ctx.run(c, as_stream(stream), &algo_run);
  }
  throw_if_error(status);
  return algo_run;
}

// Every thread rank's call at once: shards[r] = (q, k, v, o, lse[, dout, dq, dk, dv]) of rank r.
std::string threads_attention(const std::vector<RankContext*>& ranks, const std::vector<std::vector<Array>>& shards,
                              int64_t window_left, int64_t window_right, double scale, const std::string& algo,
                              const std::string& layout, int64_t seq_len, const std::vector<int64_t>& doc_offsets,
                              const std::string& mask, uintptr_t stream) {
  require(!ranks.empty() && ranks.size() == shards.size(), "need one shard tuple per rank");
  std::vector<ShardCall> calls;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::vector<Array>& t = shards[r];
    require(t.size() == 5 || t.size() == 9, "a shard tuple holds 5 tensors (forward) or 9 (backward)");
    const bool bwd = t.size() == 9;
    auto opt = [&](size_t i) { return bwd ? std::optional<Array>(t[i]) : std::nullopt; };
    calls.push_back(make_call(t[0], t[1], t[2], t[3], t[4], opt(5), opt(6), opt(7), opt(8),
                              {window_left, window_right, scale, algo, layout, seq_len, doc_offsets, mask}));
    check_shard_call(calls.back(), static_cast<int>(r), static_cast<int>(ranks.size()));
  }
  std::string algo_run;
  Status status;
  {
    nb::gil_scoped_release no_gil;
    status = run_thread_ranks(ranks, calls, as_stream(stream), &algo_run);
  }
  throw_if_error(status);
  return algo_run;
}

// The global sequence length: the sum of every rank's local length (a small all-gather).
int64_t agree_seq_len(RankContext& ctx, int64_t local_len) {
  Communicator& comm = ctx.comm();
  std::vector<int64_t> all(comm.size());
  const Status status = [&] {
    nb::gil_scoped_release no_gil;
    const PhaseScope phase(comm, Phase::kOther);
    return comm.all_gather(&local_len, all.data(), sizeof(int64_t));
  }();
  throw_if_error(status);
  int64_t total = 0;
  for (int64_t n : all) total += n;
  return total;
}

std::unique_ptr<RankContext> from_transport(nb::object transport, int rank, int size) {
  require(size >= 1 && rank >= 0 && rank < size,
          "rank " + std::to_string(rank) + " is out of range for a group of " + std::to_string(size));
  return std::make_unique<RankContext>(make_python_transport_communicator(std::move(transport), rank, size), false);
}

nb::bytes nccl_id() {
  const std::vector<char> id = value_or_throw(nccl_unique_id());
  return nb::bytes(id.data(), id.size());
}

std::unique_ptr<RankContext> from_nccl_id(const nb::bytes& id, int rank, int size, int device) {
  const char* p = static_cast<const char*>(id.data());
  std::vector<char> bytes(p, p + id.size());
  auto comm = [&] {
    nb::gil_scoped_release no_gil;  // every rank of the group must join: this waits for them
    return make_nccl_communicator(bytes, rank, size, device);
  }();
  return std::make_unique<RankContext>(value_or_throw(std::move(comm)), false);
}

std::vector<std::unique_ptr<RankContext>> thread_ranks(int size) {
  require(size >= 1 && size <= 256, "thread ranks must number 1 to 256; got " + std::to_string(size));
  std::vector<std::unique_ptr<RankContext>> out;
  for (auto& comm : make_local_communicators(size)) out.push_back(std::make_unique<RankContext>(std::move(comm), true));
  return out;
}

}  // namespace

void register_shard_api(nb::module_& m) {
  nb::class_<RankContext>(m, "Rank", "One rank's communicator, GPU state and cached plans")
      .def_prop_ro("rank", [](RankContext& c) { return c.comm().rank(); })
      .def_prop_ro("size", [](RankContext& c) { return c.comm().size(); })
      .def_prop_ro("backend", [](RankContext& c) { return c.comm().backend_name(); })
      .def("counters", &counters, "bytes sent and received per phase (forward, backward, other)")
      .def("reset_counters", [](RankContext& c) { c.comm().reset_counters(); })
      .def("agree_seq_len", &agree_seq_len, nb::arg("local_len"),
           "the global length: every rank's local length summed (collective)");
  m.def("rank_from_transport", &from_transport, nb::arg("transport"), nb::arg("rank"), nb::arg("size"));
  m.def("nccl_available", &nccl_available);
  m.def("nccl_unique_id", &nccl_id);
  m.def("rank_from_nccl_id", &from_nccl_id, nb::arg("id"), nb::arg("rank"), nb::arg("size"), nb::arg("device"));
  m.def("thread_ranks", &thread_ranks, nb::arg("size"));
  m.def("abandon_device", &abandon_device,
        "from now on, GPU state still held (buffers, other threads' cuDNN handles) is left to the process's end "
        "instead of freed: for interpreter exit, once the ranks are destroyed");
  m.def("shard_attention", &shard_attention, nb::arg("rank"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"),
        nb::arg("lse"), nb::arg("dout").none(), nb::arg("dq").none(), nb::arg("dk").none(), nb::arg("dv").none(),
        nb::arg("window_left"), nb::arg("window_right"), nb::arg("scale"), nb::arg("algo"), nb::arg("layout"),
        nb::arg("seq_len"), nb::arg("doc_offsets") = std::vector<int64_t>{}, nb::arg("mask") = "",
        nb::arg("stream") = 0);
  m.def("threads_attention", &threads_attention, nb::arg("ranks"), nb::arg("shards"), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("scale"), nb::arg("algo"), nb::arg("layout"), nb::arg("seq_len"),
        nb::arg("doc_offsets") = std::vector<int64_t>{}, nb::arg("mask") = "", nb::arg("stream") = 0);
}

}  // namespace seqpar::py
