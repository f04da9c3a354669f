// The model's one product (every linear layer and the LM head): row-major C[M, N] = alpha op(A)
// op(B) + beta C with bf16 A and B, C in fp32 or bf16, fp32 compute, through cuBLASLt with its
// algorithm chosen per shape by timing. Why: cuBLAS's default (cublasGemmEx) leaves up to 1.3x on
// shapes the trainer runs (dev/cublaslt_algos/README.md, one H200: the LM head's fp32
// dW += G^T X over 1,024-row chunks 2.27 -> 1.73 ms, its first heuristic 2.24; the 1B's
// 2048 x 2048 products 1.14x). Candidates: cuBLASLt's heuristic's, less those that split K and
// those whose bits differ from the first's on a corner of the product (keep_first_bits), so the
// choice moves time, not results (tested: ModelCuda.TunedProductsGiveEveryCandidatesBits and the
// LM head's loss with and without its gradient). The first kRounds x n calls of a shape run the n
// candidates in turn, each timed by events on the caller's stream (no host wait); the first call
// after they have all finished fixes the fastest. SEQPAR_GEMM=cublas keeps cublasGemmEx, =first
// takes the heuristic's first candidate (A/B runs). Plans are per thread (a rank is a thread).
#include <cublasLt.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/cuda_common.cuh"
#include "seqpar/gpu.hpp"

namespace seqpar::model::cuda {

cublasHandle_t cublas_for(void* stream) {
  thread_local cublasHandle_t handle = nullptr;
  if (!handle && cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return nullptr;
  cublasSetStream(handle, as_stream(stream));
  return handle;
}

namespace {

enum class GemmMode { kTuned, kFirst, kCublas };
GemmMode gemm_mode() {
  static const GemmMode mode = [] {
    const char* e = std::getenv("SEQPAR_GEMM");
    if (e && std::strcmp(e, "cublas") == 0) return GemmMode::kCublas;
    if (e && std::strcmp(e, "first") == 0) return GemmMode::kFirst;
    return GemmMode::kTuned;
  }();
  return mode;
}

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's own default on Hopper
constexpr int kMaxCandidates = 8;
constexpr int kRounds = 2;  // each candidate timed twice, its faster time kept

struct ShapeKey {
  bool ta, tb;
  int64_t M, N, K, lda;
  cudaDataType_t ctype;
  bool accumulate;  // beta != 0: C is read (its traffic is part of what is timed)
  int align;        // the pointers' common alignment in bytes, at most 256 (the algorithms differ)
  bool operator==(const ShapeKey& o) const {
    return ta == o.ta && tb == o.tb && M == o.M && N == o.N && K == o.K && lda == o.lda &&
           ctype == o.ctype && accumulate == o.accumulate && align == o.align;
  }
};
struct ShapeHash {
  size_t operator()(const ShapeKey& k) const {
    size_t h = std::hash<int64_t>()(k.M);
    for (int64_t v : {k.N, k.K, k.lda, int64_t(k.ctype), int64_t(k.align),
                      int64_t(k.ta) | int64_t(k.tb) << 1 | int64_t(k.accumulate) << 2})
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};

// One algorithm cuBLASLt offers (wrapped: nvcc 13.0 fails on a vector of the bare C struct).
struct Candidate {
  cublasLtMatmulAlgo_t algo;
};

// A shape's descriptors and candidates, and where its trials stand. Kept for the thread's life
// (a few hundred bytes a shape; the model has a handful of shapes).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLAS's column-major operands
  std::vector<Candidate> algos;                                  // empty: cublasGemmEx does it
  std::vector<cudaEvent_t> marks;  // start and stop of each trial call, in trial order
  int trials = 0;                  // trial calls issued
  int chosen = -1;                 // the algorithm once fixed
};

struct ThreadGemm {
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  DeviceBuffer probe;  // keep_first_bits' corner of C
  std::unordered_map<ShapeKey, Plan, ShapeHash> plans;
  int forced = -1;  // a test's candidate (ScopedGemmCandidate)
};
ThreadGemm& thread_gemm() {
  thread_local ThreadGemm g;
  return g;
}

int alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  return v == 0 ? 256 : int(std::min<uintptr_t>(256, v & (~v + 1)));
}

int split_k(const cublasLtMatmulAlgo_t& algo) {
  int32_t v = 1;
  size_t got = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &v, sizeof(v),
                                           &got) != CUBLAS_STATUS_SUCCESS)
    return 1;
  return v;
}

