// cluster_lab.cuh: the lab's names for the persistent forward in 2-CTA clusters with K/V by TMA
// multicast (the library's src/kernels/hopper/hopper_fwd_cluster.cuh since call 4; README section
// "Persistent forward in 2-CTA clusters: K/V by TMA multicast"):
//   cluster_m192    persist_m192u (D = 64, 3 consumers, 192 query rows, 128 keys, 2 K/V stages)
//                   in clusters; cluster_m192s3 / s4: 3 / 4 K/V stages (not routed: 0.99-1.01x)
//   cluster192      persist192u (D = 128, 2 consumers, 128 rows, 192 keys) in clusters (3 stages
//                   of 192 keys do not fit); the backend's forward at D = 128 dense, 8K/16K-64K keys
#pragma once
#include <string>

#include "kernels/hopper/hopper_fwd_cluster.cuh"

namespace cluster_lab {
using seqpar::hopper::FwdArgs;
using seqpar::hopper::launch_fwd_cluster;

inline bool cluster_dispatch(const std::string& v, const FwdArgs& a, cudaStream_t st, int grid_cap, cudaError_t* e) {
  if (v == "cluster_m192" && a.head_dim == 64) *e = launch_fwd_cluster<64, 128, 3>(a, st, grid_cap);
  else if (v == "cluster_m192s3" && a.head_dim == 64) *e = launch_fwd_cluster<64, 128, 3, 3>(a, st, grid_cap);
  else if (v == "cluster_m192s4" && a.head_dim == 64) *e = launch_fwd_cluster<64, 128, 3, 4>(a, st, grid_cap);
  else if (v == "cluster192" && a.head_dim == 128) *e = launch_fwd_cluster<128, 192, 2>(a, st, grid_cap);
  // Session w: the pairs of 4, 8 or all 32 query heads in step (FwdParams::head_chunk).
  else if (v == "cluster192c4" && a.head_dim == 128) *e = launch_fwd_cluster<128, 192, 2>(a, st, grid_cap, 4);
  else if (v == "cluster192c8" && a.head_dim == 128) *e = launch_fwd_cluster<128, 192, 2>(a, st, grid_cap, 8);
  else if (v == "cluster192c32" && a.head_dim == 128) *e = launch_fwd_cluster<128, 192, 2>(a, st, grid_cap, 32);
  else return false;
  return true;
}
}  // namespace cluster_lab
