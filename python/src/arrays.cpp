// Array and error conversions for the Python module (arrays.hpp).
#include "arrays.hpp"

#include <stdexcept>

namespace seqpar::py {

void throw_if_error(const Status& status) {
  if (status.ok()) return;
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kUnsupported:
      throw nb::value_error(status.message().c_str());
    default:
      throw std::runtime_error(status.to_string());  // nanobind raises RuntimeError
  }
}

std::string dtype_text(DType dtype) {
  switch (dtype) {
    case DType::kF64: return "float64";
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
  }
  return "?";
}

namespace {

// dtype and C-contiguous strides of `array` into `view` (shared by view_of and any_view).
template <class Array>
void describe(const Array& array, const std::string& who, bool allow_bf16, TensorView& view) {
  const nb::dlpack::dtype dt = array.dtype();
  const auto float_code = static_cast<uint8_t>(nb::dlpack::dtype_code::Float);
  const auto bfloat_code = static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat);
  if (dt == nb::dtype<double>()) {
    view.dtype = DType::kF64;
  } else if (dt == nb::dtype<float>()) {
    view.dtype = DType::kF32;
  } else if (dt.code == float_code && dt.bits == 16 && dt.lanes == 1) {
    view.dtype = DType::kF16;
  } else if (allow_bf16 && dt.code == bfloat_code && dt.bits == 16 && dt.lanes == 1) {
    view.dtype = DType::kBF16;
  } else {
    throw nb::type_error((who + (allow_bf16 ? ": dtype must be float64, float32, float16 or bfloat16"
                                            : ": dtype must be float32 or float64 (float16 for shard/unshard)"))
                             .c_str());
  }
  if (array.ndim() > static_cast<size_t>(kMaxDims))
    throw nb::value_error((who + " has " + std::to_string(array.ndim()) + " dimensions; at most 4").c_str());
  view.ndim = static_cast<int>(array.ndim());
  // C-contiguous: strides (in elements) are the suffix products of the shape; dims of size 1
  // may carry any stride.
  int64_t expected = 1;
  for (int d = view.ndim - 1; d >= 0; --d) {
    view.shape[d] = static_cast<int64_t>(array.shape(d));
    if (view.shape[d] != 1 && array.stride(d) != expected)
      throw nb::value_error((who + " is not C-contiguous; pass " + who + ".contiguous() (numpy: numpy.ascontiguousarray(" +
                             who + "))").c_str());
    view.strides[d] = expected;
    expected *= view.shape[d];
  }
  view.data = const_cast<void*>(static_cast<const void*>(array.data()));
}

}  // namespace

TensorView view_of(const InArray& array, const char* name) {
  const std::string who(name);
  if (array.device_type() != nb::device::cpu::value)
    throw nb::type_error((who + ": seqpar's Python API computes on host arrays; this one is on another device").c_str());
  TensorView view;
  describe(array, who, /*allow_bf16=*/false, view);
  return view;
}

ArrayView any_view(const nb::ndarray<>& array, const char* name) {
  const std::string who(name);
  ArrayView out;
  if (array.device_type() == nb::device::cuda::value) {
    out.device_id = array.device_id();
  } else if (array.device_type() != nb::device::cpu::value) {
    throw nb::type_error((who + ": seqpar takes host or CUDA tensors; this one is on another kind of device").c_str());
  }
  describe(array, who, /*allow_bf16=*/true, out.view);
  if (out.device_id >= 0) out.view.device = {DeviceKind::kCuda, out.device_id};  // the kernels check where it lives
  return out;
}

OutArray to_numpy(HostTensor&& tensor) {
  auto* owned = new HostTensor(std::move(tensor));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<HostTensor*>(p); });
  const TensorView& v = owned->view();
  size_t shape[kMaxDims];
  for (int d = 0; d < v.ndim; ++d) shape[d] = static_cast<size_t>(v.shape[d]);
  nb::dlpack::dtype dt = v.dtype == DType::kF64   ? nb::dtype<double>()
                         : v.dtype == DType::kF32 ? nb::dtype<float>()
                                                  : nb::dlpack::dtype{static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
  return OutArray(v.data, static_cast<size_t>(v.ndim), shape, owner, nullptr, dt);
}

}  // namespace seqpar::py
