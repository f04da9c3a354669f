// Communicator base: argument checks, per-phase byte counters, batched point-to-point, and
// the timeout and failure helpers every backend shares. The collectives are in collectives.cpp.
#include <cstdlib>
#include <vector>

#include "seqpar/comm.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar {
namespace {

// A handle for a batch that already completed.
class CompletedExchange final : public PendingExchange {
 public:
  explicit CompletedExchange(Status status) : status_(std::move(status)) {}
  Status wait() override { return status_; }

 private:
  Status status_;
};

}  // namespace

Communicator::Communicator() = default;
Communicator::~Communicator() = default;

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kOther: return "other";
  }
  return "?";
}

Status Communicator::check_specs(std::span<const SendSpec> sends,
                                 std::span<const RecvSpec> recvs) const {
  for (const SendSpec& s : sends)
    SP_CHECK_ARG(s.peer >= 0 && s.peer < size() && (s.data || s.bytes == 0),
                 "send to rank " + std::to_string(s.peer) + " of " + std::to_string(size()) +
                     " is out of range or has no buffer");
  for (const RecvSpec& r : recvs)
    SP_CHECK_ARG(r.peer >= 0 && r.peer < size() && (r.data || r.bytes == 0),
                 "receive from rank " + std::to_string(r.peer) + " of " + std::to_string(size()) +
                     " is out of range or has no buffer");
  return Status::Ok();
}

void Communicator::count(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs) {
  const int p = static_cast<int>(phase_);
  if (counters_.sent_to.size() < static_cast<size_t>(size())) counters_.sent_to.resize(size());
  for (const SendSpec& s : sends) {
    counters_.bytes_sent[p] += static_cast<int64_t>(s.bytes);
    counters_.sent_to[s.peer][p] += static_cast<int64_t>(s.bytes);
  }
  for (const RecvSpec& r : recvs) counters_.bytes_received[p] += static_cast<int64_t>(r.bytes);
}

void Communicator::count_ring(size_t sent, size_t received) {
  if (size() == 1) return;
  const SendSpec to_next{(rank() + 1) % size(), nullptr, sent};
  const RecvSpec from_prev{(rank() + size() - 1) % size(), nullptr, received};
  count({&to_next, 1}, {&from_prev, 1});
}

StatusOr<std::unique_ptr<PendingExchange>> Communicator::start_exchange(
    std::span<const SendSpec> sends, std::span<const RecvSpec> recvs, StreamOrder order) {
  const OrderScope scope(*this, order);
  SP_RETURN_IF_ERROR(check_specs(sends, recvs));
  count(sends, recvs);
  SP_ASSIGN_OR_RETURN(std::unique_ptr<PendingExchange> pending, post(sends, recvs));
  if (overlaps()) return pending;
  return std::unique_ptr<PendingExchange>(new CompletedExchange(pending->wait()));
}

Status Communicator::exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<PendingExchange> pending, start_exchange(sends, recvs));
  return pending->wait();
}

std::chrono::milliseconds comm_timeout() {
  const char* env = std::getenv("SEQPAR_COMM_TIMEOUT_S");
  const double s = env ? std::atof(env) : 300.0;
  return std::chrono::milliseconds(static_cast<int64_t>((s > 0 ? s : 300.0) * 1000));
}

Status first_root_cause(const std::vector<Status>& results) {
  for (const Status& s : results)
    if (!s.ok() && s.message().find("communicator aborted") == std::string::npos) return s;
  for (const Status& s : results)
    if (!s.ok()) return s;
  return Status::Ok();
}

Status Communicator::synchronize(void* stream) { return stream_synchronize(stream); }

Status Communicator::barrier() {
  std::vector<char> token(size(), 0);
  return all_gather(token.data() + rank(), token.data(), 1);
}

}  // namespace seqpar
