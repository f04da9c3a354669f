// Where a training step's time goes, by kind of work (issue 36): each of the layer pass's device
// ops opens a scope of its kind. On a GPU a scope is a pair of events on the pass's stream, read
// once the step has waited for it, so a scope's time is its kernels' (and the waits they were
// queued behind); on the CPU it is the host clock, its ops being synchronous. The pass's span
// minus the scopes is what ran between them: weight gathers, gradient reduce-scatters, offload
// waits, allocations, host gaps. Off by default: a scope is then one branch.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace seqpar::model {

enum class Work : int {
  kAttention,    // the schedule's attention (local kernels and the exchanges it waits for)
  kProducts,     // the layers' linear products (cuBLAS / BLAS)
  kLmHead,       // the fused LM head + cross-entropy, its products included
  kNorms,        // RMSNorm forward and backward
  kRope,         // rotary embeddings
  kSwiglu,       // SwiGLU's elementwise part
  kEmbedding,    // the token embedding and its gradient
  kLinearMixer,  // a linear-attention layer's token mixer (LASP, its exchanges included)
  kCasts,        // fp32 -> bf16 copies of gradients into products
  kCount
};
const char* work_name(Work w);

struct WorkTimes {
  std::array<double, size_t(Work::kCount)> ms{};  // by Work
  double span_ms = 0;  // from the first scope's start to the last one's end
  bool valid = false;  // false: profiling off, or an event could not be made
};
// As StepLoss::work_ms lists them: each kind by name, then "between_ops" (the span less the
// kinds) and "pass" (the span); empty where not valid.
std::vector<std::pair<std::string, double>> named(const WorkTimes& w);

class StepProfile {
 public:
  explicit StepProfile(void* stream) : stream_(stream) {}  // a CUDA stream, or null: the host clock
  ~StepProfile();
  StepProfile(const StepProfile&) = delete;
  StepProfile& operator=(const StepProfile&) = delete;
  void enable(bool on) { on_ = on; }

  class Scope {
   public:
    Scope(StepProfile* p, Work w) : p_(p) {
      if (p_) p_->begin(w);
    }
    ~Scope() {
      if (p_) p_->end();
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepProfile* p_;
  };
  Scope time(Work w) { return Scope(on_ ? this : nullptr, w); }
  // The scopes' times since the last take, summed by kind (on a GPU: waits for the last event).
  WorkTimes take();

 private:
  using Clock = std::chrono::steady_clock;
  void begin(Work w);
  void end();
  void mark();
  double elapsed_ms(size_t from, size_t to) const;

  void* stream_;
  bool on_ = false;
  bool failed_ = false;
  int depth_ = 0;                   // scopes inside a scope count for the outer one
  std::vector<Work> kinds_;         // scope i: marks 2i and 2i + 1
  std::vector<void*> events_;       // GPU: the pool of events, reused step after step
  size_t used_ = 0;                 // GPU: events marked this step
  std::vector<Clock::time_point> host_;  // CPU: the marks
};

// What a layer pass's device (layer_pass.hpp: HostLayers, CudaLayers) offers the pass: a profile
// of its ops on its stream (null: the host clock).
class ProfiledDevice {
 public:
  explicit ProfiledDevice(void* stream) : profile_(stream) {}
  void enable_profile(bool on) { profile_.enable(on); }
  StepProfile::Scope time(Work w) { return profile_.time(w); }
  WorkTimes take_profile() { return profile_.take(); }

 private:
  StepProfile profile_;
};

}  // namespace seqpar::model
