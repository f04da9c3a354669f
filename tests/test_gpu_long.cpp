// GPU tests of long sequences and large views, each needing tens of GiB of GPU memory: ctest
// runs them one at a time (RUN_SERIAL), after or before the other GPU tests. Skipped without a
// GPU (CI) or with too little free memory.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdio>

#include "kernels/cudnn/cudnn_attention.hpp"
#include "kernels/cuda/flash_cuda.hpp"
#include "seqpar/gpu.hpp"
#include "test_util.hpp"

namespace seqpar {
namespace {

using testing::cast;

#define SKIP_WITHOUT_GPU()                                              \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device here"

// S = 32K: O, LSE and dQ of sampled query rows against the oracle under the bf16 rule (the
// plain baseline computes just those rows; dK and dV would need every row of it).
TEST(LongSequence, CudnnAndOursAt32K) {
  SKIP_WITHOUT_GPU();
  const int64_t S = 32768, H = 2, Hkv = 1, D = 128;
  const HostTensor q = testing::random_tensor(DType::kBF16, {1, S, H, D}, 61);
  const HostTensor k = testing::random_tensor(DType::kBF16, {1, S, Hkv, D}, 62);
  const HostTensor v = testing::random_tensor(DType::kBF16, {1, S, Hkv, D}, 63);
  const HostTensor dout = testing::random_tensor(DType::kBF16, {1, S, H, D}, 64);
  AttentionParams params;
  params.mask = MaskSpec::causal();
  std::vector<int64_t> rows{0, 1, 777, 4095, 4096, 16383, 20000, 32766, 32767};
  ReferenceRows ref_rows;
  ref_rows.query_rows = rows;
  ref_rows.key_rows = {0};
  auto oracle = reference_attention(q.view(), k.view(), v.view(), dout.view(), params, ref_rows);
  ASSERT_TRUE(oracle.ok());
  const ReferenceResult plain = testing::plain_lowp_attention(q, k, v, &dout, params, DType::kBF16, rows);

  auto gq = to_device(q), gk = to_device(k), gv = to_device(v), gdo = to_device(dout);
  auto o = device_zeros(DType::kBF16, {1, S, H, D});
  auto lse = device_zeros(DType::kF32, {1, H, S});
  auto dq = device_zeros(DType::kBF16, {1, S, H, D}), dk = device_zeros(DType::kBF16, {1, S, Hkv, D});
  auto dv = device_zeros(DType::kBF16, {1, S, Hkv, D});
  ASSERT_TRUE(cudnn_attention_forward(gq->view, gk->view, gv->view, params, o->view, lse->view).ok());
  ASSERT_TRUE(cudnn_attention_backward(gq->view, gk->view, gv->view, o->view, gdo->view, lse->view, params,
                                       dq->view, dk->view, dv->view).ok());
  auto check = [&](const char* who, const HostTensor& o_h, const HostTensor& lse_h, const HostTensor& dq_h) {
    std::string why = testing::check_lowp_rule_rows("O", cast(o_h, DType::kF64), plain.o, oracle->o, DType::kBF16, 1, rows);
    EXPECT_TRUE(why.empty()) << who << ": " << why;
    why = testing::check_lowp_rule_rows("LSE", cast(lse_h, DType::kF64), plain.lse, oracle->lse, DType::kF32, 2, rows);
    EXPECT_TRUE(why.empty()) << who << ": " << why;
    why = testing::check_lowp_rule_rows("dQ", cast(dq_h, DType::kF64), plain.dq, oracle->dq, DType::kBF16, 1, rows);
    EXPECT_TRUE(why.empty()) << who << ": " << why;
  };
  check("cudnn", to_host(o->view).value(), to_host(lse->view).value(), to_host(dq->view).value());

  auto o_acc = device_zeros(DType::kF32, {1, S, H, D});
  auto delta = device_zeros(DType::kF32, {1, H, S});
  auto dq32 = device_zeros(DType::kF32, {1, S, H, D}), dk32 = device_zeros(DType::kF32, {1, S, Hkv, D});
  auto dv32 = device_zeros(DType::kF32, {1, S, Hkv, D});
  ASSERT_TRUE(flash_attention_forward(gq->view, gk->view, gv->view, params, {}, o_acc->view, lse->view, false, o->view).ok());
  ASSERT_TRUE(flash_attention_delta(o->view, gdo->view, delta->view).ok());
  ASSERT_TRUE(flash_attention_backward(gq->view, gk->view, gv->view, gdo->view, lse->view, delta->view, params, {},
                                       dq32->view, dk32->view, dv32->view).ok());
  check("ours", to_host(o->view).value(), to_host(lse->view).value(), to_host(dq32->view).value());
}

// Views whose element offsets pass 2^31: the last 8 of 2560 heads of [1, 8192, 2560, 128]
// tensors (2.7e9 elements; past 2^31 from row 6553 on) against the same heads packed
// contiguously, whose offsets stay small. cuDNN runs them twice: on those heads alone as
// strided views (how the executor hands it a head group of a long shard, or of the whole
// problem on one GPU), and on all 2560 heads (the other heads are zero). Indexing that wraps
// at 2^31 would corrupt either silently. Needs about 50 GiB of GPU memory (skipped with less).
TEST(LongSequence, CudnnPastTwoToTheThirtyOneElements) {
  SKIP_WITHOUT_GPU();
  const int64_t S = 8192, H = 2560, D = 128, h = 8;
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  if (free_bytes < (56ull << 30)) GTEST_SKIP() << "needs 56 GiB of free GPU memory";
  AttentionParams params;
  params.mask = MaskSpec::causal();
  const auto last_heads = [&](const TensorView& t, int dim) { return t.narrow(dim, H - h, H); };  // of a full view
  const auto alloc = [](DType t, std::vector<int64_t> shape) {
    auto d = device_zeros(t, shape);
    EXPECT_TRUE(d.ok()) << d.status().to_string();
    return d.ok() ? std::move(d.value()) : DeviceTensor{};
  };
  // Forward + backward on (q, k, v, dout) into (o, dq, dk, dv) and lse; then `read` (O, dQ, dK,
  // dV, LSE views) packed, on the host.
  const auto run = [&](const std::array<TensorView, 4>& in, const std::array<TensorView, 4>& out,
                       const TensorView& lse, const std::array<TensorView, 5>& read) {
    std::vector<HostTensor> got;
    Status st = cudnn_attention_forward(in[0], in[1], in[2], params, out[0], lse);
    if (st.ok())
      st = cudnn_attention_backward(in[0], in[1], in[2], out[0], in[3], lse, params, out[1], out[2], out[3]);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return got;
    for (const TensorView& t : read) {
      const DeviceTensor packed = alloc(t.dtype, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim));
      EXPECT_TRUE(flash_cast(t, packed.view).ok());
      got.push_back(cast(to_host(packed.view).value(), DType::kF64));
    }
    return got;
  };
  const char* names[] = {"O", "dQ", "dK", "dV", "LSE"};
  const auto expect_equal = [&](const std::vector<HostTensor>& got, const std::vector<HostTensor>& want,
                                const char* what) {
    ASSERT_EQ(got.size(), 5u) << what;
    for (int i = 0; i < 5; ++i) {
      const double err = testing::max_abs_diff(got[i], want[i]), scale = testing::max_abs(want[i]);
      EXPECT_LE(err, (i < 4 ? 1e-2 : 1e-5) * scale) << what << " " << names[i] << ": max |error| " << err
                                                    << " of max " << scale;
    }
  };

