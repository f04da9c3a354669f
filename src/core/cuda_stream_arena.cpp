// StreamBuffer (include/seqpar/gpu.hpp): device memory in stream order, from an arena per
// device and stream. An arena reserves one range of addresses and maps physical memory onto
// its end as it grows (CUDA's virtual memory calls), so the mapped part is one run of bytes:
// free intervals are handed out best fit, split, and joined with their neighbours as blocks
// come back, and a free tail joins the memory mapped after it. What an arena holds so stays
// close to the most its stream's blocks need at once, and the same calls in the same order
// place their blocks alike every time. (CUDA's stream-ordered pool placed the two-rank ring's
// blocks differently from run to run and held up to a fifth more at 64K tokens; separate
// cudaMalloc segments held a tenth more on the two-rank Burst backward, whose cuDNN workspace
// fit none of the freed blocks.) A block given back on the arena's stream is free at once for
// the next block taken there, as work on one stream runs in order; one given back on another
// stream waits for an event recorded there. Arenas are keyed by the stream's id, which CUDA
// never gives to another stream (a handle may come back after cudaStreamDestroy, and
// cudaStreamPerThread names another stream on each thread); forget_stream_arenas returns an
// ending stream's memory.
#include <cuda.h>  // the driver's types; its calls are found through the runtime
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/arena_placement.hpp"
#include "core/cuda_check.hpp"
#include "core/cuda_memory.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar {
namespace {

size_t round_up(size_t x, size_t to) { return ArenaPlacement::round_up(x, to); }

// The driver's virtual memory calls, through the runtime (no link to libcuda).
struct Driver {
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*address_free)(CUdeviceptr, size_t);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags);
};
StatusOr<const Driver*> driver() {
  static Driver d{};
  static const std::string missing = [] {
    const auto find = [](const char* name, auto** fn) {
      cudaDriverEntryPointQueryResult found{};
      void* p = nullptr;
      const bool ok = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) == cudaSuccess &&
                      found == cudaDriverEntryPointSuccess && p;
      (void)cudaGetLastError();
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
      return ok ? std::string() : std::string(name) + " ";
    };
    return find("cuMemCreate", &d.create) + find("cuMemRelease", &d.release) + find("cuMemAddressReserve", &d.reserve) +
           find("cuMemAddressFree", &d.address_free) +
           find("cuMemMap", &d.map) + find("cuMemUnmap", &d.unmap) + find("cuMemSetAccess", &d.set_access) +
           find("cuMemGetAllocationGranularity", &d.granularity);
  }();
  if (!missing.empty())
    return SP_STATUS(StatusCode::kUnsupported, "the CUDA driver lacks virtual memory calls: " + missing);
  return &d;
}
#define SP_CU_CHECK(expr)                                                                               \
  do {                                                                                                  \
    const CUresult sp_cu_ = (expr);                                                                     \
    if (sp_cu_ != CUDA_SUCCESS)                                                                         \
      return SP_STATUS(StatusCode::kInternal, std::string(sp_cu_ == CUDA_ERROR_OUT_OF_MEMORY ? "out of device memory: " : "") + \
                                                  #expr + " failed (CUresult " + std::to_string(int(sp_cu_)) + ")"); \
  } while (0)

class Arena {
 public:
  Arena(int device, unsigned long long stream_id) : device_(device), id_(stream_id) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  // Only for an arena that holds no block (an orphan's): the rest goes back to CUDA.
  ~Arena() {
    trim(false);
    if (base_ && mapped_ == 0) (void)driver().value()->address_free(base_, range_);
  }
  bool orphaned = false;  // its stream has ended (forget_stream_arenas): dropped once it holds no block
  // An orphan whose blocks have all come back, those given back on other streams done.
  bool droppable() {
    if (!orphaned) return false;
    collect_pending(false);
    return live_.empty() && pending_.empty();
  }

  StatusOr<void*> take(size_t bytes) {
    collect_pending(false);
    const size_t need = ArenaPlacement::need(bytes);
    std::optional<size_t> offset = placement_.take(need);
    if (!offset) {
      SP_RETURN_IF_ERROR(grow(need));
      offset = placement_.take(need);
    }
    void* p = reinterpret_cast<void*>(base_ + *offset);
    live_[p] = need;
    return p;
  }

  // The block at p, given back after the work queued so far on the stream `on` (id `on_id`).
  // False when no event could mark that point: the caller waits for `on`, then calls free_now.
  bool give(void* p, cudaStream_t on, unsigned long long on_id) {
    if (on_id == id_) {
      make_free(p);
      return true;
    }
    cudaEvent_t done = nullptr;
    if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess && cudaEventRecord(done, on) == cudaSuccess) {
      pending_.push_back({p, done});
      return true;
    }
    (void)cudaGetLastError();  // reported here, not by the next kernel's launch check
    if (done) (void)cudaEventDestroy(done);
    return false;
  }
  void free_now(void* p) { make_free(p); }

  // The mapped memory past the last block held goes back to CUDA. With `device_idle` (the
  // device's work done) every block given back is free first; otherwise those whose event passed.
  // The arena's own stream must have no work queued that uses its free blocks.
  void trim(bool device_idle) {
    collect_pending(device_idle);
    while (!chunks_.empty()) {
      const Driver* d = driver().value();  // it mapped the chunks
      const size_t last = chunks_.back().second;
      if (placement_.free_tail(mapped_) < last) break;
      if (d->unmap(base_ + mapped_ - last, last) != CUDA_SUCCESS) break;  // still mapped: kept as it is
      placement_.shrink_tail(mapped_, last);
      mapped_ -= last;
      (void)d->release(chunks_.back().first);
      chunks_.pop_back();
      track_device_bytes(device_, -int64_t(last));
    }
  }

 private:
  // Maps enough memory past the mapped part that a free tail and it hold `need` bytes.
  Status grow(size_t need) {
    SP_ASSIGN_OR_RETURN(const Driver* d, driver());
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device_;
    if (!base_) {  // addresses for as much as the device holds
      size_t granule = 0, free_bytes = 0, total = 0;
      SP_CU_CHECK(d->granularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
      SP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
      int devices = 0;
      SP_CUDA_CHECK(cudaGetDeviceCount(&devices));
      access_.clear();
      for (int peer = 0; peer < devices; ++peer) {  // this device first, then the peers that reach it (NCCL)
        const int dev = peer == 0 ? device_ : peer == device_ ? 0 : peer;
        int can = dev == device_;
        if (!can && (cudaDeviceCanAccessPeer(&can, dev, device_) != cudaSuccess || !can)) {
          (void)cudaGetLastError();
          continue;
        }
        CUmemAccessDesc a{};
        a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        a.location.id = dev;
        a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        access_.push_back(a);
      }
      CUdeviceptr base = 0;
      SP_CU_CHECK(d->reserve(&base, round_up(total, granule), granule, 0, 0));
      base_ = base, range_ = round_up(total, granule), granule_ = granule;
    }
    const size_t add = round_up(need - placement_.free_tail(mapped_), granule_);
    if (mapped_ + add > range_)
      return SP_STATUS(StatusCode::kInternal, "out of device memory: a stream's blocks would need more than the device holds");
    CUmemGenericAllocationHandle h{};
    SP_CU_CHECK(d->create(&h, add, &prop, 0));
    const CUresult mapped = d->map(base_ + mapped_, add, 0, h, 0);
    const CUresult granted = mapped == CUDA_SUCCESS ? d->set_access(base_ + mapped_, add, access_.data(), 1) : mapped;
    if (granted != CUDA_SUCCESS) {
      if (mapped == CUDA_SUCCESS) (void)d->unmap(base_ + mapped_, add);
      (void)d->release(h);
      SP_CU_CHECK(granted);  // mapping the memory, or granting this device access to it
    }
    for (size_t i = 1; i < access_.size(); ++i)  // a peer that cannot be granted does not use it
      (void)d->set_access(base_ + mapped_, add, &access_[i], 1);
    chunks_.push_back({h, add});
    track_device_bytes(device_, int64_t(add));
    const size_t at = mapped_;
    mapped_ += add;
    live_[reinterpret_cast<void*>(base_ + at)] = add;  // joined with the free tail as it is given back
    make_free(reinterpret_cast<void*>(base_ + at));
    return Status::Ok();
  }
  // The block at p free again, joined with the free intervals on either side.
  void make_free(void* p) {
    auto it = live_.find(p);
    if (it == live_.end()) return;
    placement_.give(reinterpret_cast<CUdeviceptr>(p) - base_, it->second);
    live_.erase(it);
  }
  // Blocks given back on other streams whose event has passed (all: the device is idle).
  // A failed query (the device is in error) frees the block too: nothing runs there any more.
  void collect_pending(bool all) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (!all && cudaEventQuery(it->second) == cudaErrorNotReady) {
        if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();  // not an error
        ++it;
        continue;
      }
      make_free(it->first);
      (void)cudaEventDestroy(it->second);
      it = pending_.erase(it);
    }
  }

  int device_;
  unsigned long long id_;  // its stream's
  CUdeviceptr base_ = 0;
  size_t range_ = 0, mapped_ = 0, granule_ = 0;
  std::vector<CUmemAccessDesc> access_;
  std::vector<std::pair<CUmemGenericAllocationHandle, size_t>> chunks_;  // mapped in this order
  ArenaPlacement placement_;                                              // the free intervals
  std::map<void*, size_t> live_;                                          // block -> bytes
  std::vector<std::pair<void*, cudaEvent_t>> pending_;
};

