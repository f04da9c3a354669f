// The NCCL communicator (see include/seqpar/nccl_comm.hpp): non-blocking NCCL communicators,
// batches on a stream of their own, and host waits that poll with a progress deadline. The
// bootstraps that make them are in nccl_bootstrap.cpp.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <vector>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/nccl_collectives.hpp"
#include "comm/nccl_create.hpp"
#include "core/cuda_check.hpp"
#include "seqpar/gpu.hpp"
#include "seqpar/nccl_comm.hpp"

namespace seqpar {
namespace {

using Clock = std::chrono::steady_clock;

Status nccl_status(ncclResult_t r, const char* what) {
  return SP_STATUS(StatusCode::kCommError,
                   std::string(what) + " failed: " + ncclGetErrorString(r));
}

#define SP_NCCL_CHECK(expr)                                                         \
  do {                                                                              \
    const ncclResult_t sp_nccl_r_ = (expr);                                         \
    if (sp_nccl_r_ != ncclSuccess && sp_nccl_r_ != ncclInProgress)                  \
      return nccl_status(sp_nccl_r_, #expr);                                        \
  } while (0)

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

class NcclCommunicator;

// A batch in flight: an event recorded on the communicator's stream after its operations.
class NcclPending final : public PendingExchange {
 public:
  NcclPending(NcclCommunicator* comm, cudaEvent_t done) : comm_(comm), done_(done) {}
  ~NcclPending() override { (void)cudaEventDestroy(done_); }
  Status wait() override;
  Status wait_on_stream(void* stream) override {
    SP_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done_, 0));
    return Status::Ok();
  }

 private:
  NcclCommunicator* comm_;
  cudaEvent_t done_;
};

class DoneExchange final : public PendingExchange {
 public:
  Status wait() override { return Status::Ok(); }
};

// Set by nccl_exit_process_on_failure (the tool turns it on).
std::atomic<bool> g_exit_on_failure{false};

class NcclCommunicator final : public Communicator {
 public:
  // Creates rank `rank` of `size` on `device` (made current) from a shared unique id.
  // `created` sees the object before its (collective) initialisation, so another thread can
  // abort() a rank still waiting for peers that failed.
  static StatusOr<std::unique_ptr<NcclCommunicator>> create(
      const ncclUniqueId& id, int rank, int size, int device,
      const std::function<void(NcclCommunicator*)>& created = nullptr) {
    SP_CUDA_CHECK(cudaSetDevice(device));
    std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(rank, size, device));
    if (created) created(c.get());
    const Status s = c->init(id);
    if (!s.ok()) {
      if (created) created(nullptr);  // unregistered before it is destroyed
      return s;
    }
    return c;
  }

