// The `local` communicator: P ranks as threads of one process. A send is posted as a pointer;
// the matching receive (same pair, same posting order) copies straight from it, on a progress
// thread so the caller's compute overlaps. Abort and a timeout keep a failed rank from
// hanging the others.
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "seqpar/comm.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar {

class LocalWorld {
 public:
  explicit LocalWorld(int size)
      : size_(size), send_seq_(size * size, 0), recv_seq_(size * size, 0) {}

  int size() const { return size_; }

  struct Slot {
    const void* data = nullptr;
    size_t bytes = 0;
    bool consumed = false;
    bool copying = false;  // a receiver is copying out of it right now
  };
  using Key = std::tuple<int, int, int64_t>;  // (src, dst, sequence)

  // Registers sends and reserves receive sequence numbers; returns the keys to complete.
  void post(int me, std::span<const SendSpec> sends, std::span<const RecvSpec> recvs,
            std::vector<Key>* send_keys, std::vector<Key>* recv_keys) {
    std::lock_guard lock(mu_);
    for (const SendSpec& s : sends) {
      const Key key{me, s.peer, send_seq_[me * size_ + s.peer]++};
      slots_[key] = Slot{s.data, s.bytes, false};
      send_keys->push_back(key);
    }
    for (const RecvSpec& r : recvs) recv_keys->push_back({r.peer, me, recv_seq_[r.peer * size_ + me]++});
    cv_.notify_all();
  }

  // Copies each matched send into its receive buffer, then waits until our sends are taken.
  // Whatever happens, our send slots are retired before returning, so no receiver can read a
  // buffer its owner has already freed.
  Status complete(std::span<const RecvSpec> recvs, const std::vector<Key>& recv_keys,
                  const std::vector<Key>& send_keys) {
    const auto deadline = std::chrono::steady_clock::now() + comm_timeout();
    std::unique_lock lock(mu_);
    Status status = receive_all(lock, deadline, recvs, recv_keys);
    for (const Key& key : send_keys) {
      if (!status.ok()) break;
      status = wait_for(lock, deadline, [&] { return slots_.at(key).consumed; },
                        "rank " + std::to_string(std::get<1>(key)) + " to receive a message");
    }
    for (const Key& key : send_keys) {
      cv_.wait(lock, [&] { return !slots_.at(key).copying; });  // a copy in flight is short
      slots_.erase(key);
    }
    return status;
  }

  void abort(const std::string& reason) {
    std::lock_guard lock(mu_);
    abort_locked(reason);
  }

  // The sub-world for (split number, color), created by whichever member arrives first.
  std::shared_ptr<LocalWorld> subworld(int64_t split_id, int color, int size) {
    std::lock_guard lock(mu_);
    auto& world = subworlds_[{split_id, color}];
    if (!world) world = std::make_shared<LocalWorld>(size);
    return world;
  }

 private:
  Status receive_all(std::unique_lock<std::mutex>& lock,
                     std::chrono::steady_clock::time_point deadline,
                     std::span<const RecvSpec> recvs, const std::vector<Key>& recv_keys) {
    for (size_t i = 0; i < recvs.size(); ++i) {
      const Key& key = recv_keys[i];
      Slot* slot = nullptr;
      SP_RETURN_IF_ERROR(wait_for(lock, deadline, [&] {
        auto it = slots_.find(key);
        slot = it == slots_.end() ? nullptr : &it->second;
        return slot != nullptr;
      }, "a message from rank " + std::to_string(std::get<0>(key))));
      if (slot->bytes != recvs[i].bytes) {
        const std::string why = "rank " + std::to_string(std::get<1>(key)) + " expected " +
                                std::to_string(recvs[i].bytes) + " bytes from rank " +
                                std::to_string(std::get<0>(key)) + " but " +
                                std::to_string(slot->bytes) + " were sent";
        abort_locked(why);
        return SP_STATUS(StatusCode::kCommError, why);
      }
      // The sender retires the slot only after `copying` clears, so copy unlocked.
      slot->copying = true;
      const void* src = slot->data;
      lock.unlock();
      // copy_bytes also moves device buffers (ranks that share a GPU, or one GPU each).
      const Status copied = recvs[i].bytes ? copy_bytes(recvs[i].data, src, recvs[i].bytes)
                                           : Status::Ok();
      lock.lock();
      slot->copying = false;
      slot->consumed = true;
      cv_.notify_all();
      if (!copied.ok()) {
        abort_locked(copied.message());
        return copied;
      }
    }
    return Status::Ok();
  }

