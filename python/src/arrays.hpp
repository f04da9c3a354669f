// Conversions at the Python edge: arrays (numpy, or anything with DLPack / the buffer protocol,
// through nanobind's ndarray) to seqpar's TensorView and back, and seqpar::Status to Python
// exceptions. The library itself never sees Python or numpy types.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>

#include "seqpar/status.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar::py {

namespace nb = nanobind;

// Any array, read-only allowed; its device, dtype and strides are checked by view_of.
using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<nb::numpy>;

// Raises ValueError for bad arguments and unsupported problems, RuntimeError otherwise.
void throw_if_error(const Status& status);

template <class T>
T value_or_throw(StatusOr<T>&& result) {
  throw_if_error(result.status());
  return std::move(result).value();
}

// A view of a host array named `name` (for messages). Raises TypeError for a dtype other than
// float16/32/64 or an array not in host memory, ValueError when it is not C-contiguous or has
// more than 4 dimensions. The view aliases the array's memory (valid while the array lives).
TensorView view_of(const InArray& array, const char* name);

// Where an array lives: device_id -1 for host memory, else the CUDA device's index.
struct ArrayView {
  TensorView view;
  int device_id = -1;
};

// A view of a host or CUDA array of float64/32/16 or bfloat16 with its device. TypeError for
// another dtype or device kind, ValueError when it is not C-contiguous or has more than 4
// dimensions. Aliases the array's memory.
ArrayView any_view(const nb::ndarray<>& array, const char* name);

// A numpy array that takes ownership of `tensor` (no copy).
OutArray to_numpy(HostTensor&& tensor);

// "float32" etc., for messages.
std::string dtype_text(DType dtype);

}  // namespace seqpar::py
