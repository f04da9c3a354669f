// The model's CPU layers, each a pair of plain functions (forward; backward adding into the
// parameter gradients), templated on float (training) and double (the fp64 versions the tests
// hold them to). Rows are tokens: activations are [rows, dim] row-major, which is also
// [B, S, H, D] for the attention's q, k, v. One file per layer: linear.cpp (and gemm through
// BLAS), embedding.cpp, rmsnorm.cpp, rope.cpp, swiglu.cpp, lm_head_loss.cpp.
#pragma once

#include <cstdint>

#include "seqpar/optimizer.hpp"

namespace seqpar::model {

// Threads BLAS may use for one product (OpenBLAS's own pool; ranks that are threads want 1 each).
void set_blas_threads(int threads);

// C[M, N] = alpha op(A) op(B) + beta C, row-major; op transposes when asked (BLAS).
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, const T* B, T beta, T* C);

// y[rows, out] = x[rows, in] w[out, in]^T.
template <class T>
void linear_forward(const T* x, const T* w, T* y, int64_t rows, int64_t in, int64_t out);
// y[rows, out] += x w^T: a product added into the residual stream.
template <class T>
void linear_forward_add(const T* x, const T* w, T* y, int64_t rows, int64_t in, int64_t out);
// dx (= or += with accumulate_dx) dy w; dw += dy^T x.
template <class T>
void linear_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t rows, int64_t in, int64_t out,
                     bool accumulate_dx);

// x[r] = table[tokens[r]]; dtable[tokens[r]] += dx[r].
template <class T>
void embedding_forward(const int32_t* tokens, const T* table, T* x, int64_t rows, int64_t dim);
template <class T>
void embedding_backward(const int32_t* tokens, const T* dx, T* dtable, int64_t rows, int64_t dim);

// y = w * x / sqrt(mean(x^2) + eps) per row; rstd[r] = 1 / sqrt(mean(x_r^2) + eps).
template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t dim, double eps);
// dx += d(norm)/dx^T dy; dw += sum_r dy_r * x_r * rstd_r.
template <class T>
void rmsnorm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t rows, int64_t dim);

// Rotates x [batch, seq, heads, head_dim] in place by Hugging Face's rotate-half RoPE at the
// global positions[s] of each row s: pairs (i, i + D/2) turn by positions[s] * theta^(-2i/D).
// inverse turns them back (the backward: the rotation's transpose).
template <class T>
void rope_apply(T* x, const int64_t* positions, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                double theta, bool inverse);

// a = silu(g) * u elementwise; the backward gives dg and du (overwritten).
template <class T>
void swiglu_forward(const T* g, const T* u, T* a, int64_t n);
template <class T>
void swiglu_backward(const T* g, const T* u, const T* da, T* dg, T* du, int64_t n);

// The LM head and cross-entropy, fused: logits x w^T are made `chunk` rows at a time and never
// all at once. Rows whose target is negative are not counted. Returns the sum of (logsumexp -
// logit[target]) over counted rows and their count; with dx and dw (training, else null) each
// chunk's logits become scale (softmax - onehot) in the same pass, dx = that w is written and
// dw += that^T x added (scale: 1 / the global count of counted rows).
template <class T>
void lm_head_loss(const T* x, const T* w, const int32_t* targets, int64_t rows, int64_t dim, int64_t vocab,
                  int64_t chunk, double* loss_sum, int64_t* counted, double scale = 0, T* dx = nullptr,
                  T* dw = nullptr);

// One AdamW step's coefficients, the same on every device: the rate of the step, the gradient's
// clipping scale (clip_norm / norm when the norm is above it) and the bias corrections 1 - beta^t
// of the t-th update.
struct AdamWStep {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0;
  double clip = 1;
  double c1 = 1, c2 = 1;
};
// The coefficients of 0-based step `step`, the optimizer's t-th update, with the gradient's
// global norm `norm` (not finite: an error).
StatusOr<AdamWStep> adamw_step(const AdamWOptions& options, double norm, int64_t step, int64_t t);
// params, m, v updated from grads * step.clip over n elements, weight decay `decay` (the
// arithmetic in double per element).
void adamw_update(const AdamWStep& step, double decay, float* params, const float* grads, float* m, float* v, int64_t n);

}  // namespace seqpar::model
