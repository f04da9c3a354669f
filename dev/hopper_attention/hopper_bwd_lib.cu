// hopper_bwd_lib.cu: C entry points to the lab's backward kernel for ctypes (ab_bwd.py calls it on
// torch tensors, so ours and cuDNN SDPA's backward run interleaved in one process, on the same
// inputs, and their gradients can be compared at full size). Built by build.sh into
// build/libhopper_bwd.so. The forward (for O and LSE) comes from build/libhopper_fwd.so.
#include <cuda_runtime.h>

#include "variants.cuh"  // the library's kernels (src/kernels/hopper/)

extern "C" size_t hopper_bwd_workspace(int B, int H, int Sq, int D) {
  return hopper_attn::lab_workspace_bytes(B, H, Sq, D);  // every variant's
}

// q, o, dout, dq [B, Sq, H, D] bf16; k, v, dk, dv [B, Sk, Hkv, D] bf16; lse [B, H, Sq] fp32;
// delta [B, H, Sq] fp32 or null (then computed from o and dout); all contiguous. Returns the
// cudaError_t of the launches (0 on success). variant: the number in variants.cuh (0 base, 10 q80, ...).
extern "C" int hopper_bwd(const void* q, const void* k, const void* v, const void* o, const void* dout,
                          const float* lse, const float* delta, void* dq, void* dk, void* dv, void* workspace, int B,
                          int H, int Hkv, int Sq, int Sk, int D, int causal, int causal_offset, int accumulate,
                          int variant, void* stream) {
  hopper_attn::BwdArgs a{};
  a.q = q;
  a.k = k;
  a.v = v;
  a.o = o;
  a.dout = dout;
  a.lse = lse;
  a.delta = delta;
  a.dq = dq;
  a.dk = dk;
  a.dv = dv;
  a.workspace = workspace;
  a.batch = B;
  a.heads = H;
  a.kv_heads = Hkv;
  a.seq_q = Sq;
  a.seq_k = Sk;
  a.head_dim = D;
  a.causal = causal;
  a.causal_offset = causal_offset;
  a.accumulate = accumulate;
  a.variant = variant;
  return static_cast<int>(hopper_attn::dispatch_bwd(a, static_cast<cudaStream_t>(stream)));
}
