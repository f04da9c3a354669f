// A layer's MLP half, x_out = x_mid + down(silu(gate(h2)) * up(h2)) with h2 = norm2(x_mid),
// forward and backward, written once for both devices as the layer pass is (layer_pass.hpp: `Dev`
// is the device's half, its arrays from the device's TrainingMemory). Untiled, the forward keeps
// the inner activations h2, gate, up and norm2's statistics for the backward (the caller's
// arrays); with tile_rows > 0 (DeepSpeed ALST's tiled MLP) the inner activations and their
// gradients, [rows, ffn] each, exist for one tile of rows at a time, nothing is kept, and the
// backward recomputes each tile from x_mid. Every row is the same function of its input row either
// way, but not the same bits: a product's rows round by how many rows the call has (OpenBLAS's
// tail kernels, cuBLAS's choice of algorithm), and the weight gradients of the tiled products sum
// over the rows tile by tile; so losses and gradients agree with untiled to round-off (one tile of
// every row: the same bits).
#pragma once

#include <algorithm>

#include "model/training_memory.hpp"
#include "seqpar/transformer.hpp"

namespace seqpar::model {

template <class Dev>
class MlpPass {
 public:
  using W = typename Dev::Weight;
  using A = typename Dev::Act;
  using R = typename Dev::Acc;

  // The MLP's weights, or their gradients.
  template <class P>
  struct Weights {
    P n2, wg, wu, wd;
  };
  // What the untiled forward keeps for the backward; left empty when tiled.
  struct Kept {
    Array<A>&h2, &g, &u;
    Array<R>& rstd2;
  };

  // tile_rows: the rows at a time (0: all of them).
  MlpPass(const ModelConfig& config, Dev& dev, TrainingMemory& memory, int64_t tile_rows)
      : hid_(config.hidden), ffn_(config.ffn), eps_(config.norm_eps), dev_(dev), mem_(memory), tile_rows_(tile_rows) {}

  bool tiled() const { return tile_rows_ > 0; }

  // x_out = x_mid + MLP(x_mid) over `rows` rows: all at once (the inner activations into `kept`)
  // or tile by tile (none kept).
  Status forward(const Weights<const W*>& w, const R* x_mid, int64_t rows, Kept kept, R* x_out) {
    const int64_t hid = hid_, F = ffn_;
    SP_RETURN_IF_ERROR(mem_.copy(x_out, x_mid, size_t(rows * hid) * sizeof(R)));
    if (!tiled()) {
      SP_ASSIGN_OR_RETURN(Tile t, make_tile(rows, true, false));
      SP_RETURN_IF_ERROR(inner_forward(w, x_mid, t.rows(), 0, rows));
      SP_RETURN_IF_ERROR(dev_.linear_forward_add(t.act.p(), w.wd, x_out, rows, F, hid));
      kept.h2 = std::move(t.h2), kept.rstd2 = std::move(t.rstd2), kept.g = std::move(t.g), kept.u = std::move(t.u);
      return Status::Ok();
    }
    const int64_t tile = tile_of(rows);
    SP_ASSIGN_OR_RETURN(const Tile t, make_tile(tile, true, false));
    for (int64_t r0 = 0; r0 < rows; r0 += tile) {
      const int64_t n = std::min(tile, rows - r0);
      SP_RETURN_IF_ERROR(inner_forward(w, x_mid, t.rows(), r0, n));
      SP_RETURN_IF_ERROR(dev_.linear_forward_add(t.act.p(), w.wd, x_out + r0 * hid, n, F, hid));
    }
    return Status::Ok();
  }

  // dx: in, the gradient at x_out; out, at x_mid. Adds the weights' gradients into dw. Untiled
  // from the kept h2, gate, up (act recomputed); tiled, each tile's inner activations recomputed.
  Status backward(const Weights<const W*>& w, const Weights<R*>& dw, const R* x_mid, int64_t rows, Kept kept, R* dx) {
    const int64_t F = ffn_;
    const int64_t tile = tile_of(rows);
    SP_ASSIGN_OR_RETURN(Tile t, make_tile(tile, tiled(), true));
    if (!tiled()) {
      SP_RETURN_IF_ERROR(dev_.swiglu_forward(kept.g.p(), kept.u.p(), t.act.p(), rows * F));
      return rows_backward(w, dw, x_mid, {kept.h2.p(), kept.g.p(), kept.u.p(), t.act.p(), kept.rstd2.p()}, t, 0, rows,
                           dx);
    }
    for (int64_t r0 = 0; r0 < rows; r0 += tile) {
      const int64_t n = std::min(tile, rows - r0);
      SP_RETURN_IF_ERROR(inner_forward(w, x_mid, t.rows(), r0, n));
      SP_RETURN_IF_ERROR(rows_backward(w, dw, x_mid, t.rows(), t, r0, n, dx));
    }
    return Status::Ok();
  }

