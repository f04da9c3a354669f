// Making one rank's NCCL communicator (nccl_communicator.cpp), for the bootstraps that share
// its unique id (nccl_bootstrap.cpp).
#pragma once

#include <nccl.h>

#include <functional>
#include <memory>

#include "seqpar/comm.hpp"

namespace seqpar {

// Rank `rank` of `size` on GPU `device` (made current). `created` sees the communicator before
// its collective initialisation, so another thread can abort() a rank still waiting for peers
// that failed; it sees nullptr when the initialisation failed.
StatusOr<std::unique_ptr<Communicator>> create_nccl_communicator(
    const ncclUniqueId& id, int rank, int size, int device,
    const std::function<void(Communicator*)>& created = nullptr);
// Ok for ncclSuccess (and ncclInProgress: non-blocking calls), else the error with `what`.
Status nccl_call_status(ncclResult_t r, const char* what);

}  // namespace seqpar