// Never destroyed: at exit the CUDA context may be gone before static destructors run.
std::mutex& arenas_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
using ArenaMap = std::map<std::pair<int, unsigned long long>, std::unique_ptr<Arena>>;  // (device, stream id)
ArenaMap& arenas() {
  static auto* a = new ArenaMap;
  return *a;
}

StatusOr<unsigned long long> stream_id(cudaStream_t s) {
  unsigned long long id = 0;
  SP_CUDA_CHECK(cudaStreamGetId(s, &id));
  return id;
}

// Drops the orphaned arenas that hold no block (the arenas' lock held).
void drop_orphans() {
  for (auto it = arenas().begin(); it != arenas().end();) it = it->second->droppable() ? arenas().erase(it) : std::next(it);
}

}  // namespace

StatusOr<StreamBuffer> StreamBuffer::allocate(size_t bytes, void* stream) {
  StreamBuffer b;
  SP_CUDA_CHECK(cudaGetDevice(&b.device_));
  const auto s = static_cast<cudaStream_t>(stream);
  SP_ASSIGN_OR_RETURN(b.stream_id_, stream_id(s));
  const std::lock_guard<std::mutex> lock(arenas_mutex());
  auto& arena = arenas()[{b.device_, b.stream_id_}];
  if (!arena) arena = std::make_unique<Arena>(b.device_, b.stream_id_);
  SP_ASSIGN_OR_RETURN(b.data_, arena->take(bytes));
  b.bytes_ = bytes, b.stream_ = stream;
  return b;
}

