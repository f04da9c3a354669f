// gemm_algos.cu: a lab (issue 36) that times, for the GEMM shapes the trainer runs, cuBLAS's
// default (cublasGemmEx, what src/model/linear.cu calls) against each algorithm cuBLASLt's
// heuristic offers, to see whether a chosen algorithm saves time where the default does not hide
// an fp32 C read-modify-write (the LM head's dW += G^T X over 1,024-row chunks: 4.2 GB of C a
// chunk for 1.07 TFLOP at hidden 4096). Row-major shapes as gemm_bf16 takes them: C[M, N] = alpha
// op(A) op(B) + beta C, bf16 A and B, fp32 compute. Inputs uniform in [-1, 1) (no constant data:
// tensor cores run cooler on it). One JSON line per (shape, algorithm) on stdout.
// Build: nvcc -O3 -std=c++17 -arch=sm_90a gemm_algos.cu -lcublasLt -lcublas -o gemm_algos
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CK(x)                                                                   \
  do {                                                                          \
    auto e = (x);                                                               \
    if (int(e) != 0) {                                                          \
      std::fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, int(e)); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

__global__ void fill(__nv_bfloat16* x, size_t n, unsigned seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned long long z = (seed + 1) * 0x9E3779B97F4A7C15ull + i;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    x[i] = __float2bfloat16(scale * (float((z >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f));
  }
}

// A hash of C's bits (wrapping sum of word * (index + 1)): equal for the same bits.
__global__ void hash_words(const unsigned* c, size_t n, unsigned long long* out) {
  unsigned long long h = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    h += (unsigned long long)c[i] * (i + 1);
  atomicAdd(out, h);
}
unsigned long long hash_of(const void* c, size_t bytes, unsigned long long* scratch) {
  CK(cudaMemset(scratch, 0, 8));
  hash_words<<<1024, 256>>>(static_cast<const unsigned*>(c), bytes / 4, scratch);
  unsigned long long h = 0;
  CK(cudaMemcpy(&h, scratch, 8, cudaMemcpyDeviceToHost));
  return h;
}

struct Shape {
  std::string name;
  bool ta, tb;
  long M, N, K, lda;  // lda 0: packed
  bool c_f32;
  float beta;
};

// Median of `runs` timed calls after 2 untimed ones.
template <class F>
float median_ms(F f, int runs) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < runs; ++i) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t a) {
  int v = -1;
  size_t got = 0;
  uint32_t u = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, a, &u, sizeof(u), &got) == CUBLAS_STATUS_SUCCESS) v = int(u);
  return v;
}

