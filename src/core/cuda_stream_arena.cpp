// StreamBuffer (include/seqpar/gpu.hpp): device memory in stream order, from an arena per
// device and stream. An arena holds segments from cudaMalloc and hands out their free
// intervals best fit, splitting them and joining neighbours as blocks come back, so what it
// holds stays close to the most its stream's blocks need at once, and the same calls in the same
// order place their blocks alike every time. (CUDA's own stream-ordered pool placed the two-rank
// ring's blocks differently from run to run, and held up to a fifth more at 64K tokens.)
// A block given back on the arena's stream is free at once for the next block taken there, as
// work on one stream runs in order; one given back on another stream waits for an event
// recorded there.
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/cuda_memory.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar {
namespace {

constexpr size_t kAlign = 512;                     // every block starts 512-byte aligned
constexpr size_t kSegmentRound = size_t(2) << 20;  // segments are whole 2 MiB

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

class Arena {
 public:
  Arena(int device, cudaStream_t stream) : device_(device), stream_(stream) {}

  StatusOr<void*> take(size_t bytes) {
    collect_pending(false);
    const size_t need = round_up(std::max<size_t>(bytes, 1), kAlign);
    auto fit = by_size_.lower_bound(need);
    if (fit == by_size_.end()) {
      SP_RETURN_IF_ERROR(add_segment(need));
      fit = by_size_.lower_bound(need);
    }
    const size_t have = fit->first;
    const Interval at = fit->second;
    by_size_.erase(fit);
    free_[at.seg].erase(at.offset);
    if (have > need) insert_free(at.seg, at.offset + need, have - need);  // its neighbours are taken
    char* p = at.seg->base + at.offset;
    live_[p] = {at.seg, need};
    return static_cast<void*>(p);
  }

  // The block at p, given back after the work queued on `on` so far.
  void give(void* p, cudaStream_t on) {
    cudaEvent_t done = nullptr;
    if (on != stream_ && cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess &&
        cudaEventRecord(done, on) == cudaSuccess) {
      pending_.push_back({p, done});
      return;
    }
    if (on != stream_) {  // no event: wait for that stream here
      if (done) (void)cudaEventDestroy(done);
      (void)cudaStreamSynchronize(on);
    }
    make_free(p);
  }

  // With the device's work done: every block given back is free, and segments without a block
  // go back to CUDA.
  void trim() {
    collect_pending(true);
    for (auto it = segments_.begin(); it != segments_.end();) {
      Segment* seg = it->get();
      const auto spans = free_.find(seg);
      const bool unused = spans != free_.end() && spans->second.size() == 1 &&
                          spans->second.begin()->first == 0 && spans->second.begin()->second == seg->bytes;
      if (unused) {
        erase_by_size(seg, 0, seg->bytes);
        free_.erase(spans);
        (void)cudaFree(seg->base);
        track_device_bytes(device_, -int64_t(seg->bytes));
        it = segments_.erase(it);
      } else {
        ++it;
      }
    }
  }

  int device() const { return device_; }

 private:
  struct Segment {
    char* base = nullptr;
    size_t bytes = 0;
  };
  struct Interval {
    Segment* seg;
    size_t offset;
  };

  Status add_segment(size_t need) {
    auto seg = std::make_unique<Segment>();
    seg->bytes = round_up(need, kSegmentRound);
    void* base = nullptr;
    cudaError_t err = cudaMalloc(&base, seg->bytes);
    if (err == cudaErrorMemoryAllocation) {  // give back the segments nothing uses, and try again
      (void)cudaGetLastError();
      SP_CUDA_CHECK(cudaDeviceSynchronize());  // trim() frees what other streams gave back too
      trim();
      err = cudaMalloc(&base, seg->bytes);
    }
    SP_CUDA_CHECK(err);
    seg->base = static_cast<char*>(base);
    track_device_bytes(device_, int64_t(seg->bytes));
    insert_free(seg.get(), 0, seg->bytes);
    segments_.push_back(std::move(seg));
    return Status::Ok();
  }
  void insert_free(Segment* seg, size_t offset, size_t bytes) {
    free_[seg][offset] = bytes;
    by_size_.insert({bytes, {seg, offset}});
  }
  void erase_by_size(Segment* seg, size_t offset, size_t bytes) {
    auto [lo, hi] = by_size_.equal_range(bytes);
    for (auto it = lo; it != hi; ++it)
      if (it->second.seg == seg && it->second.offset == offset) {
        by_size_.erase(it);
        return;
      }
  }
  // The block at p free again, joined with the free intervals on either side.
  void make_free(void* p) {
    auto it = live_.find(p);
    if (it == live_.end()) return;
    Segment* seg = it->second.first;
    size_t offset = static_cast<char*>(p) - seg->base, bytes = it->second.second;
    live_.erase(it);
    auto& spans = free_[seg];
    auto next = spans.find(offset + bytes);
    if (next != spans.end()) {
      erase_by_size(seg, next->first, next->second);
      bytes += next->second;
      spans.erase(next);
    }
    auto prev = spans.lower_bound(offset);
    if (prev != spans.begin() && (--prev)->first + prev->second == offset) {
      erase_by_size(seg, prev->first, prev->second);
      offset = prev->first, bytes += prev->second;
      spans.erase(prev);
    }
    insert_free(seg, offset, bytes);
  }
  // Blocks given back on other streams whose event has passed (all: the device is idle).
  void collect_pending(bool all) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (all || cudaEventQuery(it->second) == cudaSuccess) {
        make_free(it->first);
        (void)cudaEventDestroy(it->second);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    (void)cudaGetLastError();  // cudaErrorNotReady is not an error
  }

  int device_;
  cudaStream_t stream_;
  std::vector<std::unique_ptr<Segment>> segments_;
  std::map<Segment*, std::map<size_t, size_t>> free_;  // per segment: offset -> bytes
  std::multimap<size_t, Interval> by_size_;            // every free interval, by size
  std::map<void*, std::pair<Segment*, size_t>> live_;  // block -> (segment, bytes)
  std::vector<std::pair<void*, cudaEvent_t>> pending_;
};

// Never destroyed: at exit the CUDA context may be gone before static destructors run.
std::mutex& arenas_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::map<std::pair<int, cudaStream_t>, std::unique_ptr<Arena>>& arenas() {
  static auto* a = new std::map<std::pair<int, cudaStream_t>, std::unique_ptr<Arena>>;
  return *a;
}

}  // namespace

StatusOr<StreamBuffer> StreamBuffer::allocate(size_t bytes, void* stream) {
  StreamBuffer b;
  SP_CUDA_CHECK(cudaGetDevice(&b.device_));
  const auto s = static_cast<cudaStream_t>(stream);
  const std::lock_guard<std::mutex> lock(arenas_mutex());
  auto& arena = arenas()[{b.device_, s}];
  if (!arena) arena = std::make_unique<Arena>(b.device_, s);
  SP_ASSIGN_OR_RETURN(b.data_, arena->take(bytes));
  b.bytes_ = bytes, b.stream_ = stream;
  return b;
}

void StreamBuffer::release(void* stream) {
  if (data_ && !device_abandoned()) {
    const std::lock_guard<std::mutex> lock(arenas_mutex());
    auto it = arenas().find({device_, static_cast<cudaStream_t>(stream_)});
    if (it != arenas().end()) it->second->give(data_, static_cast<cudaStream_t>(stream));
  }
  data_ = nullptr, bytes_ = 0;
}
StreamBuffer::~StreamBuffer() { release(stream_); }
StreamBuffer::StreamBuffer(StreamBuffer&& other) noexcept
    : data_(other.data_), bytes_(other.bytes_), stream_(other.stream_), device_(other.device_) {
  other.data_ = nullptr, other.bytes_ = 0;
}
StreamBuffer& StreamBuffer::operator=(StreamBuffer&& other) noexcept {
  if (this != &other) {
    release(stream_);
    data_ = other.data_, bytes_ = other.bytes_, stream_ = other.stream_, device_ = other.device_;
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
    if (key.first == device) arena->trim();
  return Status::Ok();
}

}  // namespace seqpar
