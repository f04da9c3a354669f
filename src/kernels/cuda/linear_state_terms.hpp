// Host replays of linear_cuda.hpp's state-term kernels (linear_state_terms.cu): the kernels'
// own per-block code run block after block on host tensors (rows bf16|fp16, states fp32), so
// that tests check the kernels' indexing and decay weights on machines without a GPU.
#pragma once

#include "seqpar/linear_attention.hpp"
#include "seqpar/status.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar {

Status linear_add_state_term_host_replay(const TensorView& q, const TensorView& state_in,
                                         const LinearAttentionParams& params, const TensorView& o);
Status linear_add_dstate_term_host_replay(const TensorView& k, const TensorView& v, const TensorView& dstate_out,
                                          const LinearAttentionParams& params, const TensorView& dk,
                                          const TensorView& dv);

}  // namespace seqpar
