// The collectives of Communicator: ring all-gather and reduce-scatter over exchange (P-1 steps,
// each to the next rank), all-reduce as the two over padded chunks, all-to-all(v) as one batch
// of point-to-point. On device buffers a backend's native collective runs instead where it has
// one (NCCL, stream-ordered); elsewhere the same ring runs with its reductions in a CUDA
// kernel. Every path counts the bytes the ring sends, so counters compare across backends.
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "comm/device_reduce.hpp"
#include "seqpar/comm.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar {
namespace {

template <class T>
void reduce_into(T* acc, const T* in, size_t n, ReduceOp op) {
  if (op == ReduceOp::kSum)
    for (size_t i = 0; i < n; ++i) acc[i] += in[i];
  else
    for (size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], in[i]);
}

void host_reduce_into(void* acc, const void* in, size_t n, DType dtype, ReduceOp op) {
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

// Whether a collective's buffers are on the device. Null buffers (of empty pieces) say nothing;
// a mix of host and device is refused rather than guessed at. Host-only communicators (MPI)
// never ask: the query would make a CUDA context in every CPU rank of a GPU machine.
StatusOr<bool> buffers_on_device(const Communicator& comm, std::initializer_list<const void*> buffers) {
  if (!comm.moves_device_buffers()) return false;
  int on_device = 0, on_host = 0;
  for (const void* b : buffers)
    if (b) ++(is_device_pointer(b) ? on_device : on_host);
  SP_CHECK_ARG(on_device == 0 || on_host == 0,
               "a collective's buffers must be all on the host or all on the device");
  return on_device > 0;
}

// Elements per chunk of the all-reduce: P chunks of ceil(count / P), the last ones padded.
size_t all_reduce_chunk(size_t count, int P) { return (count + P - 1) / P; }

}  // namespace

// ---- the ring, on host or device buffers ------------------------------------------------

Status Communicator::copy_local(void* dst, const void* src, size_t bytes, bool on_device) {
  if (bytes == 0 || dst == src) return Status::Ok();
  if (!on_device) {
    std::memmove(dst, src, bytes);
    return Status::Ok();
  }
  return copy_bytes(dst, src, bytes);  // synchronous: the ring's next step reads it at once
}

Status Communicator::reserve_device_scratch(size_t bytes) {
  if (!device_scratch_) device_scratch_ = std::make_unique<DeviceBuffer>();
  return device_scratch_->reserve(std::max<size_t>(bytes, 1));
}

// recv [P * n] holds this rank's block already; step s passes on block r-s, receives r-s-1.
Status Communicator::ring_all_gather(void* recv, size_t n) {
  const int P = size(), r = rank();
  char* out = static_cast<char*>(recv);
  for (int s = 0; s < P - 1; ++s) {
    const SendSpec snd{wrap(r + 1, P), out + wrap(r - s, P) * n, n};
    const RecvSpec rcv{wrap(r - 1, P), out + wrap(r - s - 1, P) * n, n};
    SP_RETURN_IF_ERROR(exchange({&snd, 1}, {&rcv, 1}));
  }
  return Status::Ok();
}

// acc [P * count] starts as this rank's input and ends with block `rank` reduced over all
// ranks; incoming [count] is work space.
Status Communicator::ring_reduce_scatter(char* acc, char* incoming, size_t count, DType dtype,
                                         ReduceOp op, bool on_device) {
  const int P = size(), r = rank();
  const size_t n = count * dtype_size(dtype);
  // Step s: pass on the partial sum of block r-s-1, receive and add to block r-s-2.
  for (int s = 0; s < P - 1; ++s) {
    const int out_block = wrap(r - s - 1, P), in_block = wrap(r - s - 2, P);
    const SendSpec snd{wrap(r + 1, P), acc + out_block * n, n};
    const RecvSpec rcv{wrap(r - 1, P), incoming, n};
    SP_RETURN_IF_ERROR(exchange({&snd, 1}, {&rcv, 1}));
    if (!on_device) {
      host_reduce_into(acc + in_block * n, incoming, count, dtype, op);
      continue;
    }
    // The next step sends this block (host-driven): the kernel must be done first.
    SP_RETURN_IF_ERROR(device_reduce_into(acc + in_block * n, incoming, count, dtype, op, stream()));
    SP_RETURN_IF_ERROR(synchronize(stream()));
  }
  return Status::Ok();
}

