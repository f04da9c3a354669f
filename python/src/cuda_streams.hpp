// CUDA devices and streams for the binding (the core passes streams as void*): a guard that
// makes a device current for a scope, streams of thread ranks, and ordering one stream after
// another with an event. Without CUDA every call refuses with kUnsupported.
#pragma once

#include "seqpar/status.hpp"

namespace seqpar::py {

// Makes `device` current and restores the previous one on destruction.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  Status status_;
};

// A non-blocking stream on the current device.
StatusOr<void*> create_stream();
void destroy_stream(void* stream);
// Later work queued on `waiter` runs after the work queued on `waited` until now.
Status stream_wait(void* waiter, void* waited);

}  // namespace seqpar::py
