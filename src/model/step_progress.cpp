// The progress lines of step_progress.hpp.
#include "model/step_progress.hpp"

#include <chrono>
#include <cstdio>

namespace seqpar::model {
namespace {

using Clock = std::chrono::steady_clock;
thread_local int64_t t_step = 0;
thread_local double t_every_s = -1;
thread_local Clock::time_point t_start, t_last;

}  // namespace

void set_step_progress(int64_t step, double every_s) {
  t_step = step, t_every_s = every_s;
  t_start = t_last = Clock::now();
}

void report_layer(const char* phase, int64_t done, int64_t layers) {
  if (t_every_s < 0) return;
  const Clock::time_point now = Clock::now();
  if (std::chrono::duration<double>(now - t_last).count() < t_every_s) return;
  t_last = now;
  std::fprintf(stderr, "seqpar train: step %lld: %s, %lld of %lld layers (%.0f s into the step)\n",
               static_cast<long long>(t_step), phase, static_cast<long long>(done), static_cast<long long>(layers),
               std::chrono::duration<double>(now - t_start).count());
}

}  // namespace seqpar::model
