// The executor's blocks (the class: executor.hpp): each block's parts laid out in one buffer of
// the block memory, or views of the caller's tensors; buffers given back in stream order;
// blocks kept for the backward; results made, cleared and joined from their head parts; the
// rank's own inputs, head parts cut out of whole-heads blocks, packs, and span blocks joined
// from their pieces or split into them.
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/executor.hpp"

namespace seqpar::parallel {

namespace {
// Parts start 256-byte aligned inside a block's buffer (kernels and NCCL like aligned rows).
size_t padded(size_t bytes) { return (bytes + 255) / 256 * 256; }
// Whether a slice of the caller's tensors can be sent and computed on as it is.
bool usable_as_is(const TensorView& t) { return t.is_contiguous() && reinterpret_cast<uintptr_t>(t.data) % 16 == 0; }
}  // namespace

// A block's parts in wire order (schedule.hpp's BlockKind), for one head group: which heads
// each spans (query heads, K/V heads, or row stats [B, H, S]) and its dtype. Results are
// accumulators, or (`rounded`) in the inputs' dtype as they travel home (goes_home).
std::vector<Executor::PartShape> Executor::part_shapes(const Block& b, int64_t rows, bool rounded) const {
  const int64_t hq = heads_of(Heads::kQuery, b.part).count(), hkv = heads_of(Heads::kKV, b.part).count();
  const std::vector<int64_t> q{B_, rows, hq, D_}, kv{B_, rows, hkv, D_}, stats{B_, hq, rows};
  const DType acc = rounded ? dtype_ : acc_;
  const PartShape Q{dtype_, Heads::kQuery, q}, KV{dtype_, Heads::kKV, kv}, RowStats{stats_, Heads::kStats, stats};
  switch (b.kind) {
    case BlockKind::kKV: return {KV, KV};
    case BlockKind::kQuery: return {Q};
    case BlockKind::kOutput: return {{acc, Heads::kQuery, q}, RowStats};
    case BlockKind::kQueryPack:  // Q, dO, D (or O where the backend takes no D), LSE
      return {Q, Q, takes_delta() ? RowStats : Q, RowStats};
    case BlockKind::kDQ: return {{acc, Heads::kQuery, q}};
    case BlockKind::kDKV: return {{acc, Heads::kKV, kv}, {acc, Heads::kKV, kv}};
    case BlockKind::kGradPack: return {Q, takes_delta() ? RowStats : Q, RowStats};  // dO, D (or O), LSE
  }
  return {};
}
// The heads of head part `part` within the group (all of the group's for kAllHeads).
HeadRange Executor::heads_of(Heads h, int part) const {
  return parallel::heads_of(h, part, plan_.schedule.head_parts, Hg_, Hkg_);
}

// Block b's parts (all its rows, or `rows` of them: a trimmed transfer's), in one buffer; with
// `in_buffer`, only the parts it marks (the others empty views for the caller to fill, and no
// buffer where it marks none).
StatusOr<std::unique_ptr<Executor::Stored>> Executor::make_block(const Block& b, bool rounded, int64_t rows,
                                                                  const std::vector<bool>* in_buffer) {
  auto st = std::make_unique<Stored>();
  if (rows < 0) rows = block_rows(b, plan_.layout);
  const std::vector<PartShape> shapes = part_shapes(b, rows, rounded);
  SP_CHECK_ARG(!in_buffer || in_buffer->size() == shapes.size(),
               "internal: " + block_name(b) + " takes " + std::to_string(shapes.size()) + " parts");
  const auto placed = [&](size_t i) { return !in_buffer || (*in_buffer)[i]; };
  size_t capacity = 0;
  for (size_t i = 0; i < shapes.size(); ++i)
    if (placed(i))
      capacity += padded(TensorView::contiguous(nullptr, shapes[i].dtype, shapes[i].shape).numel() *
                         dtype_size(shapes[i].dtype));
  char* at = nullptr;
  if (!in_buffer || capacity > 0) {
    SP_ASSIGN_OR_RETURN(st->buffer, mem_.allocate(capacity));
    at = static_cast<char*>(st->buffer->data());
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (!placed(i)) {
      st->parts.emplace_back();
      continue;
    }
    st->parts.push_back(TensorView::contiguous(at, shapes[i].dtype, shapes[i].shape, t_.q.device));
    at += padded(view_bytes(st->parts.back()));
  }
  return st;
}
// Gives a block's buffer back after the work queued so far (stream order).
void Executor::release(std::unique_ptr<Stored> st) {
  if (st) mem_.release(std::move(st->buffer));
}
void Executor::release_all() {
  for (auto& [b, st] : store_) release(std::move(st));
  store_.clear();
  for (auto& [b, st] : kept_) mem_.release(std::move(st->buffer));
  kept_.clear();
}

// Group g's kept blocks into the state at the forward's end (out of the memory's reuse until
// the backward gives them back); out of it at the backward's start.
Status Executor::keep(int g) {
  for (const Block& b : plan_.schedule.kept) {
    auto it = store_.find(b);
    SP_CHECK_ARG(it != store_.end(), "internal: the forward ends without " + block_name(b) + ", which it keeps");
    state_->impl().blocks[{g, b}] = std::shared_ptr<Stored>(std::move(it->second));
    store_.erase(it);
  }
  return Status::Ok();
}
void Executor::take_kept(int g) {
  auto& blocks = state_->impl().blocks;
  for (const Block& b : plan_.schedule.kept) {
    auto it = blocks.find({g, b});
    kept_[b] = std::static_pointer_cast<Stored>(it->second);
    blocks.erase(it);
  }
}

// How this rank holds result b: in the inputs' dtype (rounded_), its own in the caller's tensors.
bool Executor::held_rounded(const Block& b) const { return rounded_.count(b) > 0; }
bool Executor::in_callers(const Block& b) const { return held_rounded(b) && is_own_result(b, me_) && home_.count(b.kind); }
// A result present (*fresh = false), or made with nothing in it yet (*fresh = true): its first
// part is written, not added.
StatusOr<Executor::Stored*> Executor::result(const Block& b, bool* fresh) {
  auto& slot = store_[b];
  *fresh = !slot;
  if (!slot && in_callers(b)) {
    slot = std::make_unique<Stored>();
    slot->parts = home_.at(b.kind);
  } else if (!slot) {
    SP_ASSIGN_OR_RETURN(slot, make_block(b, held_rounded(b)));
  }
  return slot.get();
}
// A result present, or made empty: zero, and for (O, LSE) LSE = -inf.
StatusOr<Executor::Stored*> Executor::cleared_result(const Block& b) {
  bool fresh = false;
  SP_ASSIGN_OR_RETURN(Stored* r, result(b, &fresh));
  if (fresh) SP_RETURN_IF_ERROR(clear(b, *r));
  return r;
}
Status Executor::clear(const Block& b, const Stored& r) {
  for (size_t i = 0; i < r.parts.size(); ++i)
    SP_RETURN_IF_ERROR(mem_.fill(r.parts[i], b.kind == BlockKind::kOutput && i == 1 ? -INFINITY : 0.0f));
  return Status::Ok();
}
// This rank's own input block for head group g: the caller's slices where they can be used
// as they are, copies (or, for D, computed rows) in a block buffer otherwise. The buffer holds
// only those parts: the backward's own query pack with D computed is D's rows alone, not Q and
// dO beside it unused (which cost 2 n H D elements in the inputs' dtype a rank, GQA or not).
Status Executor::make_home(const Block& b, const std::vector<TensorView>& slices, int computed_part) {
  std::vector<bool> stored(slices.size());
  for (size_t i = 0; i < slices.size(); ++i) stored[i] = int(i) == computed_part || !usable_as_is(slices[i]);
  SP_ASSIGN_OR_RETURN(std::unique_ptr<Stored> st, make_block(b, false, -1, &stored));
  for (size_t i = 0; i < slices.size(); ++i) {
    if (!stored[i]) st->parts[i] = slices[i];
    else if (int(i) != computed_part) SP_RETURN_IF_ERROR(mem_.copy(slices[i], st->parts[i]));
  }
  store_[b] = std::move(st);
  return Status::Ok();
}

// An input block: held, kept by the forward, or cut out of a block the rank holds: a head
// part of the same block with all heads, or its own grad pack out of its query pack.
StatusOr<Executor::Stored*> Executor::input(const Block& b) {
  auto it = store_.find(b);
  if (it != store_.end()) return it->second.get();
  auto k = kept_.find(b);
  if (k != kept_.end()) return k->second.get();
  const auto source = parallel::input_source(b, me_, [&](const Block& x) { return store_.count(x) > 0; });
  SP_CHECK_ARG(source.has_value(),
               "internal: the schedule reads " + block_name(b) + ", which rank " + std::to_string(me_) + " lacks");
  const auto w = store_.find(source->whole);
  const size_t first = source->first_part;
  SP_ASSIGN_OR_RETURN(std::unique_ptr<Stored> part, make_block(b));
  const std::vector<PartShape> shapes = part_shapes(b, 0);
  std::vector<std::pair<TensorView, TensorView>> copies;
  for (size_t i = 0; i < shapes.size(); ++i)
    copies.emplace_back(parallel::heads_slice(w->second->parts[first + i], shapes[i].heads,
                                              heads_of(shapes[i].heads, b.part)),
                        part->parts[i]);
  SP_RETURN_IF_ERROR(mem_.copy_many(copies));
  return (store_[b] = std::move(part)).get();
}

// kPack: the query pack from the Q block and the grad pack of the same name.
Status Executor::pack(const Step& s) {
  Block q = s.block, grads = s.block;
  q.kind = BlockKind::kQuery, grads.kind = BlockKind::kGradPack;
  SP_ASSIGN_OR_RETURN(Stored* from_q, input(q));
  SP_ASSIGN_OR_RETURN(Stored* from_grads, input(grads));
  SP_ASSIGN_OR_RETURN(std::unique_ptr<Stored> made, make_block(s.block));
  std::vector<std::pair<TensorView, TensorView>> copies{{from_q->parts[0], made->parts[0]}};
  for (size_t i = 1; i < made->parts.size(); ++i) copies.emplace_back(from_grads->parts[i - 1], made->parts[i]);
  SP_RETURN_IF_ERROR(mem_.copy_many(copies));
  store_[s.block] = std::move(made);
  return Status::Ok();
}

StatusOr<Executor::Stored*> Executor::held_result(const Block& b) {
  auto it = store_.find(b);
  SP_CHECK_ARG(it != store_.end(), "internal: the schedule sends " + block_name(b) + ", which rank " +
                                       std::to_string(me_) + " lacks");
  return it->second.get();
}

// The home result's head parts, copied (O, LSE: disjoint heads) or added (dQ, dK/dV: GQA may
// give two parts one K/V head) into the whole-heads result, and released. Where every part is
// here with heads of its own and the result is new (Ulysses' results), each is copied into its
// heads and nothing is cleared first: the rank's own result straight into the caller's tensors
// (joined_home_), since every head there comes from one part, the parts that travelled already
// rounded to the inputs' dtype and the rank's own rounded once, as through a whole result.
Status Executor::join_parts(const Block& whole) {
  const int parts = plan_.schedule.head_parts;
  if (parts <= 1) return Status::Ok();
  const std::vector<PartShape> shapes = part_shapes(whole, 0);
  bool every_part = true;
  std::vector<int64_t> heads(shapes.size(), 0);  // each part kind's heads summed over the parts
  for (int p = 0; p < parts; ++p) {
    every_part = every_part && store_.count({whole.kind, whole.shard, 1, p});
    for (size_t i = 0; i < shapes.size(); ++i) heads[i] += heads_of(shapes[i].heads, p).count();
  }
  bool disjoint = every_part;
  for (size_t i = 0; i < shapes.size(); ++i) disjoint = disjoint && heads[i] == heads_of(shapes[i].heads, kAllHeads).count();
  // The caller takes the result cleared where no part reached it (executor.cpp), so making it
  // here first changes nothing but the clear that new disjoint parts make needless.
  Stored* into = nullptr;
  bool overwrite = false;
  if (disjoint && !store_.count(whole) && whole.shard == me_ && home_.count(whole.kind)) {
    auto callers = std::make_unique<Stored>();
    callers->parts = home_.at(whole.kind);
    into = (store_[whole] = std::move(callers)).get();
    joined_home_.insert(whole);
    overwrite = true;
  } else if (disjoint) {
    SP_ASSIGN_OR_RETURN(into, result(whole, &overwrite));
  } else {
    SP_ASSIGN_OR_RETURN(into, cleared_result(whole));
  }
  const bool copying = whole.kind == BlockKind::kOutput || overwrite;  // disjoint heads: copies in one batch
  std::vector<std::pair<TensorView, TensorView>> copies;
  std::vector<std::unique_ptr<Stored>> joined;
  for (int p = 0; p < parts; ++p) {
    auto it = store_.find({whole.kind, whole.shard, 1, p});
    if (it == store_.end()) continue;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const TensorView slice = parallel::heads_slice(into->parts[i], shapes[i].heads, heads_of(shapes[i].heads, p));
      if (copying) copies.emplace_back(it->second->parts[i], slice);
      else SP_RETURN_IF_ERROR(mem_.add(it->second->parts[i], slice));
    }
    joined.push_back(std::move(it->second));
    store_.erase(it);
  }
  SP_RETURN_IF_ERROR(mem_.copy_many(copies));
  for (auto& st : joined) release(std::move(st));
  return Status::Ok();
}

