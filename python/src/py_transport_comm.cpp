// The Python-transport communicator (py_transport_comm.hpp). Every call into Python holds the
// GIL for its duration only: the schedules run with the GIL released and take it back here.
#include "py_transport_comm.hpp"

#include <nanobind/ndarray.h>

#include <chrono>
#include <mutex>
#include <utility>

namespace seqpar::py {
namespace {

using ByteArray = nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>;

// A numpy view of seqpar's buffer; valid while the batch is in flight (the schedule keeps it).
nb::object byte_array(const void* data, size_t bytes) {
  const size_t shape[1] = {bytes};
  return nb::cast(ByteArray(const_cast<void*>(data), 1, shape, nb::handle()), nb::rv_policy::reference);
}

// "RuntimeError: reason" (the exception without its traceback). Holds the GIL.
Status python_failure(const char* what, const nb::python_error& e) {
  std::string reason = nb::str(e.value()).c_str();
  try {
    reason = std::string(nb::str(nb::handle(e.type()).attr("__name__")).c_str()) + ": " + reason;
  } catch (nb::python_error&) {
  }
  return Status(StatusCode::kCommError, std::string("torch.distributed transport: ") + what + " failed: " + reason);
}

double timeout_seconds() {
  return std::chrono::duration<double>(comm_timeout()).count();
}

class PythonPending final : public PendingExchange {
 public:
  explicit PythonPending(nb::object handle) : handle_(std::move(handle)) {}
  ~PythonPending() override {
    if (!done_) (void)wait();
    nb::gil_scoped_acquire gil;
    handle_.reset();
  }
  Status wait() override {
    if (done_) return status_;
    done_ = true;
    nb::gil_scoped_acquire gil;
    try {
      handle_.attr("wait")(timeout_seconds());
    } catch (nb::python_error& e) {
      status_ = python_failure("waiting for a batch", e);
    }
    return status_;
  }

 private:
  nb::object handle_;
  bool done_ = false;
  Status status_;
};

class PythonTransportCommunicator final : public Communicator {
 public:
  PythonTransportCommunicator(nb::object transport, int rank, int size)
      : transport_(std::move(transport)), rank_(rank), size_(size) {}
  ~PythonTransportCommunicator() override {
    nb::gil_scoped_acquire gil;
    transport_.reset();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "torch.distributed"; }

  StatusOr<std::unique_ptr<Communicator>> split(int, int) override {
    return Status(StatusCode::kUnsupported,
                  "the torch.distributed communicator does not split; make the sub-group with "
                  "torch.distributed.new_group and pass it as group=");
  }

  void abort(const std::string& reason) override {
    {
      std::lock_guard lock(mu_);
      if (!aborted_.empty()) return;
      aborted_ = reason.empty() ? "aborted" : reason;
    }
    nb::gil_scoped_acquire gil;
    try {
      if (nb::hasattr(transport_, "abort")) transport_.attr("abort")(reason);
    } catch (nb::python_error& e) {
      e.discard_as_unraisable("seqpar: the transport's abort");
    }
  }

 protected:
  StatusOr<std::unique_ptr<PendingExchange>> post(std::span<const SendSpec> sends,
                                                  std::span<const RecvSpec> recvs) override {
    {
      std::lock_guard lock(mu_);
      if (!aborted_.empty())
        return Status(StatusCode::kCommError, "communicator aborted: " + aborted_);
    }
    nb::gil_scoped_acquire gil;
    try {
      nb::list send_list, recv_list;
      for (const RecvSpec& r : recvs) recv_list.append(nb::make_tuple(r.peer, byte_array(r.data, r.bytes)));
      for (const SendSpec& s : sends) send_list.append(nb::make_tuple(s.peer, byte_array(s.data, s.bytes)));
      nb::object handle = transport_.attr("post")(send_list, recv_list);
      return std::unique_ptr<PendingExchange>(new PythonPending(std::move(handle)));
    } catch (nb::python_error& e) {
      return python_failure("posting a batch", e);
    }
  }
  bool overlaps() const override { return true; }

 private:
  nb::object transport_;
  int rank_, size_;
  std::mutex mu_;
  std::string aborted_;
};

}  // namespace

std::unique_ptr<Communicator> make_python_transport_communicator(nb::object transport, int rank, int size) {
  return std::make_unique<PythonTransportCommunicator>(std::move(transport), rank, size);
}

}  // namespace seqpar::py
