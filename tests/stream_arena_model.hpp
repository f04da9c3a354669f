// A model of the GPU stream arena's placement for tests on CPU ranks: where each block would sit
// in the arena that StreamBuffer::allocate takes it from, and how much memory that arena maps.
// It imitates class Arena in src/core/cuda_stream_arena.cpp (take, grow, make_free) step for
// step: a block of `bytes` takes round_up(max(bytes, 1), 512); it goes best fit into the free
// intervals (std::multimap lower_bound on size, so among equal sizes the one freed first), the
// rest of the interval staying free; where none fits, the arena maps round_up(need - free tail,
// granule) more bytes at its end, joined with a free tail; a block given back joins its free
// neighbours. The granule is the driver's recommended allocation granularity (2 MiB on H100 and
// H200); a test that scales a problem down divides it by the same factor so that the placements
// are the full size's, scaled. Not modelled: blocks given back on another stream (pending until
// an event passes) and trim_stream_arenas (no caller between a benchmark's passes).
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <map>

namespace seqpar::testing {

class StreamArenaModel {
 public:
  explicit StreamArenaModel(size_t granule) : granule_(granule) {}

  // The block's offset in the arena (Arena::take).
  size_t take(size_t bytes) {
    const size_t need = round_up(std::max<size_t>(bytes, 1), kAlign);
    auto fit = by_size_.lower_bound(need);
    if (fit == by_size_.end()) {
      grow(need);
      fit = by_size_.lower_bound(need);
    }
    const size_t have = fit->first, offset = fit->second;
    by_size_.erase(fit);
    free_.erase(offset);
    if (have > need) insert_free(offset + need, have - need);
    live_[offset] = need;
    return offset;
  }
  // The block at `offset` given back on the arena's stream (Arena::make_free).
  void give(size_t offset) {
    auto it = live_.find(offset);
    if (it == live_.end()) return;
    size_t bytes = it->second;
    live_.erase(it);
    auto next = free_.find(offset + bytes);
    if (next != free_.end()) {
      erase_by_size(next->first, next->second);
      bytes += next->second;
      free_.erase(next);
    }
    auto prev = free_.lower_bound(offset);
    if (prev != free_.begin() && (--prev)->first + prev->second == offset) {
      erase_by_size(prev->first, prev->second);
      offset = prev->first, bytes += prev->second;
      free_.erase(prev);
    }
    insert_free(offset, bytes);
  }
  // The bytes mapped: the arena's device memory, never less than at any earlier time.
  size_t mapped() const { return mapped_; }
  size_t granule() const { return granule_; }

 private:
  static constexpr size_t kAlign = 512;
  static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }
  // Arena::grow: maps enough past the mapped part that a free tail and it hold `need` bytes.
  void grow(size_t need) {
    const bool tail_free = !free_.empty() && std::prev(free_.end())->first + std::prev(free_.end())->second == mapped_;
    const size_t tail = tail_free ? std::prev(free_.end())->second : 0;
    const size_t add = round_up(need - tail, granule_);
    const size_t at = mapped_;
    mapped_ += add;
    live_[at] = add;  // joined with the free tail as it is given back
    give(at);
  }
  void insert_free(size_t offset, size_t bytes) {
    free_[offset] = bytes;
    by_size_.insert({bytes, offset});
  }
  void erase_by_size(size_t offset, size_t bytes) {
    auto [lo, hi] = by_size_.equal_range(bytes);
    for (auto it = lo; it != hi; ++it)
      if (it->second == offset) {
        by_size_.erase(it);
        return;
      }
  }

  size_t granule_, mapped_ = 0;
  std::map<size_t, size_t> free_;          // offset -> bytes
  std::multimap<size_t, size_t> by_size_;  // bytes -> offset
  std::map<size_t, size_t> live_;          // offset -> bytes
};

}  // namespace seqpar::testing
