// The arguments of the Hopper (sm_90a) attention kernels (hopper_fwd.cuh, hopper_bwd.cuh), as
// plain structs without CUDA types, so host C++ (the backend, hopper_backend.cpp) fills them and
// the kernels' translation unit (hopper_kernels.cu) launches them. Zero-initialise, then fill:
// strides left 0 mean contiguous [B, S, H, D] (and [B, H, S] for row statistics).
#pragma once

#include <cstddef>
#include <cstdint>

namespace seqpar::hopper {

// Element strides of a [B, S, H, D] tensor whose last dim is contiguous; all 0: contiguous.
struct RowStrides {
  int64_t b = 0, s = 0, h = 0;
};
// Element strides of a [B, H, S] row-statistics tensor whose last dim is contiguous; 0: contiguous.
struct StatStrides {
  int64_t b = 0, h = 0;
};

struct FwdArgs {
  const void* q;  // [B, S_q, H, D] bf16
  const void* k;  // [B, S_k, H_kv, D] bf16
  const void* v;
  void* o;        // [B, S_q, H, D] bf16, or fp32 with o_f32
  float* lse;     // [B, H, S_q]
  int batch, heads, kv_heads, seq_q, seq_k, head_dim;
  // causal: key j visible from query i iff j <= i + causal_offset (0: top-left aligned; a shard
  // pair whose rows start at positions q0 and k0 has offset q0 - k0; negative offsets leave the
  // first rows with no key: O = 0, LSE = -inf).
  int causal, causal_offset;
  float scale;    // 0: 1/sqrt(D)
  int o_f32;      // O is fp32 (else bf16)
  RowStrides q_st, k_st, v_st, o_st;
  StatStrides lse_st;
};

struct BwdArgs {
  const void* q;     // [B, S_q, H, D] bf16
  const void* k;     // [B, S_k, H_kv, D] bf16
  const void* v;
  const void* o;     // [B, S_q, H, D] bf16 contiguous, for D = rowsum(dO * O); unused when delta is given
  const void* dout;  // [B, S_q, H, D] bf16
  const float* lse;  // [B, H, S_q]: the final LSE
  const float* delta;  // [B, H, S_q] or nullptr (then computed from o and dout)
  void* dq;          // [B, S_q, H, D] bf16, or fp32 with dq_f32
  void* dk;          // [B, S_k, H_kv, D] bf16, or fp32 with dkv_f32
  void* dv;
  void* workspace;   // bwd_workspace_bytes(...)
  int batch, heads, kv_heads, seq_q, seq_k, head_dim;
  int causal, causal_offset, accumulate;  // accumulate: add to dq, dk, dv (else write them)
  float scale;       // 0: 1/sqrt(D)
  int variant;       // the lab's dispatch_bwd: 0 base, 1 defer (the backend runs base)
  int main_only;     // timing aid: launch only the main kernel (the workspace must hold a
                     // previous call's LSE2 and D; dQ is then neither zeroed nor converted)
  int dq_f32, dkv_f32;      // dq; dk and dv: fp32 (else bf16)
  int dq_fresh, dkv_fresh;  // with accumulate: write dq (dk and dv) all the same, reading nothing
  RowStrides q_st, k_st, v_st, dout_st, dq_st, dk_st, dv_st;
  StatStrides lse_st, delta_st;
};

// Host entry points (hopper_kernels.cu): the variants the backend runs (forward: 192-key tiles
// at D = 128, 192 query rows at D = 64; backward: "base"). They return the cudaError_t of the
// launches (0 on success) and launch nothing on a device they cannot run on.
int forward(const FwdArgs& a, void* stream);
int backward(const BwdArgs& a, void* stream);
size_t backward_workspace_bytes(int batch, int heads, int seq_q, int head_dim);
// Empty when device `device` can run the kernels (compute capability 9.0 and sm_90a code in
// this build); else why not. Queried once per device.
const char* device_refusal(int device);
// The message of a cudaError_t.
const char* error_string(int error);

}  // namespace seqpar::hopper
