// Our sm_90a kernels (FlashAttention-3-style: wgmma, TMA, warp specialisation) as the local-
// attention backend "hopper" of include/seqpar/backend.hpp. Each call is one kernel launch over
// the whole shard pair: bf16, head dim 64 or 128, each side's positions strictly increasing: one
// run with step 1 (a contiguous shard) or several (a zigzag shard's two, a documents-layout
// shard's many, a striped shard's step P). With one run per side, the full mask and a causal band
// (window (-1, R), R >= 0: causal is R = 0) run the kernels' arithmetic path; documents, windows
// bounded on the left and block-sparse patterns run them over visible-tile lists
// (hopper_tiles.hpp). With several runs, every mask but the full one runs over tile lists whose
// per-row intervals are in rows, not positions (a tile may straddle runs: the keys a query row
// sees are still one interval of key rows), one launch for the whole pair. Positions that do not
// increase throughout (Ulysses gathers every rank's shard: one increasing segment per rank), and
// block patterns on several runs (the kernels read a pattern's blocks from the first row's
// position plus the row), are cut into segments (increasing; with a pattern, runs of step 1),
// one launch per pair of segments, as our CUDA kernels do per pair of runs. The lists are built
// on the host once per (mask, pair positions, head dim) and kept on the device in a cache. GQA
// reads K/V heads by index.
//   forward   a fresh result (FreshOutputs::o) is written straight by the kernel (O in bf16 or
//             fp32, LSE fp32; rows that see no key get O = 0, LSE = -inf); else the pair's part
//             goes to a stream buffer and is merged into the running (O, LSE)
//             (flash_merge_partials);
//   backward  the kernels add into dQ, dK, dV (bf16 or fp32: each element read once, added in
//             fp32, rounded once), or write them where fresh, against the final LSE and the
//             given D (caps: takes_delta);
//   delta, merge, accumulate: our CUDA kernels' (CudaKernelBackend).
// Tensors may be strided views (TMA takes any 16-byte multiple strides; outputs any even ones)
// with a contiguous last dim; what the kernels cannot take is refused (supports, or the call's
// status for K/V, whose length supports() does not see).
#include "kernels/hopper/hopper_backend.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <string>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/hopper/hopper_args.hpp"
#include "kernels/hopper/hopper_tiles.hpp"
#include "kernels/cuda/flash_cuda.hpp"

