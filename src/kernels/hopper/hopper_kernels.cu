// The Hopper kernels' one translation unit: the variants the backend runs, instantiated once
// (forward: 192-key tiles with two consumer warpgroups at D = 128, "pp192", and its persistent
// form "persist192", and that in 2-CTA clusters with K/V by multicast, "cluster192", and on tile
// lists of 64 x 64 tiles with one consumer warpgroup, two CTAs per SM, "persist64"; three
// consumer warpgroups of 64 rows at D = 64, persistent, "persist_m192";
// backward: "q80", 80-row query tiles, at D = 128 on dense masks and on tile lists of 80-row
// tiles, "base" at D = 128 on lists of 128 x 64 tiles, "short64" at D = 128 on lists of 64 x 64
// tiles (one consumer warpgroup, two CTAs per SM), "q128", 128-row query tiles, at D = 64),
// behind the plain host
// interface of hopper_args.hpp, and the device check
// (compute capability 9.0, sm_90a code in this build).
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>

#include "kernels/hopper/hopper_args.hpp"
#include "kernels/hopper/hopper_bwd_launch.cuh"
#include "kernels/hopper/hopper_bwd_short.cuh"
#include "kernels/hopper/hopper_fwd.cuh"
#include "kernels/hopper/hopper_fwd_cluster.cuh"
#include "kernels/hopper/hopper_fwd_persist.cuh"

