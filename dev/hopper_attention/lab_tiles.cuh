// lab_tiles.cuh: the lab's drivers' way to the visible-tile lists: builds them for a PairMask
// (lab_masks.hpp) with the tiles of a forward variant and of the backward, uploads the blob, and
// gives the kernels' TileMask views (what hopper_backend.cpp does with its cache).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/hopper/hopper_bwd.cuh"
#include "kernels/hopper/hopper_tiles.hpp"
#include "lab_masks.hpp"

namespace lab {

// Query rows and keys per tile of the forward variants in variants.cuh.
inline void fwd_tile(const std::string& variant, int D, int* bm, int* bn) {
  *bm = 128, *bn = 128;
  if (variant == "pp176" || variant.rfind("persist176", 0) == 0) *bn = 176;
  if (variant.rfind("pp192", 0) == 0 || variant.rfind("persist192", 0) == 0) *bn = 192;
  if (variant.rfind("m192", 0) == 0 || variant.rfind("persist_m192", 0) == 0) *bm = 192;
  if (variant == "persist64") *bm = 64, *bn = 64;  // fwd_persist_kernel at kC = 1
  (void)D;
}

struct DeviceTiles {
  void* blob = nullptr;
  seqpar::hopper::TileMask fwd{}, bwd{};
  long long entries[2] = {0, 0}, boundary[2] = {0, 0};  // entries, those with a flag
  double visible = 0;
  void release() {
    if (blob) cudaFree(blob);
    blob = nullptr;
  }
};

// LAB_TILE_ORDER=neighbours|classes|heavy|position picks order_tiles' order (A/B runs); default:
// the library's.
inline seqpar::hopper::TileOrder lab_tile_order() {
  using seqpar::hopper::TileOrder;
  const char* e = std::getenv("LAB_TILE_ORDER");
  const std::string s = e ? e : "";
  return s == "heavy"      ? TileOrder::kHeavyFirst
         : s == "position" ? TileOrder::kPosition
         : s == "classes"  ? TileOrder::kClasses
                           : TileOrder::kNeighbours;
}

// bwd_bm: the backward variant's query rows per tile (variants.cuh, bwd_query_rows); bwd_bn: its
// keys per tile (bwd_key_tile: 64 for short64, hopper_bwd_short.cuh; else 128).
inline DeviceTiles upload_tiles(const PairMask& m, int fwd_bm, int fwd_bn, int bwd_bm = seqpar::hopper::bwd::kBM,
                                int bwd_bn = seqpar::hopper::bwd::kBN) {
  using namespace seqpar::hopper;
  const TilePlan plan = plan_tiles(m, fwd_bm, fwd_bn, bwd_bm, bwd_bn, lab_tile_order());
  const PackedTiles k = pack_tiles(plan, m);
  DeviceTiles d;
  if (cudaMalloc(&d.blob, std::max<size_t>(16, k.blob.size() * 4)) != cudaSuccess ||
      cudaMemcpy(d.blob, k.blob.data(), k.blob.size() * 4, cudaMemcpyHostToDevice) != cudaSuccess) {
    std::fprintf(stderr, "tile list upload failed\n");
    std::exit(2);
  }
  d.fwd = tile_mask_view(k, 0, d.blob);
  d.bwd = tile_mask_view(k, 1, d.blob);
  const SideTiles* sides[2] = {&plan.fwd, &plan.bwd};
  for (int s = 0; s < 2; ++s) {
    d.entries[s] = sides[s]->entry_count();
    for (int32_t e : sides[s]->entries) d.boundary[s] += (e & 3) != 0;
  }
  d.visible = visible_pairs(m);
  return d;
}

// The drivers' one way to a mask: builds mask spec `spec` (lab_masks.hpp's make_mask, over
// Sq x Sk tokens) into *pm and uploads its lists with the tiles of forward variant `fwd_variant`
// at head dim D (and the backward's, of bwd_bm query rows). False, with a message, for a spec
// make_mask does not know.
inline bool mask_tiles(const char* spec, int Sq, int Sk, int offset, uint64_t seed, const std::string& fwd_variant,
                       int D, PairMask* pm, DeviceTiles* tiles, int bwd_bm = seqpar::hopper::bwd::kBM,
                       int bwd_bn = seqpar::hopper::bwd::kBN) {
  if (!make_mask(spec, Sq, Sk, offset, seed, pm)) {
    std::fprintf(stderr, "unknown mask %s\n", spec);
    return false;
  }
  int bm, bn;
  fwd_tile(fwd_variant, D, &bm, &bn);
  *tiles = upload_tiles(*pm, bm, bn, bwd_bm, bwd_bn);
  return true;
}

}  // namespace lab
