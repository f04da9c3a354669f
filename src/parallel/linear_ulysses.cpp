// The LASP paper's Ulysses baseline for linear attention (linear_ulysses.hpp): the all-to-alls'
// buffers in a pass's scratch, the states in the backend's memory, the packing of head parts, and
// the pieces run in order.
#include "parallel/linear_ulysses.hpp"

#include <algorithm>
#include <numeric>

#include "seqpar/schedule.hpp"

namespace seqpar::linear_ulysses {
namespace {

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Rank `me`'s passes: a part's heads (hq query, hk K/V) and every rank's rows. The backend's
// memory holds T entering states of the pieces (piece 0's is zero, unused) and two dStates. A
// pass's scratch is two buffers, `a` and `b`, each big enough for either of two layouts of rows
// of [q | k | v | o] width:
//   blocks  this rank's rows in T blocks, block r for (or from) rank r with part r's heads
//   pieces  the part's whole sequence: rank r's rows in rank order
// and the passes move between them (the send buffer of one all-to-all is free once it returns,
// or on the stream once it is queued, so the kernels write their results into it):
//   forward   q, k, v blocks in a -> pieces in b; o pieces in a -> o blocks in b -> o
//   backward  q, k, v, dO blocks in a -> pieces in b; dq, dk, dv pieces in a -> blocks in b -> dq, dk, dv
// A "row" is one (batch entry, token) of a part: wq + wk + wv elements of q, k, v, wo of o.
struct Sizes {
  int P = 1, me = 0;
  int64_t B = 0, H = 0, Hkv = 0, hq = 0, hk = 0, dk = 0, dv = 0;
  std::vector<int64_t> S;  // rows of each sequence on rank r
  DType dtype = DType::kF32, state_dtype = DType::kF32;
  Device device;
  size_t es = 0, state_bytes = 0;

  int64_t wq() const { return hq * dk; }
  int64_t wk() const { return hk * dk; }
  int64_t wv() const { return hk * dv; }
  size_t qkv_row() const { return size_t(wq() + wk() + wv()) * es; }
  size_t o_row() const { return size_t(hq * dv) * es; }
  size_t rows(int r) const { return size_t(B * S[size_t(r)]); }
  size_t rows_before(int r) const { return size_t(B * std::accumulate(S.begin(), S.begin() + r, int64_t(0))); }
  size_t whole_rows() const { return rows_before(P); }

  size_t states_total() const { return size_t(P + 2) * state_bytes; }
  size_t buffer() const { return aligned(std::max(size_t(P) * rows(me), whole_rows()) * (qkv_row() + o_row())); }
  size_t scratch_total() const { return 2 * buffer(); }