namespace seqpar::hopper {
namespace {

// One side's rows as the kernels see them: the first and last position, and whether they are one
// run with step 1 (else the lists read each row's position).
struct SideRows {
  int64_t first = 0, last = 0;
  bool one_run = true;
};
// Why rows [0, n) at `positions` (null: one run from default_start) cannot be computed: they must
// strictly increase. Empty when they can; *rows receives their shape.
std::string rows_refusal(const int64_t* positions, int64_t n, int64_t default_start, SideRows* rows,
                         const char* side) {
  rows->first = positions && n > 0 ? positions[0] : default_start;
  rows->last = positions && n > 0 ? positions[n - 1] : default_start + n - 1;
  rows->one_run = true;
  if (!positions) return {};
  for (int64_t i = 1; i < n; ++i) {
    if (positions[i] <= positions[i - 1])
      return std::string("the Hopper kernels take each side's positions strictly increasing; the ") + side +
             " positions fall at row " + std::to_string(i) + " (" + std::to_string(positions[i - 1]) + " then " +
             std::to_string(positions[i]) + ")";
    if (positions[i] != positions[i - 1] + 1) rows->one_run = false;
  }
  return {};
}

// The row ranges [begin, end) of one side that one launch takes: maximal runs of strictly
// increasing positions, or of step 1 with a block pattern (the kernels read its blocks from the
// first row's position plus the row). Null positions: one range.
using Segments = std::vector<std::pair<int64_t, int64_t>>;
Segments segments(const int64_t* positions, int64_t n, bool step_one) {
  Segments out;
  int64_t begin = 0;
  for (int64_t i = 1; positions && i < n; ++i)
    if (step_one ? positions[i] != positions[i - 1] + 1 : positions[i] <= positions[i - 1])
      out.emplace_back(begin, i), begin = i;
  out.emplace_back(begin, n);
  return out;
}
// Launches per call at most (pairs of segments): a Ulysses gather of 16 ranks' zigzag shards is 16.
constexpr size_t kMaxSegments = 64;
std::string segments_refusal(size_t count, const char* side) {
  if (count <= kMaxSegments) return {};
  return std::string("the Hopper kernels take at most ") + std::to_string(kMaxSegments) + " segments of " + side +
         " positions per call (increasing runs; with a block pattern, runs of step 1); this call has " +
         std::to_string(count);
}

// Why TMA cannot load this [B, S, H, D] bf16 view: it wants a contiguous last dim, a 16-byte
// aligned base and strides that are multiples of 16 bytes.
std::string load_refusal(const TensorView& t, const char* what) {
  if (t.ndim != 4) return std::string(what) + " must be [B, S, H, D]; got " + t.shape_string();
  if (t.strides[3] != 1) return std::string(what) + " needs a contiguous last dim for the Hopper kernels";
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0 || t.strides[0] % 8 != 0 || t.strides[1] % 8 != 0 ||
      t.strides[2] % 8 != 0 || t.strides[0] < 0 || t.strides[1] < 0 || t.strides[2] < 0)
    return std::string(what) + ": the Hopper kernels' TMA loads need a 16-byte aligned base and row strides that are "
                               "multiples of 8 elements";
  return {};
}

// Whether the kernels can store into this [B, S, H, D] output (bf16 or fp32, pairs of elements
// from a contiguous last dim, even strides).
bool storable(const TensorView& t) {
  if (t.ndim != 4 || (t.dtype != DType::kBF16 && t.dtype != DType::kF32) || t.strides[3] != 1) return false;
  const size_t pair = 2 * dtype_size(t.dtype);
  return reinterpret_cast<uintptr_t>(t.data) % pair == 0 && t.strides[0] % 2 == 0 && t.strides[1] % 2 == 0 &&
         t.strides[2] % 2 == 0;
}
RowStrides strides_of(const TensorView& t) { return {t.strides[0], t.strides[1], t.strides[2]}; }
StatStrides stat_strides_of(const TensorView& t) { return {t.strides[0], t.strides[1]}; }
bool stats_readable(const TensorView& t) { return t.ndim == 3 && t.dtype == DType::kF32 && t.strides[2] == 1; }

Status launched(int error, const char* what) {
  if (error == 0) return Status::Ok();
  return Status(StatusCode::kInternal, std::string("the Hopper ") + what + " failed: " + error_string(error));
}

// Where a pair's causal band puts its diagonal: key row j is visible from query row i iff
// j <= i + offset, or every key is (full), or none is (empty). Masks the band cannot say come as
// tile lists (fwd, bwd: device views; fwd.begin == nullptr when unused).
struct Band {
  bool causal = false, empty = false;
  int offset = 0;
  TileMask fwd{}, bwd{};
  bool fwd_empty = false, bwd_empty = false;  // the lists hold no entry
};

// At most 65535 tiles of 128 rows (the smallest tile the lists' side of either pass has) per call
// with tile lists: the bound of the grids before they put tiles in x (heads outer), kept because
// the lists index their entries with int32 and have not been tried beyond it.
constexpr int64_t kMaxListedRows = int64_t(65535) * 128;

// Masks that need tile lists: anything beyond the full mask and a causal band.
bool needs_lists(const MaskSpec& m) { return m.has_documents() || m.has_block_pattern() || m.window_left >= 0; }
// The full mask: every key visible from every query, whatever the positions.
bool full_mask(const MaskSpec& m) { return !needs_lists(m) && m.window_right < 0; }
// Whether a pair with these rows runs over tile lists.
bool listed(const MaskSpec& m, const SideRows& q, const SideRows& k) {
  return needs_lists(m) || (!full_mask(m) && !(q.one_run && k.one_run));
}

// FNV-1a over 64-bit words.
uint64_t hash_words(uint64_t h, const int64_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ uint64_t(p[i])) * 1099511628211ull;
  return h;
}

class HopperBackend : public cuda::CudaKernelBackend {
 public:
  const char* name() const override { return "hopper"; }
  BackendCaps caps() const override {
    BackendCaps c;
    c.takes_delta = true;   // the backward takes the final D as given
    c.writes_parts = true;  // outputs may be in the inputs' dtype (bf16)
    c.device = true;
    return c;
  }

