// The NCCL communicator's bootstraps (include/seqpar/nccl_comm.hpp): ranks as threads, one GPU
// each; MPI processes; torchrun's environment (the unique id over tcp_bootstrap.hpp); and a
// unique id the caller carries itself (the Python binding, through a c10d store).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/nccl_create.hpp"
#include "comm/tcp_bootstrap.hpp"
#include "seqpar/gpu.hpp"
#include "seqpar/nccl_comm.hpp"

namespace seqpar {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

StatusOr<int> local_device(int local_rank) {
  const int n = cuda_device_count();
  SP_CHECK_SUPPORTED(n > 0, "the NCCL communicator needs a CUDA GPU; none is visible");
  return local_rank % n;
}

}  // namespace


Status run_nccl_local_ranks(int num_gpus, const std::function<Status(Communicator&)>& fn) {
  SP_CHECK_ARG(num_gpus >= 1, "need at least one GPU");
  const int visible = cuda_device_count();
  SP_CHECK_ARG(num_gpus <= visible, "asked for " + std::to_string(num_gpus) + " GPUs but " +
                                        std::to_string(visible) + " are visible");
  ncclUniqueId id;
  SP_RETURN_IF_ERROR(nccl_call_status(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  std::vector<Status> results(num_gpus);
  std::vector<Communicator*> live(num_gpus, nullptr);
  std::mutex mu;
  std::string failure;  // sticky: ranks that register after a failure abort at once
  auto fail_all = [&](int from, const std::string& why) {
    std::lock_guard lock(mu);
    if (failure.empty()) failure = "rank " + std::to_string(from) + " failed: " + why;
    for (Communicator* c : live)
      if (c) c->abort(failure);
  };
  auto enter = [&](int r, Communicator* c) {
    std::lock_guard lock(mu);
    live[r] = c;
    if (c && !failure.empty()) c->abort(failure);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < num_gpus; ++r) {
    threads.emplace_back([&, r] {
      auto comm = create_nccl_communicator(id, r, num_gpus, r, [&](Communicator* c) { enter(r, c); });
      if (!comm.ok()) {
        enter(r, nullptr);
        results[r] = comm.status();
        fail_all(r, results[r].message());
        return;
      }
      results[r] = fn(*comm.value());
      // A failed rank aborts every communicator, its own too: its queued batches will never be
      // matched, and its destructor must not wait for them.
      if (!results[r].ok()) fail_all(r, results[r].message());
      enter(r, nullptr);
    });
  }
  for (auto& t : threads) t.join();
  return first_root_cause(results);
}

StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator_mpi() {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> mpi, make_mpi_world_communicator());
  const int rank = mpi->rank(), size = mpi->size();
  ncclUniqueId id{};
  if (rank == 0) SP_RETURN_IF_ERROR(nccl_call_status(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  std::vector<ncclUniqueId> all(size);
  SP_RETURN_IF_ERROR(mpi->all_gather(&id, all.data(), sizeof(id)));
  SP_ASSIGN_OR_RETURN(const int device, local_device(env_int("OMPI_COMM_WORLD_LOCAL_RANK",
                                                             env_int("MPI_LOCALRANKID", rank))));
  return create_nccl_communicator(all[0], rank, size, device);
}

StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator_env() {
  SP_CHECK_ARG(launched_by_torchrun(), "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT must be set");
  const int rank = env_int("RANK", 0), size = env_int("WORLD_SIZE", 1);
  SP_CHECK_ARG(size >= 1 && rank >= 0 && rank < size,
               "RANK " + std::to_string(rank) + " is out of range for WORLD_SIZE " + std::to_string(size));
  const int port = bootstrap_port();
  ncclUniqueId id{};
  BootstrapPeer me = bootstrap_peer_from_env();
  me.rank = rank, me.world = size;
  const std::string master = std::getenv("MASTER_ADDR");
  if (rank == 0) {
    SP_RETURN_IF_ERROR(nccl_call_status(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    SP_RETURN_IF_ERROR(serve_bytes(&id, sizeof(id), bootstrap_listen_host(master, me), port, me));
  } else {
    SP_RETURN_IF_ERROR(fetch_bytes(master, port, &id, sizeof(id), me));
  }
  SP_ASSIGN_OR_RETURN(const int device, local_device(env_int("LOCAL_RANK", rank)));
  return create_nccl_communicator(id, rank, size, device);
}

StatusOr<std::vector<char>> nccl_unique_id() {
  ncclUniqueId id{};
  SP_RETURN_IF_ERROR(nccl_call_status(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  const char* bytes = reinterpret_cast<const char*>(&id);
  return std::vector<char>(bytes, bytes + sizeof(id));
}

StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(const std::vector<char>& id_bytes, int rank, int size,
                                                               int device) {
  SP_CHECK_ARG(id_bytes.size() == sizeof(ncclUniqueId), "an NCCL unique id has " +
                                                            std::to_string(sizeof(ncclUniqueId)) + " bytes; got " +
                                                            std::to_string(id_bytes.size()));
  SP_CHECK_ARG(size >= 1 && rank >= 0 && rank < size,
               "rank " + std::to_string(rank) + " is out of range for size " + std::to_string(size));
  SP_CHECK_ARG(device >= 0 && device < cuda_device_count(), "GPU " + std::to_string(device) + " is not visible");
  ncclUniqueId id;
  std::memcpy(&id, id_bytes.data(), sizeof(id));
  return create_nccl_communicator(id, rank, size, device);
}

}  // namespace seqpar
