// The CUDA halves of the model's layers (src/model/layers.hpp has the CPU halves and the math):
// device pointers, work queued on `stream`. Mixed precision as the GPU engine keeps it:
// weights and the layers' inputs to matrix products in bf16; the residual stream, every
// gradient that is added to, row statistics and the loss in fp32. Matrix products go through
// cuBLASLt (bf16 inputs, fp32 compute; the algorithm timed per shape, gemm_bf16.cu). A bf16 array is passed as `uint16_t*` so this header needs
// no CUDA include; the .cu files read it as __nv_bfloat16.
#pragma once

#include <cstdint>

#include "seqpar/status.hpp"

namespace seqpar::model::cuda {

using bf16_t = uint16_t;

// y[rows, out] (bf16) = x[rows, in] w[out, in]^T.
Status linear_forward(const bf16_t* x, const bf16_t* w, bf16_t* y, int64_t rows, int64_t in, int64_t out,
                      void* stream);
// y[rows, out] (fp32) += x w^T: a product added into the residual stream.
Status linear_forward_add(const bf16_t* x, const bf16_t* w, float* y, int64_t rows, int64_t in, int64_t out,
                          void* stream);
// dx[rows, in] (fp32) = (or += with accumulate_dx) dy w; dw[out, in] (fp32) += dy^T x. dy bf16.
Status linear_backward(const bf16_t* x, const bf16_t* w, const bf16_t* dy, float* dx, float* dw, int64_t rows,
                       int64_t in, int64_t out, bool accumulate_dx, void* stream);
// The same with dx in bf16, overwritten: for a gradient that only feeds the next step (attention's
// dO, SwiGLU's da), never summed; cuBLAS rounds its fp32 result once, as a cast after it would,
// and half the bytes go out.
Status linear_backward(const bf16_t* x, const bf16_t* w, const bf16_t* dy, bf16_t* dx, float* dw, int64_t rows,
                       int64_t in, int64_t out, void* stream);

// For tests of the products' tuning (gemm_bf16.cu): while one lives, the calling thread's
// products run cuBLASLt's candidate i (the shape's last where it has fewer), untimed; and the
// most candidates any product of the calling thread has had.
class ScopedGemmCandidate {
 public:
  explicit ScopedGemmCandidate(int i);
  ~ScopedGemmCandidate();
  ScopedGemmCandidate(const ScopedGemmCandidate&) = delete;
  ScopedGemmCandidate& operator=(const ScopedGemmCandidate&) = delete;

 private:
  int saved_;
};
int gemm_candidates_max();

// x[rows, dim] (fp32) = table[tokens[r]] (bf16); tokens device int32 [rows].
Status embedding_forward(const int32_t* tokens, const bf16_t* table, float* x, int64_t rows, int64_t dim, void* stream);
// dtable[vocab, dim] (fp32) += dx[rows, dim] (fp32) scattered to the rows' tokens, deterministic:
// each token's rows are added in ascending row order (no atomics). host_tokens: int32 [rows] in
// host memory, each >= 0, grouped by token on the host (a counting sort) and the grouping
// uploaded on `stream`; they may be freed on return.
Status embedding_backward(const int32_t* host_tokens, const float* dx, float* dtable, int64_t rows, int64_t dim,
                          void* stream);

// y (bf16) = w * x * rstd from the fp32 residual x; rstd fp32 [rows].
Status rmsnorm_forward(const float* x, const bf16_t* w, bf16_t* y, float* rstd, int64_t rows, int64_t dim, double eps,
                       void* stream);
// dx (fp32) += ..., dw (fp32) += ... from dy (fp32). dw's column sums are reduced in a fixed
// order (fixed chunks of rows, then the chunks in order): the same bits on every run.
Status rmsnorm_backward(const float* x, const bf16_t* w, const float* rstd, const float* dy, float* dx, float* dw,
                        int64_t rows, int64_t dim, void* stream);

// In-place RoPE at global positions (device int64 [seq]) on [batch, seq, heads, head_dim]: bf16
// (q, k in the forward) or fp32 (their gradients, with inverse = true).
Status rope_apply(bf16_t* x, const int64_t* positions, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                  double theta, bool inverse, void* stream);
Status rope_apply(float* x, const int64_t* positions, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                  double theta, bool inverse, void* stream);

// a = silu(g) * u (bf16); the backward takes da in bf16 (the down product's dx, rounded as
// PyTorch's bf16 autograd rounds it) and writes dg, du in bf16 (inputs of the next products).
Status swiglu_forward(const bf16_t* g, const bf16_t* u, bf16_t* a, int64_t n, void* stream);
Status swiglu_backward(const bf16_t* g, const bf16_t* u, const bf16_t* da, bf16_t* dg, bf16_t* du, int64_t n,
                       void* stream);

// The linear-attention mixer's elementwise steps (linear_attention_layer.cpp's math in fp32).
// SiLU, the feature map on q and k: y = silu(x); dx = dy * silu'(x) (dx may be dy), all bf16.
Status silu_forward(const bf16_t* x, bf16_t* y, int64_t n, void* stream);
Status silu_backward(const bf16_t* x, const bf16_t* dy, bf16_t* dx, int64_t n, void* stream);
// The output gate: a = normed * g, or normed * silu(g) with silu_gate (bf16). The backward takes
// da fp32 and writes dg in bf16 (a product's input) and dnormed in fp32 (the norm backward's dy).
Status mixer_gate_forward(bool silu_gate, const bf16_t* g, const bf16_t* normed, bf16_t* a, int64_t n, void* stream);
Status mixer_gate_backward(bool silu_gate, const bf16_t* g, const bf16_t* normed, const float* da, bf16_t* dg,
                           float* dnormed, int64_t n, void* stream);

// The fused LM head + cross-entropy (lm_head_loss.cpp's algorithm): logits of `chunk` rows at a
// time in scratch, fp32 or (kBf16, as Liger-Kernel keeps them) bf16; row_loss[r] (fp32) = lse -
// logit[target] for counted rows, else 0. With dx and dw (training) the gradient comes in the same
// pass: dx (fp32) written, dw (fp32) added, scale (softmax - onehot) made in bf16.
enum class Logits { kF32, kBf16 };
Status lm_head_loss(const bf16_t* x, const bf16_t* w, const int32_t* targets, int64_t rows, int64_t dim, int64_t vocab,
                    int64_t chunk, float* row_loss, double scale, float* dx, float* dw, void* stream,
                    Logits logits = Logits::kF32);

// fp32 <-> bf16 copies (weights' compute copies, activations into products).
Status to_bf16(const float* x, bf16_t* y, int64_t n, void* stream);
Status to_f32(const bf16_t* x, float* y, int64_t n, void* stream);
// dst += src over n fp32 elements (ZeRO-3 adds a reduce-scattered gradient into its slice).
Status add(float* dst, const float* src, int64_t n, void* stream);

// AdamW on n elements (optimizer.hpp's arithmetic, in fp32): params, m, v updated from grads
// scaled by `clip`; the bf16 copy of the params refreshed (may be null).
Status adamw_update(float* params, bf16_t* params_bf16, const float* grads, float* m, float* v, int64_t n, double lr,
                    double beta1, double beta2, double eps, double weight_decay, double clip, double c1, double c2,
                    void* stream);
// sum of x^2 over n elements added into *out (device fp64 accumulator, zeroed by the caller), in
// an order fixed by n: the same bits on every run.
Status sum_of_squares(const float* x, int64_t n, double* out, void* stream);

}  // namespace seqpar::model::cuda