  // A piece [B, S_r, heads, d] at `at`.
  TensorView piece(char* at, int r, int64_t heads, int64_t d) const {
    return TensorView::contiguous(at, dtype, {B, S[size_t(r)], heads, d}, device);
  }
  // State i of the backend's memory at `states`.
  TensorView state(void* states, int i) const {
    return TensorView::contiguous(static_cast<char*>(states) + size_t(i) * state_bytes, state_dtype,
                                  {B, hq, dk, dv}, device);
  }
};

StatusOr<Sizes> sizes_of(const LinearBackend& backend, const std::vector<int64_t>& rows, int rank,
                         const TensorView& q, const TensorView& k, const TensorView& v) {
  SP_CHECK_ARG(q.ndim == 4 && k.ndim == 4 && v.ndim == 4, "q, k, v must be [B, S, heads, d]");
  Sizes s;
  s.P = int(rows.size()), s.me = rank, s.S = rows;
  s.B = q.shape[0], s.H = q.shape[2], s.Hkv = k.shape[2], s.dk = q.shape[3], s.dv = v.shape[3];
  const std::string why = refusal(s.P, s.H, s.Hkv);
  SP_CHECK_SUPPORTED(why.empty(), why);
  s.hq = s.H / s.P, s.hk = s.Hkv / s.P;
  s.dtype = q.dtype, s.state_dtype = backend.state_dtype(q.dtype), s.device = q.device;
  s.es = dtype_size(q.dtype);
  s.state_bytes = size_t(s.B * s.hq * s.dk * s.dv) * dtype_size(s.state_dtype);
  return s;
}

// The decays of rank `me`'s query heads (one value stays one value).
LinearAttentionParams part_params(const LinearAttentionParams& params, const Sizes& s) {
  LinearAttentionParams p = params;
  if (p.decay.size() > 1) {
    const HeadRange h = head_part_range(s.me, s.P, s.H);
    p.decay.assign(params.decay.begin() + h.first, params.decay.begin() + h.last);
  }
  return p;
}

// Moves heads `h` of t [B, S_local, heads, d] (rows of heads contiguous) to or from `packed`
// ([B, S_local, h.count(), d] contiguous).
Status move_heads(LinearBackend& backend, const TensorView& t, HeadRange h, char* packed, bool to_packed,
                  void* stream) {
  SP_CHECK_ARG(t.strides[3] == 1 && t.strides[2] == t.shape[3],
               "ulysses cuts head parts out of rows whose heads lie side by side: got strides of " +
                   t.shape_string());
  const size_t es = dtype_size(t.dtype), width = size_t(h.count() * t.shape[3]) * es;
  const size_t pitch = size_t(t.strides[1]) * es, height = size_t(t.shape[1]);
  for (int64_t b = 0; b < t.shape[0]; ++b) {
    char* strided = static_cast<char*>(t.data) + size_t(b * t.strides[0] + h.first * t.strides[2]) * es;
    char* dense = packed + size_t(b) * height * width;
    SP_RETURN_IF_ERROR(to_packed ? backend.copy_rows(dense, width, strided, pitch, width, height, stream)
                                 : backend.copy_rows(strided, pitch, dense, width, width, height, stream));
  }
  return Status::Ok();
}

// A tensor of this rank's rows and whether its heads are query heads (q, o, dO, dq) or K/V heads.
struct Local {
  TensorView t;
  bool query = true;
};

// Block r of `blocks` <-> part r of the tensors, one after the other in a block; `row` bytes a
// row over all of them.
Status move_parts(LinearBackend& backend, const Sizes& s, const std::vector<Local>& ts, size_t row, char* blocks,
                  bool to_packed, void* stream) {
  for (int r = 0; r < s.P; ++r) {
    char* at = blocks + size_t(r) * s.rows(s.me) * row;
    for (const Local& l : ts) {
      const HeadRange h = l.query ? head_part_range(r, s.P, s.H) : kv_part_range(r, s.P, s.H, s.Hkv);
      SP_RETURN_IF_ERROR(move_heads(backend, l.t, h, at, to_packed, stream));
      at += s.rows(s.me) * size_t(h.count() * l.t.shape[3]) * s.es;
    }
  }
  return Status::Ok();
}

// One all-to-all between `blocks` (this rank's rows of each part) and `pieces` (every rank's rows
// of this rank's part, in rank order): `row` bytes a row. to_pieces: blocks -> pieces.
Status exchange(Communicator& comm, const LinearBackend& backend, const Sizes& s, size_t row, char* blocks,
                char* pieces, bool to_pieces, void* stream) {
  std::vector<size_t> block_bytes(size_t(s.P)), block_at(size_t(s.P)), piece_bytes(size_t(s.P)), piece_at(size_t(s.P));
  for (int r = 0; r < s.P; ++r) {
    block_bytes[size_t(r)] = s.rows(s.me) * row, block_at[size_t(r)] = size_t(r) * s.rows(s.me) * row;
    piece_bytes[size_t(r)] = s.rows(r) * row, piece_at[size_t(r)] = s.rows_before(r) * row;
  }
  const StreamOrder order = backend.device() == DeviceKind::kCpu ? StreamOrder{} : StreamOrder::on(stream);
  if (to_pieces) return comm.all_to_all_v(blocks, block_bytes, block_at, pieces, piece_bytes, piece_at, order);
  return comm.all_to_all_v(pieces, piece_bytes, piece_at, blocks, block_bytes, block_at, order);
}

// Piece r of pieces laid out [q | k | v] (with_o: [q | k | v | o]) a piece from `base`.
struct Piece {
  TensorView q, k, v, o;
};
Piece piece_of(const Sizes& s, char* base, int r, bool with_o) {
  const size_t row = s.qkv_row() + (with_o ? s.o_row() : 0);
  char* at = base + s.rows_before(r) * row;
  const size_t n = s.rows(r) * s.es;
  Piece p{s.piece(at, r, s.hq, s.dk), s.piece(at + n * size_t(s.wq()), r, s.hk, s.dk),
          s.piece(at + n * size_t(s.wq() + s.wk()), r, s.hk, s.dv), {}};
  if (with_o) p.o = s.piece(at + n * size_t(s.wq() + s.wk() + s.wv()), r, s.hq, s.dv);
  return p;
}

}  // namespace

std::string refusal(int ranks, int64_t heads, int64_t kv_heads) {
  std::string why = head_parts_refusal(ranks, heads, kv_heads);
  if (why.empty() && kv_heads % ranks != 0)
    why = std::to_string(kv_heads) + " K/V heads do not split into " + std::to_string(ranks) +
          " parts (linear ulysses does not copy a K/V head into several parts)";
  return why.empty() ? why : "linear attention's ulysses over " + std::to_string(ranks) + " ranks: " + why;
}

std::vector<int64_t> rows_of(const Layout& layout) {
  std::vector<int64_t> rows;
  for (int r = 0; r < layout.ranks(); ++r) rows.push_back(layout.local_len(r));
  return rows;
}

Status reserve(LinearBackend& backend, const std::vector<int64_t>& rows, int rank, const TensorView& q,
               const TensorView& k, const TensorView& v, const LinearAttentionParams& params, void** memory) {
  SP_ASSIGN_OR_RETURN(const Sizes s, sizes_of(backend, rows, rank, q, k, v));
  const int64_t longest = *std::max_element(rows.begin(), rows.end());
  const auto like = [&](const TensorView& t, int64_t heads) {
    return TensorView::contiguous(t.data, t.dtype, {s.B, longest, heads, t.shape[3]}, t.device);
  };
  const TensorView pq = like(q, s.hq), pk = like(k, s.hk), pv = like(v, s.hk);
  const std::string refused = backend.supports(pq, pk, pv, part_params(params, s));
  SP_CHECK_SUPPORTED(refused.empty(), std::string("ulysses on the ") + backend.name() + " backend: " + refused);
  return backend.reserve(pq, pk, pv, s.states_total(), memory);
}

StatusOr<size_t> scratch_bytes(const LinearBackend& backend, const std::vector<int64_t>& rows, int rank,
                               const TensorView& q, const TensorView& k, const TensorView& v) {
  SP_ASSIGN_OR_RETURN(const Sizes s, sizes_of(backend, rows, rank, q, k, v));
  return s.scratch_total();
}

Status forward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params, LinearBackend& backend,
               void* memory, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               void* stream) {
  SP_ASSIGN_OR_RETURN(const Sizes s, sizes_of(backend, rows_of(layout), comm.rank(), q, k, v));
  const LinearAttentionParams p = part_params(params, s);
  SP_ASSIGN_OR_RETURN(const LinearScratch scratch, backend.scratch(s.scratch_total(), stream));
  char *a = scratch.data, *b = scratch.data + s.buffer();
  SP_RETURN_IF_ERROR(move_parts(backend, s, {{q, true}, {k, false}, {v, false}}, s.qkv_row(), a, true, stream));
  SP_RETURN_IF_ERROR(exchange(comm, backend, s, s.qkv_row(), a, b, true, stream));
  for (int r = 0; r < s.P; ++r) {  // piece r enters with the state piece r - 1 left
    const Piece t = piece_of(s, b, r, false);
    const TensorView o_r = s.piece(a + s.rows_before(r) * s.o_row(), r, s.hq, s.dv);
    SP_RETURN_IF_ERROR(backend.forward(t.q, t.k, t.v, r > 0 ? s.state(memory, r) : TensorView{}, p, o_r,
                                       r + 1 < s.P ? s.state(memory, r + 1) : TensorView{}, stream));
  }
  SP_RETURN_IF_ERROR(exchange(comm, backend, s, s.o_row(), b, a, false, stream));
  return move_parts(backend, s, {{o, true}}, s.o_row(), b, false, stream);
}

