// The LASP paper's baseline for causal linear attention (seqpar/lasp.hpp, LaspAlgorithm::kUlysses):
// Ulysses-style head parallelism over a contiguous layout of T ranks. Forward: one all-to-all
// sends part r of this rank's heads of q, k, v (head_part_range, as the softmax Ulysses schedules
// cut them) to rank r, which then holds its part's whole sequence as T pieces in rank order;
// the single-rank kernel runs the pieces in order, the state carried from one to the next (the
// same as one call over the whole sequence, whose chunks carry it the same way, and no copy to
// join the pieces when B > 1); a second all-to-all sends each piece's o home. The backward sends
// q, k, v over again from the caller's local ones (kept or, under checkpointing, recomputed),
// with dO in the same message, runs the pieces in reverse from the forward's entering states,
// and sends dq, dk, dv home: per peer, one message a way and pass.
// What a layer keeps from its forward to its backward is those T states of d_k x d_v per head of
// its part, as LASP keeps its few; not the received q, k, v (the whole sequence for H/T heads, as
// big as the local q, k, v), which the softmax Ulysses does not keep either by default. The
// all-to-alls' buffers are the pass's scratch (LinearBackend::scratch), so the layers, which run
// one at a time, share one pass's worth instead of each holding its own.
// Both devices through the linear backend table (kernels/linear_backend.hpp); its memory holds
// the states.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/linear_backend.hpp"
#include "seqpar/comm.hpp"
#include "seqpar/layout.hpp"

namespace seqpar::linear_ulysses {

// Empty when `heads` query and `kv_heads` K/V heads both split into `ranks` parts, else why not.
std::string refusal(int ranks, int64_t heads, int64_t kv_heads);

// Checks the problem against the backend (a part's heads over `rows[r]` rows of each sequence on
// rank r) and reserves the backend's memory for rank `rank`'s passes (the states and the
// kernels' workspace); *memory is its start.
Status reserve(LinearBackend& backend, const std::vector<int64_t>& rows, int rank, const TensorView& q,
               const TensorView& k, const TensorView& v, const LinearAttentionParams& params, void** memory);

// Bytes of scratch each pass of rank `rank` takes (the same for both passes).
StatusOr<size_t> scratch_bytes(const LinearBackend& backend, const std::vector<int64_t>& rows, int rank,
                               const TensorView& q, const TensorView& k, const TensorView& v);

// This rank's rows of each sequence, for every rank of the layout.
std::vector<int64_t> rows_of(const Layout& layout);

// Forward on this rank: o [B, S_local, H, d_v] from q, k, v of its rows (memory from reserve
// for the layout's rows). Collective over comm; device work on `stream`.
Status forward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params, LinearBackend& backend,
               void* memory, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               void* stream);

// Backward on this rank (after its forward, on the same memory): dq, dk, dv from dout and the
// forward's q, k, v (sent again, so a recompute must give them as the forward had them).
Status backward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params, LinearBackend& backend,
                void* memory, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                const TensorView& dq, const TensorView& dk, const TensorView& dv, void* stream);

}  // namespace seqpar::linear_ulysses
