// Helpers for the tests: seeded random tensors and error measures against fp64 results.
#pragma once

#include <cstdint>
#include <vector>

#include "seqpar/attention.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar::testing {

// Uniform in [-1, 1) from a fixed seed, in any dtype.
HostTensor random_tensor(DType dtype, const std::vector<int64_t>& shape, uint64_t seed);
// Same values converted to another dtype.
HostTensor cast(const HostTensor& t, DType dtype);
// max |a - b| over all elements (NaN counts as infinite error); -inf == -inf counts as 0.
double max_abs_diff(const HostTensor& a, const HostTensor& b);
// Largest |x| (the scale for relative tolerances).
double max_abs(const HostTensor& t);

}  // namespace seqpar::testing
