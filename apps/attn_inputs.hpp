// `seqpar attn`'s inputs: q, k, v and dO drawn uniform in [-1, 1) as a pure function of (seed,
// tensor, global index), so every rank makes its own rows and the checker remakes the whole
// tensors (or any rows of them) without communication.
#pragma once

#include <cstdint>
#include <vector>

#include "attn_options.hpp"
#include "seqpar/layout.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar::app {

enum TensorId : uint64_t { kQ = 1, kK, kV, kDout };

// A [B, n, heads, D] tensor of `id` in the job's dtype; local row i is global row
// positions[i] (every row when null).
HostTensor make_input(const Job& job, TensorId id, int64_t heads, const std::vector<int64_t>* positions);

// This rank's rows of q, k, v and dO (all rows on a one-rank layout).
struct Inputs {
  HostTensor q, k, v, dout;
};
Inputs local_inputs(const Job& job, const Layout& layout, int rank);

}  // namespace seqpar::app
