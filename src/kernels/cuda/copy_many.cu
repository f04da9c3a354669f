// flash_copy_many (flash_cuda.hpp): many same-dtype copies between device views in one launch.
// The executor's span steps copy a block's rows piece by piece (a documents layout interleaves
// each shard with the others in up to 64 pieces, every part a copy), hundreds of copies a step;
// one launch each made those steps launch-bound (about 1.6 ms for a backward pack's 1,000 copies
// of a few hundred KiB on an H100). Here each copy is a list entry of rows (a view flattened to
// at most one strided level), the blocks are dealt out to the entries by their sizes, and a
// block finds its entry by a binary search over the entries' first blocks.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cuda_check.hpp"
#include "kernels/cuda/flash_cuda.hpp"

namespace seqpar {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kUnitsPerBlock = int64_t(kThreads) * 8;  // each thread about 8 units (128 B at 16 B)
constexpr int kMaxBlocksPerCopy = 1024;

// One copy: `rows` rows of `row_units` units each, at pitches in units; `unit` bytes a unit.
struct CopyRows {
  const char* src;
  char* dst;
  int64_t row_units, rows, src_pitch, dst_pitch;
  int first_block, blocks, unit;
};

// As many entries as fit the 32 KB of kernel parameters CUDA 12.1+ takes on sm_70+.
constexpr int kMaxCopies = 480;
struct CopyList {
  CopyRows c[kMaxCopies];
  int count;
};
static_assert(sizeof(CopyList) < 32000, "the copy list must fit the kernel parameter space");

template <class T>
__device__ void copy_units(const CopyRows& c, int block) {
  const T* src = reinterpret_cast<const T*>(c.src);
  T* dst = reinterpret_cast<T*>(c.dst);
  const int64_t total = c.row_units * c.rows, stride = int64_t(c.blocks) * blockDim.x;
  for (int64_t e = int64_t(block) * blockDim.x + threadIdx.x; e < total; e += stride) {
    int64_t r = 0, x = e;
    if (c.rows > 1) r = e / c.row_units, x = e - r * c.row_units;
    dst[r * c.dst_pitch + x] = src[r * c.src_pitch + x];
  }
}

__global__ void __launch_bounds__(kThreads) copy_many_kernel(const __grid_constant__ CopyList list) {
  // The last entry whose first block is at or before this block (the same for every thread).
  int lo = 0, hi = list.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (list.c[mid].first_block <= int(blockIdx.x)) lo = mid;
    else hi = mid - 1;
  }
  const CopyRows& c = list.c[lo];
  const int block = int(blockIdx.x) - c.first_block;
  switch (c.unit) {
    case 16: copy_units<uint4>(c, block); break;
    case 8: copy_units<uint2>(c, block); break;
    case 4: copy_units<uint32_t>(c, block); break;
    case 2: copy_units<uint16_t>(c, block); break;
    default: copy_units<uint8_t>(c, block); break;
  }
}

// src and dst (one shape) as `rows` rows of `row` elements at element pitches, or false where
// a view needs more than one strided level. Dims contiguous in both views (from the last
// inward) make the row; the rest must each step by the pitch times the rows before them.
bool as_rows(const TensorView& src, const TensorView& dst, int64_t* row, int64_t* rows, int64_t* src_pitch,
             int64_t* dst_pitch) {
  *row = 1, *rows = 1, *src_pitch = 0, *dst_pitch = 0;
  bool in_row = true;
  for (int d = src.ndim - 1; d >= 0; --d) {
    if (src.shape[d] == 1) continue;
    if (in_row && src.strides[d] == *row && dst.strides[d] == *row) {
      *row *= src.shape[d];
      continue;
    }
    if (in_row) {
      in_row = false;
      *src_pitch = src.strides[d], *dst_pitch = dst.strides[d], *rows = src.shape[d];
      continue;
    }
    if (src.strides[d] != *src_pitch * *rows || dst.strides[d] != *dst_pitch * *rows) return false;
    *rows *= src.shape[d];
  }
  return true;
}

// The widest unit of 16, 8, 4, 2, 1 bytes dividing every address and length of the copy.
int unit_of(const CopyRows& c, int64_t row_bytes, int64_t src_pitch_bytes, int64_t dst_pitch_bytes) {
  const uint64_t all = reinterpret_cast<uintptr_t>(c.src) | reinterpret_cast<uintptr_t>(c.dst) |
                       uint64_t(row_bytes) | uint64_t(c.rows > 1 ? src_pitch_bytes | dst_pitch_bytes : 0);
  for (int u : {16, 8, 4, 2})
    if (all % uint64_t(u) == 0) return u;
  return 1;
}

}  // namespace

Status flash_copy_many(std::span<const std::pair<TensorView, TensorView>> pairs, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  CopyList list{};
  int blocks = 0;
  const auto launch = [&]() -> Status {
    if (list.count == 0) return Status::Ok();
    copy_many_kernel<<<unsigned(blocks), kThreads, 0, s>>>(list);
    SP_CUDA_CHECK(cudaGetLastError());
    list.count = 0, blocks = 0;
    return Status::Ok();
  };
  for (const auto& [src, dst] : pairs) {
    SP_CHECK_ARG(src.ndim >= 1 && src.ndim <= 4 && src.same_shape(dst),
                 "copy needs two views of one shape (up to 4 dims); got " + src.shape_string() + " and " +
                     dst.shape_string());
    int64_t row = 0, rows = 0, src_pitch = 0, dst_pitch = 0;
    if (src.dtype != dst.dtype || src.device.kind != DeviceKind::kCuda || dst.device.kind != DeviceKind::kCuda ||
        !as_rows(src, dst, &row, &rows, &src_pitch, &dst_pitch)) {
      SP_RETURN_IF_ERROR(flash_cast(src, dst, stream));  // a cast, or a view of two strided levels
      continue;
    }
    if (src.numel() == 0) continue;
    const int64_t size = int64_t(dtype_size(src.dtype));
    CopyRows c{static_cast<const char*>(src.data), static_cast<char*>(dst.data), 0, rows, 0, 0, 0, 0, 0};
    c.unit = unit_of(c, row * size, src_pitch * size, dst_pitch * size);
    c.row_units = row * size / c.unit;
    c.src_pitch = src_pitch * size / c.unit, c.dst_pitch = dst_pitch * size / c.unit;
    const int64_t units = c.row_units * c.rows;
    c.blocks = int(std::clamp<int64_t>((units + kUnitsPerBlock - 1) / kUnitsPerBlock, 1, kMaxBlocksPerCopy));
    if (list.count == kMaxCopies || int64_t(blocks) + c.blocks > INT32_MAX / 2) SP_RETURN_IF_ERROR(launch());
    c.first_block = blocks;
    blocks += c.blocks;
    list.c[list.count++] = c;
  }
  return launch();
}

}  // namespace seqpar
