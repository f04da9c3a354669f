// The host half of host_offload.hpp: the slots are plain vectors and every copy is done when it
// returns, so nothing waits; the layer pass still drops and brings back each checkpoint.
#include "model/host_offload.hpp"

#include <cstring>
#include <map>
#include <utility>
#include <vector>

namespace seqpar::model {
namespace {

class HostCopies final : public HostOffload {
 public:
  Status to_host(int64_t layer, int index, const void* src, size_t bytes) override {
    std::vector<char>& slot = slots_[{layer, index}];
    slot.resize(bytes);
    if (bytes) std::memcpy(slot.data(), src, bytes);
    return Status::Ok();
  }
  Status from_host(int64_t layer, int index, void* dst, size_t bytes) override {
    const auto it = slots_.find({layer, index});
    SP_CHECK_ARG(it != slots_.end() && it->second.size() == bytes,
                 "internal: a checkpoint brought back that was not offloaded with that size");
    if (bytes) std::memcpy(dst, it->second.data(), bytes);
    return Status::Ok();
  }
  Status wait(int64_t) override { return Status::Ok(); }
  Status wait_all() override { return Status::Ok(); }
  int64_t host_bytes() const override {
    int64_t n = 0;
    for (const auto& [key, slot] : slots_) n += int64_t(slot.size());
    return n;
  }

 private:
  std::map<std::pair<int64_t, int>, std::vector<char>> slots_;
};

}  // namespace

StatusOr<std::unique_ptr<HostOffload>> make_host_offload(TrainingMemory& memory) {
  if (memory.device() == DeviceKind::kCuda) return make_cuda_host_offload(memory);
  return std::unique_ptr<HostOffload>(std::make_unique<HostCopies>());
}

}  // namespace seqpar::model
