// The Hopper backend's factory (hopper_backend.cpp): our sm_90a kernels (hopper_fwd.cuh,
// hopper_bwd.cuh) as a local-attention backend named "hopper". Compiled only where the build
// has CUDA and sm_90a code (SEQPAR_HAVE_HOPPER); make_hopper_backend() in backend.hpp is the
// public way to it.
#pragma once

#include <memory>

#include "seqpar/backend.hpp"

namespace seqpar::hopper {

std::unique_ptr<AttentionBackend> make_backend();

}  // namespace seqpar::hopper
