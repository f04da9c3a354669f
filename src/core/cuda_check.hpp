// CUDA error checking: every runtime call goes through SP_CUDA_CHECK, which turns a failure
// into a Status with the call, the error name and file:line.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "seqpar/status.hpp"

#define SP_CUDA_CHECK(expr)                                                          \
  do {                                                                               \
    const cudaError_t sp_cuda_err_ = (expr);                                         \
    if (sp_cuda_err_ != cudaSuccess)                                                 \
      return SP_STATUS(::seqpar::StatusCode::kInternal,                              \
                       std::string(#expr) + " failed: " + cudaGetErrorName(sp_cuda_err_) + \
                           " (" + cudaGetErrorString(sp_cuda_err_) + ")");           \
  } while (0)
