// Writes host tensors as NumPy .npy files (format version 1.0), so anyone can check the
// numbers with their own tools.
#pragma once

#include <string>

#include "seqpar/status.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar::app {

// Writes a contiguous host tensor; fp64/fp32/fp16 map to <f8/<f4/<f2, bf16 is widened to <f4.
Status write_npy(const std::string& path, const HostTensor& tensor);

}  // namespace seqpar::app