// The contiguous views piece `piece` travels in where it joins `span` on arrival
// (Transfer::into_span), in the same order at both ends: per part, per row piece of its shard in
// the span, per batch entry (and head, for row stats [B, H, S]); views of the span block's rows
// (in_span) or of the piece's own.
std::vector<TensorView> Executor::span_piece_views(const Stored& st, const Block& piece, const Block& span,
                                                   bool in_span) {
  const std::vector<PartShape> shapes = part_shapes(piece, 0);
  std::vector<TensorView> views;
  for (size_t i = 0; i < shapes.size(); ++i)
    for (const SpanPositions::Piece& p : positions_.pieces(span)) {
      if (p.shard != piece.shard) continue;
      const TensorView rows = parallel::rows_slice(st.parts[i], shapes[i].heads, in_span ? p.to : p.from, p.rows);
      for (int64_t e = 0; e < rows.shape[0]; ++e) {
        const TensorView entry = rows.narrow(0, e, e + 1);
        if (shapes[i].heads != Heads::kStats) views.push_back(entry);
        else
          for (int64_t h = 0; h < entry.shape[1]; ++h) views.push_back(entry.narrow(1, h, h + 1));
      }
    }
  return views;
}

// kConcat: the span block from its pieces (the rank's own input pieces cut from its
// whole-heads block; pieces received into it, there already); kSplit: a span result cut into
// pieces.
Status Executor::regroup(const Step& s) {
  const Block& b = s.block;
  const std::vector<PartShape> shapes = part_shapes(b, 0);
  Stored* whole = nullptr;
  std::unique_ptr<Stored> joined;
  if (s.kind == StepKind::kConcat) {
    auto made = store_.find(b);  // at the post that received pieces straight into it
    if (made != store_.end()) {
      joined = std::move(made->second), store_.erase(made);
    } else {
      SP_ASSIGN_OR_RETURN(joined, make_block(b));
    }
    whole = joined.get();
  } else {
    SP_ASSIGN_OR_RETURN(whole, held_result(b));
  }
  std::map<int, Stored*> parts;  // each shard's piece block
  for (int x = b.shard; x < b.shard + b.span; ++x) {
    const Block piece{b.kind, x, 1, b.part};
    if (s.kind == StepKind::kConcat && joined_on_arrival_.erase(piece)) continue;  // in the span already
    if (s.kind == StepKind::kConcat) {
      SP_ASSIGN_OR_RETURN(parts[x], input(piece));
    } else {
      SP_ASSIGN_OR_RETURN(std::unique_ptr<Stored> made, make_block(piece));
      parts[x] = (store_[piece] = std::move(made)).get();
    }
  }
  std::vector<std::pair<TensorView, TensorView>> copies;  // the span's rows from (or to) its shards' rows
  for (const SpanPositions::Piece& p : positions_.pieces(b))
    for (size_t i = 0; i < shapes.size() && parts.count(p.shard); ++i) {
      const TensorView span_rows = parallel::rows_slice(whole->parts[i], shapes[i].heads, p.to, p.rows);
      const TensorView shard_rows = parallel::rows_slice(parts[p.shard]->parts[i], shapes[i].heads, p.from, p.rows);
      if (s.kind == StepKind::kConcat) copies.emplace_back(shard_rows, span_rows);
      else copies.emplace_back(span_rows, shard_rows);
    }
  SP_RETURN_IF_ERROR(mem_.copy_many(copies));
  if (s.kind == StepKind::kConcat)
    for (int x = b.shard; x < b.shard + b.span; ++x) {
      const Block piece{b.kind, x, 1, b.part};
      if (x == me_ && piece.part == kAllHeads) continue;
      auto it = store_.find(piece);
      if (it != store_.end()) release(std::move(it->second)), store_.erase(it);
    }
  if (s.kind == StepKind::kConcat) {
    store_[b] = std::move(joined);
  } else {
    auto it = store_.find(b);
    release(std::move(it->second)), store_.erase(it);
  }
  return Status::Ok();
}

}  // namespace seqpar::parallel