int main(int argc, char** argv) {
  const int want = argc > 1 ? std::atoi(argv[1]) : 16;  // heuristic results asked for
  const int runs = argc > 2 ? std::atoi(argv[2]) : 5;
  const char* only = argc > 3 ? argv[3] : "";  // a substring of the shape names to run
  std::vector<Shape> shapes;
  for (long hidden : {4096L, 2048L})
    for (long chunk : {1024L, 4096L}) {
      const long V = 128256;
      const std::string tag = "lmhead_h" + std::to_string(hidden) + "_c" + std::to_string(chunk);
      shapes.push_back({tag + "_logits_bf16", false, true, chunk, V, hidden, 0, false, 0.0f});
      shapes.push_back({tag + "_dx", false, false, chunk, hidden, V, V, true, 0.0f});
      shapes.push_back({tag + "_dw_f32_acc", true, false, V, hidden, chunk, V, true, 1.0f});
      shapes.push_back({tag + "_dw_f32_set", true, false, V, hidden, chunk, V, true, 0.0f});
      shapes.push_back({tag + "_dw_bf16_acc", true, false, V, hidden, chunk, V, false, 1.0f});
    }
  // The 1B preset's products at 32K tokens: forward y = x W^T (bf16), dx = dy W (bf16), dW += dy^T x.
  const long T = 32768;
  for (auto [in, out] : {std::pair{2048L, 2048L}, {2048L, 512L}, {2048L, 8192L}, {8192L, 2048L}}) {
    const std::string tag = "1b_" + std::to_string(in) + "x" + std::to_string(out);
    shapes.push_back({tag + "_fwd", false, true, T, out, in, 0, false, 0.0f});
    shapes.push_back({tag + "_dx", false, false, T, in, out, 0, false, 0.0f});
    shapes.push_back({tag + "_dw_f32_acc", true, false, out, in, T, 0, true, 1.0f});
  }
  size_t max_a = 0, max_b = 0, max_c = 0;
  for (auto& s : shapes) {
    const long lda = s.lda ? s.lda : (s.ta ? s.M : s.K);
    max_a = std::max(max_a, size_t(s.ta ? s.K * lda : s.M * lda));
    max_b = std::max(max_b, size_t(s.K * s.N));
    max_c = std::max(max_c, size_t(s.M * s.N) * (s.c_f32 ? 4 : 2));
  }
  __nv_bfloat16 *A, *B;
  void *C, *ws;
  const size_t ws_bytes = 64ull << 20;
  CK(cudaMalloc(&A, max_a * 2));
  CK(cudaMalloc(&B, max_b * 2));
  CK(cudaMalloc(&C, max_c));
  CK(cudaMalloc(&ws, ws_bytes));
  fill<<<2048, 256>>>(A, max_a, 1, 1.0f);
  fill<<<2048, 256>>>(B, max_b, 2, 1.0f);
  CK(cudaMemset(C, 0, max_c));
  unsigned long long* hash_scratch;
  CK(cudaMalloc(&hash_scratch, 8));
  cublasHandle_t h;
  cublasLtHandle_t lt;
  CK(cublasCreate(&h));
  CK(cublasLtCreate(&lt));
  for (auto& s : shapes) {
    if (*only && s.name.find(only) == std::string::npos) continue;
    // cuBLAS is column-major: C^T[N, M] = op(B)^T op(A)^T, as linear.cu's gemm_bf16.
    const int m = int(s.N), n = int(s.M), k = int(s.K);
    const int lda = int(s.lda ? s.lda : (s.ta ? s.M : s.K)), ldb = int(s.tb ? s.K : s.N);
    const cublasOperation_t opa = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cudaDataType_t ct = s.c_f32 ? CUDA_R_32F : CUDA_R_16BF;
    const float alpha = 1.0f, beta = s.beta;
    const double flop = 2.0 * double(s.M) * double(s.N) * double(s.K);
    const size_t c_bytes = size_t(s.M * s.N) * (s.c_f32 ? 4 : 2);
    unsigned long long first_hash = 0;
    bool same = false;
    auto line = [&](const char* how, int idx, float ms, const cublasLtMatmulAlgo_t* algo) {
      std::printf("{\"shape\":\"%s\",\"M\":%ld,\"N\":%ld,\"K\":%ld,\"how\":\"%s\",\"idx\":%d,\"ms\":%.4f,\"tflops\":%.1f",
                  s.name.c_str(), s.M, s.N, s.K, how, idx, ms, flop / ms / 1e9);
      if (algo)
        std::printf(",\"algo\":%d,\"tile\":%d,\"stages\":%d,\"splitk\":%d,\"swizzle\":%d,\"custom\":%d,\"cluster\":%d",
                    attr(*algo, CUBLASLT_ALGO_CONFIG_ID), attr(*algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                    attr(*algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), attr(*algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                    attr(*algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING), attr(*algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
                    attr(*algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
      if (algo) std::printf(",\"same_bits_as_first\":%s", same ? "true" : "false");
      std::printf("}\n");
      std::fflush(stdout);
    };
    const float t_def = median_ms(
        [&] {
          CK(cublasGemmEx(h, opa, opb, m, n, k, &alpha, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta, C, ct, m,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        },
        runs);
    line("cublasGemmEx", -1, t_def, nullptr);
    cublasLtMatmulDesc_t desc;
    CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    cublasLtMatrixLayout_t la, lb, lc;
    CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, opa == CUBLAS_OP_N ? m : k, opa == CUBLAS_OP_N ? k : m, ldb));
    CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, opb == CUBLAS_OP_N ? k : n, opb == CUBLAS_OP_N ? n : k, lda));
    CK(cublasLtMatrixLayoutCreate(&lc, ct, m, n, m));
    for (size_t wsb : {size_t(32) << 20, ws_bytes}) {
      cublasLtMatmulPreference_t pref;
      CK(cublasLtMatmulPreferenceCreate(&pref));
      CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
      std::vector<cublasLtMatmulHeuristicResult_t> res(static_cast<size_t>(want));
      int got = 0;
      CK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, want, res.data(), &got));
      for (int i = 0; i < got; ++i) {
        auto call = [&] {
          CK(cublasLtMatmul(lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &res[size_t(i)].algo, ws, wsb,
                            nullptr));
        };
        const float t = median_ms(call, runs);
        CK(cudaMemset(C, 0, c_bytes));  // the bits of one call from zeros, against the first candidate's
        call();
        const unsigned long long hsh = hash_of(C, c_bytes, hash_scratch);
        if (i == 0) first_hash = hsh;
        same = hsh == first_hash;
        line(wsb == ws_bytes ? "lt_ws64" : "lt_ws32", i, t, &res[size_t(i)].algo);
      }
      CK(cublasLtMatmulPreferenceDestroy(pref));
      if (*only == 0) break;  // the 64 MiB workspace only when one shape family is asked for
    }
    CK(cublasLtMatrixLayoutDestroy(la));
    CK(cublasLtMatrixLayoutDestroy(lb));
    CK(cublasLtMatrixLayoutDestroy(lc));
    CK(cublasLtMatmulDescDestroy(desc));
  }
  return 0;
}
