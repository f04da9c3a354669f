// Where blocks go in a stream arena (cuda_stream_arena.cpp): the bookkeeping of one run of
// mapped bytes, without the device. Free intervals are handed out best fit (the smallest that
// holds the block; among equal sizes the one freed first) and split, a block given back joins
// its free neighbours, and a free tail counts towards what the arena must map to grow. Host code
// alone, so tests on CPU ranks place blocks as the GPU arena does (tests/stream_arena_model.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <map>
#include <optional>

namespace seqpar {

class ArenaPlacement {
 public:
  static constexpr size_t kAlign = 512;  // every block starts 512-byte aligned
  static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }
  // The bytes a block of `bytes` takes.
  static size_t need(size_t bytes) { return round_up(std::max<size_t>(bytes, 1), kAlign); }

  // The offset of a block of need(...) bytes, taken out of the best-fitting free interval (its
  // rest stays free); nullopt where none holds it (the arena grows, then frees what it mapped).
  std::optional<size_t> take(size_t need) {
    auto fit = by_size_.lower_bound(need);
    if (fit == by_size_.end()) return std::nullopt;
    const size_t have = fit->first, offset = fit->second;
    by_size_.erase(fit);
    free_.erase(offset);
    if (have > need) insert_free(offset + need, have - need);  // its neighbours are taken
    return offset;
  }
  // [offset, offset + bytes) free again, joined with the free intervals on either side.
  void give(size_t offset, size_t bytes) {
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
  // The free bytes that end at `mapped` (the arena's end): what a growth joins.
  size_t free_tail(size_t mapped) const {
    if (free_.empty()) return 0;
    const auto tail = std::prev(free_.end());
    return tail->first + tail->second == mapped ? tail->second : 0;
  }
  // Takes the last `bytes` off a free tail ending at `mapped`, if it has that many (the arena
  // unmaps them); false otherwise.
  bool shrink_tail(size_t mapped, size_t bytes) {
    if (free_tail(mapped) < bytes || bytes == 0) return false;
    const auto tail = std::prev(free_.end());
    const size_t offset = tail->first, have = tail->second;
    erase_by_size(offset, have);
    free_.erase(tail);
    if (have > bytes) insert_free(offset, have - bytes);
    return true;
  }

 private:
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

  std::map<size_t, size_t> free_;          // offset -> bytes
  std::multimap<size_t, size_t> by_size_;  // bytes -> offset
};

}  // namespace seqpar