// In place over P chunks of ceil(count / P): in `data` itself when P divides count on the
// device, else through a padded copy. The padding is reduced too but never read back.
Status Communicator::ring_all_reduce(void* data, size_t count, DType dtype, ReduceOp op,
                                     bool on_device) {
  const int P = size();
  const size_t es = dtype_size(dtype), chunk = all_reduce_chunk(count, P), n = chunk * es;
  std::vector<char> host_work;
  char *padded = nullptr, *incoming = nullptr;
  if (on_device) {
    const bool in_place = chunk * P == count;
    SP_RETURN_IF_ERROR(reserve_device_scratch((in_place ? 0 : P * n) + n));
    char* scratch = static_cast<char*>(device_scratch_->data());
    padded = in_place ? static_cast<char*>(data) : scratch + n;
    incoming = scratch;
  } else {
    host_work.assign(P * n + n, 0);
    padded = host_work.data() + n;
    incoming = host_work.data();
  }
  SP_RETURN_IF_ERROR(copy_local(padded, data, count * es, on_device));
  SP_RETURN_IF_ERROR(ring_reduce_scatter(padded, incoming, chunk, dtype, op, on_device));
  SP_RETURN_IF_ERROR(ring_all_gather(padded, n));
  return copy_local(data, padded, count * es, on_device);
}

// ---- device buffers: native where the backend has it, else the ring ----------------------

Status Communicator::finish_on_stream(StatusOr<std::unique_ptr<PendingExchange>> started) {
  SP_RETURN_IF_ERROR(started.status());
  std::unique_ptr<PendingExchange> pending = std::move(started).value();
  return has_stream() ? pending->wait_on_stream(stream()) : pending->wait();
}

Status Communicator::settle_stream_for_host_driven() {
  return has_stream() ? synchronize(stream()) : Status::Ok();
}

Status Communicator::run_device_collective(const CollectiveSpec& spec) {
  const int P = size(), r = rank();
  const size_t es = spec.kind == CollectiveKind::kAllGather ? 1 : dtype_size(spec.dtype);
  // What the ring sends to the next rank (and receives from the previous one).
  size_t ring_bytes = 0;
  switch (spec.kind) {
    case CollectiveKind::kAllGather: ring_bytes = (P - 1) * spec.count; break;
    case CollectiveKind::kReduceScatter: ring_bytes = (P - 1) * spec.count * es; break;
    case CollectiveKind::kAllReduce: ring_bytes = 2 * (P - 1) * all_reduce_chunk(spec.count, P) * es; break;
  }
  SP_ASSIGN_OR_RETURN(std::unique_ptr<PendingExchange> native, post_collective(spec));
  if (native) {
    count_ring(ring_bytes, ring_bytes);
    return finish_on_stream(std::move(native));
  }
  SP_RETURN_IF_ERROR(settle_stream_for_host_driven());
  switch (spec.kind) {
    case CollectiveKind::kAllGather: {
      char* out = static_cast<char*>(spec.recv);
      SP_RETURN_IF_ERROR(copy_local(out + r * spec.count, spec.send, spec.count, true));
      return ring_all_gather(out, spec.count);
    }
    case CollectiveKind::kReduceScatter: {
      const size_t n = spec.count * es;
      SP_RETURN_IF_ERROR(reserve_device_scratch(P * n + n));
      char* acc = static_cast<char*>(device_scratch_->data());
      SP_RETURN_IF_ERROR(copy_local(acc, spec.send, P * n, true));
      SP_RETURN_IF_ERROR(ring_reduce_scatter(acc, acc + P * n, spec.count, spec.dtype, spec.op, true));
      return copy_local(spec.recv, acc + r * n, n, true);
    }
    case CollectiveKind::kAllReduce:
      return ring_all_reduce(spec.recv, spec.count, spec.dtype, spec.op, true);
  }
  return SP_STATUS(StatusCode::kInternal, "unknown collective");
}

// ---- the public collectives ----------------------------------------------------------------

Status Communicator::all_gather(const void* send, void* recv, size_t n, StreamOrder order) {
  const OrderScope scope(*this, order);
  SP_ASSIGN_OR_RETURN(const bool on_device, buffers_on_device(*this, {send, recv}));
  if (on_device)
    return run_device_collective({CollectiveKind::kAllGather, send, recv, n, DType::kF32, ReduceOp::kSum});
  SP_RETURN_IF_ERROR(copy_local(static_cast<char*>(recv) + rank() * n, send, n, false));
  return ring_all_gather(recv, n);
}

