// The NCCL communicator between GPUs of one process (a thread per rank): a failing rank makes
// the others fail instead of hang, and the host collectives and splits work. Skipped below two
// GPUs.
#include <gtest/gtest.h>

#include "seqpar/gpu.hpp"
#include "seqpar/nccl_comm.hpp"

namespace seqpar {
namespace {

// A rank that fails makes the others return an error instead of waiting for it.
TEST(NcclCommunicator, FailingRankAbortsTheOthers) {
  if (cuda_device_count() < 2 || !nccl_available()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  const Status s = run_nccl_local_ranks(2, [](Communicator& comm) -> Status {
    if (comm.rank() == 1) return SP_STATUS(StatusCode::kInternal, "rank 1 gives up");
    auto buf = DeviceBuffer::allocate(1 << 20);
    if (!buf.ok()) return buf.status();
    auto other = DeviceBuffer::allocate(1 << 20);
    if (!other.ok()) return other.status();
    const SendSpec send{1, buf->data(), 1 << 20};
    const RecvSpec recv{1, other->data(), 1 << 20};
    return comm.exchange({&send, 1}, {&recv, 1});  // rank 1 never posts
  });
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 1 gives up"), std::string::npos) << s.message();
}

TEST(NcclCommunicator, HostCollectives) {
  if (cuda_device_count() < 2 || !nccl_available()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  const Status s = run_nccl_local_ranks(2, [](Communicator& comm) -> Status {
    double x[2] = {1.0 + comm.rank(), 10.0 * comm.rank()};
    SP_RETURN_IF_ERROR(comm.all_reduce(x, 2, DType::kF64, ReduceOp::kSum));
    SP_CHECK_ARG(x[0] == 3.0 && x[1] == 10.0, "all_reduce gave " + std::to_string(x[0]));
    // Splits are cached per (color, key): both views talk through one NCCL communicator.
    for (int again = 0; again < 2; ++again) {
      SP_ASSIGN_OR_RETURN(auto alone, comm.split(comm.rank(), 0));
      SP_CHECK_ARG(alone->size() == 1 && alone->rank() == 0, "a split of one rank");
      SP_ASSIGN_OR_RETURN(auto both, comm.split(0, -comm.rank()));
      SP_CHECK_ARG(both->size() == 2 && both->rank() == 1 - comm.rank(),
                   "keys order the split: rank " + std::to_string(comm.rank()) + " became " +
                       std::to_string(both->rank()) + " of " + std::to_string(both->size()));
      double y = 1.0;
      SP_RETURN_IF_ERROR(both->all_reduce(&y, 1, DType::kF64, ReduceOp::kSum));
      SP_CHECK_ARG(y == 2.0 && both->counters().sent(Phase::kOther) > 0, "all_reduce on the split");
    }
    return comm.barrier();
  });
  EXPECT_TRUE(s.ok()) << s.to_string();
}

}  // namespace
}  // namespace seqpar