  std::string supports(const TensorView& q, const AttentionParams& params) const override {
    if (q.device.kind != DeviceKind::kCuda) return "the Hopper kernels take device tensors";
    if (std::string why = device_refusal(q.device.index); !why.empty()) return why;
    if (q.dtype != DType::kBF16) return std::string("the Hopper kernels compute in bf16, not ") + dtype_name(q.dtype);
    if (q.ndim != 4) return "the Hopper kernels take q as [B, S, H, D]; got " + q.shape_string();
    if (q.shape[3] != 64 && q.shape[3] != 128)
      return "the Hopper kernels take head dim 64 or 128, not " + std::to_string(q.shape[3]);
    if (q.shape[0] > 65535 || q.shape[2] > 65535) return "the Hopper kernels take at most 65535 batch entries and heads";
    if (q.shape[1] > INT_MAX / 4) return "the Hopper kernels take at most 2^29 query rows per call";
    if (std::string why = load_refusal(q, "q"); !why.empty()) return why;
    const MaskSpec& m = params.mask;
    if (m.has_block_pattern())
      if (std::string why = pattern_refusal(m.block_pattern->block_size(), m.block_pattern->blocks()); !why.empty())
        return why;
    const Segments q_segments = segments(params.q_positions, q.shape[1], m.has_block_pattern());
    if (std::string why = segments_refusal(q_segments.size(), "query"); !why.empty()) return why;
    SideRows rows;
    (void)rows_refusal(params.q_positions, q.shape[1], 0, &rows, "query");
    if (q_segments.size() > 1) rows.first = INT64_MAX, rows.last = INT64_MIN, rows.one_run = false;
    for (const auto& [b, e] : q_segments) {  // the bounds over every segment
      rows.first = std::min(rows.first, params.q_positions ? params.q_positions[b] : b);
      rows.last = std::max(rows.last, params.q_positions ? params.q_positions[e - 1] : e - 1);
    }
    const bool lists = needs_lists(m) || (!rows.one_run && !full_mask(m));
    // Tile lists carry positions and row indices as int32.
    if (lists && (rows.first < -(int64_t(1) << 30) || rows.last >= (int64_t(1) << 30)))
      return "the Hopper kernels take masked problems at positions below 2^30";
    // With tile lists, at most kMaxListedRows query rows (see there).
    if (lists && q.shape[1] > kMaxListedRows)
      return "the Hopper kernels take masked problems of at most " + std::to_string(kMaxListedRows) +
             " query rows per call";
    return {};
  }

  Status forward(const TensorView& q, const TensorView& k, const TensorView& v, const AttentionParams& params,
                 const TensorView& o, const TensorView& lse, FreshOutputs fresh, void* stream) const override {
    SP_ASSIGN_OR_RETURN(const Split split, split_of(q, k, v, params));
    if (!split.many()) return forward_one(q, k, v, params, o, lse, fresh, stream);
    for (const auto& [qa, qb] : split.q)
      for (size_t j = 0; j < split.k.size(); ++j) {
        const auto [ka, kb] = split.k[j];
        SP_RETURN_IF_ERROR(forward_one(q.narrow(1, qa, qb), k.narrow(1, ka, kb), v.narrow(1, ka, kb),
                                       split.params(params, qa, ka), o.narrow(1, qa, qb), lse.narrow(2, qa, qb),
                                       FreshOutputs{fresh.o && j == 0, false, false}, stream));
      }
    return Status::Ok();
  }

