// The executor's class, private to the files that define it: one executor runs any plan of
// distributed_attention.hpp on either device, over a BlockMemory (block_memory.hpp: where blocks
// live, how they are copied) and the plan's backend (how pairs are computed). Its members are
// defined in
//   executor.cpp           run, the argument checks, the head-group loop and compute;
//   executor_blocks.cpp    the blocks: their parts and buffers, kept blocks, results, the rank's
//                          own inputs, head parts cut out, packs, and span blocks joined and split;
//   executor_exchange.cpp  the exchanges: post and wait, and which results travel rounded.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "parallel/block_memory.hpp"
#include "parallel/block_views.hpp"
#include "parallel/forward_state.hpp"
#include "seqpar/distributed_attention.hpp"

namespace seqpar::parallel {

// Runs one pass of `plan` on this rank's tensors, their blocks in `memory`.
Status run_pass(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, Pass pass, BlockMemory& memory,
                PassStats* stats, ForwardState* state);

class Executor {
 public:
  Executor(Communicator& comm, const AttentionPlan& plan, const ShardTensors& t, Pass pass, BlockMemory& memory,
           ForwardState* state);
  // Makes the stream wait for exchanges still in flight before their buffers go back.
  ~Executor();

  Status run(PassStats* stats);

 private:
  // A block's parts in wire order: which heads each spans, its dtype and shape (part_shapes).
  struct PartShape {
    DType dtype;
    Heads heads;
    std::vector<int64_t> shape;
  };
  struct Stored {
    std::unique_ptr<MemoryBlock> buffer;  // null where every part is a view of the caller's tensors
    std::vector<TensorView> parts;
  };
  struct Pending {
    std::unique_ptr<PendingExchange> exchange;
    std::vector<std::pair<Transfer, std::unique_ptr<Stored>>> arriving;  // result parts to combine
    std::vector<Block> leaving;                                            // results sent away
    std::vector<std::unique_ptr<Stored>> rounded;                          // accumulators' copies sent home
  };

  // executor.cpp
  Status check_args();
  Status check_tensor(const char* name, const TensorView& t, DType dtype, const std::vector<int64_t>& shape) const;
  Status run_group(int g, PassStats* stats);
  Status compute(const Step& s);
  Status mark(int g, size_t step, const char* what);

  // executor_blocks.cpp: the blocks' parts and buffers
  std::vector<PartShape> part_shapes(const Block& b, int64_t rows, bool rounded = false) const;
  HeadRange heads_of(Heads h, int part) const;
  bool takes_delta() const { return plan_.backend->caps().takes_delta; }
  StatusOr<std::unique_ptr<Stored>> make_block(const Block& b, bool rounded = false, int64_t rows = -1,
                                               const std::vector<bool>* in_buffer = nullptr);
  void release(std::unique_ptr<Stored> st);
  void release_all();
  Status keep(int g);
  void take_kept(int g);
  // executor_blocks.cpp: the results
  bool held_rounded(const Block& b) const;
  bool in_callers(const Block& b) const;
  StatusOr<Stored*> result(const Block& b, bool* fresh);
  StatusOr<Stored*> cleared_result(const Block& b);
  Status clear(const Block& b, const Stored& r);
  // executor_blocks.cpp: the inputs, packs, and head parts and span blocks joined and split
  Status make_home(const Block& b, const std::vector<TensorView>& slices, int computed_part = -1);
  StatusOr<Stored*> input(const Block& b);
  Status pack(const Step& s);
  StatusOr<Stored*> held_result(const Block& b);
  Status join_parts(const Block& whole);
  Status regroup(const Step& s);
  std::vector<TensorView> span_piece_views(const Stored& st, const Block& piece, const Block& span, bool in_span);

  // executor_exchange.cpp
  bool rounds_home(const Block& b, int to) const;
  bool adoptable(const Block& b) const;
  Status post(const Step& s);
  Status wait(const Step& s);

  Communicator& comm_;
  const AttentionPlan& plan_;
  const ShardTensors& t_;
  Pass pass_;
  const std::vector<Step>& steps_;
  BlockMemory& mem_;
  int me_;
  int64_t B_ = 0, H_ = 0, Hkv_ = 0, D_ = 0, Hg_ = 0, Hkg_ = 0;
  DType dtype_ = DType::kF32;  // the inputs'
  DType acc_ = DType::kF32;    // the accumulators' (fp32 on devices, the inputs' on the host)
  DType stats_ = DType::kF32;  // LSE's and D's
  std::map<Block, std::unique_ptr<Stored>> store_;
  std::map<int, Pending> pending_;
  std::map<Block, size_t> last_use_;
  SpanPositions positions_{plan_.layout};
  ForwardState* state_;
  std::map<Block, std::shared_ptr<Stored>> kept_;  // the backward's blocks kept by the forward
  std::set<Block> rounded_;                        // results held in the inputs' dtype
  std::set<Block> joined_home_;                    // own results join_parts put in the caller's tensors
  std::set<Block> joined_on_arrival_;              // pieces received straight into their span block
  std::map<BlockKind, std::vector<TensorView>> home_;  // the caller's tensors for the group's own results
};

}  // namespace seqpar::parallel