 private:
  // Rows [r0, r0 + n) of the inner activations (the kept arrays untiled, else one tile's).
  struct Rows {
    A *h2, *g, *u, *act;
    R* rstd2;
  };
  // One tile's arrays: the inner activations, and the backward's gradients of them (dy: the
  // products' dy where Act is narrower than Acc, taken at the first tile).
  struct Tile {
    Array<A> h2, g, u, act, dact, dg, du, dy;
    Array<R> rstd2, dh;
    Rows rows() const { return {h2.p(), g.p(), u.p(), act.p(), rstd2.p()}; }
  };
  int64_t tile_of(int64_t rows) const { return tiled() ? std::min(tile_rows_, rows) : rows; }
  // The arrays of `rows` rows: the inner activations (with `inner`) and the gradients (`grads`).
  StatusOr<Tile> make_tile(int64_t rows, bool inner, bool grads) {
    const int64_t hid = hid_, F = ffn_;
    Tile t;
    if (inner) {
      SP_ASSIGN_OR_RETURN(t.h2, mem_.template make<A>(rows * hid));
      SP_ASSIGN_OR_RETURN(t.rstd2, mem_.template make<R>(rows));
      SP_ASSIGN_OR_RETURN(t.g, mem_.template make<A>(rows * F));
      SP_ASSIGN_OR_RETURN(t.u, mem_.template make<A>(rows * F));
    }
    SP_ASSIGN_OR_RETURN(t.act, mem_.template make<A>(rows * F));
    if (grads) {
      SP_ASSIGN_OR_RETURN(t.dact, mem_.template make<A>(rows * F));
      SP_ASSIGN_OR_RETURN(t.dg, mem_.template make<A>(rows * F));
      SP_ASSIGN_OR_RETURN(t.du, mem_.template make<A>(rows * F));
      SP_ASSIGN_OR_RETURN(t.dh, mem_.template make<R>(rows * hid));
    }
    return t;
  }
  // h2 = norm2(x_mid), g = gate(h2), u = up(h2), act = silu(g) * u over rows [r0, r0 + n) into t.
  Status inner_forward(const Weights<const W*>& w, const R* x_mid, const Rows& t, int64_t r0, int64_t n) {
    const int64_t hid = hid_, F = ffn_;
    SP_RETURN_IF_ERROR(dev_.rmsnorm_forward(x_mid + r0 * hid, w.n2, t.h2, t.rstd2, n, hid, eps_));
    SP_RETURN_IF_ERROR(dev_.linear_forward(t.h2, w.wg, t.g, n, hid, F));
    SP_RETURN_IF_ERROR(dev_.linear_forward(t.h2, w.wu, t.u, n, hid, F));
    return dev_.swiglu_forward(t.g, t.u, t.act, n * F);
  }
  // The backward over rows [r0, r0 + n) from the inner activations `in`: dx's rows, in the
  // gradient at x_out, out at x_mid; adds the weights' gradients. g: the tile's gradients.
  Status rows_backward(const Weights<const W*>& w, const Weights<R*>& dw, const R* x_mid, const Rows& in, Tile& g,
                       int64_t r0, int64_t n, R* dx) {
    const int64_t hid = hid_, F = ffn_;
    R* dx_rows = dx + r0 * hid;
    SP_ASSIGN_OR_RETURN(const A* dy, dev_.as_act(dx_rows, n * hid, g.dy));
    SP_RETURN_IF_ERROR(dev_.linear_backward_act(in.act, w.wd, dy, g.dact.p(), dw.wd, n, F, hid));
    SP_RETURN_IF_ERROR(dev_.swiglu_backward(in.g, in.u, g.dact.p(), g.dg.p(), g.du.p(), n * F));
    SP_RETURN_IF_ERROR(dev_.linear_backward(in.h2, w.wg, g.dg.p(), g.dh.p(), dw.wg, n, hid, F, false));
    SP_RETURN_IF_ERROR(dev_.linear_backward(in.h2, w.wu, g.du.p(), g.dh.p(), dw.wu, n, hid, F, true));
    return dev_.rmsnorm_backward(x_mid + r0 * hid, w.n2, in.rstd2, g.dh.p(), dx_rows, dw.n2, n, hid);
  }

  int64_t hid_, ffn_;
  double eps_;
  Dev& dev_;
  TrainingMemory& mem_;
  int64_t tile_rows_;
};

}  // namespace seqpar::model