// cuBLAS's column-major operands of the shape's product, C^T[N, M] = op(B)^T op(A)^T, for the
// first m columns and n rows of C^T (the whole product: m = N, n = M), with the shape's strides.
bool make_layouts(const ShapeKey& k, uint64_t m, uint64_t n, cublasLtMatrixLayout_t* a,
                  cublasLtMatrixLayout_t* b, cublasLtMatrixLayout_t* c) {
  const uint64_t kk = uint64_t(k.K);
  const int64_t ldb = k.tb ? k.K : k.N;  // B as gemm_bf16 names it (cuBLAS's first operand)
  return cublasLtMatrixLayoutCreate(a, CUDA_R_16BF, k.tb ? kk : m, k.tb ? m : kk, ldb) ==
             CUBLAS_STATUS_SUCCESS &&
         cublasLtMatrixLayoutCreate(b, CUDA_R_16BF, k.ta ? n : kk, k.ta ? kk : n, k.lda) ==
             CUBLAS_STATUS_SUCCESS &&
         cublasLtMatrixLayoutCreate(c, k.ctype, m, n, int64_t(m)) == CUBLAS_STATUS_SUCCESS;
}

// The shape's descriptors and candidates from cuBLASLt's heuristic (none: the plan stays empty).
Plan make_plan(ThreadGemm& g, const ShapeKey& k) {
  Plan p;
  const cublasOperation_t opa = k.tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                          opb = k.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS)
    return p;
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa));
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb));
  if (!make_layouts(k, uint64_t(k.N), uint64_t(k.M), &p.a, &p.b, &p.c)) return p;
  cublasLtMatmulPreference_t pref = nullptr;
  if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return p;
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t align = uint32_t(k.align);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
  cublasLtMatmulHeuristicResult_t found[kMaxCandidates];
  int count = 0;
  if (cublasLtMatmulAlgoGetHeuristic(g.handle, p.desc, p.a, p.b, p.c, p.c, pref, kMaxCandidates,
                                     found, &count) == CUBLAS_STATUS_SUCCESS)
    for (int i = 0; i < count; ++i)
      if (found[i].state == CUBLAS_STATUS_SUCCESS && found[i].workspaceSize <= ws &&
          split_k(found[i].algo) == 1)
        p.algos.push_back(Candidate{found[i].algo});
  cublasLtMatmulPreferenceDestroy(pref);
  return p;
}

// Keeps the candidates whose sums round as the first's: each computes a corner of the product
// (at most 128 x 128 of C, the whole K, from the caller's A and B) into scratch, and those whose
// bits differ are dropped, so that the timed choice moves time, never a result (on one H200 the
// large shapes' candidates all agree; a 16-row one of the tests' did not). One host wait, on the
// shape's first call; none while the stream is captured into a graph (then the first alone).
Status keep_first_bits(ThreadGemm& g, Plan& p, const ShapeKey& k, const void* A, const void* B,
                       cudaStream_t s) {
  if (p.algos.size() < 2) return Status::Ok();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    p.algos.resize(1);
    return Status::Ok();
  }
  const uint64_t m = uint64_t(std::min<int64_t>(k.N, 128)),
                 n = uint64_t(std::min<int64_t>(k.M, 128));
  const size_t bytes = size_t(m * n) * (k.ctype == CUDA_R_32F ? 4 : 2);
  SP_RETURN_IF_ERROR(g.probe.reserve(bytes));
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  const bool made = make_layouts(k, m, n, &a, &b, &c);
  std::vector<char> first(bytes), got(bytes);
  std::vector<Candidate> kept;
  const float alpha = 1.0f, beta = k.accumulate ? 1.0f : 0.0f;
  for (size_t i = 0; made && i < p.algos.size(); ++i) {
    SP_CUDA_CHECK(cudaMemsetAsync(g.probe.data(), 0, bytes, s));
    if (cublasLtMatmul(g.handle, p.desc, &alpha, B, a, A, b, &beta, g.probe.data(), c,
                       g.probe.data(), c, &p.algos[i].algo, g.workspace.data(), kWorkspaceBytes,
                       s) != CUBLAS_STATUS_SUCCESS)
      continue;  // not for the corner: not tried
    SP_CUDA_CHECK(cudaMemcpyAsync(i == 0 ? first.data() : got.data(), g.probe.data(), bytes,
                                  cudaMemcpyDeviceToHost, s));
    SP_CUDA_CHECK(cudaStreamSynchronize(s));
    if (i == 0 || std::memcmp(first.data(), got.data(), bytes) == 0) kept.push_back(p.algos[i]);
    if (kept.empty()) break;  // the first failed on the corner: it alone stays
  }
  for (auto* l : {a, b, c})
    if (l) cublasLtMatrixLayoutDestroy(l);
  if (kept.empty()) kept.push_back(p.algos[0]);
  p.algos = std::move(kept);
  return Status::Ok();
}

