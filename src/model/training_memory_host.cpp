// The host half of training_memory.hpp: plain memory, every call done when it returns; the
// compute copy is the f32 master weights themselves. AdamW's arithmetic is adamw.cpp's.
#include <cmath>
#include <cstring>
#include <vector>

#include "model/layers.hpp"
#include "model/training_memory.hpp"

namespace seqpar::model {
namespace {

class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(size_t bytes) : bytes_((bytes + 63) / 64) {}
  void* data() const override { return const_cast<Line*>(bytes_.data()); }

 private:
  struct alignas(64) Line {
    char b[64];
  };
  std::vector<Line> bytes_;
};

class HostTrainingMemory final : public TrainingMemory {
 public:
  DeviceKind device() const override { return DeviceKind::kCpu; }
  void* stream() const override { return nullptr; }
  DType compute_dtype() const override { return DType::kF32; }
  StatusOr<std::unique_ptr<Buffer>> allocate(size_t bytes) override {
    return std::unique_ptr<Buffer>(std::make_unique<HostBuffer>(bytes));
  }
  Status zero(void* p, size_t bytes) override {
    if (bytes) std::memset(p, 0, bytes);
    return Status::Ok();
  }
  Status copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
    return Status::Ok();
  }
  Status copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                   size_t height) override {
    for (size_t r = 0; r < height && width > 0; ++r)
      std::memmove(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, width);
    return Status::Ok();
  }
  Status to_host(void* host, const void* src, size_t bytes) override { return copy(host, src, bytes); }
  Status from_host(void* dst, const void* host, size_t bytes) override { return copy(dst, host, bytes); }
  Status to_compute(const float* src, void* dst, int64_t n) override {
    return copy(dst, src, size_t(n) * sizeof(float));
  }
  Status add(float* dst, const float* src, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
    return Status::Ok();
  }
  StatusOr<double> sum_of_squares(const float* x, int64_t n) override {
    double sq = 0;
    for (int64_t i = 0; i < n; ++i) sq += double(x[i]) * double(x[i]);
    return sq;
  }
  Status adamw(const AdamWStep& step, double decay, float* params, void*, const float* grads, float* m, float* v,
               int64_t n) override {
    adamw_update(step, decay, params, grads, m, v, n);
    return Status::Ok();
  }
  Status synchronize() override { return Status::Ok(); }
  StatusOr<std::unique_ptr<TrainingMemory>> make_lane() override { return make_host_training_memory(); }
  Status wait_for(const TrainingMemory&) override { return Status::Ok(); }  // every call is done already
  int64_t peak_bytes() const override { return 0; }
};

}  // namespace

std::unique_ptr<TrainingMemory> make_host_training_memory() { return std::make_unique<HostTrainingMemory>(); }

}  // namespace seqpar::model