  ~NcclCommunicator() override {
    // Drain while the watchdog still guards against a dead peer; then act on a late abort.
    if (stream_ && !device_abandoned()) (void)synchronize(stream_);
    stop_ = true;
    if (watchdog_.joinable()) watchdog_.join();
    if (abort_requested_ && !aborted_) abort_now();
    if (comm_ && !aborted_) {  // an error seen while idle: a communicator in error is aborted
      ncclResult_t async = ncclSuccess;
      (void)ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) abort_now();
    }
    if (device_abandoned()) return;  // a stuck kernel would block every call below
    (void)cudaSetDevice(device_);
    if (stream_ && !aborted_) (void)cudaStreamSynchronize(stream_);
    for (const auto& w : watched_) (void)cudaEventDestroy(w);
    if (ready_) (void)cudaEventDestroy(ready_);
    if (stream_) (void)cudaStreamDestroy(stream_);
    if (comm_ && !aborted_) (void)ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "nccl"; }
  bool stream_ordered() const override { return true; }

  // Sub-communicators are cached by every rank's (color, key): the same collective split
  // hands out a view of the same NCCL communicator, with byte counters of its own. The key
  // must be the whole job's arguments, which every rank sees alike, so that all ranks find
  // the split cached or all build it (one rank's own (color, key) may repeat in another split).
  StatusOr<std::unique_ptr<Communicator>> split(int color, int key) override {
    SP_RETURN_IF_ERROR(check_alive());
    std::vector<int> all(2 * static_cast<size_t>(size_));
    const int mine[2] = {color, key};
    SP_RETURN_IF_ERROR(all_gather(mine, all.data(), sizeof(mine)));
    auto& cached = splits_[all];
    if (!cached) {
      SP_ASSIGN_OR_RETURN(cached, build_split(all));
    }
    return view_of(cached);
  }

  // NCCL mis-orders negative keys, so NCCL gets this rank's place in the (key, rank) order of
  // its color, which is never negative.
  StatusOr<std::shared_ptr<NcclCommunicator>> build_split(const std::vector<int>& all) {
    const int color = all[2 * rank_], key = all[2 * rank_ + 1];
    int place = 0;
    for (int r = 0; r < size_; ++r) {
      const bool same_color = all[2 * r] == color;
      const int other_key = all[2 * r + 1];
      if (same_color && (other_key < key || (other_key == key && r < rank_))) ++place;
    }
    std::shared_ptr<NcclCommunicator> c(new NcclCommunicator(0, 0, device_));
    ncclConfig_t config = nonblocking_config();
    {
      std::lock_guard lock(nccl_mu_);
      SP_NCCL_CHECK(ncclCommSplit(comm_, color, place, &c->comm_, &config));
    }
    SP_RETURN_IF_ERROR(settle("ncclCommSplit"));
    SP_RETURN_IF_ERROR(c->settle("ncclCommSplit"));
    SP_NCCL_CHECK(ncclCommUserRank(c->comm_, &c->rank_));
    SP_NCCL_CHECK(ncclCommCount(c->comm_, &c->size_));
    SP_RETURN_IF_ERROR(c->start());
    return c;
  }

  // Safe from any thread: the watchdog aborts the NCCL communicator.
  void abort(const std::string& reason) override {
    std::lock_guard lock(abort_mu_);
    if (!abort_requested_) abort_reason_ = reason;
    abort_requested_ = true;
  }

  Status synchronize(void* stream) override {
    SP_CUDA_CHECK(cudaSetDevice(device_));
    cudaEvent_t done;
    SP_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    Status s = Status::Ok();
    if (cudaEventRecord(done, static_cast<cudaStream_t>(stream)) != cudaSuccess)
      s = SP_STATUS(StatusCode::kInternal, "cudaEventRecord failed");
    if (s.ok()) s = wait_event(done, "the GPU work of this rank");
    (void)cudaEventDestroy(done);
    return s;
  }

  // Polls `done` until it completes or the communicator aborts (the watchdog aborts it when
  // transfers stop making progress, so this never waits forever).
  Status wait_event(cudaEvent_t done, const std::string& what) {
    for (int spins = 0;; ++spins) {
      SP_RETURN_IF_ERROR(check_alive());
      const cudaError_t q = cudaEventQuery(done);
      if (q == cudaSuccess) return Status::Ok();
      if (q != cudaErrorNotReady) {
        (void)cudaGetLastError();
        abort(std::string("CUDA error while waiting for ") + what + ": " + cudaGetErrorString(q));
        continue;
      }
      if (spins < 1000) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

 protected:
  StatusOr<std::unique_ptr<PendingExchange>> post(std::span<const SendSpec> sends,
                                                  std::span<const RecvSpec> recvs) override {
    SP_RETURN_IF_ERROR(check_alive());
    SP_CUDA_CHECK(cudaSetDevice(device_));
    bool on_host = false;
    for (const SendSpec& s : sends) on_host = on_host || (s.bytes && !is_device_pointer(s.data));
    for (const RecvSpec& r : recvs) on_host = on_host || (r.bytes && !is_device_pointer(r.data));
    if (on_host) return post_staged(sends, recvs);
    SP_RETURN_IF_ERROR(order_after_caller());
    SP_RETURN_IF_ERROR(enqueue(sends, recvs));
    return pending_batch();
  }
  bool overlaps() const override { return true; }

  // NCCL's own all-gather / reduce-scatter / all-reduce (nccl_collectives.cpp), ordered like a
  // batch; the base class hands over device buffers only.
  StatusOr<std::unique_ptr<PendingExchange>> post_collective(const CollectiveSpec& spec) override {
    SP_RETURN_IF_ERROR(check_alive());
    SP_CUDA_CHECK(cudaSetDevice(device_));
    SP_RETURN_IF_ERROR(order_after_caller());
    SP_RETURN_IF_ERROR(enqueue_group([&] { return issue_nccl_collective(spec, comm_, stream_); }));
    return pending_batch();
  }

 private:
  NcclCommunicator(int rank, int size, int device) : rank_(rank), size_(size), device_(device) {}

  Status init(const ncclUniqueId& id) {
    ncclConfig_t config = nonblocking_config();
    SP_NCCL_CHECK(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config));
    SP_RETURN_IF_ERROR(settle("NCCL initialisation"));
    return start();
  }

  Status start() {
    SP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    SP_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    watchdog_ = std::thread([this] { watch(); });
    return Status::Ok();
  }

  // Starts our stream's next batch after the work already queued on the caller's stream.
  Status order_after_caller() {
    if (!Communicator::has_stream()) return Status::Ok();
    // One reused event: the wait takes the event's state at the time it is queued.
    SP_CUDA_CHECK(cudaEventRecord(ready_, static_cast<cudaStream_t>(Communicator::stream())));
    SP_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    return Status::Ok();
  }

  // The handle of what was just queued on our stream.
  StatusOr<std::unique_ptr<PendingExchange>> pending_batch() {
    cudaEvent_t done;
    SP_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    SP_CUDA_CHECK(cudaEventRecord(done, stream_));
    return std::unique_ptr<PendingExchange>(new NcclPending(this, done));
  }

  Status enqueue(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs) {
    return enqueue_group([&] {
      ncclResult_t r = ncclSuccess;
      for (const SendSpec& snd : sends)
        if (snd.bytes && (r == ncclSuccess || r == ncclInProgress))
          r = ncclSend(snd.data, snd.bytes, ncclUint8, snd.peer, comm_, stream_);
      for (const RecvSpec& rcv : recvs)
        if (rcv.bytes && (r == ncclSuccess || r == ncclInProgress))
          r = ncclRecv(rcv.data, rcv.bytes, ncclUint8, rcv.peer, comm_, stream_);
      return r;
    });
  }

  // Queues the NCCL calls of `issue` as one group on our stream and hands the watchdog an
  // event that marks its end.
  Status enqueue_group(const std::function<ncclResult_t()>& issue) {
    {
      std::lock_guard lock(nccl_mu_);
      SP_RETURN_IF_ERROR(check_alive());
      SP_NCCL_CHECK(ncclGroupStart());
      const ncclResult_t r = issue();
      const ncclResult_t end = ncclGroupEnd();  // always closed, even after a failed call
      SP_NCCL_CHECK(r);
      SP_NCCL_CHECK(end);
    }
    SP_RETURN_IF_ERROR(settle("ncclGroupEnd"));
    cudaEvent_t marker;
    SP_CUDA_CHECK(cudaEventCreateWithFlags(&marker, cudaEventDisableTiming));
    SP_CUDA_CHECK(cudaEventRecord(marker, stream_));
    std::lock_guard lock(watch_mu_);
    watched_.push_back(marker);
    return Status::Ok();
  }

  // Host buffers: copy into device staging, run the batch, copy back; complete on return.
  StatusOr<std::unique_ptr<PendingExchange>> post_staged(std::span<const SendSpec> sends,
                                                         std::span<const RecvSpec> recvs) {
    size_t total = 0;
    std::vector<size_t> offsets;
    for (const SendSpec& s : sends) offsets.push_back(total), total += (s.bytes + 255) / 256 * 256;
    for (const RecvSpec& r : recvs) offsets.push_back(total), total += (r.bytes + 255) / 256 * 256;
    SP_RETURN_IF_ERROR(staging_.reserve(std::max<size_t>(total, 1)));
    char* base = static_cast<char*>(staging_.data());
    std::vector<SendSpec> dsends;
    std::vector<RecvSpec> drecvs;
    size_t i = 0;
    for (const SendSpec& s : sends) {
      SP_CUDA_CHECK(cudaMemcpyAsync(base + offsets[i], s.data, s.bytes, cudaMemcpyDefault, stream_));
      dsends.push_back({s.peer, base + offsets[i++], s.bytes});
    }
    for (const RecvSpec& r : recvs) drecvs.push_back({r.peer, base + offsets[i++], r.bytes});
    SP_RETURN_IF_ERROR(enqueue(dsends, drecvs));
    i = sends.size();
    for (const RecvSpec& r : recvs)
      SP_CUDA_CHECK(cudaMemcpyAsync(r.data, base + offsets[i++], r.bytes, cudaMemcpyDefault, stream_));
    SP_RETURN_IF_ERROR(synchronize(stream_));
    return std::unique_ptr<PendingExchange>(new DoneExchange());
  }

  // Non-blocking NCCL calls may return "in progress": poll until they settle.
  Status settle(const std::string& what) {
    const auto deadline = Clock::now() + comm_timeout();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      {
        std::lock_guard lock(nccl_mu_);
        if (aborted_) return check_alive();
        SP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
      }
      if (state == ncclSuccess) return Status::Ok();
      if (state != ncclInProgress) abort(what + ": " + ncclGetErrorString(state));
      else if (Clock::now() > deadline) abort(what + " did not complete in time");
      if (abort_requested_.load()) {
        if (!watchdog_.joinable()) abort_now();  // during creation, before the watchdog runs
        SP_RETURN_IF_ERROR(check_alive());
      }
      std::this_thread::yield();
    }
  }

  // The watchdog: retires finished transfers; when the oldest one makes no progress for the
  // timeout, NCCL reports an error, or abort() was called, it aborts the communicator, which
  // stops its kernels and so frees any thread blocked behind them.
  void watch() {
    (void)cudaSetDevice(device_);
    auto last_progress = Clock::now();
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      bool stalled = false, busy = false;
      {
        std::lock_guard lock(watch_mu_);
        while (!watched_.empty() && cudaEventQuery(watched_.front()) == cudaSuccess) {
          (void)cudaEventDestroy(watched_.front());
          watched_.pop_front();
          last_progress = Clock::now();
        }
        if (watched_.empty()) last_progress = Clock::now();
        busy = !watched_.empty();
        stalled = Clock::now() - last_progress > comm_timeout();
      }
      if (!aborted_) {
        ncclResult_t async = ncclSuccess;
        {
          std::lock_guard lock(nccl_mu_);
          if (comm_) (void)ncclCommGetAsyncError(comm_, &async);
        }
        // An error with nothing in flight (a peer that finished and left) waits for the next
        // batch, which fails on it; only work in flight is aborted.
        if (busy && async != ncclSuccess && async != ncclInProgress)
          abort(std::string("NCCL error: ") + ncclGetErrorString(async));
        if (stalled)
          abort("timed out waiting for a transfer on rank " + std::to_string(rank_) +
                " (a peer failed or stalled; SEQPAR_COMM_TIMEOUT_S sets the limit)");
        if (abort_requested_) abort_now();
      } else if (g_exit_on_failure && !acknowledged_ &&
                 Clock::now() - aborted_at_ > std::chrono::seconds(10)) {
        // The owning thread is blocked in a call that the abort did not release.
        std::fprintf(stderr, "seqpar: rank %d: communicator aborted (%s); ending the process\n",
                     rank_, abort_reason().c_str());
        std::fflush(stderr);
        std::fflush(stdout);
        std::_Exit(1);
      }
    }
  }

  // Aborts the NCCL communicator (so its kernels stop waiting). With a dead peer the abort
  // itself may not return: after a grace period the device is given up (no more frees or
  // syncs in this process) so the rank can still report and exit.
  void abort_now() {
    std::lock_guard lock(nccl_mu_);
    if (aborted_ || !comm_) return;
    aborted_at_ = Clock::now();
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> finished = done->get_future();
    std::thread([comm = comm_, done] {
      (void)ncclCommAbort(comm);
      done->set_value();
    }).detach();
    if (finished.wait_for(std::chrono::seconds(15)) != std::future_status::ready) {
      std::fprintf(stderr, "seqpar: rank %d: ncclCommAbort did not return; abandoning the GPU\n", rank_);
      abandon_device();
    }
    comm_ = nullptr;
    aborted_ = true;
  }

  std::string abort_reason() {
    std::lock_guard lock(abort_mu_);
    return abort_reason_;
  }

  Status check_alive() {
    if (aborted_ || abort_requested_) {
      acknowledged_ = true;
      return SP_STATUS(StatusCode::kCommError, "communicator aborted: " + abort_reason());
    }
    return Status::Ok();
  }

  friend class NcclView;
  static std::unique_ptr<Communicator> view_of(std::shared_ptr<NcclCommunicator> c);

  std::map<std::vector<int>, std::shared_ptr<NcclCommunicator>> splits_;  // by all ranks' (color, key)
  ncclComm_t comm_ = nullptr;  // guarded by nccl_mu_ against the watchdog's abort
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // orders a batch after the caller's stream
  int rank_, size_, device_;
  DeviceBuffer staging_;
  std::mutex nccl_mu_, watch_mu_, abort_mu_;
  std::deque<cudaEvent_t> watched_;  // end markers of queued batches, oldest first
  std::thread watchdog_;
  std::atomic<bool> stop_{false}, aborted_{false}, abort_requested_{false}, acknowledged_{false};
  Clock::time_point aborted_at_;
  std::string abort_reason_;
};