Status backward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params, LinearBackend& backend,
                void* memory, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                const TensorView& dq, const TensorView& dk, const TensorView& dv, void* stream) {
  SP_ASSIGN_OR_RETURN(const Sizes s, sizes_of(backend, rows_of(layout), comm.rank(), q, k, v));
  const LinearAttentionParams p = part_params(params, s);
  SP_ASSIGN_OR_RETURN(const LinearScratch scratch, backend.scratch(s.scratch_total(), stream));
  char *a = scratch.data, *b = scratch.data + s.buffer();
  const size_t row = s.qkv_row() + s.o_row();
  SP_RETURN_IF_ERROR(
      move_parts(backend, s, {{q, true}, {k, false}, {v, false}, {dout, true}}, row, a, true, stream));
  SP_RETURN_IF_ERROR(exchange(comm, backend, s, row, a, b, true, stream));
  // Pieces in reverse: the dState piece r + 1 sent back enters piece r; none enters the last
  // (no gradient reaches the final state). Two dState buffers in turn: one read, one written.
  TensorView arriving;
  for (int r = s.P - 1; r >= 0; --r) {
    const Piece t = piece_of(s, b, r, true), g = piece_of(s, a, r, false);
    const TensorView departing = r > 0 ? s.state(memory, s.P + r % 2) : TensorView{};
    SP_RETURN_IF_ERROR(backend.backward(t.q, t.k, t.v, r > 0 ? s.state(memory, r) : TensorView{}, t.o, arriving, p,
                                        g.q, g.k, g.v, departing, stream));
    arriving = departing;
  }
  SP_RETURN_IF_ERROR(exchange(comm, backend, s, s.qkv_row(), b, a, false, stream));
  return move_parts(backend, s, {{dq, true}, {dk, false}, {dv, false}}, s.qkv_row(), b, false, stream);
}

}  // namespace seqpar::linear_ulysses
