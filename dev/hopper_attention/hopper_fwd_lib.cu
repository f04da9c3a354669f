// hopper_fwd_lib.cu: a C entry point to the lab's forward kernels for ctypes (ab_compare.py
// calls it on torch tensors, so ours and cuDNN SDPA run interleaved in one process, on the same
// inputs, and their outputs can be compared at full size). Built by build.sh into
// build/libhopper_fwd.so.
#include <cuda_runtime.h>

#include "order_lab.cuh"  // the library's kernels (src/kernels/hopper/): variants.cuh's names and order_lab.cuh's

// q, o [B, Sq, H, D] bf16; k, v [B, Sk, Hkv, D] bf16; lse [B, H, Sq] fp32; all contiguous.
// Returns the cudaError_t of the launch (0 on success).
extern "C" int hopper_fwd(const char* variant, const void* q, const void* k, const void* v, void* o, float* lse,
                          int B, int H, int Hkv, int Sq, int Sk, int D, int causal, int causal_offset,
                          void* stream) {
  hopper_attn::FwdArgs a{};
  a.q = q;
  a.k = k;
  a.v = v;
  a.o = o;
  a.lse = lse;
  a.batch = B;
  a.heads = H;
  a.kv_heads = Hkv;
  a.seq_q = Sq;
  a.seq_k = Sk;
  a.head_dim = D;
  a.causal = causal;
  a.causal_offset = causal_offset;
  return static_cast<int>(hopper_attn::lab_dispatch(variant, a, static_cast<cudaStream_t>(stream)));
}
