// The NCCL communicator: the Communicator interface over NCCL point-to-point, one GPU per
// rank. Batches run on the communicator's own CUDA stream, ordered after the work queued on
// the stream of the call's StreamOrder, so a schedule overlaps transfers with compute without
// blocking the host (PendingExchange::wait_on_stream). Host buffers (the collectives' small
// bookkeeping) are staged through device memory.
//
// Three ways to start, all on the same class:
//   run_nccl_local_ranks   one process drives every local GPU, one thread per GPU;
//   make_nccl_communicator_mpi  under mpirun: MPI hands out the NCCL unique id;
//   make_nccl_communicator_env  under torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
//       MASTER_ADDR, MASTER_PORT): rank 0 serves the id over TCP on MASTER_PORT + 1
//       (torchrun's own store holds MASTER_PORT); SEQPAR_BOOTSTRAP_PORT overrides the port.
//   make_nccl_communicator  from an id the caller carried (e.g. through torch.distributed's
//       store, by the Python binding).
//
// Failure: communicators are non-blocking NCCL communicators watched by a thread of their
// own. When the oldest queued transfer makes no progress for SEQPAR_COMM_TIMEOUT_S (default
// 300 s), NCCL reports an error while transfers are in flight (an error with nothing in
// flight fails the next batch, or aborts at destruction), or abort() is called (from any
// thread), the watchdog aborts the communicator (ncclCommAbort), which stops its kernels; the
// rank's calls then return kCommError instead of hanging.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "seqpar/comm.hpp"

namespace seqpar {

// Whether this build has the NCCL communicator.
bool nccl_available();

// When on, a rank whose communicator aborted but whose own thread stays blocked (in a CUDA
// call the abort did not release) for 10 s more ends the process with exit code 1 after
// printing why. Off by default: a library should not end its host; the seqpar tool turns it on.
void nccl_exit_process_on_failure(bool enable);

// Runs fn(comm) on `num_gpus` threads, thread r on GPU r with the current device set; returns
// the first non-ok Status (the root cause rather than the aborts it caused). A rank that fails
// aborts the others.
Status run_nccl_local_ranks(int num_gpus, const std::function<Status(Communicator&)>& fn);

// One rank per process; the GPU is the node-local rank modulo the visible GPUs.
StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator_mpi();
StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator_env();

// NCCL's unique id for a new communicator, as bytes: one rank makes it and hands it to every
// rank by any channel of its own.
StatusOr<std::vector<char>> nccl_unique_id();
// Rank `rank` of `size` on GPU `device` from the id (nccl_unique_id's bytes). Collective: every
// rank calls it; it returns once all have joined (or after SEQPAR_COMM_TIMEOUT_S with an error).
StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(const std::vector<char>& id, int rank, int size,
                                                               int device);

}  // namespace seqpar
