// Communicator base: argument checks, per-phase byte counters, and the collectives built from
// batched point-to-point steps (ring all-gather / reduce-scatter, pairwise all-to-all).
#include <algorithm>
#include <cstdlib>
#include <cstring>
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

template <class T>
void reduce_into(T* acc, const T* in, size_t n, ReduceOp op) {
  if (op == ReduceOp::kSum)
    for (size_t i = 0; i < n; ++i) acc[i] += in[i];
  else
    for (size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], in[i]);
}

void reduce_into(void* acc, const void* in, size_t n, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kF64:
      reduce_into(static_cast<double*>(acc), static_cast<const double*>(in), n, op);
      return;
    case DType::kF32:
      reduce_into(static_cast<float*>(acc), static_cast<const float*>(in), n, op);
      return;
    case DType::kBF16:
    case DType::kF16: {  // through float, one element at a time
      std::vector<float> a(n), b(n);
      convert(acc, dtype, a.data(), DType::kF32, n);
      convert(in, dtype, b.data(), DType::kF32, n);
      reduce_into(a.data(), b.data(), n, op);
      convert(a.data(), DType::kF32, acc, dtype, n);
      return;
    }
  }
}

int wrap(int r, int p) { return ((r % p) + p) % p; }

}  // namespace

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

StatusOr<std::unique_ptr<PendingExchange>> Communicator::start_exchange(
    std::span<const SendSpec> sends, std::span<const RecvSpec> recvs) {
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

Status Communicator::all_gather(const void* send, void* recv, size_t n) {
  const int P = size(), r = rank();
  char* out = static_cast<char*>(recv);
  if (send != out + r * n) std::memmove(out + r * n, send, n);
  for (int s = 0; s < P - 1; ++s) {
    const SendSpec snd{wrap(r + 1, P), out + wrap(r - s, P) * n, n};
    const RecvSpec rcv{wrap(r - 1, P), out + wrap(r - s - 1, P) * n, n};
    SP_RETURN_IF_ERROR(exchange({&snd, 1}, {&rcv, 1}));
  }
  return Status::Ok();
}

Status Communicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                    ReduceOp op) {
  const int P = size(), r = rank();
  const size_t n = count * dtype_size(dtype);
  std::vector<char> acc(static_cast<const char*>(send), static_cast<const char*>(send) + P * n);
  std::vector<char> incoming(n);
  // Step s: pass on the partial sum of block r-s-1, receive and add to block r-s-2.
  for (int s = 0; s < P - 1; ++s) {
    const int out_block = wrap(r - s - 1, P), in_block = wrap(r - s - 2, P);
    const SendSpec snd{wrap(r + 1, P), acc.data() + out_block * n, n};
    const RecvSpec rcv{wrap(r - 1, P), incoming.data(), n};
    SP_RETURN_IF_ERROR(exchange({&snd, 1}, {&rcv, 1}));
    reduce_into(acc.data() + in_block * n, incoming.data(), count, dtype, op);
  }
  std::memcpy(recv, acc.data() + r * n, n);
  return Status::Ok();
}

Status Communicator::all_to_all(const void* send, void* recv, size_t n) {
  const int P = size(), r = rank();
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  std::memcpy(out + r * n, in + r * n, n);
  for (int s = 1; s < P; ++s) {
    const int to = wrap(r + s, P), from = wrap(r - s, P);
    const SendSpec snd{to, in + to * n, n};
    const RecvSpec rcv{from, out + from * n, n};
    SP_RETURN_IF_ERROR(exchange({&snd, 1}, {&rcv, 1}));
  }
  return Status::Ok();
}

Status Communicator::all_reduce(void* data, size_t count, DType dtype, ReduceOp op) {
  const int P = size();
  if (P == 1) return Status::Ok();
  const size_t es = dtype_size(dtype);
  const size_t chunk = (count + P - 1) / P;
  // Pad to P equal chunks; padding is never read back.
  std::vector<char> padded(chunk * P * es, 0);
  std::memcpy(padded.data(), data, count * es);
  std::vector<char> mine(chunk * es);
  SP_RETURN_IF_ERROR(reduce_scatter(padded.data(), mine.data(), chunk, dtype, op));
  SP_RETURN_IF_ERROR(all_gather(mine.data(), padded.data(), chunk * es));
  std::memcpy(data, padded.data(), count * es);
  return Status::Ok();
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