  Status backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                  const TensorView& lse, const TensorView& delta, const AttentionParams& params, const TensorView& dq,
                  const TensorView& dk, const TensorView& dv, FreshOutputs fresh, void* stream) const override {
    SP_ASSIGN_OR_RETURN(const Split split, split_of(q, k, v, params));
    if (!split.many()) return backward_one(q, k, v, dout, lse, delta, params, dq, dk, dv, fresh, stream);
    for (size_t i = 0; i < split.q.size(); ++i)
      for (size_t j = 0; j < split.k.size(); ++j) {
        const auto [qa, qb] = split.q[i];
        const auto [ka, kb] = split.k[j];
        SP_RETURN_IF_ERROR(backward_one(q.narrow(1, qa, qb), k.narrow(1, ka, kb), v.narrow(1, ka, kb),
                                        dout.narrow(1, qa, qb), lse.narrow(2, qa, qb), delta.narrow(2, qa, qb),
                                        split.params(params, qa, ka), dq.narrow(1, qa, qb), dk.narrow(1, ka, kb),
                                        dv.narrow(1, ka, kb), FreshOutputs{false, fresh.dq && j == 0, fresh.dkv && i == 0},
                                        stream));
      }
    return Status::Ok();
  }

 private:
  // A call cut into segment pairs (one launch each), with every row's position made explicit so
  // that each pair carries its own.
  struct Split {
    Segments q, k;
    cuda::PairPositions positions;
    bool many() const { return q.size() > 1 || k.size() > 1; }
    AttentionParams params(const AttentionParams& whole, int64_t qa, int64_t ka) const {
      AttentionParams p = whole;
      p.q_positions = positions.q.data() + qa, p.k_positions = positions.k.data() + ka;
      return p;
    }
  };
  // The call's segments; where there are several, every pair is checked before any launch (so a
  // refusal writes nothing).
  StatusOr<Split> split_of(const TensorView& q, const TensorView& k, const TensorView& v,
                           const AttentionParams& params) const {
    SP_CHECK_ARG(q.ndim == 4 && k.ndim == 4 && v.ndim == 4, "q, k, v must be [B, S, H, D]");
    const bool step_one = params.mask.has_block_pattern();
    Split s;
    s.q = segments(params.q_positions, q.shape[1], step_one);
    s.k = segments(params.k_positions, k.shape[1], step_one);
    for (const auto& [count, side] : {std::pair{s.q.size(), "query"}, std::pair{s.k.size(), "key"}}) {
      const std::string why = segments_refusal(count, side);
      SP_CHECK_SUPPORTED(why.empty(), why);
    }
    if (!s.many()) return s;
    s.positions = cuda::pair_positions(params, q.shape[1], k.shape[1]);
    for (const auto& [qa, qb] : s.q)
      for (const auto& [ka, kb] : s.k) {
        SP_ASSIGN_OR_RETURN(const Band band, checked_band(q.narrow(1, qa, qb), k.narrow(1, ka, kb),
                                                          v.narrow(1, ka, kb), s.params(params, qa, ka)));
        (void)band;
      }
    return s;
  }

  Status forward_one(const TensorView& q, const TensorView& k, const TensorView& v, const AttentionParams& params,
                     const TensorView& o, const TensorView& lse, FreshOutputs fresh, void* stream) const {
    SP_ASSIGN_OR_RETURN(const Band band, checked_band(q, k, v, params));
    const int64_t B = q.shape[0], n = q.shape[1], H = q.shape[2], D = q.shape[3];
    SP_CHECK_ARG(o.ndim == 4 && o.same_shape(q) && stats_readable(lse) && lse.shape[0] == B && lse.shape[1] == H &&
                     lse.shape[2] == n,
                 "the Hopper forward takes O shaped like q and an fp32 LSE [B, H, S_q]; got " + o.shape_string() +
                     ", " + lse.shape_string());
    if (n == 0) return Status::Ok();
    if (band.empty || band.fwd_empty) {  // no key of this pair is visible: the running result stays as it is
      if (!fresh.o) return Status::Ok();
      SP_RETURN_IF_ERROR(flash_fill(o, 0.0f, stream));
      return flash_fill(lse, -INFINITY, stream);
    }
    FwdArgs a = args(q, k, v, params, band);
    if (fresh.o && storable(o)) {  // straight into the result, where the pair's kernel can write it
      FwdArgs direct = a;
      direct.o = o.data, direct.o_f32 = o.dtype == DType::kF32, direct.o_st = strides_of(o);
      direct.lse = static_cast<float*>(lse.data), direct.lse_st = stat_strides_of(lse);
      if (hopper::forward_writes_o(direct)) return launched(hopper::forward(direct, stream), "forward");
    }
    // This pair's part, then cast in (fresh) or merged into the running result.
    PartLease lease(stream);
    SP_ASSIGN_OR_RETURN(const TensorView o_part, lease.take(q.dtype, {B, n, H, D}, q));
    SP_ASSIGN_OR_RETURN(const TensorView lse_part, lease.take(DType::kF32, {B, H, n}, q));
    a.o = o_part.data, a.lse = static_cast<float*>(lse_part.data);
    SP_RETURN_IF_ERROR(launched(hopper::forward(a, stream), "forward"));
    return settle_forward(o_part, lse_part, o, lse, fresh.o, stream);
  }

  Status backward_one(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                      const TensorView& lse, const TensorView& delta, const AttentionParams& params,
                      const TensorView& dq, const TensorView& dk, const TensorView& dv, FreshOutputs fresh,
                      void* stream) const {
    SP_ASSIGN_OR_RETURN(const Band band, checked_band(q, k, v, params));
    const int64_t B = q.shape[0], n = q.shape[1], H = q.shape[2], D = q.shape[3], nk = k.shape[1], Hkv = k.shape[2];
    if (std::string why = load_refusal(dout, "dout"); !why.empty()) return Status(StatusCode::kUnsupported, why);
    SP_CHECK_ARG(dout.same_shape(q) && dout.dtype == q.dtype, "dout must be shaped like q; got " + dout.shape_string());
    for (const TensorView* t : {&lse, &delta})
      SP_CHECK_ARG(stats_readable(*t) && t->shape[0] == B && t->shape[1] == H && t->shape[2] == n,
                   "the Hopper backward takes fp32 LSE and D [B, H, S_q] (caps: takes_delta); got " +
                       t->shape_string());
    SP_CHECK_ARG(dq.ndim == 4 && dq.same_shape(q) && dk.ndim == 4 && dk.same_shape(k) && dv.ndim == 4 &&
                     dv.same_shape(k) && dk.dtype == dv.dtype,
                 "the Hopper backward takes dq like q, dk and dv like k, of one dtype; got " + dq.shape_string() +
                     ", " + dk.shape_string() + ", " + dv.shape_string());
    if (band.empty || band.bwd_empty || n == 0 || nk == 0) {  // nothing to add; fresh gradients are the empty result
      if (fresh.dq && n > 0) SP_RETURN_IF_ERROR(flash_fill(dq, 0.0f, stream));
      if (fresh.dkv && nk > 0) SP_RETURN_IF_ERROR(flash_fill(dk, 0.0f, stream));
      if (fresh.dkv && nk > 0) SP_RETURN_IF_ERROR(flash_fill(dv, 0.0f, stream));
      return Status::Ok();
    }
    const FwdArgs f = args(q, k, v, params, band);
    BwdArgs a{};
    a.q = f.q, a.k = f.k, a.v = f.v, a.dout = dout.data;
    a.q_st = f.q_st, a.k_st = f.k_st, a.v_st = f.v_st, a.dout_st = strides_of(dout);
    a.lse = static_cast<const float*>(lse.data), a.lse_st = stat_strides_of(lse);
    a.delta = static_cast<const float*>(delta.data), a.delta_st = stat_strides_of(delta);
    a.batch = f.batch, a.heads = f.heads, a.kv_heads = f.kv_heads, a.seq_q = f.seq_q, a.seq_k = f.seq_k;
    a.head_dim = f.head_dim, a.causal = f.causal, a.causal_offset = f.causal_offset, a.scale = f.scale;
    a.tiles = band.bwd;
    a.accumulate = 1, a.dq_fresh = fresh.dq, a.dkv_fresh = fresh.dkv;
    PartLease lease(stream);
    SP_ASSIGN_OR_RETURN(const TensorView workspace,
                        lease.take(DType::kF32,
                                   {int64_t(backward_workspace_bytes(int(B), int(H), int(n), int(D)) / 4)}, q));
    a.workspace = workspace.data;
    // Outputs the kernels cannot store into take fp32 parts, cast or added in after.
    const bool q_direct = storable(dq), k_direct = storable(dk) && storable(dv);
    TensorView dq_to = dq, dk_to = dk, dv_to = dv;
    if (!q_direct) {
      SP_ASSIGN_OR_RETURN(dq_to, lease.take(DType::kF32, {B, n, H, D}, q));
      a.dq_fresh = 1;
    }
    if (!k_direct) {
      SP_ASSIGN_OR_RETURN(dk_to, lease.take(DType::kF32, {B, nk, Hkv, D}, q));
      SP_ASSIGN_OR_RETURN(dv_to, lease.take(DType::kF32, {B, nk, Hkv, D}, q));
      a.dkv_fresh = 1;
    }
    a.dq = dq_to.data, a.dq_f32 = dq_to.dtype == DType::kF32, a.dq_st = strides_of(dq_to);
    a.dk = dk_to.data, a.dv = dv_to.data, a.dkv_f32 = dk_to.dtype == DType::kF32;
    a.dk_st = strides_of(dk_to), a.dv_st = strides_of(dv_to);
    SP_RETURN_IF_ERROR(launched(hopper::backward(a, stream), "backward"));
    if (!q_direct) SP_RETURN_IF_ERROR(settle_gradient(dq_to, dq, fresh.dq, stream));
    if (!k_direct) SP_RETURN_IF_ERROR(settle_gradient(dk_to, dk, fresh.dkv, stream));
    if (!k_direct) SP_RETURN_IF_ERROR(settle_gradient(dv_to, dv, fresh.dkv, stream));
    return Status::Ok();
  }

  // The pair's band, after checking what supports() could not see (K/V and their positions).
  StatusOr<Band> checked_band(const TensorView& q, const TensorView& k, const TensorView& v,
                              const AttentionParams& params) const {
    if (std::string why = supports(q, params); !why.empty()) return Status(StatusCode::kUnsupported, why);
    for (const auto& [t, what] : {std::pair{&k, "k"}, std::pair{&v, "v"}})
      if (std::string why = load_refusal(*t, what); !why.empty()) return Status(StatusCode::kUnsupported, why);
    SP_CHECK_ARG(k.same_shape(v) && k.dtype == q.dtype && v.dtype == q.dtype && k.shape[0] == q.shape[0] &&
                     k.shape[3] == q.shape[3] && k.shape[2] > 0 && q.shape[2] % k.shape[2] == 0,
                 "k and v must be [B, S_k, H_kv, D] of q's dtype with H_kv dividing H; got q " + q.shape_string() +
                     ", k " + k.shape_string() + ", v " + v.shape_string());
    const int64_t n = q.shape[1], nk = k.shape[1];
    SP_CHECK_SUPPORTED(nk <= INT_MAX / 4, "the Hopper kernels take at most 2^29 key rows per call");
    SideRows qr, kr;
    (void)rows_refusal(params.q_positions, n, params.mask.align == MaskAlign::kBottomRight ? nk - n : 0, &qr, "query");
    const std::string why = rows_refusal(params.k_positions, nk, 0, &kr, "key");
    SP_CHECK_SUPPORTED(why.empty(), why);
    SP_CHECK_SUPPORTED(kr.one_run || !params.mask.has_block_pattern(),
                       "the Hopper kernels take a block pattern's key rows as one run of step 1 per launch");
    const int64_t q0 = qr.first, k0 = kr.first;
    Band band;
    if (n == 0 || nk == 0) return Band{false, true, 0};  // nothing to compute (and no empty tensor map)
    const bool lists_needed = listed(params.mask, qr, kr);
    if (kr.first < -(int64_t(1) << 30) || kr.last >= (int64_t(1) << 30))
      SP_CHECK_SUPPORTED(!lists_needed, "the Hopper kernels take masked problems at positions below 2^30");
    SP_CHECK_SUPPORTED(!lists_needed || nk <= kMaxListedRows,
                       "the Hopper kernels take masked problems of at most " + std::to_string(kMaxListedRows) +
                           " key rows per call");
    if (lists_needed) {
      SP_ASSIGN_OR_RETURN(const Lists* lists,
                          tile_lists(params.mask, q0, k0, qr.one_run ? nullptr : params.q_positions,
                                     kr.one_run ? nullptr : params.k_positions, int(n), int(nk), int(q.shape[3])));
      band.fwd = tile_mask_view(lists->packed, 0, lists->device.data());
      band.bwd = tile_mask_view(lists->packed, 1, lists->device.data());
      band.fwd_empty = lists->packed.entries[0] == 0;
      band.bwd_empty = lists->packed.entries[1] == 0;
      return band;
    }
    if (params.mask.window_right < 0) return band;       // full
    // Key row j (position k0 + j) is visible from query row i (q0 + i) iff k0 + j <= q0 + i + R.
    const int64_t offset = q0 - k0 + params.mask.window_right;
    if (offset >= nk - 1) return band;                   // every query row sees every key: full
    if (offset < -(n - 1)) return Band{true, true, 0};   // not even the last query row sees a key
    band.causal = true;
    band.offset = int(offset);
    return band;
  }

  // A pair's tile lists on the device, made once per (mask, positions, lengths, head dim); at
  // D = 128 the backward's are of 64- or 80-row query tiles, chosen per pair (backend_plan), and
  // their TileMask says which, for backward()'s kernel.
  // q_pos, k_pos: each row's position where that side is several runs (else null: q0 + i).
  struct Lists {
    PackedTiles packed;  // the offsets into the device copy (its host blob is dropped)
    DeviceBuffer device;
  };
  StatusOr<const Lists*> tile_lists(const MaskSpec& mask, int64_t q0, int64_t k0, const int64_t* q_pos,
                                    const int64_t* k_pos, int n, int nk, int head_dim) const {
    const int64_t dims[] = {q0, k0, n, nk, head_dim, mask.window_left, mask.window_right, q_pos != nullptr,
                            k_pos != nullptr};
    uint64_t h = hash_words(1469598103934665603ull, dims, 9);
    if (q_pos) h = hash_words(h ^ 0x9905, q_pos, size_t(n));
    if (k_pos) h = hash_words(h ^ 0x4905, k_pos, size_t(nk));
    h = hash_words(h ^ 0xd0c5, mask.doc_offsets.data(), mask.doc_offsets.size());
    const BlockPattern* pattern = mask.block_pattern.get();
    if (pattern) {
      const int64_t shape[] = {pattern->block_size(), pattern->blocks(), pattern->pair_count()};
      h = hash_words(h ^ 0xb10c, shape, 3);
      for (int64_t qb = 0; qb < pattern->blocks(); ++qb) {
        const std::span<const int64_t> r = pattern->row(qb);
        h = hash_words(h ^ uint64_t(qb), r.data(), r.size());
      }
    }
    auto it = lists_.find(h);
    if (it != lists_.end()) return &it->second;
    PairMask m;
    m.q0 = q0, m.k0 = k0, m.seq_q = n, m.seq_k = nk;
    if (q_pos) m.q_pos.assign(q_pos, q_pos + n);
    if (k_pos) m.k_pos.assign(k_pos, k_pos + nk);
    m.window_left = mask.window_left, m.window_right = mask.window_right;
    m.doc_offsets = mask.doc_offsets;
    if (pattern) {
      m.pattern_block = pattern->block_size();
      m.pattern_begin.push_back(0);
      for (int64_t qb = 0; qb < pattern->blocks(); ++qb) {
        const std::span<const int64_t> r = pattern->row(qb);
        m.pattern_cols.insert(m.pattern_cols.end(), r.begin(), r.end());
        m.pattern_begin.push_back(int64_t(m.pattern_cols.size()));
      }
    }
    Lists lists;
    lists.packed = pack_tiles(backend_plan(m, head_dim), m);
    const size_t bytes = lists.packed.blob.size() * sizeof(int32_t);
    SP_ASSIGN_OR_RETURN(lists.device, DeviceBuffer::allocate(std::max<size_t>(bytes, 16)));
    SP_RETURN_IF_ERROR(copy_bytes(lists.device.data(), lists.packed.blob.data(), bytes));
    lists.packed.blob = {};
    // A bounded cache: a schedule's pairs repeat every layer, and each entry is small.
    if (lists_.size() >= 256) lists_.clear();
    return &lists_.emplace(h, std::move(lists)).first->second;
  }
  mutable std::map<uint64_t, Lists> lists_;

  static FwdArgs args(const TensorView& q, const TensorView& k, const TensorView& v, const AttentionParams& params,
                      const Band& band) {
    FwdArgs a{};
    a.q = q.data, a.k = k.data, a.v = v.data;
    a.q_st = strides_of(q), a.k_st = strides_of(k), a.v_st = strides_of(v);
    a.batch = int(q.shape[0]), a.heads = int(q.shape[2]), a.kv_heads = int(k.shape[2]);
    a.seq_q = int(q.shape[1]), a.seq_k = int(k.shape[1]), a.head_dim = int(q.shape[3]);
    a.causal = band.causal, a.causal_offset = band.offset;
    a.scale = float(params.scale);  // 0: 1/sqrt(D)
    a.tiles = band.fwd;
    return a;
  }
};

}  // namespace

std::unique_ptr<AttentionBackend> make_backend() { return std::make_unique<HopperBackend>(); }

}  // namespace seqpar::hopper
