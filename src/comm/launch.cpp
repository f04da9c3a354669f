// How this process was launched, and the MPI entry point when MPI is not built in.
#include <cstdlib>

#include "seqpar/comm.hpp"
#include "seqpar/nccl_comm.hpp"

namespace seqpar {

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(var)) return true;
  return false;
}

bool launched_by_torchrun() {
  return std::getenv("RANK") && std::getenv("WORLD_SIZE") && std::getenv("MASTER_ADDR") &&
         std::getenv("MASTER_PORT");
}

#ifndef SEQPAR_HAVE_MPI
StatusOr<std::unique_ptr<Communicator>> make_mpi_world_communicator() {
  return SP_STATUS(StatusCode::kUnsupported,
                   "seqpar was built without MPI (install libopenmpi-dev and rebuild)");
}
#endif

}  // namespace seqpar