  // The heads packed: small offsets.
  std::array<HostTensor, 4> host;
  for (int i = 0; i < 4; ++i) host[i] = testing::random_tensor(DType::kBF16, {1, S, h, D}, 81 + i);
  std::vector<HostTensor> want;
  {
    std::array<DeviceTensor, 4> in, out;
    for (int i = 0; i < 4; ++i) in[i] = to_device(host[i]).value(), out[i] = alloc(DType::kBF16, {1, S, h, D});
    const DeviceTensor lse = alloc(DType::kF32, {1, h, S});
    const std::array<TensorView, 4> o{out[0].view, out[1].view, out[2].view, out[3].view};
    want = run({in[0].view, in[1].view, in[2].view, in[3].view}, o, lse.view, {o[0], o[1], o[2], o[3], lse.view});
    ASSERT_EQ(want.size(), 5u);
  }
  ASSERT_TRUE(cudnn_release_workspace().ok());

  // The same heads as the last of H, in place.
  std::array<DeviceTensor, 4> in, out;
  for (int i = 0; i < 4; ++i) {
    in[i] = alloc(DType::kBF16, {1, S, H, D}), out[i] = alloc(DType::kBF16, {1, S, H, D});
    const DeviceTensor part = to_device(host[i]).value();
    ASSERT_TRUE(flash_cast(part.view, last_heads(in[i].view, 2)).ok());
  }
  const DeviceTensor lse = alloc(DType::kF32, {1, H, S});
  const auto slices = [&](const std::array<DeviceTensor, 4>& t) {
    return std::array<TensorView, 4>{last_heads(t[0].view, 2), last_heads(t[1].view, 2), last_heads(t[2].view, 2),
                                     last_heads(t[3].view, 2)};
  };
  // The strided call writes its LSE into a buffer of its own, as the executor's calls do.
  const DeviceTensor lse_heads = alloc(DType::kF32, {1, h, S});
  const std::array<TensorView, 4> o = slices(out);
  expect_equal(run(slices(in), o, lse_heads.view, {o[0], o[1], o[2], o[3], lse_heads.view}), want,
               "strided head slice:");
  ASSERT_TRUE(cudnn_release_workspace().ok());
  for (const DeviceTensor& t : out) ASSERT_EQ(cudaMemset(t.view.data, 0, t.buffer.bytes()), cudaSuccess);
  const std::vector<HostTensor> last =
      run({in[0].view, in[1].view, in[2].view, in[3].view}, {out[0].view, out[1].view, out[2].view, out[3].view},
          lse.view, {o[0], o[1], o[2], o[3], last_heads(lse.view, 1)});
  expect_equal(last, want, "all heads:");
  ASSERT_TRUE(cudnn_release_workspace().ok());
}

// One long causal backward call against calls over its last half of query rows alone (the
// same rows' dQ, one batch element at a time, bottom-right aligned over all keys), whose views
// stay short and so take cuDNN's plain path. cuDNN alone gets dQ wrong from the first row with
// offsets of 2^31 or more (a head slice of [786432, 32, 128] tensors, from row 524288 on; a
// 1M-token single-GPU run showed it), so the adapter runs such calls on compact copies, in
// chunks of heads where even those would pass 2^31. Cases: a short span (plain); head slices
// of 32-head tensors whose offsets stay just under 2^31 (plain, the boundary) or pass it
// (compact copies); 264 query heads over 66 K/V heads (GQA, two head chunks); two batch
// elements whose batch stride takes the span past 2^31. Each (batch, head) holds its own data
// (one random sequence rotated by its own number of rows), so a wrong head or batch offset shows.
struct LongCall {
  int64_t batch, seq, heads, kv_heads;  // of the call
  int64_t tensor_heads;                 // of the q-side tensors (their row stride)
};

class CudnnLongCall : public ::testing::TestWithParam<LongCall> {};

TEST_P(CudnnLongCall, DqMatchesCallsOfItsLastRows) {
  SKIP_WITHOUT_GPU();
  const LongCall c = GetParam();
  const int64_t B = c.batch, S = c.seq, h = c.heads, hk = c.kv_heads, Ht = c.tensor_heads, D = 128, R = S / 2;
  const size_t wide = size_t(B * S * Ht * D * 2), narrow = size_t(B * S * h * D * 2), kv = size_t(B * S * hk * D * 2);
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  // Ours: 4 wide, 6 kv, 1 narrow; the adapter's copies: 4 narrow, 4 kv; cuDNN's fp32 dQ: 2 narrow.
  const size_t need = 4 * wide + 10 * kv + 7 * narrow;
  if (free_bytes < need) GTEST_SKIP() << "needs " << (need >> 30) << " GiB free";
  AttentionParams params;
  params.mask = MaskSpec::causal();
  const auto heads = [&](const DeviceTensor& t) { return t.view.narrow(2, 0, h); };  // of a q-side tensor
  const auto rows = [](const TensorView& v, int64_t b, int64_t first, int64_t end) {  // batch b, rows [first, end)
    return v.narrow(0, b, b + 1).narrow(1, first, end);
  };
  const auto filled = [&](int64_t tensor_heads, int64_t used, uint64_t seed) {
    DeviceTensor t = device_zeros(DType::kBF16, {B, S, tensor_heads, D}).value();
    const DeviceTensor one = to_device(testing::random_tensor(DType::kBF16, {1, S, 1, D}, seed)).value();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < used; ++i) {
        const int64_t shift = 1 + (b * 131 + i * 97) % (S - 1);  // rows [shift, S) first
        const TensorView head = t.view.narrow(2, i, i + 1);
        EXPECT_TRUE(flash_cast(rows(one.view, 0, shift, S), rows(head, b, 0, S - shift)).ok());
        EXPECT_TRUE(flash_cast(rows(one.view, 0, 0, shift), rows(head, b, S - shift, S)).ok());
      }
    return t;
  };
  const DeviceTensor q = filled(Ht, h, 91), dout = filled(Ht, h, 92), k = filled(hk, hk, 93), v = filled(hk, hk, 94);
  const DeviceTensor o = device_zeros(DType::kBF16, {B, S, Ht, D}).value();
  const DeviceTensor dq = device_zeros(DType::kBF16, {B, S, Ht, D}).value();
  const DeviceTensor dk = device_zeros(DType::kBF16, {B, S, hk, D}).value();
  const DeviceTensor dv = device_zeros(DType::kBF16, {B, S, hk, D}).value();
  const DeviceTensor lse = device_zeros(DType::kF32, {B, h, S}).value();
  ASSERT_TRUE(cudnn_attention_forward(heads(q), k.view, v.view, params, heads(o), lse.view).ok());
  ASSERT_TRUE(cudnn_attention_backward(heads(q), k.view, v.view, heads(o), heads(dout), lse.view, params, heads(dq),
                                       dk.view, dv.view).ok());

