// A layer's activations as the layer pass (layer_pass.hpp) holds them from a layer's forward to
// its backward (each checkpointing policy keeps some of them), and their trips to host memory
// when the checkpoints are offloaded (host_offload.hpp): out under the next layer's forward, back
// one layer ahead in the backward. A = the products' inputs' element type, R = the residual
// stream's, statistics' and gradients' (the device half's Dev::Act and Dev::Acc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "model/host_offload.hpp"
#include "model/training_memory.hpp"

namespace seqpar::model {

template <class A, class R>
struct LayerActs {
  Array<R> x_in, rstd1, lse, x_mid, rstd2;
  Array<A> h1, q, k, v, o, h2, g, u;
  Array<A> o_late;     // sequence policy: O of the shard's second half
  Array<R> lse_late;   // and its LSE
  Array<A> q_in, k_in, mix_g, normed;  // a linear layer's (linear_attention_layer.hpp)
  Array<R> rstd_o;                     // and its output norm's statistics
  uint32_t in_host = 0;                // bit i: array i (each's order) waits in host memory
  // f(i, array) for every array, i its place (the host slot's index).
  template <class F>
  void each(F&& f) {
    each_of(*this, f);
  }
  template <class F>
  void each(F&& f) const {
    each_of(*this, f);
  }
  // Bytes in this memory (not those waiting in host memory).
  int64_t bytes() const {
    int64_t n = 0;
    each([&](int, const auto& t) {
      if (t.buffer) n += t.n * int64_t(sizeof(*t.p()));
    });
    return n;
  }

 private:
  template <class Self, class F>
  static void each_of(Self& s, F& f) {
    int i = 0;
    for (auto* r : {&s.x_in, &s.rstd1, &s.lse, &s.x_mid, &s.rstd2, &s.lse_late, &s.rstd_o}) f(i++, *r);
    for (auto* t : {&s.h1, &s.q, &s.k, &s.v, &s.o, &s.h2, &s.g, &s.u, &s.o_late, &s.q_in, &s.k_in, &s.mix_g, &s.normed})
      f(i++, *t);
  }
};

// Makes the memory's stream wait for every offload copy when a pass ends, failed or not: declared
// after the layers' activations, so no array is given back under a copy still using it.
struct CopiesEnd {
  HostOffload* offload;
  ~CopiesEnd() {
    if (offload) (void)offload->wait_all();
  }
};

// Queues the copies of what layer l keeps to host memory; the arrays stay until drop_offloaded.
template <class A, class R>
Status offload_to_host(HostOffload& offload, int64_t l, LayerActs<A, R>& a) {
  Status status = Status::Ok();
  a.each([&](int i, auto& t) {
    if (!t.buffer || !status.ok()) return;
    status = offload.to_host(l, i, t.p(), size_t(t.n) * sizeof(*t.p()));
    a.in_host |= 1u << i;
  });
  return status;
}

// Gives layer l's device copies back once its copies to the host are done (in stream order).
template <class A, class R>
Status drop_offloaded(HostOffload& offload, int64_t l, LayerActs<A, R>& a) {
  SP_RETURN_IF_ERROR(offload.wait(l));
  a.each([&](int i, auto& t) {
    if (a.in_host >> i & 1) t.buffer.reset();
  });
  return Status::Ok();
}

// Takes layer l's arrays from `mem` again and queues their copies back (offload.wait(l) before
// reading them).
template <class A, class R>
Status offload_from_host(TrainingMemory& mem, HostOffload& offload, int64_t l, LayerActs<A, R>& a) {
  Status status = Status::Ok();
  a.each([&](int i, auto& t) {
    if (!(a.in_host >> i & 1) || !status.ok()) return;
    const size_t bytes = size_t(t.n) * sizeof(*t.p());
    StatusOr<std::unique_ptr<Buffer>> b = mem.allocate(std::max<size_t>(bytes, 1));
    if (!b.ok()) {
      status = b.status();
      return;
    }
    t.buffer = std::move(b).value();
    status = offload.from_host(l, i, t.p(), bytes);
  });
  a.in_host = 0;
  return status;
}

}  // namespace seqpar::model