namespace seqpar::hopper {
namespace {
constexpr auto kFwd128 = launch_fwd<128, 192, 2, true, true, 2>;
// The persistent forms (hopper_fwd_persist.cuh; they launch fwd_kernel where O is fp32 or its
// strides do not suit a TMA store), with kUniform: wgmma descriptors in uniform registers
// (dev/hopper_attention/README.md, "Uniform descriptors", one H200: 0.99-1.03x the plain
// persistent kernel, median 1.01x at D = 128 and 1.02x at D = 64; fwd_kernel with kUniform was
// 0.97-1.02x the plain one, slower at 32K-64K dense full, so kFwd128 and the fallbacks keep it).
constexpr auto kFwdPersist128 = launch_fwd_persist<128, 192, 2, true, true>;
constexpr auto kFwdPersist64 = launch_fwd_persist<64, 128, 3, true, true>;
// At D = 64 under the causal mask up to 16K keys: kOrder 2, chunks of 4 query heads (a GQA group of
// 4) in step, heaviest tile first, so the grid's last units are light tiles (dev/hopper_attention/
// README.md, "D = 64 forward: unit order and tile shape", one H200, two calls: causal 8K 1.05-1.06x
// the plain order, 16K 1.01-1.03x, 32K 1.00x; dense full 8K 32:32 0.97x, so full keeps the plain one).
constexpr auto kFwdPersist64Chunks = launch_fwd_persist<64, 128, 3, true, true, 2>;
// Tile lists (masks) keep the plain persistent kernel: kUniform was timed on the full and causal
// paths only.
constexpr auto kFwdPersistLists128 = launch_fwd_persist<128, 192, 2>;
constexpr auto kFwdPersistLists64 = launch_fwd_persist<64, 128, 3>;
// Dense masks at D = 128 from 8K keys to 64K (full) or 128K (causal): persist192u in clusters of
// 2 CTAs that multicast K/V (hopper_fwd_cluster.cuh; O that the TMA store cannot write goes to
// kFwdPersist128's kernel).
constexpr auto kFwdCluster128 = launch_fwd_cluster<128, 192, 2>;
// Tile lists of 64 x 64 tiles at D = 128 (plan_tiles chose them where short_tiles_pay says so):
// the persistent kernel with one consumer, two CTAs per SM ("persist64").
constexpr auto kFwdShortLists128 = launch_fwd_persist<128, 64, 1>;
}  // namespace

bool forward_writes_o(const FwdArgs& a) {
  if (forward_kernel(a) != FwdKernel::kShortLists) return true;
  const RowStrides ost = row_strides(a.o_st, a.seq_q, a.heads, a.head_dim);
  return !a.o_f32 && (reinterpret_cast<uintptr_t>(a.o) & 15) == 0 && (ost.b | ost.s | ost.h) % 8 == 0;
}

int forward(const FwdArgs& a, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  // The kernel per case: forward_kernel (hopper_args.hpp), where the measurements are cited.
  const FwdKernel k = forward_kernel(a);
  if (a.head_dim == 128) {
    switch (k) {
      case FwdKernel::kPersistLists: return kFwdPersistLists128(a, s, true, 0);
      case FwdKernel::kShortLists: return kFwdShortLists128(a, s, true, 0);
      case FwdKernel::kCluster: return kFwdCluster128(a, s, 0, -1);  // -1: forward_head_chunk's rule
      case FwdKernel::kPingPong192: return kFwd128(a, s);
      case FwdKernel::kPersist: return kFwdPersist128(a, s, true, 0);
      case FwdKernel::kPersistHeadChunks: break;
    }
    return cudaErrorInvalidValue;
  }
  if (a.head_dim == 64) {
    switch (k) {
      case FwdKernel::kPersistLists: return kFwdPersistLists64(a, s, true, 0);
      case FwdKernel::kPersistHeadChunks: return kFwdPersist64Chunks(a, s, true, 0);
      case FwdKernel::kPersist: return kFwdPersist64(a, s, true, 0);
      case FwdKernel::kShortLists:
      case FwdKernel::kCluster:
      case FwdKernel::kPingPong192: break;
    }
    return cudaErrorInvalidValue;
  }
  return cudaErrorInvalidValue;
}

int backward(const BwdArgs& a, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  // The kernel per case: backward_kernel (hopper_args.hpp), where the measurements are cited.
  switch (backward_kernel(a)) {
    case BwdKernel::kQ80: return launch_bwd_q80(a, s);
    case BwdKernel::kBase: return launch_bwd<128, false>(a, s);
    case BwdKernel::kShort64: return launch_bwd_short<true>(a, s);  // lists only: the dense kernel is the lab's
    case BwdKernel::kQ128: return launch_bwd<64, false, kPrologueBest, 128>(a, s);
    case BwdKernel::kNone: break;
  }
  return cudaErrorInvalidValue;
}

// tile_shape (hopper_args.hpp) against the kernels above. Forward: pp192 (128 query rows, 192
// keys) or persist64 (64 x 64) at D = 128, m192 (192 rows, 128 keys) at D = 64; backward: 64
// query rows (base) or 80 (q80) at D = 128, 128 at D = 64, 128 keys; or 64 x 64 (short64) at
// D = 128. forward_kernel tells persist64's lists by their 64-row query tiles, backward_kernel
// short64's by their 64-key tiles.
static_assert(tile_shape(128).fwd_bm == Cfg<2>::kBM && tile_shape(128).fwd_bn == 192 &&
              tile_shape(128).bwd_bm == bwd::kBM && tile_shape(128).bwd_bm_tall == bwd::kQ80 &&
              tile_shape(128).bwd_bn == bwd::kBN && tile_shape(128).fwd_short_bm == Cfg<1>::kBM &&
              tile_shape(128).fwd_short_bm == 64 && tile_shape(128).fwd_short_bn == 64 &&
              tile_shape(128).bwd_short_bn == bwds::kBN && tile_shape(128).bwd_bm == bwds::kBM);
static_assert(tile_shape(64).fwd_bm == Cfg<3>::kBM && tile_shape(64).fwd_bn == 128 && tile_shape(64).bwd_bm == 128 &&
              tile_shape(64).bwd_bm_tall == 0 && tile_shape(64).bwd_bn == bwd::kBN && tile_shape(64).fwd_short_bm == 0 &&
              tile_shape(64).bwd_short_bn == 0);

size_t backward_workspace_bytes(int batch, int heads, int seq_q, int head_dim) {
  // At D = 128 sized for the 80-row kernel, which also covers the 64-row one (tile lists).
  return bwd_workspace_bytes(batch, heads, seq_q, head_dim, head_dim == 128 ? bwd::kQ80 : bwd::kBM);
}

const char* device_refusal(int device) {
  static std::mutex mu;
  static std::map<int, std::string> known;
  const std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(device);
  if (it == known.end()) {
    std::string why;
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
      why = "the Hopper kernels could not query GPU " + std::to_string(device);
    } else if (major != 9 || minor != 0) {
      why = "the Hopper kernels run on sm_90 (H100/H200) only; GPU " + std::to_string(device) + " is sm_" +
            std::to_string(major) + std::to_string(minor);
    } else {
      // The SASS this device would run must be sm_90a's (the other passes hold a trap).
      int current = 0;
      cudaFuncAttributes attr{};
      if (cudaGetDevice(&current) != cudaSuccess || cudaSetDevice(device) != cudaSuccess ||
          cudaFuncGetAttributes(&attr, fwd_kernel<128, 192, 2, true, true, 2>) != cudaSuccess ||
          cudaSetDevice(current) != cudaSuccess)
        why = "the Hopper kernels could not be loaded on GPU " + std::to_string(device);
      else if (attr.binaryVersion != 90)
        why = "this build has no sm_90a code for the Hopper kernels (binary version " +
              std::to_string(attr.binaryVersion) + ")";
      else if (!tensor_map_encoder())
        why = "the CUDA driver has no cuTensorMapEncodeTiled (the Hopper kernels need TMA)";
    }
    (void)cudaGetLastError();  // a failed query leaves no sticky error for the caller
    it = known.emplace(device, std::move(why)).first;
  }
  return it->second.c_str();
}

const char* error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // namespace seqpar::hopper