  // Per batch element, the last R query rows alone: their LSE rows made contiguous.
  AttentionParams tail = params;
  tail.mask.align = MaskAlign::kBottomRight;
  const DeviceTensor lse_tail = device_zeros(DType::kF32, {1, h, R}).value();
  const DeviceTensor dq_tail = device_zeros(DType::kBF16, {1, R, h, D}).value();
  const DeviceTensor dq_long = device_zeros(DType::kBF16, {1, R, h, D}).value();
  const DeviceTensor dk_tail = device_zeros(DType::kBF16, {1, S, hk, D}).value();
  const DeviceTensor dv_tail = device_zeros(DType::kBF16, {1, S, hk, D}).value();
  double err = 0, scale = 0;
  int64_t first_bad = -1, bad_batch = -1;
  for (int64_t b = 0; b < B; ++b) {
    ASSERT_EQ(cudaMemcpy2D(lse_tail.view.data, R * 4, static_cast<float*>(lse.view.data) + b * h * S + (S - R), S * 4,
                           R * 4, h, cudaMemcpyDeviceToDevice), cudaSuccess);
    ASSERT_TRUE(cudnn_attention_backward(rows(heads(q), b, S - R, S), rows(k.view, b, 0, S), rows(v.view, b, 0, S),
                                         rows(heads(o), b, S - R, S), rows(heads(dout), b, S - R, S), lse_tail.view,
                                         tail, dq_tail.view, dk_tail.view, dv_tail.view)
                    .ok());
    ASSERT_TRUE(flash_cast(rows(heads(dq), b, S - R, S), dq_long.view).ok());
    const HostTensor got = cast(to_host(dq_long.view).value(), DType::kF32);
    const HostTensor want = cast(to_host(dq_tail.view).value(), DType::kF32);
    const float* g = got.data<float>();
    const float* w = want.data<float>();
    const double batch_scale = testing::max_abs(want);
    scale = std::max(scale, batch_scale);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t i = 0; i < h * D; ++i) {
        const double e = std::abs(double(g[r * h * D + i]) - w[r * h * D + i]);
        err = std::max(err, e);
        if (first_bad < 0 && e > 1e-2 * batch_scale) first_bad = S - R + r, bad_batch = b;
      }
  }
  std::printf("B=%lld S=%lld heads=%lld/%lld of %lld: max |dQ long - dQ of the last rows| %.3e of max %.3e; "
              "first row past 1e-2: %lld (batch %lld)\n",
              (long long)B, (long long)S, (long long)h, (long long)hk, (long long)Ht, err, scale,
              (long long)first_bad, (long long)bad_batch);
  EXPECT_LT(first_bad, 0) << "first disagreeing row " << first_bad << " of batch " << bad_batch;
  EXPECT_LE(err, 1e-2 * scale);
  ASSERT_TRUE(cudnn_release_workspace().ok());
}

INSTANTIATE_TEST_SUITE_P(Cases, CudnnLongCall,
                         ::testing::Values(LongCall{1, 786432, 2, 2, 2}, LongCall{1, 524288, 1, 1, 32},
                                           LongCall{1, 786432, 1, 1, 32}, LongCall{1, 786432, 8, 8, 32},
                                           LongCall{1, 65536, 264, 66, 264}, LongCall{2, 393216, 2, 2, 32}),
                         [](const auto& info) {
                           const LongCall& c = info.param;
                           return "B" + std::to_string(c.batch) + "_S" + std::to_string(c.seq) + "_h" +
                                  std::to_string(c.heads) + "_kv" + std::to_string(c.kv_heads) + "_of" +
                                  std::to_string(c.tensor_heads);
                         });

}  // namespace
}  // namespace seqpar
