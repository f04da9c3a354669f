// The executor's exchanges (the class: executor.hpp): a batch's sends and receives posted on
// the communicator, accumulator results sent home rounded to the inputs' dtype, pieces received
// straight into the span blocks they join (Transfer::into_span); at its wait,
// what arrived taken as the block or combined into the result (replaced, added, merged, or
// added into some of its rows), and the buffers of what was sent given back.
#include <memory>
#include <utility>
#include <vector>

#include "parallel/executor.hpp"

namespace seqpar::parallel {

// Whether results travel home rounded (the inputs are narrower than the accumulators).
bool Executor::rounds_home(const Block& b, int to) const { return dtype_ != acc_ && goes_home(b, to); }
// Whether a result received from the wire can be the block as this rank holds it.
bool Executor::adoptable(const Block& b) const { return rounds_home(b, me_) == held_rounded(b) && !in_callers(b); }

Status Executor::post(const Step& s) {
  Pending p;
  std::vector<SendSpec> sends;
  std::vector<RecvSpec> recvs;
  // Spans received straight into are made first, below the post's other buffers in the stream's
  // arena: those are given back together once the exchange is done, one region for what the
  // pass makes next.
  for (const Transfer& t : s.recvs)
    if (t.into_span && !store_.count(*t.into_span)) {
      SP_ASSIGN_OR_RETURN(std::unique_ptr<Stored> span, make_block(*t.into_span));
      store_[*t.into_span] = std::move(span);
    }
  for (const Transfer& t : s.sends) {
    Stored* from = nullptr;
    if (is_result(t.block.kind)) {
      SP_ASSIGN_OR_RETURN(from, held_result(t.block));
      p.leaving.push_back(t.block);
      if (rounds_home(t.block, t.peer) && !held_rounded(t.block)) {
        SP_ASSIGN_OR_RETURN(std::unique_ptr<Stored> rounded, make_block(t.block, true));
        for (size_t i = 0; i < rounded->parts.size(); ++i)
          SP_RETURN_IF_ERROR(mem_.copy(from->parts[i], rounded->parts[i]));
        from = rounded.get();
        p.rounded.push_back(std::move(rounded));
      }
    } else {
      SP_ASSIGN_OR_RETURN(from, input(t.block));
    }
    if (t.into_span) {
      for (const TensorView& piece : span_piece_views(*from, t.block, *t.into_span, false))
        sends.push_back({t.peer, piece.data, view_bytes(piece)});
      continue;
    }
    for (const TensorView& part : from->parts)
      for (const TensorView& piece : t.trimmed() ? row_pieces(part, t.row_begin, t.row_end)
                                                 : std::vector<TensorView>{part})
        sends.push_back({t.peer, piece.data, view_bytes(piece)});
  }
  for (const Transfer& t : s.recvs) {
    if (t.into_span) {
      for (const TensorView& piece : span_piece_views(*store_.at(*t.into_span), t.block, *t.into_span, true))
        recvs.push_back({t.peer, piece.data, view_bytes(piece)});
      joined_on_arrival_.insert(t.block);
      continue;
    }
    SP_ASSIGN_OR_RETURN(std::unique_ptr<Stored> into,
                        make_block(t.block, rounds_home(t.block, me_), t.trimmed() ? t.row_end - t.row_begin : -1));
    for (const TensorView& part : into->parts)
      for (const TensorView& piece : t.trimmed() ? row_pieces(part, 0, t.row_end - t.row_begin)
                                                 : std::vector<TensorView>{part})
        recvs.push_back({t.peer, piece.data, view_bytes(piece)});
    if (t.combine == Combine::kReplace && (!is_result(t.block.kind) || adoptable(t.block))) {
      auto& slot = store_[t.block];
      release(std::move(slot));
      slot = std::move(into);
    } else {
      p.arriving.emplace_back(t, std::move(into));
    }
  }
  // Host-driven communicators move the buffers at once: what the stream queued must be done.
  if (!comm_.stream_ordered()) SP_RETURN_IF_ERROR(mem_.settle());
  const StreamOrder order = mem_.device() == DeviceKind::kCuda ? StreamOrder::on(mem_.stream()) : StreamOrder{};
  auto started = comm_.start_exchange(sends, recvs, order);
  SP_RETURN_IF_ERROR(started.status());
  p.exchange = std::move(started).value();
  pending_[s.batch] = std::move(p);
  return Status::Ok();
}

Status Executor::wait(const Step& s) {
  auto it = pending_.find(s.batch);
  SP_CHECK_ARG(it != pending_.end(), "internal: a wait for a batch never posted");
  Pending& p = it->second;
  SP_RETURN_IF_ERROR(p.exchange->wait_on_stream(mem_.stream()));
  for (auto& rounded : p.rounded) release(std::move(rounded));
  for (const Block& b : p.leaving) {
    auto left = store_.find(b);
    if (left != store_.end()) release(std::move(left->second)), store_.erase(left);
  }
  for (auto& [t, got] : p.arriving) {
    auto& slot = store_[t.block];
    if (t.combine == Combine::kReplace) release(std::move(slot));
    if (!slot && adoptable(t.block) && !t.trimmed()) {  // the first part becomes the result
      slot = std::move(got);
      continue;
    }
    bool fresh = false;
    SP_ASSIGN_OR_RETURN(Stored* into, result(t.block, &fresh));
    if (t.trimmed()) {  // some rows of it (dQ or dK/dV, never merged): added into those, per
      if (fresh) SP_RETURN_IF_ERROR(clear(t.block, *into));  // batch entry (contiguous pieces)
      for (size_t i = 0; i < into->parts.size(); ++i) {
        const std::vector<TensorView> to = row_pieces(into->parts[i], t.row_begin, t.row_end),
                                      from = row_pieces(got->parts[i], 0, t.row_end - t.row_begin);
        for (size_t b = 0; b < to.size(); ++b)
          SP_RETURN_IF_ERROR(plan_.backend->accumulate(to[b], from[b], mem_.stream()));
      }
      release(std::move(got));
      continue;
    }
    for (size_t i = 0; i < into->parts.size(); ++i) {
      if (fresh) SP_RETURN_IF_ERROR(mem_.copy(got->parts[i], into->parts[i]));  // the first part, cast in
      else if (t.combine == Combine::kMerge && i == 0)
        SP_RETURN_IF_ERROR(plan_.backend->merge(into->parts[0], into->parts[1], got->parts[0], got->parts[1], mem_.stream()));
      else if (t.combine != Combine::kMerge) SP_RETURN_IF_ERROR(plan_.backend->accumulate(into->parts[i], got->parts[i], mem_.stream()));
    }
    release(std::move(got));  // stream order: the next use of its buffer comes after these
  }
  pending_.erase(it);
  return Status::Ok();
}

}  // namespace seqpar::parallel
