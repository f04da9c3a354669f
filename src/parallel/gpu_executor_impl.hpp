// The GPU executor's class, private to the three files that define it (the executor itself is
// described at the top of gpu_executor.cpp): its members, the blocks as it stores them, the
// exchanges in flight, and the helpers the files share. Its members are defined in
//   gpu_executor.cpp     the constructor and destructor, run, check_args, run_group, compute;
//   gpu_block_store.cpp  the blocks: their parts, buffers, kept blocks, results, the rank's own
//                        inputs, head parts cut out, packs, and span blocks joined and split;
//   gpu_exchange.cpp     the exchanges: post and wait, and which results travel rounded.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "parallel/block_views.hpp"
#include "parallel/forward_state.hpp"
#include "parallel/gpu_workspace.hpp"
#include "seqpar/gpu.hpp"
#include "seqpar/gpu_executor.hpp"

namespace seqpar::parallel_gpu {

inline size_t view_bytes(const TensorView& t) { return t.numel() * dtype_size(t.dtype); }
// Parts start 256-byte aligned inside a block's buffer (kernels and NCCL like aligned rows).
inline size_t padded(size_t bytes) { return (bytes + 255) / 256 * 256; }
// Whether a slice of the caller's tensors can be sent and computed on as it is.
inline bool usable_as_is(const TensorView& t) { return t.is_contiguous() && reinterpret_cast<uintptr_t>(t.data) % 16 == 0; }

inline Status check_device(const char* name, const TensorView& t, DType dtype, const std::vector<int64_t>& shape) {
  bool ok = t.device.kind == DeviceKind::kCuda && t.dtype == dtype && t.ndim == int(shape.size()) &&
            t.strides[t.ndim - 1] == 1;
  for (int i = 0; ok && i < t.ndim; ++i) ok = t.shape[i] == shape[i];
  SP_CHECK_ARG(ok, std::string(name) + " must be a device " + dtype_name(dtype) + " tensor of shape " +
                       TensorView::contiguous(nullptr, dtype, shape).shape_string() +
                       " (contiguous last dim) as the layout asks; got " + t.shape_string() + " " +
                       dtype_name(t.dtype));
  return Status::Ok();
}

class GpuExecutor {
 public:
  GpuExecutor(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, Pass pass,
              GpuWorkspace::Impl& ws, cudaStream_t s, ForwardState* state);
  // Makes the stream wait for exchanges still in flight before their buffers go back.
  ~GpuExecutor();

  Status run(PassStats* stats);

 private:
  // A block's parts in wire order: which heads each spans, its dtype and shape (part_shapes).
  using Heads = parallel::Heads;
  struct PartShape {
    DType dtype;
    Heads heads;
    std::vector<int64_t> shape;
  };
  struct Stored {
    StreamBuffer buffer;  // empty where every part is a view of the caller's tensors
    std::vector<TensorView> parts;
  };
  struct Pending {
    std::unique_ptr<PendingExchange> exchange;
    std::vector<std::pair<Transfer, std::unique_ptr<Stored>>> arriving;  // result parts to combine
    std::vector<Block> leaving;                                            // results sent away
    std::vector<std::unique_ptr<Stored>> rounded;                          // fp32 ones' copies sent home
  };

  // gpu_executor.cpp
  Status check_args();
  Status run_group(int g, PassStats* stats);
  Status compute(const Step& s);

  // gpu_block_store.cpp: the blocks' parts and buffers
  std::vector<PartShape> part_shapes(const Block& b, int64_t rows, bool rounded = false) const;
  HeadRange heads_of(Heads h, int part) const;
  bool takes_delta() const { return plan_.backend->caps().takes_delta; }
  StatusOr<std::unique_ptr<Stored>> make_block(const Block& b, bool rounded = false, int64_t rows = -1);
  void release(std::unique_ptr<Stored> st);
  void release_all();
  Status keep(int g);
  void take_kept(int g);
  // gpu_block_store.cpp: the results
  bool held_rounded(const Block& b) const;
  bool in_callers(const Block& b) const;
  StatusOr<Stored*> result(const Block& b, bool* fresh);
  StatusOr<Stored*> cleared_result(const Block& b);
  Status clear(const Block& b, const Stored& r);
  // gpu_block_store.cpp: the inputs, packs, and head parts and span blocks joined and split
  Status make_home(const Block& b, const std::vector<TensorView>& slices, int computed_part = -1);
  StatusOr<Stored*> input(const Block& b);
  Status pack(const Step& s);
  StatusOr<Stored*> held_result(const Block& b);
  Status join_parts(const Block& whole);
  Status regroup(const Step& s);

  // gpu_exchange.cpp
  bool rounds_home(const Block& b, int to) const;
  bool adoptable(const Block& b) const;
  Status post(const Step& s);
  Status wait(const Step& s);

  Communicator& comm_;
  const AttentionPlan& plan_;
  const ShardTensors& t_;
  Pass pass_;
  const std::vector<Step>& steps_;
  GpuWorkspace::Impl& ws_;
  cudaStream_t s_;
  int me_;
  int64_t B_ = 0, H_ = 0, Hkv_ = 0, D_ = 0, Hg_ = 0, Hkg_ = 0;
  DType dtype_ = DType::kBF16;
  std::map<Block, std::unique_ptr<Stored>> store_;
  std::map<int, Pending> pending_;
  std::map<Block, size_t> last_use_;
  parallel::SpanPositions positions_{plan_.layout};
  ForwardState* state_;
  std::map<Block, std::shared_ptr<Stored>> kept_;  // the backward's blocks kept by the forward
  std::set<Block> rounded_;                        // results held in the inputs' dtype
  std::map<BlockKind, std::vector<TensorView>> home_;  // the caller's tensors for the group's own results
};

}  // namespace seqpar::parallel_gpu