Status NcclPending::wait() { return comm_->wait_event(done_, "a transfer"); }

// A cached sub-communicator as handed out by split(): forwards to the shared communicator and
// keeps its own byte counters and ordering stream.
class NcclView final : public Communicator {
 public:
  explicit NcclView(std::shared_ptr<NcclCommunicator> c) : c_(std::move(c)) {}
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  std::string backend_name() const override { return c_->backend_name(); }
  bool stream_ordered() const override { return true; }
  StatusOr<std::unique_ptr<Communicator>> split(int color, int key) override {
    return c_->split(color, key);
  }
  void abort(const std::string& reason) override { c_->abort(reason); }
  Status synchronize(void* stream) override { return c_->synchronize(stream); }

 protected:
  StatusOr<std::unique_ptr<PendingExchange>> post(std::span<const SendSpec> sends,
                                                  std::span<const RecvSpec> recvs) override {
    forward_stream();
    return c_->post(sends, recvs);
  }
  bool overlaps() const override { return true; }
  StatusOr<std::unique_ptr<PendingExchange>> post_collective(const CollectiveSpec& spec) override {
    forward_stream();
    return c_->post_collective(spec);
  }

 private:
  void forward_stream() {
    if (has_stream()) c_->set_stream(stream());
    else c_->clear_stream();
  }

  std::shared_ptr<NcclCommunicator> c_;
};

std::unique_ptr<Communicator> NcclCommunicator::view_of(std::shared_ptr<NcclCommunicator> c) {
  return std::make_unique<NcclView>(std::move(c));
}

}  // namespace

void nccl_exit_process_on_failure(bool enable) { g_exit_on_failure = enable; }

bool nccl_available() { return true; }

Status nccl_call_status(ncclResult_t r, const char* what) {
  return r == ncclSuccess || r == ncclInProgress ? Status::Ok() : nccl_status(r, what);
}

StatusOr<std::unique_ptr<Communicator>> create_nccl_communicator(const ncclUniqueId& id, int rank, int size,
                                                                 int device,
                                                                 const std::function<void(Communicator*)>& created) {
  SP_ASSIGN_OR_RETURN(auto comm, NcclCommunicator::create(id, rank, size, device, [&](NcclCommunicator* c) {
                        if (created) created(c);
                      }));
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace seqpar
