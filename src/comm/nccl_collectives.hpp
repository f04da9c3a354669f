// NCCL's own collectives for the NCCL communicator's native path (Communicator::post_collective):
// a CollectiveSpec mapped to ncclAllGather / ncclReduceScatter / ncclAllReduce.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include "seqpar/comm.hpp"

namespace seqpar {

// Queues the collective of `spec` (device buffers) on `stream`; the caller brackets it in a
// group and settles the non-blocking communicator. all_gather moves bytes (ncclUint8).
ncclResult_t issue_nccl_collective(const CollectiveSpec& spec, ncclComm_t comm, cudaStream_t stream);

}  // namespace seqpar
