// One rank's state for attention over its local shard (seqpar.torch with a process group or
// thread ranks), kept between calls: its communicator (the torch.distributed transport, NCCL,
// or a thread rank's local one), a Session per algorithm spec (include/seqpar/session.hpp: the
// backend choice, the plans cached by problem, the GPU workspace), the masks parsed from text,
// and for thread ranks on a GPU a stream of its own.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "seqpar/session.hpp"

namespace seqpar::py {

// Local shapes (S = this rank's tokens under the layout):
//   q, o, dout, dq: [B, S, H, D]   k, v, dk, dv: [B, S, H_kv, D]   lse: [B, H, S]
// Host: float32/float64, lse in q's dtype. CUDA: bfloat16/float16, lse float32. One device.
struct ShardCall {
  ArrayView q, k, v, o, lse;  // o and lse: written by the forward, read by the backward
  ArrayView dout, dq, dk, dv; // backward only
  bool backward = false;
  int64_t window_left = -1, window_right = -1;
  std::vector<int64_t> doc_offsets;  // documents: global start offsets and the total (cu_seqlens)
  std::string mask;                  // a mask in parse_mask's text, instead of the window
  double scale = 0.0;  // 0: 1/sqrt(D)
  std::string algo = "auto", layout = "zigzag";
  int64_t seq_len = 0;  // the global length; 0: the local length times the ranks
};

// ValueError / TypeError with the reason unless `call` is rank `rank` of `ranks`'s part of one
// problem seqpar can run; fills in seq_len when it is 0.
void check_shard_call(ShardCall& call, int rank, int ranks);

class RankContext {
 public:
  // own_stream: thread ranks sharing a GPU each queue on a stream of their own, ordered after
  // (and before) the caller's stream; other ranks queue on the caller's stream itself.
  RankContext(std::unique_ptr<Communicator> comm, bool own_stream);
  ~RankContext();
  RankContext(const RankContext&) = delete;
  RankContext& operator=(const RankContext&) = delete;

  // Runs the forward or backward of a checked call. `stream` is the caller's CUDA stream
  // (device tensors; the work is queued on it, or ordered before it) and is ignored on the host.
  // `algo_run` (may be null) receives the algorithm the plan chose.
  Status run(const ShardCall& call, void* stream, std::string* algo_run);

  Communicator& comm() { return *comm_; }

 private:
  StatusOr<AttentionParams> params_for(const ShardCall& call);
  StatusOr<Session*> session_for(const std::string& algo);

  std::unique_ptr<Communicator> comm_;
  bool own_stream_;
  int device_ = -1;  // the GPU this rank's device state lives on, once it has any
  void* stream_ = nullptr;
  std::map<std::string, std::unique_ptr<Session>> sessions_;  // by algorithm spec
  std::map<std::string, MaskSpec> masks_;                     // parsed, by text and length
};

// Runs calls[r] on contexts[r] in one thread per rank (thread ranks over local communicators)
// and returns the root cause of a failure; a failing rank aborts the others' communicator.
Status run_thread_ranks(const std::vector<RankContext*>& contexts, const std::vector<ShardCall>& calls, void* stream,
                        std::string* algo_run);

}  // namespace seqpar::py
