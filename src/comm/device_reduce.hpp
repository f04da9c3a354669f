// The reduction step of the device ring collectives (reduce-scatter, all-reduce) on backends
// without native device collectives: acc = op(acc, in) elementwise on the GPU.
#pragma once

#include <cstddef>

#include "seqpar/comm.hpp"
#include "seqpar/dtype.hpp"
#include "seqpar/status.hpp"

namespace seqpar {

// acc: [count] dtype, in: [count] dtype, both device memory; queued on `stream` (a
// cudaStream_t, nullptr the default stream). bf16 and f16 reduce through float and round to
// nearest even, as the host ring does. kUnsupported in builds without CUDA.
[[nodiscard]] Status device_reduce_into(void* acc, const void* in, size_t count, DType dtype,
                                        ReduceOp op, void* stream);

}  // namespace seqpar