void StreamBuffer::release(void* stream) {
  if (data_ && !device_abandoned()) {
    const auto on = static_cast<cudaStream_t>(stream);
    // The stream it was taken on needs no lookup (it may have ended since); cudaStreamPerThread
    // is another stream on each thread.
    auto on_id = on == static_cast<cudaStream_t>(stream_) && on != cudaStreamPerThread ? StatusOr<unsigned long long>(stream_id_)
                                                                                       : stream_id(on);
    // `give` to the block's arena under the lock; an ended stream's arena goes with its last block.
    const auto settle = [&](const auto& give) {
      const std::lock_guard<std::mutex> lock(arenas_mutex());
      auto it = arenas().find({device_, stream_id_});
      if (it == arenas().end()) return true;
      if (!give(*it->second)) return false;
      if (it->second->droppable()) arenas().erase(it);
      return true;
    };
    if (!settle([&](Arena& a) { return on_id.ok() && a.give(data_, on, on_id.value()); })) {
      // No event marks where `on` is: wait for it here, the lock released meanwhile.
      if (!on_id.ok() || cudaStreamSynchronize(on) != cudaSuccess) (void)cudaDeviceSynchronize();
      (void)cudaGetLastError();
      (void)settle([&](Arena& a) { return a.free_now(data_), true; });
    }
  }
  data_ = nullptr, bytes_ = 0;
}
StreamBuffer::~StreamBuffer() { release(stream_); }
StreamBuffer::StreamBuffer(StreamBuffer&& other) noexcept
    : data_(other.data_), bytes_(other.bytes_), stream_(other.stream_), stream_id_(other.stream_id_), device_(other.device_) {
  other.data_ = nullptr, other.bytes_ = 0;
}
StreamBuffer& StreamBuffer::operator=(StreamBuffer&& other) noexcept {
  if (this != &other) {
    release(stream_);
    data_ = other.data_, bytes_ = other.bytes_, stream_ = other.stream_, stream_id_ = other.stream_id_,
    device_ = other.device_;
    other.data_ = nullptr, other.bytes_ = 0;
  }
  return *this;
}

Status trim_stream_arenas() {
  int device = 0;
  SP_CUDA_CHECK(cudaGetDevice(&device));
  SP_CUDA_CHECK(cudaDeviceSynchronize());  // blocks given back in stream order are free by now
  const std::lock_guard<std::mutex> lock(arenas_mutex());
  for (auto& [key, arena] : arenas())
    if (key.first == device) arena->trim(true);
  drop_orphans();
  return Status::Ok();
}

Status forget_stream_arenas(void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  SP_ASSIGN_OR_RETURN(const unsigned long long id, stream_id(s));
  SP_CUDA_CHECK(cudaStreamSynchronize(s));  // what it queued is done: its free blocks can go
  const std::lock_guard<std::mutex> lock(arenas_mutex());
  for (auto& [key, arena] : arenas())
    if (key.second == id) arena->orphaned = true, arena->trim(false);
  drop_orphans();
  return Status::Ok();
}

}  // namespace seqpar
