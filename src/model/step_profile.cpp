// StepProfile (step_profile.hpp): the scopes' marks as CUDA events on the pass's stream, or the
// host clock where there is no stream (the CPU device, or a build without CUDA).
#include "model/step_profile.hpp"

#ifdef SEQPAR_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace seqpar::model {

const char* work_name(Work w) {
  static constexpr const char* kNames[] = {"attention", "products",     "lm_head", "norms", "rope",
                                           "swiglu",    "embedding",    "linear_mixer", "casts"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == size_t(Work::kCount));
  return kNames[int(w)];
}

StepProfile::~StepProfile() {
#ifdef SEQPAR_HAVE_CUDA
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
#endif
}

void StepProfile::begin(Work w) {
  if (depth_++ > 0 || failed_) return;
  kinds_.push_back(w);
  mark();
}

void StepProfile::end() {
  if (--depth_ > 0 || failed_) return;
  mark();
}

void StepProfile::mark() {
  if (!stream_) {
    host_.push_back(Clock::now());
    return;
  }
#ifdef SEQPAR_HAVE_CUDA
  if (used_ == events_.size()) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) {
      failed_ = true;
      return;
    }
    events_.push_back(e);
  }
  if (cudaEventRecord(static_cast<cudaEvent_t>(events_[used_]), static_cast<cudaStream_t>(stream_)) != cudaSuccess)
    failed_ = true;
  ++used_;
#else
  failed_ = true;  // a stream without CUDA: cannot happen
#endif
}

double StepProfile::elapsed_ms(size_t from, size_t to) const {
  if (!stream_) return std::chrono::duration<double, std::milli>(host_[to] - host_[from]).count();
  float ms = 0;
#ifdef SEQPAR_HAVE_CUDA
  cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[from]), static_cast<cudaEvent_t>(events_[to]));
#endif
  return double(ms);
}

std::vector<std::pair<std::string, double>> named(const WorkTimes& w) {
  std::vector<std::pair<std::string, double>> out;
  if (!w.valid) return out;
  double ops = 0;
  for (int k = 0; k < int(Work::kCount); ++k) {
    out.emplace_back(work_name(Work(k)), w.ms[size_t(k)]);
    ops += w.ms[size_t(k)];
  }
  out.emplace_back("between_ops", w.span_ms - ops);
  out.emplace_back("pass", w.span_ms);
  return out;
}

WorkTimes StepProfile::take() {
  WorkTimes t;
  const size_t marks = stream_ ? used_ : host_.size();
  t.valid = on_ && !failed_ && depth_ == 0 && marks == 2 * kinds_.size();
#ifdef SEQPAR_HAVE_CUDA
  if (t.valid && stream_ && marks > 0)
    t.valid = cudaEventSynchronize(static_cast<cudaEvent_t>(events_[marks - 1])) == cudaSuccess;
#endif
  if (t.valid && marks > 0) {
    for (size_t i = 0; i < kinds_.size(); ++i) t.ms[size_t(kinds_[i])] += elapsed_ms(2 * i, 2 * i + 1);
    t.span_ms = elapsed_ms(0, marks - 1);
  }
  kinds_.clear(), host_.clear(), used_ = 0, failed_ = false;
  return t;
}

}  // namespace seqpar::model
