// Tensor views (pointer, dtype, device, shape, strides in elements) and a small owning host
// tensor. The core only ever sees views; the owning type is a convenience for tools and tests.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "seqpar/dtype.hpp"
#include "seqpar/status.hpp"

namespace seqpar {

enum class DeviceKind : uint8_t { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  static Device cpu() { return {}; }
  bool operator==(const Device&) const = default;
};

inline constexpr int kMaxDims = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // in elements

  // A row-major (last dim fastest) view of `data`.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::cpu());
  static TensorView contiguous(void* data, DType dtype, std::span<const int64_t> shape,
                               Device device = Device::cpu());

  int64_t size(int dim) const { return shape[dim]; }
  int64_t numel() const;
  // Elements from `data` to the last one the view reaches, inclusive (0 when empty): the
  // extent of memory it covers, with non-negative strides.
  int64_t span_elements() const;
  // Indices [begin, end) along `dim`: the same memory, the offset and that extent changed.
  TensorView narrow(int dim, int64_t begin, int64_t end) const;
  bool is_contiguous() const;
  bool same_shape(const TensorView& other) const;
  std::string shape_string() const;  // "[2, 128, 8, 64] fp32"
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// Owning, contiguous host memory with a view of it.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::initializer_list<int64_t> shape);
  HostTensor(DType dtype, const std::vector<int64_t>& shape);
  HostTensor(const HostTensor& other);
  HostTensor& operator=(const HostTensor& other);
  HostTensor(HostTensor&&) noexcept = default;  // vector storage moves, pointer stays valid
  HostTensor& operator=(HostTensor&&) noexcept = default;

  const TensorView& view() const { return view_; }
  TensorView& view() { return view_; }
  template <class T>
  T* data() {
    return static_cast<T*>(view_.data);
  }
  template <class T>
  const T* data() const {
    return static_cast<const T*>(view_.data);
  }
  int64_t numel() const { return view_.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(view_.dtype); }

 private:
  // Elements left uninitialised by the vector: the constructor zeroes them across the cores
  // (a million-token tensor is billions of elements, serial zeroing took seconds each).
  template <class T>
  struct Uninitialized : std::allocator<T> {
    template <class U>
    struct rebind {
      using other = Uninitialized<U>;
    };
    template <class U, class... Args>
    void construct(U* p, Args&&... args) {
      if constexpr (sizeof...(Args) > 0) ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
  };
  std::vector<uint64_t, Uninitialized<uint64_t>> storage_;  // uint64 keeps every dtype aligned
  TensorView view_;
};

}  // namespace seqpar
