// Block memory on the host (block_memory.hpp): plain aligned allocations, and copies, fills
// and sums over strided views of up to 4 dims, a contiguous innermost row at a time. No
// stream: every call is done when it returns.
#include <cstdlib>
#include <cstring>
#include <algorithm>

#include "parallel/block_memory.hpp"

namespace seqpar::parallel {
namespace {

class HostBlock final : public MemoryBlock {
 public:
  explicit HostBlock(size_t bytes) : data_(std::aligned_alloc(256, std::max<size_t>(256, (bytes + 255) / 256 * 256))) {}
  ~HostBlock() override { std::free(data_); }
  void* data() const override { return data_; }

 private:
  void* data_;
};

// Calls row(dst_offset, src_offset) for every innermost row of views of one shape (offsets in
// elements), the row being shape[ndim - 1] elements long with unit stride.
template <class Row>
Status for_each_row(const TensorView& dst, const TensorView* src, Row&& row) {
  SP_CHECK_ARG(dst.ndim >= 1 && dst.ndim <= 4 && dst.strides[dst.ndim - 1] == 1,
               "host block views have up to 4 dims and a contiguous last dim; got " + dst.shape_string());
  if (src) {
    bool same = src->ndim == dst.ndim && src->strides[src->ndim - 1] == 1;
    for (int i = 0; same && i < dst.ndim; ++i) same = src->shape[i] == dst.shape[i];
    SP_CHECK_ARG(same, "host block views differ: " + src->shape_string() + " into " + dst.shape_string());
  }
  int64_t shape[3] = {1, 1, 1}, ds[3] = {0, 0, 0}, ss[3] = {0, 0, 0};
  const int outer = dst.ndim - 1;
  for (int i = 0; i < outer; ++i) {
    shape[3 - outer + i] = dst.shape[i];
    ds[3 - outer + i] = dst.strides[i];
    ss[3 - outer + i] = src ? src->strides[i] : 0;
  }
  for (int64_t a = 0; a < shape[0]; ++a)
    for (int64_t b = 0; b < shape[1]; ++b)
      for (int64_t c = 0; c < shape[2]; ++c) row(a * ds[0] + b * ds[1] + c * ds[2], a * ss[0] + b * ss[1] + c * ss[2]);
  return Status::Ok();
}

template <class T>
void add_row(const TensorView& src, const TensorView& dst, int64_t n, int64_t d, int64_t s) {
  T* out = dst.as<T>() + d;
  const T* in = src.as<T>() + s;
  for (int64_t i = 0; i < n; ++i) out[i] += in[i];
}

template <class T>
void fill_row(const TensorView& dst, int64_t n, int64_t d, float value) {
  std::fill_n(dst.as<T>() + d, n, T(value));
}

class HostBlockMemory final : public BlockMemory {
 public:
  DeviceKind device() const override { return DeviceKind::kCpu; }
  void* stream() const override { return nullptr; }
  StatusOr<std::unique_ptr<MemoryBlock>> allocate(size_t bytes) override {
    auto block = std::make_unique<HostBlock>(bytes);
    if (!block->data())
      return SP_STATUS(StatusCode::kInternal, "a host block of " + std::to_string(bytes) + " bytes could not be allocated");
    return std::unique_ptr<MemoryBlock>(std::move(block));
  }
  void release(std::unique_ptr<MemoryBlock> block) override { block.reset(); }

  Status copy(const TensorView& src, const TensorView& dst) override {
    const int64_t n = dst.shape[dst.ndim - 1];
    const size_t ss = dtype_size(src.dtype), ds = dtype_size(dst.dtype);
    return for_each_row(dst, &src, [&](int64_t d, int64_t s) {
      convert(static_cast<const char*>(src.data) + s * ss, src.dtype, static_cast<char*>(dst.data) + d * ds, dst.dtype,
              size_t(n));
    });
  }
  Status fill(const TensorView& dst, float value) override {
    SP_CHECK_SUPPORTED(dst.dtype == DType::kF32 || dst.dtype == DType::kF64,
                       std::string("host blocks are filled in fp32 or fp64, not ") + dtype_name(dst.dtype));
    const int64_t n = dst.shape[dst.ndim - 1];
    return for_each_row(dst, nullptr, [&](int64_t d, int64_t) {
      if (dst.dtype == DType::kF32) fill_row<float>(dst, n, d, value);
      else fill_row<double>(dst, n, d, value);
    });
  }
  Status add(const TensorView& src, const TensorView& dst) override {
    SP_CHECK_SUPPORTED(src.dtype == dst.dtype && (dst.dtype == DType::kF32 || dst.dtype == DType::kF64),
                       std::string("host blocks add fp32 or fp64 of one dtype, not ") + dtype_name(src.dtype) +
                           " into " + dtype_name(dst.dtype));
    const int64_t n = dst.shape[dst.ndim - 1];
    return for_each_row(dst, &src, [&](int64_t d, int64_t s) {
      if (dst.dtype == DType::kF32) add_row<float>(src, dst, n, d, s);
      else add_row<double>(src, dst, n, d, s);
    });
  }

  Status settle() override { return Status::Ok(); }
  Status begin() override { return Status::Ok(); }
  Status end() override { return Status::Ok(); }
  bool tracing() const override { return false; }
  Status mark(const std::string&) override { return Status::Ok(); }
};

}  // namespace

std::unique_ptr<BlockMemory> make_host_block_memory() { return std::make_unique<HostBlockMemory>(); }

}  // namespace seqpar::parallel
