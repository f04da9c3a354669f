// Inside the CUDA memory code: the per-device byte counters behind device_memory_stats
// (include/seqpar/gpu.hpp), which every owner of device memory (DeviceBuffer, the stream
// arenas) updates as it takes and frees memory from CUDA.
#pragma once

#include <cstdint>

namespace seqpar {

void track_device_bytes(int device, int64_t delta);

}  // namespace seqpar
