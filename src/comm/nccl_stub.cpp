// NCCL entry points for builds without NCCL (or without CUDA): clear refusals.
#ifndef SEQPAR_HAVE_NCCL
#include "seqpar/nccl_comm.hpp"

namespace seqpar {
namespace {
Status no_nccl() {
  return SP_STATUS(StatusCode::kUnsupported,
                   "seqpar was built without NCCL (needs CUDA and nccl.h); multi-GPU runs are "
                   "unavailable");
}
}  // namespace

bool nccl_available() { return false; }
void nccl_exit_process_on_failure(bool) {}
Status run_nccl_local_ranks(int, const std::function<Status(Communicator&)>&) { return no_nccl(); }
StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator_mpi() { return no_nccl(); }
StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator_env() { return no_nccl(); }
StatusOr<std::vector<char>> nccl_unique_id() { return no_nccl(); }
StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(const std::vector<char>&, int, int, int) {
  return no_nccl();
}

}  // namespace seqpar
#endif
