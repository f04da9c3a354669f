// LASP: causal linear attention (seqpar/linear_attention.hpp) over a sequence split contiguously
// across the ranks of a communicator; only d_k x d_v states per head cross ranks, so the bytes
// do not depend on the sequence length. Two ways to pass them:
//   lasp   (LASP-1, Sun et al. 2404.02882, Algorithms 2-3 as corrected in the team's report)
//          a chain: the state goes rank t -> t+1 in the forward, dState t+1 -> t in the
//          backward; T-1 messages of one state per pass per group.
//   lasp2  (LASP-2 style) each rank's own state contribution from a zero state, one all_gather
//          of the T contributions, a local decayed prefix (suffix in the backward).
// And the baseline the LASP paper compares them with (not LASP; src/parallel/linear_ulysses.hpp):
//   ulysses  an all-to-all turns each rank's rows of q, k, v into the whole sequence for H/T of
//          the heads, the single-rank kernel runs it, a second all-to-all sends o home (the
//          backward: q, k, v again with dO over, dq, dk, dv back, so that a layer keeps no more
//          than LASP's states between its passes). T must divide the heads (and the K/V heads);
//          the bytes grow with the sequence, as those of softmax Ulysses.
// One pass order for both (src/parallel/lasp_steps.hpp): each rank first computes its own
// contribution from a zero state (the cheap half of its pass) so the neighbour waits on that
// alone, then its full pass from the entering state.
//
// One implementation for both devices, through a linear-attention backend table chosen by the
// tensors' device: host tensors (fp32/fp64, states in the inputs' dtype) on the CPU kernels;
// CUDA tensors (bf16/fp16, fp32 states) on our CUDA kernels, over a communicator that moves
// device buffers (NCCL, or thread ranks sharing a GPU). States live on the tensors' device.
// Device work is queued on `stream` (a cudaStream_t; nullptr the default stream) and returns
// queued there; host-driven communicators get the stream synchronised before a batch is posted.
//
// Shapes are those of linear_attention.hpp with S = this rank's local length
// (layout.local_len(rank)): q, o, dout, dq [B, S_local, H, d_k | d_v]; k, dk [B, S_local, H_kv,
// d_k]; v, dv [B, S_local, H_kv, d_v]; states [B, H, d_k, d_v].
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "seqpar/comm.hpp"
#include "seqpar/layout.hpp"
#include "seqpar/linear_attention.hpp"

namespace seqpar {

enum class LaspAlgorithm : uint8_t { kChain, kAllGather, kAuto, kUlysses };

const char* lasp_algorithm_name(LaspAlgorithm algorithm);  // "lasp", "lasp2", "auto", "ulysses"
StatusOr<LaspAlgorithm> parse_lasp_algorithm(const std::string& name);

// --algo auto: a latency/bandwidth model of one pass's state traffic on the critical path.
// chain: T-1 dependent hops of (latency + state / bandwidth). all_gather: the Communicator's
// collectives are rings of T-1 dependent steps of one block each, so the same time, with T-1
// times the bytes per rank. Under this model the chain is never slower, and auto picks it
// (ties go to fewer bytes); a log-depth all-gather would change the time term, not the bytes.
// auto never picks ulysses: the baseline runs when asked for.
struct LaspLinkModel {
  double latency_s = 10e-6;
  double bytes_per_s = 10e9;
};
double lasp_chain_seconds(int ranks, int64_t state_bytes, const LaspLinkModel& link);
double lasp_allgather_seconds(int ranks, int64_t state_bytes, const LaspLinkModel& link);
LaspAlgorithm choose_lasp_algorithm(int ranks, int64_t state_bytes, const LaspLinkModel& link = {});

// Bytes of one message: a state of every (batch, query head) in the states' dtype.
int64_t lasp_state_bytes(int64_t batch, int64_t heads, int64_t dk, int64_t dv, DType dtype);
// Bytes rank `rank` of `ranks` sends per pass (kChain or kAllGather; ulysses's bytes are those
// of its all-to-alls, linear_ulysses.hpp): the paper's formula.
struct LaspTraffic {
  int64_t forward = 0, backward = 0;
};
LaspTraffic lasp_expected_bytes(LaspAlgorithm algorithm, int ranks, int rank, int64_t state_bytes);
// The same, walked from the steps the passes run (tests hold the two and the counters equal).
LaspTraffic lasp_walked_bytes(LaspAlgorithm algorithm, int ranks, int rank, int64_t state_bytes);

// The backend, the states and the scratch of one rank's passes (defined in src/parallel/lasp.cpp).
struct LaspBuffers;

// What the forward keeps for the backward: the state entering this rank's tokens (received, or
// prefixed from the gathered ones, once; the backward neither receives nor recomputes it), and
// the buffers both passes reuse (ulysses: the states entering its part's pieces; its all-to-alls'
// buffers are each pass's scratch, which the layers share). One per rank and layer; move-only.
struct LaspContext {
  LaspContext();
  ~LaspContext();
  LaspContext(LaspContext&&) noexcept;
  LaspContext& operator=(LaspContext&&) noexcept;

  LaspAlgorithm algorithm = LaspAlgorithm::kChain;  // what runs (never kAuto)
  std::unique_ptr<LaspBuffers> buffers;             // null until reserved (or forwarded)

  // Whether it holds a forward's result for the backward (a checkpointing recompute reuses it).
  bool forwarded() const;
  // [B, H, d_k, d_v] views on the tensors' device (empty before a forward, and under ulysses,
  // where no state enters a rank's tokens): the state entering this rank's tokens (zero on rank
  // 0), and leaving them (the last rank's is the final state).
  TensorView state_in() const;
  TensorView state_out() const;
  // Bytes of one state message (lasp_state_bytes in the states' dtype); 0 before reserving.
  int64_t state_bytes() const;
};

// The leaving state copied into a host tensor (after the stream's work is done).
StatusOr<HostTensor> lasp_state_out_on_host(const LaspContext& ctx);

// Checks the inputs, picks the backend of their device and sizes every buffer of *ctx for this
// problem on `ranks` ranks with this algorithm (kAuto: choose_lasp_algorithm's pick; either way
// ctx->algorithm says which); ulysses also takes a pass's scratch on `stream` once and gives it
// back (a device stream's arena keeps the memory for the passes on that stream). The forward
// does it too; a caller that must know whether the problem fits before any rank communicates (a
// benchmark at the edge of memory) calls it first.
Status lasp_reserve(LaspContext* ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                    const LinearAttentionParams& params, int ranks, LaspAlgorithm algorithm,
                    void* stream = nullptr);

// Forward on this rank: writes o [B, S_local, H, d_v] and fills *ctx. The layout must be
// contiguous over comm.size() ranks; the sequence starts from a zero state.
Status lasp_forward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                    LaspAlgorithm algorithm, const TensorView& q, const TensorView& k,
                    const TensorView& v, const TensorView& o, LaspContext* ctx, void* stream = nullptr);

// Backward on this rank (the algorithm of ctx): writes dq, dk, dv; no gradient arrives for the
// final state.
Status lasp_backward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                     LaspContext* ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& dout, const TensorView& dq, const TensorView& dk,
                     const TensorView& dv, void* stream = nullptr);

// Data-sequence hybrid (Algorithm 1): a world of W = T x G ranks as G sequence groups of T
// consecutive ranks (group = rank / T), each running its own sequences. W must be divisible by
// T (the paper prints the reverse). Collective over `world`.
StatusOr<std::unique_ptr<Communicator>> make_sequence_group(Communicator& world, int sequence_ranks);

}  // namespace seqpar
