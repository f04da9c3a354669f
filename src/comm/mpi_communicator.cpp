// The `mpi` communicator: Open MPI processes. Batches become MPI_Isend/MPI_Irecv (messages
// between a pair keep their order, so batches match as in the local backend); messages over
// 1 GiB are sent in pieces because MPI counts are ints. Built only when MPI is found.
#include <mpi.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "seqpar/comm.hpp"

namespace seqpar {
namespace {

constexpr size_t kMaxPiece = size_t(1) << 30;
constexpr int kTag = 7;

Status check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return Status::Ok();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return SP_STATUS(StatusCode::kCommError, std::string(what) + " failed: " + std::string(text, len));
}

class MpiPending final : public PendingExchange {
 public:
  std::vector<MPI_Request> requests;
  ~MpiPending() override {
    if (!requests.empty()) (void)wait();
  }
  Status wait() override {
    if (requests.empty()) return Status::Ok();
    const int rc = MPI_Waitall(static_cast<int>(requests.size()), requests.data(),
                               MPI_STATUSES_IGNORE);
    requests.clear();
    return check_mpi(rc, "MPI_Waitall");
  }
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Errors come back as codes, turned into Status, instead of aborting inside MPI.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "mpi"; }

  Status barrier() override { return check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

  StatusOr<std::unique_ptr<Communicator>> split(int color, int key) override {
    MPI_Comm sub;
    SP_RETURN_IF_ERROR(check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split"));
    return std::unique_ptr<Communicator>(new MpiCommunicator(sub, true));
  }

  void abort(const std::string& reason) override {
    std::fprintf(stderr, "seqpar: rank %d aborting the MPI job: %s\n", rank_, reason.c_str());
    MPI_Abort(comm_, 1);
  }

 protected:
  StatusOr<std::unique_ptr<PendingExchange>> post(std::span<const SendSpec> sends,
                                                  std::span<const RecvSpec> recvs) override {
    auto pending = std::make_unique<MpiPending>();
    // Receives first so eager messages land directly.
    for (const RecvSpec& r : recvs)
      for (size_t off = 0; off < r.bytes || off == 0; off += kMaxPiece) {
        const int n = static_cast<int>(std::min(kMaxPiece, r.bytes - off));
        pending->requests.emplace_back();
        SP_RETURN_IF_ERROR(check_mpi(MPI_Irecv(static_cast<char*>(r.data) + off, n, MPI_BYTE,
                                               r.peer, kTag, comm_, &pending->requests.back()),
                                     "MPI_Irecv"));
        if (r.bytes == 0) break;
      }
    for (const SendSpec& s : sends)
      for (size_t off = 0; off < s.bytes || off == 0; off += kMaxPiece) {
        const int n = static_cast<int>(std::min(kMaxPiece, s.bytes - off));
        pending->requests.emplace_back();
        SP_RETURN_IF_ERROR(check_mpi(
            MPI_Isend(static_cast<const char*>(s.data) + off, n, MPI_BYTE, s.peer, kTag, comm_,
                      &pending->requests.back()),
            "MPI_Isend"));
        if (s.bytes == 0) break;
      }
    return std::unique_ptr<PendingExchange>(std::move(pending));
  }
  bool overlaps() const override { return true; }

 private:
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

StatusOr<std::unique_ptr<Communicator>> make_mpi_world_communicator() {
  static std::once_flag once;
  static int init_rc = MPI_SUCCESS;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      init_rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      if (init_rc == MPI_SUCCESS) std::atexit(finalize_mpi);
    }
  });
  SP_RETURN_IF_ERROR(check_mpi(init_rc, "MPI_Init_thread"));
  return std::unique_ptr<Communicator>(new MpiCommunicator(MPI_COMM_WORLD, false));
}

}  // namespace seqpar
