// Tensor view helpers and the owning host tensor.
#include "seqpar/tensor.hpp"

#include <algorithm>
#include <cstring>

namespace seqpar {

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  return contiguous(data, dtype, std::span<const int64_t>(shape.begin(), shape.size()), device);
}

TensorView TensorView::contiguous(void* data, DType dtype, std::span<const int64_t> shape,
                                  Device device) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.ndim = static_cast<int>(shape.size());
  std::copy(shape.begin(), shape.end(), v.shape.begin());
  int64_t stride = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.strides[i] = stride;
    stride *= v.shape[i];
  }
  return v;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

int64_t TensorView::span_elements() const {
  if (numel() == 0) return 0;
  int64_t last = 0;
  for (int i = 0; i < ndim; ++i) last += (shape[i] - 1) * strides[i];
  return last + 1;
}

TensorView TensorView::narrow(int dim, int64_t begin, int64_t end) const {
  TensorView t = *this;
  t.data = static_cast<char*>(t.data) + begin * t.strides[dim] * int64_t(dtype_size(t.dtype));
  t.shape[dim] = end - begin;
  return t;
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != stride) return false;
    stride *= shape[i];
  }
  return true;
}

bool TensorView::same_shape(const TensorView& other) const {
  if (ndim != other.ndim) return false;
  for (int i = 0; i < ndim; ++i)
    if (shape[i] != other.shape[i]) return false;
  return true;
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "] " + dtype_name(dtype);
}

HostTensor::HostTensor(DType dtype, std::initializer_list<int64_t> shape)
    : HostTensor(dtype, std::vector<int64_t>(shape)) {}

HostTensor::HostTensor(DType dtype, const std::vector<int64_t>& shape) {
  view_.dtype = dtype;
  view_.ndim = static_cast<int>(shape.size());
  int64_t n = 1;
  for (int i = view_.ndim - 1; i >= 0; --i) {
    view_.shape[i] = shape[i];
    view_.strides[i] = n;
    n *= shape[i];
  }
  const int64_t words = static_cast<int64_t>((static_cast<size_t>(n) * dtype_size(dtype) + 7) / 8);
  storage_.resize(static_cast<size_t>(words));
  uint64_t* w = storage_.data();
#pragma omp parallel for schedule(static) if (words >= (int64_t{1} << 22))
  for (int64_t i = 0; i < words; ++i) w[i] = 0;
  view_.data = storage_.data();
}

HostTensor::HostTensor(const HostTensor& other) : storage_(other.storage_), view_(other.view_) {
  view_.data = storage_.data();
}

HostTensor& HostTensor::operator=(const HostTensor& other) {
  if (this != &other) {
    storage_ = other.storage_;
    view_ = other.view_;
    view_.data = storage_.data();
  }
  return *this;
}


}  // namespace seqpar