Status Communicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                    ReduceOp op, StreamOrder order) {
  const OrderScope scope(*this, order);
  SP_ASSIGN_OR_RETURN(const bool on_device, buffers_on_device(*this, {send, recv}));
  if (on_device)
    return run_device_collective({CollectiveKind::kReduceScatter, send, recv, count, dtype, op});
  const int P = size();
  const size_t n = count * dtype_size(dtype);
  std::vector<char> acc(static_cast<const char*>(send), static_cast<const char*>(send) + P * n);
  std::vector<char> incoming(n);
  SP_RETURN_IF_ERROR(ring_reduce_scatter(acc.data(), incoming.data(), count, dtype, op, false));
  std::memcpy(recv, acc.data() + rank() * n, n);
  return Status::Ok();
}

Status Communicator::all_reduce(void* data, size_t count, DType dtype, ReduceOp op, StreamOrder order) {
  if (size() == 1) return Status::Ok();
  const OrderScope scope(*this, order);
  SP_ASSIGN_OR_RETURN(const bool on_device, buffers_on_device(*this, {data}));
  if (on_device)
    return run_device_collective({CollectiveKind::kAllReduce, data, data, count, dtype, op});
  return ring_all_reduce(data, count, dtype, op, false);
}

Status Communicator::all_to_all(const void* send, void* recv, size_t n, StreamOrder order) {
  const std::vector<size_t> bytes(size(), n);
  std::vector<size_t> offsets(size());
  for (int q = 0; q < size(); ++q) offsets[q] = q * n;
  return all_to_all_v(send, bytes, offsets, recv, bytes, offsets, order);
}

Status Communicator::all_to_all_v(const void* send, std::span<const size_t> send_bytes,
                                  std::span<const size_t> send_offsets, void* recv,
                                  std::span<const size_t> recv_bytes,
                                  std::span<const size_t> recv_offsets, StreamOrder order) {
  const OrderScope scope(*this, order);
  const int P = size(), r = rank();
  const size_t p = static_cast<size_t>(P);
  SP_CHECK_ARG(send_bytes.size() == p && send_offsets.size() == p && recv_bytes.size() == p &&
                   recv_offsets.size() == p,
               "all_to_all_v needs " + std::to_string(P) + " sizes and offsets on each side");
  SP_CHECK_ARG(send_bytes[r] == recv_bytes[r],
               "rank " + std::to_string(r) + " keeps " + std::to_string(send_bytes[r]) +
                   " bytes of its own but expects " + std::to_string(recv_bytes[r]));
  const bool sends_any = std::any_of(send_bytes.begin(), send_bytes.end(), [](size_t b) { return b > 0; });
  const bool receives_any = std::any_of(recv_bytes.begin(), recv_bytes.end(), [](size_t b) { return b > 0; });
  SP_CHECK_ARG((send || !sends_any) && (recv || !receives_any), "all_to_all_v has pieces but no buffer");
  SP_ASSIGN_OR_RETURN(const bool on_device, buffers_on_device(*this, {send, recv}));
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  // One batch, peers in ring order; empty pieces are not posted (both sides agree on them).
  std::vector<SendSpec> sends;
  std::vector<RecvSpec> recvs;
  for (int s = 1; s < P; ++s) {
    const int to = wrap(r + s, P), from = wrap(r - s, P);
    if (send_bytes[to]) sends.push_back({to, in + send_offsets[to], send_bytes[to]});
    if (recv_bytes[from]) recvs.push_back({from, out + recv_offsets[from], recv_bytes[from]});
  }
  const size_t own = send_bytes[r];
  if (on_device && stream_ordered() && has_stream()) {  // queued, the host does not wait
    if (own)
      SP_RETURN_IF_ERROR(copy_bytes_on_stream(out + recv_offsets[r], in + send_offsets[r], own, stream()));
    return finish_on_stream(start_exchange(sends, recvs));
  }
  if (on_device) SP_RETURN_IF_ERROR(settle_stream_for_host_driven());
  if (own) SP_RETURN_IF_ERROR(copy_local(out + recv_offsets[r], in + send_offsets[r], own, on_device));
  return exchange(sends, recvs);
}

}  // namespace seqpar
