// The GPU executor's exchanges (the class: gpu_executor_impl.hpp): a batch's sends and receives
// posted on the communicator, fp32 results sent home rounded to the inputs' dtype; at its wait,
// what arrived taken as the block or combined into the result (replaced, added, merged, or
// added into some of its rows), and the buffers of what was sent given back.
#include <memory>
#include <utility>
#include <vector>

#include "parallel/gpu_executor_impl.hpp"
#include "seqpar/flash_cuda.hpp"

namespace seqpar::parallel_gpu {

// Whether results travel home rounded (the inputs are not fp32, as the accumulators are).
bool GpuExecutor::rounds_home(const Block& b, int to) const { return dtype_ != DType::kF32 && goes_home(b, to); }
// Whether a result received from the wire can be the block as this rank holds it.
bool GpuExecutor::adoptable(const Block& b) const { return rounds_home(b, me_) == held_rounded(b) && !in_callers(b); }

Status GpuExecutor::post(const Step& s) {
  Pending p;
  std::vector<SendSpec> sends;
  std::vector<RecvSpec> recvs;
  for (const Transfer& t : s.sends) {
    Stored* from = nullptr;
    if (is_result(t.block.kind)) {
      SP_ASSIGN_OR_RETURN(from, held_result(t.block));
      p.leaving.push_back(t.block);
      if (rounds_home(t.block, t.peer) && !held_rounded(t.block)) {
        SP_ASSIGN_OR_RETURN(std::unique_ptr<Stored> rounded, make_block(t.block, true));
        for (size_t i = 0; i < rounded->parts.size(); ++i)
          SP_RETURN_IF_ERROR(flash_cast(from->parts[i], rounded->parts[i], s_));
        from = rounded.get();
        p.rounded.push_back(std::move(rounded));
      }
    } else {
      SP_ASSIGN_OR_RETURN(from, input(t.block));
    }
    for (const TensorView& part : from->parts)
      for (const TensorView& piece : t.trimmed() ? parallel::row_pieces(part, t.row_begin, t.row_end)
                                                 : std::vector<TensorView>{part})
        sends.push_back({t.peer, piece.data, view_bytes(piece)});
  }
  for (const Transfer& t : s.recvs) {
    SP_ASSIGN_OR_RETURN(std::unique_ptr<Stored> into,
                        make_block(t.block, rounds_home(t.block, me_), t.trimmed() ? t.row_end - t.row_begin : -1));
    for (const TensorView& part : into->parts)
      for (const TensorView& piece : t.trimmed() ? parallel::row_pieces(part, 0, t.row_end - t.row_begin)
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
  // Host-driven communicators move device buffers at once: what the stream queued must be done.
  if (!comm_.stream_ordered()) SP_RETURN_IF_ERROR(stream_synchronize(s_));
  comm_.set_stream(s_);
  auto started = comm_.start_exchange(sends, recvs);
  comm_.clear_stream();  // the caller's stream may not outlive this call
  SP_RETURN_IF_ERROR(started.status());
  p.exchange = std::move(started).value();
  pending_[s.batch] = std::move(p);
  return Status::Ok();
}

Status GpuExecutor::wait(const Step& s) {
  auto it = pending_.find(s.batch);
  SP_CHECK_ARG(it != pending_.end(), "internal: a wait for a batch never posted");
  Pending& p = it->second;
  SP_RETURN_IF_ERROR(p.exchange->wait_on_stream(s_));
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
    if (t.trimmed()) {  // some rows of it (dQ or dK/dV, never merged): added into those
      if (fresh) SP_RETURN_IF_ERROR(clear(t.block, *into));
      for (size_t i = 0; i < into->parts.size(); ++i)
        SP_RETURN_IF_ERROR(plan_.backend->accumulate(into->parts[i].narrow(1, t.row_begin, t.row_end), got->parts[i], s_));
      release(std::move(got));
      continue;
    }
    for (size_t i = 0; i < into->parts.size(); ++i) {
      if (fresh) SP_RETURN_IF_ERROR(flash_cast(got->parts[i], into->parts[i], s_));  // the first part, cast in
      else if (t.combine == Combine::kMerge && i == 0)
        SP_RETURN_IF_ERROR(plan_.backend->merge(into->parts[0], into->parts[1], got->parts[0], got->parts[1], s_));
      else if (t.combine != Combine::kMerge) SP_RETURN_IF_ERROR(plan_.backend->accumulate(into->parts[i], got->parts[i], s_));
    }
    release(std::move(got));  // stream order: the next use of its buffer comes after these
  }
  pending_.erase(it);
  return Status::Ok();
}

}  // namespace seqpar::parallel_gpu
