// device_reduce_into for builds without CUDA: no device buffers exist there, so a call is a bug.
#ifndef SEQPAR_HAVE_CUDA
#include "comm/device_reduce.hpp"

namespace seqpar {

Status device_reduce_into(void*, const void*, size_t, DType, ReduceOp, void*) {
  return SP_STATUS(StatusCode::kUnsupported, "seqpar was built without CUDA: no device reductions");
}

}  // namespace seqpar
#endif
