// The collectives over a TrainingMemory's arrays (training_memory.hpp): host arrays go to the
// communicator as they are; device arrays too where it moves device buffers (NCCL, the local
// communicator between thread ranks sharing a GPU), ordered on the memory's stream; otherwise
// (MPI) through host copies, after the stream's work is done.
#include "model/training_memory.hpp"

#include <vector>

namespace seqpar::model {
namespace {

bool direct(const Communicator& comm, const TrainingMemory& memory) {
  return memory.device() == DeviceKind::kCpu || comm.moves_device_buffers();
}
StreamOrder order_of(const TrainingMemory& memory) {
  return memory.device() == DeviceKind::kCpu ? StreamOrder{} : StreamOrder::on(memory.stream());
}

}  // namespace

Status all_reduce(Communicator& comm, TrainingMemory& memory, float* data, int64_t n) {
  if (comm.size() == 1 || n == 0) return Status::Ok();
  if (direct(comm, memory)) return comm.all_reduce(data, size_t(n), DType::kF32, ReduceOp::kSum, order_of(memory));
  std::vector<float> host(static_cast<size_t>(n));
  SP_RETURN_IF_ERROR(memory.to_host(host.data(), data, host.size() * sizeof(float)));
  SP_RETURN_IF_ERROR(comm.all_reduce(host.data(), host.size(), DType::kF32, ReduceOp::kSum));
  return memory.from_host(data, host.data(), host.size() * sizeof(float));
}

Status reduce_scatter(Communicator& comm, TrainingMemory& memory, const float* send, float* recv, int64_t n) {
  if (direct(comm, memory))
    return comm.reduce_scatter(send, recv, size_t(n), DType::kF32, ReduceOp::kSum, order_of(memory));
  std::vector<float> in(static_cast<size_t>(n * comm.size())), out(static_cast<size_t>(n));
  SP_RETURN_IF_ERROR(memory.to_host(in.data(), send, in.size() * sizeof(float)));
  SP_RETURN_IF_ERROR(comm.reduce_scatter(in.data(), out.data(), size_t(n), DType::kF32, ReduceOp::kSum));
  return memory.from_host(recv, out.data(), out.size() * sizeof(float));
}

Status all_gather(Communicator& comm, TrainingMemory& memory, const void* send, void* recv, size_t bytes) {
  if (direct(comm, memory)) return comm.all_gather(send, recv, bytes, order_of(memory));
  std::vector<char> in(bytes), out(bytes * size_t(comm.size()));
  SP_RETURN_IF_ERROR(memory.to_host(in.data(), send, bytes));
  SP_RETURN_IF_ERROR(comm.all_gather(in.data(), out.data(), bytes));
  return memory.from_host(recv, out.data(), out.size());
}

}  // namespace seqpar::model
