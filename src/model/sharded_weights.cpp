// ZeRO-3's weight store: sharded_weights.hpp says what it holds and how the overlap works.
#include "model/sharded_weights.hpp"

#include <algorithm>

namespace seqpar::model {

ShardedWeights::ShardedWeights(Communicator& world, TrainingMemory& memory, int64_t slice, const void* compute,
                               float* grads, bool overlap)
    : world_(world), memory_(memory), slice_(slice), element_bytes_(dtype_size(memory.compute_dtype())),
      compute_(static_cast<const char*>(compute)), grads_(grads) {
  if (overlap && world.size() > 1) {
    StatusOr<std::unique_ptr<TrainingMemory>> lane = memory.make_lane();
    if (lane.ok()) lane_ = std::move(lane).value();  // else: no second stream, the collectives run in line
  }
}

std::pair<int64_t, int64_t> ShardedWeights::part(int r, int64_t begin, int64_t end) const {
  return {std::clamp(r * slice_, begin, end), std::clamp((r + 1) * slice_, begin, end)};
}

int64_t ShardedWeights::largest_part(int64_t begin, int64_t end) const {
  int64_t m = 1;
  for (int r = 0; r < world_.size(); ++r) m = std::max(m, part(r, begin, end).second - part(r, begin, end).first);
  return m;
}

// All of it queued on `on`: its buffers come from there and are used there alone.
StatusOr<ShardedWeights::Gathered> ShardedWeights::gather(TrainingMemory& on, int64_t begin, int64_t end) {
  const PhaseScope other(world_, Phase::kOther);  // not the attention's traffic
  const size_t e = element_bytes_, piece = size_t(largest_part(begin, end)) * e;
  Gathered g;
  SP_ASSIGN_OR_RETURN(g.send, on.allocate(piece));
  SP_ASSIGN_OR_RETURN(g.recv, on.allocate(piece * size_t(world_.size())));
  const auto [lo, hi] = part(world_.rank(), begin, end);
  SP_RETURN_IF_ERROR(on.copy(g.send->data(), compute_ + size_t(lo - mine()) * e, size_t(hi - lo) * e));
  SP_RETURN_IF_ERROR(model::all_gather(world_, on, g.send->data(), g.recv->data(), piece));
  SP_ASSIGN_OR_RETURN(g.unit, on.allocate(size_t(end - begin) * e));
  char* u = static_cast<char*>(g.unit->data());
  for (int r = 0; r < world_.size(); ++r) {
    const auto [a, b] = part(r, begin, end);
    SP_RETURN_IF_ERROR(on.copy(u + size_t(a - begin) * e, static_cast<char*>(g.recv->data()) + size_t(r) * piece,
                               size_t(b - a) * e));
  }
  return g;
}

StatusOr<const void*> ShardedWeights::weights(int64_t begin, int64_t end) {
  order_.emplace_back(begin, end);
  Held h;
  if (ahead_ && ahead_->begin == begin && ahead_->end == end) {
    SP_RETURN_IF_ERROR(memory_.wait_for(*lane_));  // the gather is done before the pass reads it
    h = {std::move(ahead_->g.unit), true};
    ahead_.reset();  // its send and receive buffers go back on the lane, after the gather
    ++gathered_ahead_;
  } else {
    SP_ASSIGN_OR_RETURN(Gathered g, gather(memory_, begin, end));
    h = {std::move(g.unit), false};
  }
  const void* p = h.unit->data();
  held_[begin] = std::move(h);
  SP_RETURN_IF_ERROR(gather_next());
  return p;
}

// The unit that followed this one in the last pass, gathered on the lane now.
Status ShardedWeights::gather_next() {
  const size_t k = order_.size();
  if (!lane_ || ahead_ || k >= last_order_.size() || last_order_[k - 1] != order_[k - 1]) return Status::Ok();
  const auto [begin, end] = last_order_[k];
  if (held_.count(begin)) return Status::Ok();
  // After the work queued so far: the compute copy is current, and the lane's arenas may hand out
  // memory the pass gave back on the lane.
  SP_RETURN_IF_ERROR(lane_->wait_for(memory_));
  SP_ASSIGN_OR_RETURN(Gathered g, gather(*lane_, begin, end));
  ahead_ = Ahead{begin, end, std::move(g)};
  return Status::Ok();
}

Status ShardedWeights::release(int64_t begin, int64_t) {
  const auto it = held_.find(begin);
  if (it == held_.end()) return Status::Ok();
  if (it->second.on_lane) SP_RETURN_IF_ERROR(lane_->wait_for(memory_));  // after the pass's last read
  held_.erase(it);
  return Status::Ok();
}

StatusOr<void*> ShardedWeights::gradient(int64_t begin, int64_t end) {
  SP_ASSIGN_OR_RETURN(Array<float> unit, memory_.make_zeroed<float>(end - begin));
  void* p = unit.p();
  gradients_[begin] = std::move(unit);
  return p;
}

Status ShardedWeights::gradient_done(int64_t begin, int64_t end) {
  const PhaseScope other(world_, Phase::kOther);
  TrainingMemory& on = lane_ ? *lane_ : memory_;
  if (lane_) SP_RETURN_IF_ERROR(lane_->wait_for(memory_));  // the unit's gradient is complete
  const int64_t piece = largest_part(begin, end);
  SP_ASSIGN_OR_RETURN(const Array<float> send, on.make_zeroed<float>(piece * world_.size()));
  SP_ASSIGN_OR_RETURN(const Array<float> recv, on.make<float>(piece));
  const float* unit = gradients_.at(begin).p();
  for (int r = 0; r < world_.size(); ++r) {
    const auto [a, b] = part(r, begin, end);
    SP_RETURN_IF_ERROR(on.copy(send.p() + r * piece, unit + (a - begin), size_t(b - a) * sizeof(float)));
  }
  // The unit's gradient goes back on the memory's stream once the lane has copied it; the sums
  // below then run under the pass's next work.
  if (lane_) SP_RETURN_IF_ERROR(memory_.wait_for(*lane_));
  gradients_.erase(begin);
  SP_RETURN_IF_ERROR(model::reduce_scatter(world_, on, send.p(), recv.p(), piece));
  const auto [lo, hi] = part(world_.rank(), begin, end);
  return on.add(grads_ + (lo - mine()), recv.p(), hi - lo);
}

Status ShardedWeights::end_pass() {
  Status s = Status::Ok();
  if (lane_) s = memory_.wait_for(*lane_);  // every gradient sum, before the optimizer reads them
  ahead_.reset();  // its buffers go back on the lane, after its gather
  const bool lane_held = std::any_of(held_.begin(), held_.end(), [](const auto& u) { return u.second.on_lane; });
  if (lane_held && s.ok()) s = lane_->wait_for(memory_);  // one wait covers every unit the pass still held
  held_.clear();
  gradients_.clear();
  last_order_ = std::move(order_);
  order_.clear();
  return s;
}

}  // namespace seqpar::model