  template <class Pred>
  Status wait_for(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point deadline,
                  Pred ready, const std::string& what) {
    while (!ready()) {
      if (aborted_) return SP_STATUS(StatusCode::kCommError, "communicator aborted: " + abort_reason_);
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !ready()) {
        const std::string why = "timed out waiting for " + what +
                                " (SEQPAR_COMM_TIMEOUT_S sets the limit)";
        abort_locked(why);
        return SP_STATUS(StatusCode::kCommError, why);
      }
    }
    return Status::Ok();
  }
  void abort_locked(const std::string& reason) {
    if (!aborted_) abort_reason_ = reason;
    aborted_ = true;
    cv_.notify_all();
  }

  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int64_t> send_seq_, recv_seq_;  // per (src, dst)
  std::map<Key, Slot> slots_;
  std::map<std::pair<int64_t, int>, std::shared_ptr<LocalWorld>> subworlds_;
  bool aborted_ = false;
  std::string abort_reason_;
};

namespace {

class LocalPending final : public PendingExchange {
 public:
  explicit LocalPending(std::future<Status> done) : done_(std::move(done)) {}
  ~LocalPending() override {
    if (done_.valid()) done_.wait();
  }
  Status wait() override { return done_.valid() ? done_.get() : Status::Ok(); }

 private:
  std::future<Status> done_;
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalWorld> world, int rank)
      : world_(std::move(world)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return world_->size(); }
  std::string backend_name() const override { return "local"; }

  StatusOr<std::unique_ptr<Communicator>> split(int color, int key) override {
    std::vector<int> mine{color, key}, all(2 * size());
    SP_RETURN_IF_ERROR(all_gather(mine.data(), all.data(), 2 * sizeof(int)));
    std::vector<std::pair<int, int>> members;  // (key, rank) of my color
    for (int r = 0; r < size(); ++r)
      if (all[2 * r] == color) members.push_back({all[2 * r + 1], r});
    std::sort(members.begin(), members.end());
    const int new_rank = static_cast<int>(
        std::find(members.begin(), members.end(), std::pair{key, rank_}) - members.begin());
    auto sub = world_->subworld(split_count_++, color, static_cast<int>(members.size()));
    return std::unique_ptr<Communicator>(new LocalCommunicator(std::move(sub), new_rank));
  }

  void abort(const std::string& reason) override { world_->abort(reason); }

 protected:
  StatusOr<std::unique_ptr<PendingExchange>> post(std::span<const SendSpec> sends,
                                                  std::span<const RecvSpec> recvs) override {
    std::vector<LocalWorld::Key> send_keys, recv_keys;
    world_->post(rank_, sends, recvs, &send_keys, &recv_keys);
    std::vector<RecvSpec> recv_copy(recvs.begin(), recvs.end());
    // Completion runs on its own thread so the caller can compute meanwhile.
    return std::unique_ptr<PendingExchange>(new LocalPending(std::async(
        std::launch::async,
        [world = world_, recv_copy = std::move(recv_copy), recv_keys = std::move(recv_keys),
         send_keys = std::move(send_keys)] {
          return world->complete(recv_copy, recv_keys, send_keys);
        })));
  }
  bool overlaps() const override { return true; }

 public:
  bool moves_device_buffers() const override { return true; }  // copy_bytes moves them

 private:
  std::shared_ptr<LocalWorld> world_;
  int rank_;
  int64_t split_count_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_local_communicators(int size) {
  auto world = std::make_shared<LocalWorld>(size);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) comms.emplace_back(new LocalCommunicator(world, r));
  return comms;
}

Status run_local_ranks(int size, const std::function<Status(Communicator&)>& fn) {
  if (size < 1) return SP_STATUS(StatusCode::kInvalidArgument, "need at least one rank");
  auto comms = make_local_communicators(size);
  std::vector<Status> results(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      results[r] = fn(*comms[r]);
      if (!results[r].ok()) comms[r]->abort("rank " + std::to_string(r) + " failed: " +
                                            results[r].to_string());
    });
  }
  for (auto& t : threads) t.join();
  return first_root_cause(results);
}

}  // namespace seqpar
