// order_lab.cuh: the D = 64 forward's variants of the unit-order / tile-size round (README
// section "D = 64 forward: unit order and tile shape"), dispatched before variants.cuh's names by
// hopper_fwd_test.cu and hopper_fwd_lib.cu. All are the library's persistent kernel
// (hopper_fwd_persist.cuh) with kUniform, as the backend runs it:
//   persist_m192g   3 consumers, 192 query rows, 128 keys (persist_m192u) with kOrder 1: the
//                   query heads of one K/V head in step (heaviest tile first, heads fastest)
//   persist_m192c   the same with kOrder 2: chunks of 4 query heads in step (at H = H_kv too)
//   persist_n192u   2 consumers, 128 query rows, 192-key tiles (pp192's shape at D = 64)
//   persist_n192g   the same with kOrder 1
// and, at D = 128 (session w, not yet run: README next steps 000 (d)), the backend's persistent
// kernel below 8K keys (persist192u) with its units in step:
//   persist192c     kOrder 2: chunks of 4 query heads (H = H_kv), whole GQA groups otherwise
#pragma once
#include <string>

#include "cluster_lab.cuh"  // cluster_m192, cluster192: 2-CTA clusters with K/V multicast
#include "kernels/hopper/hopper_fwd_persist.cuh"
#include "variants.cuh"

namespace hopper_attn {
// Whether `v` is one of this file's names; then *e is its launch's result.
inline bool order_dispatch(const std::string& v, const seqpar::hopper::FwdArgs& a, cudaStream_t st, int grid_cap,
                           cudaError_t* e) {
  using namespace seqpar::hopper;
  if (a.head_dim == 128 && v == "persist192c") {
    *e = launch_fwd_persist<128, 192, 2, true, true, 2>(a, st, true, grid_cap);
    return true;
  }
  if (a.head_dim != 64) return false;
  if (v == "persist_m192g") *e = launch_fwd_persist<64, 128, 3, true, true, 1>(a, st, true, grid_cap);
  else if (v == "persist_m192c") *e = launch_fwd_persist<64, 128, 3, true, true, 2>(a, st, true, grid_cap);
  else if (v == "persist_n192u") *e = launch_fwd_persist<64, 192, 2, true, true, 0>(a, st, true, grid_cap);
  else if (v == "persist_n192g") *e = launch_fwd_persist<64, 192, 2, true, true, 1>(a, st, true, grid_cap);
  else return false;
  return true;
}
// This file's names, cluster_lab.cuh's, then variants.cuh's (the persistent ones under g_grid_cap).
inline cudaError_t lab_dispatch(const std::string& v, const seqpar::hopper::FwdArgs& a, cudaStream_t st) {
  cudaError_t e = cudaSuccess;
  if (order_dispatch(v, a, st, g_grid_cap, &e)) return e;
  if (cluster_lab::cluster_dispatch(v, a, st, g_grid_cap, &e)) return e;
  return dispatch(v, a, st);
}
}  // namespace hopper_attn
