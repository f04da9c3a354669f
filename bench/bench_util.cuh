// Pieces the GPU benchmarks share: uniform random bf16 inputs in [-1, 1), the median, and the
// CUDA-event-timed median of a call.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "seqpar/status.hpp"

namespace seqpar::bench {

// x[i] = uniform in [-1, 1) from a splitmix hash of (seed, i), rounded to bf16 (raw bits).
__global__ inline void fill_uniform_bf16(uint16_t* x, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + i;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    const float u = float((z >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
    uint32_t bits = __float_as_uint(u);
    x[i] = uint16_t((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
  }
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median over `iters` calls of fn, in ms by CUDA events on the legacy stream, after `warmup`
// untimed calls; a failing call prints its error and clears *ok.
inline double event_median_ms(const std::function<Status()>& fn, int warmup, int iters, bool* ok) {
  for (int i = 0; i < warmup; ++i)
    if (!fn().ok()) *ok = false;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(start);
    const Status s = fn();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
      *ok = false;
    }
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(times);
}

}  // namespace seqpar::bench
