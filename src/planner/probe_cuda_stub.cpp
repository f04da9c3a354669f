// `seqpar probe`'s GPU half for builds without CUDA (probe_cuda.cu is left out): a clear refusal.
#ifndef SEQPAR_HAVE_CUDA
#include "planner/probe.hpp"

namespace seqpar::planner {

StatusOr<ProbeMeasurements> measure_cuda(const ProbeOptions&, const ProbeLog&) {
  return SP_STATUS(StatusCode::kUnsupported, "seqpar was built without CUDA: probe with --device cpu");
}

}  // namespace seqpar::planner
#endif
