// bwd_groups_lab.cuh (lab only; issue 34, the backward's fixed part on short lists): a whole
// backward run as G head groups that alternate over two streams, so that one group's
// bandwidth-bound prologue (accumulator zeroing, preprocessing) and dQ conversion can run beside
// another group's main kernel (compute-bound) instead of after it. On 256 documents at 32K the
// fixed part is 0.49 ms of short64's 1.67 ms (README, "Backward on 64-key tiles for short
// lists"), all of it at HBM speed, none of it on the tensor cores.
// Each group is the launcher's usual backward on a view of heads [g H/G, (g + 1) H/G) (and their
// K/V heads): pointers offset by the group's first head, the full tensors' strides, its own slice
// of the workspace. LAB_GROUPS (default 4) sets G; LAB_GROUP_PRIORITY=1 gives the second stream
// the higher priority (its kernels' blocks are dispatched first as SMs free up).
#pragma once

#include <cstdlib>

#include "kernels/hopper/hopper_bwd_launch.cuh"

namespace hopper_attn {
using namespace seqpar::hopper;

inline int lab_groups() {
  const char* e = std::getenv("LAB_GROUPS");
  return e ? std::atoi(e) : 4;
}

// The second stream and the fork / join events, made once.
struct GroupStreams {
  cudaStream_t aux = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  GroupStreams() {
    int lo = 0, hi = 0;
    cudaDeviceGetStreamPriorityRange(&lo, &hi);
    const bool high = std::getenv("LAB_GROUP_PRIORITY") && std::atoi(std::getenv("LAB_GROUP_PRIORITY")) == 1;
    cudaStreamCreateWithPriority(&aux, cudaStreamNonBlocking, high ? hi : lo);
    cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
  }
};

// launch(args, stream): one whole backward (prologue, main kernel, conversion) on a view.
// q_rows: its query tile's rows (the workspace's padding).
template <class Launch>
cudaError_t launch_bwd_head_groups(const BwdArgs& a, cudaStream_t stream, int q_rows, Launch launch) {
  const int G = lab_groups();
  if (G <= 1 || a.heads % G != 0 || a.kv_heads % G != 0 || a.main_only != 0) return launch(a, stream);
  static GroupStreams gs;
  const int D = a.head_dim, gh = a.heads / G, gkv = a.kv_heads / G;
  // Slices start 16-byte aligned (the kernels' vector accesses); rounding up fits in the whole
  // workspace, as no launcher here uses a slice's last part (the store-first tile states).
  const size_t slice = (bwd_workspace_bytes(a.batch, gh, a.seq_q, D, q_rows) + 15) / 16 * 16;
  const RowStrides qst = row_strides(a.q_st, a.seq_q, a.heads, D), kst = row_strides(a.k_st, a.seq_k, a.kv_heads, D),
                   vst = row_strides(a.v_st, a.seq_k, a.kv_heads, D), ost = row_strides(a.o_st, a.seq_q, a.heads, D),
                   dost = row_strides(a.dout_st, a.seq_q, a.heads, D), dqst = row_strides(a.dq_st, a.seq_q, a.heads, D),
                   dkst = row_strides(a.dk_st, a.seq_k, a.kv_heads, D), dvst = row_strides(a.dv_st, a.seq_k, a.kv_heads, D);
  const StatStrides lst = stat_strides(a.lse_st, a.heads, a.seq_q), dst = stat_strides(a.delta_st, a.heads, a.seq_q);
  cudaError_t e;
  if ((e = cudaEventRecord(gs.fork, stream)) != cudaSuccess || (e = cudaStreamWaitEvent(gs.aux, gs.fork)) != cudaSuccess)
    return e;
  const auto at = [](const void* p, int64_t elems, int bytes) {
    return static_cast<void*>(static_cast<char*>(const_cast<void*>(p)) + elems * bytes);
  };
  for (int g = 0; g < G; ++g) {
    BwdArgs b = a;
    const int64_t h0 = int64_t(g) * gh, kh0 = int64_t(g) * gkv;
    b.heads = gh, b.kv_heads = gkv;
    b.q = at(a.q, h0 * qst.h, 2), b.k = at(a.k, kh0 * kst.h, 2), b.v = at(a.v, kh0 * vst.h, 2);
    b.o = a.o ? at(a.o, h0 * ost.h, 2) : nullptr;
    b.dout = at(a.dout, h0 * dost.h, 2);
    b.lse = a.lse + h0 * lst.h;
    b.delta = a.delta ? a.delta + h0 * dst.h : nullptr;
    b.dq = at(a.dq, h0 * dqst.h, a.dq_f32 ? 4 : 2);
    b.dk = at(a.dk, kh0 * dkst.h, a.dkv_f32 ? 4 : 2), b.dv = at(a.dv, kh0 * dvst.h, a.dkv_f32 ? 4 : 2);
    b.q_st = qst, b.k_st = kst, b.v_st = vst, b.o_st = ost, b.dout_st = dost, b.dq_st = dqst, b.dk_st = dkst,
    b.dv_st = dvst, b.lse_st = lst, b.delta_st = dst;
    b.workspace = at(a.workspace, int64_t(g) * int64_t(slice), 1);
    if ((e = launch(b, g % 2 ? gs.aux : stream)) != cudaSuccess) return e;
  }
  if ((e = cudaEventRecord(gs.join, gs.aux)) != cudaSuccess) return e;
  return cudaStreamWaitEvent(stream, gs.join);
}

}  // namespace hopper_attn
