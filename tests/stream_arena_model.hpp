// A model of the GPU stream arena for tests on CPU ranks: where each block would sit in the arena
// that StreamBuffer::allocate takes it from, and how much memory that arena maps. The placement is
// the arena's own (src/core/arena_placement.hpp, which class Arena in cuda_stream_arena.cpp uses);
// the model adds the mapping: where no free interval holds a block, the arena maps
// round_up(need - free tail, granule) more bytes at its end, joined with a free tail. The granule
// is the driver's recommended allocation granularity (2 MiB on H100 and H200); a test that scales
// a problem down divides it by the same factor so that the placements are the full size's,
// scaled. Not modelled: blocks given back on another stream (pending until an event passes) and
// trim_stream_arenas (no caller between a benchmark's passes).
#pragma once

#include <cstddef>
#include <map>

#include "core/arena_placement.hpp"

namespace seqpar::testing {

class StreamArenaModel {
 public:
  explicit StreamArenaModel(size_t granule) : granule_(granule) {}

  // The block's offset in the arena (Arena::take).
  size_t take(size_t bytes) {
    const size_t need = ArenaPlacement::need(bytes);
    std::optional<size_t> offset = placement_.take(need);
    if (!offset) {  // Arena::grow: maps past the end enough that a free tail and it hold `need`
      const size_t add = ArenaPlacement::round_up(need - placement_.free_tail(mapped_), granule_);
      placement_.give(mapped_, add);
      mapped_ += add;
      offset = placement_.take(need);
    }
    live_[*offset] = need;
    return *offset;
  }
  // The block at `offset` given back on the arena's stream (Arena::make_free).
  void give(size_t offset) {
    auto it = live_.find(offset);
    if (it == live_.end()) return;
    placement_.give(offset, it->second);
    live_.erase(it);
  }
  // The bytes mapped: the arena's device memory, never less than at any earlier time.
  size_t mapped() const { return mapped_; }
  size_t granule() const { return granule_; }

 private:
  size_t granule_, mapped_ = 0;
  ArenaPlacement placement_;
  std::map<size_t, size_t> live_;  // offset -> bytes
};

}  // namespace seqpar::testing