// Which candidate runs this call, and whether it is a timed trial.
int pick(Plan& p, cudaStream_t stream, bool* timed) {
  *timed = false;
  const int n = int(p.algos.size());
  if (p.chosen >= 0) return p.chosen;
  if (n == 1) return p.chosen = 0;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone)
    return 0;
  if (p.trials < kRounds * n) {
    *timed = true;
    return p.trials % n;
  }
  for (cudaEvent_t e : p.marks)
    if (cudaEventQuery(e) != cudaSuccess) {
      if (cudaPeekAtLastError() == cudaErrorNotReady)
        (void)cudaGetLastError();  // not an error: not yet
      return 0;
    }
  std::vector<float> best(size_t(n), 1e30f);
  for (int t = 0; t < kRounds * n; ++t) {
    float ms = 1e30f;
    if (cudaEventElapsedTime(&ms, p.marks[size_t(2 * t)], p.marks[size_t(2 * t + 1)]) ==
        cudaSuccess)
      best[size_t(t % n)] = std::min(best[size_t(t % n)], ms);
  }
  for (cudaEvent_t e : p.marks) cudaEventDestroy(e);
  p.marks.clear();
  p.chosen = 0;
  for (int i = 1; i < n; ++i)
    if (best[size_t(i)] < best[size_t(p.chosen)]) p.chosen = i;
  return p.chosen;
}

Status gemm_cublas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16_t* A,
                   const bf16_t* B, float beta, void* C, cudaDataType_t ctype, void* stream,
                   int64_t lda) {
  cublasHandle_t h = cublas_for(stream);
  SP_CHECK_ARG(h != nullptr, "cannot create a cuBLAS handle");
  const int ldb = int(tb ? K : N);
  SP_CUBLAS_CHECK(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                               int(N), int(M), int(K), &alpha, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF,
                               int(lda), &beta, C, ctype, int(N), CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
  return Status::Ok();
}

// The shape's plan (made on first use), or nullptr where cuBLASLt has no candidate.
StatusOr<Plan*> plan_for(ThreadGemm& g, const ShapeKey& key, const void* A, const void* B,
                         cudaStream_t s) {
  if (!g.handle) {
    SP_CUBLAS_CHECK(cublasLtCreate(&g.handle));
  }
  auto it = g.plans.find(key);
  if (it != g.plans.end()) return it->second.algos.empty() ? nullptr : &it->second;
  SP_RETURN_IF_ERROR(g.workspace.reserve(kWorkspaceBytes));
  Plan& p = g.plans.emplace(key, make_plan(g, key)).first->second;
  if (p.algos.empty()) return static_cast<Plan*>(nullptr);
  if (gemm_mode() != GemmMode::kTuned) {
    p.algos.resize(1);
    return &p;
  }
  // A failed check leaves the first candidate alone, none unchecked.
  const Status checked = keep_first_bits(g, p, key, A, B, s);
  if (!checked.ok()) p.algos.resize(1);
  SP_RETURN_IF_ERROR(checked);
  return &p;
}

ShapeKey key_of(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, const void* A,
                const void* B, float beta, const void* C, cudaDataType_t ctype) {
  const int align = std::min({alignment(A), alignment(B), alignment(C)});
  return {ta, tb, M, N, K, lda, ctype, beta != 0.0f, align};
}

}  // namespace

ScopedGemmCandidate::ScopedGemmCandidate(int candidate) : saved_(thread_gemm().forced) {
  thread_gemm().forced = candidate;
}
ScopedGemmCandidate::~ScopedGemmCandidate() {
  thread_gemm().forced = saved_;
}

int gemm_candidates_max() {
  int most = 0;
  for (const auto& entry : thread_gemm().plans)
    most = std::max(most, int(entry.second.algos.size()));
  return most;
}

Status gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16_t* A,
                 const bf16_t* B, float beta, void* C, cudaDataType_t ctype, void* stream,
                 int64_t lda_a) {
  const int64_t lda = lda_a > 0 ? lda_a : ta ? M : K;
  ThreadGemm& g = thread_gemm();
  if (gemm_mode() == GemmMode::kCublas || M == 0 || N == 0 || K == 0)
    return gemm_cublas(ta, tb, M, N, K, alpha, A, B, beta, C, ctype, stream, lda);
  const cudaStream_t s = as_stream(stream);
  SP_ASSIGN_OR_RETURN(Plan * p,
                      plan_for(g, key_of(ta, tb, M, N, K, lda, A, B, beta, C, ctype), A, B, s));
  if (!p) return gemm_cublas(ta, tb, M, N, K, alpha, A, B, beta, C, ctype, stream, lda);
  bool timed = false;
  const int i = g.forced >= 0 ? std::min(g.forced, int(p->algos.size()) - 1) : pick(*p, s, &timed);
  if (timed) {
    cudaEvent_t mark[2];
    for (auto& e : mark) SP_CUDA_CHECK(cudaEventCreate(&e));
    p->marks.insert(p->marks.end(), mark, mark + 2);
    SP_CUDA_CHECK(cudaEventRecord(mark[0], s));
  }
  SP_CUBLAS_CHECK(cublasLtMatmul(g.handle, p->desc, &alpha, B, p->a, A, p->b, &beta, C, p->c, C,
                                 p->c, &p->algos[size_t(i)].algo, g.workspace.data(),
                                 kWorkspaceBytes, s));
  if (timed) {
    SP_CUDA_CHECK(cudaEventRecord(p->marks.back(), s));
    ++p->trials;
  }
  return Status::Ok();
}

}  // namespace seqpar::model::cuda
