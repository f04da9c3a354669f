// The local-attention backend interface every executor computes through (ggml's backend table
// is the model): each backend says whether it supports a problem, and why not, and runs the
// step kinds a schedule needs on one shard pair. Masks are in global positions
// (params.q_positions / k_positions give each local row's position).
//   forward     continues a running (O, LSE): merges these keys into it, as if all keys so far
//               had been seen in one call (O = 0, LSE = -inf before the first);
//   backward    *adds* this pair's dQ, dK, dV, against the final LSE and D = rowsum(dO * O)
//               (a backend whose caps say !takes_delta gets O [B, S_q, H, D] as `delta`);
//   delta       D = rowsum(dO * O);
//   merge       (O, LSE) <- merge((O, LSE), (O_part, LSE_part)), -inf safe;
//   accumulate  acc += x (same shape; on device backends x may be in the inputs' dtype where
//               acc is fp32, as O_part may in merge: results sent home travel rounded).
// Forward and backward outputs named fresh (FreshOutputs) hold nothing yet: the backend writes
// them as if they held the empty result, without reading them (no clearing pass, no first
// read-add-write). A backend that writes parts (caps) also takes outputs, and merge and
// accumulate targets, in the inputs' dtype: each call then rounds once what it read and added
// in fp32, so a result of at most two parts comes out as an fp32 accumulator rounded once would.
// Shapes as in attention.hpp: q, o, dout, dq [B, S_q, H, D]; k, v, dk, dv [B, S_k, H_kv, D];
// lse, delta [B, H, S_q]. `stream` is the CUDA stream of device backends (CPU ones ignore it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "seqpar/attention.hpp"

namespace seqpar {

struct BackendCaps {
  bool takes_delta = true;          // backward reads D (else O, passed as `delta`: packs carry O)
  bool writes_parts = false;        // its kernels write whole parts it then merges or adds itself
                                    // (so its outputs may be in the inputs' dtype)
  bool needs_dense_blocks = false;  // its kernels take only full or top-left causal blocks (it
                                    // plans each shard pair into such calls itself)
  bool device = false;              // computes on a GPU: accumulators and row stats are fp32, and
                                    // the planner bounds its workspace with head groups
};

// Which outputs of a forward or backward call hold nothing yet (see above).
struct FreshOutputs {
  bool o = false;    // forward: O and LSE
  bool dq = false;   // backward: dQ
  bool dkv = false;  // backward: dK and dV
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  virtual const char* name() const = 0;
  virtual BackendCaps caps() const = 0;
  // Empty when this backend runs attention over tensors like q (dtype, device, head dim) with
  // these params; else the reason it refuses them.
  virtual std::string supports(const TensorView& q, const AttentionParams& params) const = 0;

  [[nodiscard]] virtual Status forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const AttentionParams& params, const TensorView& o,
                                       const TensorView& lse, FreshOutputs fresh, void* stream) const = 0;
  [[nodiscard]] virtual Status backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                        const TensorView& dout, const TensorView& lse,
                                        const TensorView& delta, const AttentionParams& params,
                                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                        FreshOutputs fresh, void* stream) const = 0;
  [[nodiscard]] virtual Status delta(const TensorView& o, const TensorView& dout, const TensorView& delta,
                                     void* stream) const = 0;
  [[nodiscard]] virtual Status merge(const TensorView& o, const TensorView& lse, const TensorView& o_part,
                                     const TensorView& lse_part, void* stream) const = 0;
  [[nodiscard]] virtual Status accumulate(const TensorView& acc, const TensorView& x, void* stream) const = 0;
  // A backend that hands each call to another ("auto"): how many calls each ran so far, as
  // ("forward hopper", n), ("backward cuda", n), ...; empty for a backend that runs its own.
  virtual std::vector<std::pair<std::string, int64_t>> calls_by_backend() const { return {}; }
};

// The fast blocked CPU kernels (fp32, fp64).
const AttentionBackend& cpu_kernel_backend();
// The fp64 oracle as a backend: plain loops, every step computed in fp64 (fp32 or fp64 tensors).
const AttentionBackend& cpu_oracle_backend();
// Every backend this build has (GPU ones where CUDA is built: ours, cuDNN, Hopper, and auto where
// GPU 0 is sm_90), for the backend test. The GPU
// instances keep scratch: use them from one thread.
std::vector<const AttentionBackend*> all_backends();

// GPU backends, one instance per rank (they keep scratch buffers and cached plans); nullptr
// where this build lacks them. max_call_rows > 0: no cuDNN call spans more rows (a guard and
// a diagnostic for very long shards). deterministic: cuDNN's backward gives the same bits every
// run (src/kernels/cudnn/cudnn_attention.hpp says what it costs).
std::unique_ptr<AttentionBackend> make_cuda_backend();
std::unique_ptr<AttentionBackend> make_cudnn_backend(int64_t max_call_rows = 0, bool deterministic = false);
// Our sm_90a (H100/H200) kernels, "hopper": bf16, head dim 64 or 128; full and causal masks, and
// documents, left-bounded windows and block patterns (blocks a power of two of at least 8 tokens)
// as visible-tile lists; each side's positions any number of increasing runs (contiguous, zigzag,
// striped and documents-layout shards in one launch; gathered shards, up to 64 increasing
// segments a side, one launch per pair of segments); supports() says what else it refuses (every
// GPU but sm_90). nullptr where this build lacks CUDA or sm_90a code.
std::unique_ptr<AttentionBackend> make_hopper_backend();
// "auto": cuDNN, Hopper and our kernels behind one backend that hands each forward and backward
// call to the fastest that takes it (src/kernels/backend_choice.cpp has the measured table), under
// one contract (caps: fp32 or input-dtype parts). Its backward takes D, so it never runs on cuDNN,
// unless made with backward_from_o (and the build has cuDNN): then it takes O (the schedules'
// query packs carry O, more bytes than D), cuDNN may run it, and the other kernels get D made for
// the call's rows. nullptr where this build lacks the Hopper kernels or GPU `device` is not sm_90.
std::unique_ptr<AttentionBackend> make_auto_backend(int device, int64_t max_call_rows = 0,
                                                    bool backward_from_o = false);
// Whether auto's table puts cuDNN's backward first for this head dim (none since the Hopper D = 64
// backward's 128-row query tiles: the table is measured per head dim), so that problems of it take
// the backward_from_o variant (any build: the planner prices its packs).
bool auto_backward_from_o(int64_t head_dim);
// The GPU backend the environment forces: SEQPAR_ATTN_BACKEND = cudnn, hopper, cuda or auto
// (unset or empty: none, returns ""); an error for any other value.
StatusOr<std::string> forced_gpu_backend();
// The GPU backend of that name (cudnn, hopper, cuda; auto on `device`); nullptr where this build
// or device lacks it.
std::unique_ptr<AttentionBackend> make_gpu_backend_named(const std::string& name, int device = 0,
                                                         int64_t max_call_rows = 0);
// The GPU backend for problems like (q, params): the one SEQPAR_ATTN_BACKEND names, if set; else
// with prefer_cudnn (the fastest) "auto" on sm_90 devices where it takes the problem, else cuDNN
// where built and supported; else our own kernels; nullptr without CUDA.
std::unique_ptr<AttentionBackend> make_gpu_backend(const TensorView& q, const AttentionParams& params,
                                                   bool prefer_cudnn = true, int64_t max_call_rows = 0);

}  // namespace seqpar
