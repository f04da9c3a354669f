// `seqpar attn`: builds the problem, runs ring attention forward + backward on every rank,
// gathers the results on rank 0, checks them against the fp64 oracle (every row, or sampled
// rows when the problem is too large), and prints a table and optionally one JSON object.
#include "attn_command.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#ifdef SEQPAR_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "npy.hpp"
#include "seqpar/burst.hpp"
#include "seqpar/distributed_attention.hpp"
#include "seqpar/gpu.hpp"
#include "seqpar/gpu_ring.hpp"
#include "seqpar/nccl_comm.hpp"
#include "seqpar/ring.hpp"

namespace seqpar::app {
namespace {

using Clock = std::chrono::steady_clock;

// Problems with at most this many score-FLOPs (B H S^2 D) are checked on every row; up to
// the second limit on sampled rows (the oracle's fp64 forward still covers every row); above
// it --check auto skips the oracle.
constexpr double kFullCheckLimit = 2.0e9;
constexpr double kSampledCheckLimit = 2.0e12;
// bf16/fp16 on GPUs: the tool passes results within this fraction of the reference's largest
// value (the test suite holds the kernels to the stricter bf16 rule of CONVENTIONS.md).
constexpr double kLowPrecisionRelativeTolerance = 1e-2;
// --check single: O, dQ, dK, dV pass within kLowPrecisionRelativeTolerance of the single-GPU
// result in relative Frobenius norm (a block missed or counted twice moves whole rows, far
// beyond bf16 rounding); the fp32 LSE, computed from the same bf16 inputs, within this much.
constexpr double kSingleLseTolerance = 1e-3;

struct Job {
  AttnOptions opt;
  DType dtype = DType::kF32;
  MaskSpec mask;
  int64_t kv_heads = 0;
  int ranks = 1;
  int threads_per_rank = 1;
  std::string comm_backend;
};

enum TensorId : uint64_t { kQ = 1, kK, kV, kDout };

// Uniform in [-1, 1), a pure function of (seed, tensor, global index): every rank generates
// its own rows, and the checker regenerates the global tensors, without any communication.
double hashed_uniform(uint64_t seed, uint64_t tensor, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + tensor * 0xD1B54A32D192ED03ull + index;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

// Fills a [B, n, H, D] tensor; local row i is global row positions[i] (all rows when null).
HostTensor make_input(const Job& job, TensorId id, int64_t heads,
                      const std::vector<int64_t>* positions) {
  const int64_t B = job.opt.batch, S = job.opt.seq, D = job.opt.head_dim;
  const int64_t n = positions ? static_cast<int64_t>(positions->size()) : S;
  HostTensor out(job.dtype, {B, n, heads, D});
  const size_t es = dtype_size(job.dtype);
#pragma omp parallel
  {
    std::vector<double> row(static_cast<size_t>(D));  // one head's row, converted into place
#pragma omp for collapse(2)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = positions ? (*positions)[i] : i;
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t d = 0; d < D; ++d) row[d] = hashed_uniform(job.opt.seed, id, ((b * S + t) * heads + h) * D + d);
          convert(row.data(), DType::kF64, static_cast<char*>(out.view().data) + ((b * n + i) * heads + h) * D * es,
                  job.dtype, D);
        }
      }
  }
  return out;
}

// Visible (query, key) pairs under the mask, for FLOP counts: O(S) per batch entry.
double visible_pairs(const MaskSpec& mask, int64_t S) {
  double total = 0;
  for (int64_t i = 0; i < S; ++i) {
    int64_t lo = 0, hi = S - 1;
    if (mask.window_left >= 0) lo = std::max(lo, i - mask.window_left);
    if (mask.window_right >= 0) hi = std::min(hi, i + mask.window_right);
    if (mask.has_documents()) {
      const auto& o = mask.doc_offsets;
      const auto it = std::upper_bound(o.begin(), o.end(), i);
      lo = std::max(lo, *(it - 1));
      hi = std::min(hi, *it - 1);
    }
    total += std::max<int64_t>(0, hi - lo + 1);
  }
  return total;
}

// Gathers every rank's [.., S_r, ..] tensor (sequence along seq_dim) into the global tensor on
// rank 0 (the only one that checks or dumps; a million-token result is tens of GiB). Shards
// are padded to the longest one.
Status gather_on_rank0(Communicator& comm, const Layout& layout, const HostTensor& local,
                       int seq_dim, HostTensor* global) {
  const TensorView& lv = local.view();
  std::vector<int64_t> padded_shape(lv.shape.begin(), lv.shape.begin() + lv.ndim);
  padded_shape[seq_dim] = layout.max_local_len();
  HostTensor padded(lv.dtype, padded_shape);
  TensorView rows = padded.view();
  rows.shape[seq_dim] = lv.shape[seq_dim];
  // Copy the local rows into the padded buffer through a one-rank layout (an identity map).
  SP_ASSIGN_OR_RETURN(const Layout identity,
                      Layout::create(LayoutKind::kContiguous, lv.shape[seq_dim], 1));
  SP_RETURN_IF_ERROR(identity.unshard(lv, seq_dim, 0, rows));
  const int P = comm.size();
  if (comm.rank() != 0) {
    const SendSpec to_root{0, padded.view().data, padded.bytes()};
    return comm.exchange({&to_root, 1}, {});
  }
  // One peer at a time: a GPU communicator stages what it receives in device memory.
  std::vector<HostTensor> blocks(P);
  for (int r = 1; r < P; ++r) {
    blocks[r] = HostTensor(lv.dtype, padded_shape);
    const RecvSpec from{r, blocks[r].view().data, padded.bytes()};
    SP_RETURN_IF_ERROR(comm.exchange({}, {&from, 1}));
  }
  blocks[0] = std::move(padded);
  std::vector<int64_t> global_shape = padded_shape;
  global_shape[seq_dim] = layout.seq_len();
  *global = HostTensor(lv.dtype, global_shape);
  for (int r = 0; r < P; ++r) {
    TensorView block = blocks[r].view();
    block.shape[seq_dim] = layout.local_len(r);
    SP_RETURN_IF_ERROR(layout.unshard(block, seq_dim, r, global->view()));
    blocks[r] = HostTensor();
  }
  return Status::Ok();
}

// --check rows: O, LSE and dQ of the global query `rows`, each from the rank that holds it, as
// fp64 [B, R, H, D], [B, H, R] and [B, R, H, D] tensors on every rank. Each rank fills the rows
// it holds and an all-reduce sums them (a row has one owner): O(R) bytes move, so results of
// millions of tokens stay where they are.
Status rows_from_owners(Communicator& comm, const Layout& layout, const std::vector<int64_t>& rows,
                        const HostTensor& out, const HostTensor& lse, const HostTensor& dq, HostTensor* o_rows,
                        HostTensor* lse_rows, HostTensor* dq_rows) {
  const TensorView& ov = out.view();
  const int64_t B = ov.shape[0], n = ov.shape[1], H = ov.shape[2], D = ov.shape[3];
  const int64_t R = static_cast<int64_t>(rows.size()), block = B * R * H * D;
  std::vector<double> buf(size_t(2 * block + B * H * R), 0.0);  // O, dQ, LSE
  std::unordered_map<int64_t, int64_t> wanted;  // global row -> its place in `rows`
  for (int64_t r = 0; r < R; ++r) wanted[rows[r]] = r;
  const std::vector<int64_t>& mine = layout.positions(comm.rank());  // local row i is global mine[i]
  const TensorView& dqv = dq.view();
  const size_t es = dtype_size(ov.dtype), dq_es = dtype_size(dqv.dtype), lse_es = dtype_size(lse.view().dtype);
  for (int64_t i = 0; i < n; ++i) {
    const auto found = wanted.find(mine[i]);
    if (found == wanted.end()) continue;
    const int64_t r = found->second;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t from = ((b * n + i) * H + h) * D, to = ((b * R + r) * H + h) * D;
        convert(static_cast<const char*>(ov.data) + from * es, ov.dtype, &buf[to], DType::kF64, D);
        convert(static_cast<const char*>(dqv.data) + from * dq_es, dqv.dtype, &buf[block + to], DType::kF64, D);
        convert(static_cast<const char*>(lse.view().data) + ((b * H + h) * n + i) * lse_es, lse.view().dtype,
                &buf[2 * block + (b * H + h) * R + r], DType::kF64, 1);
      }
  }
  SP_RETURN_IF_ERROR(comm.all_reduce(buf.data(), buf.size(), DType::kF64, ReduceOp::kSum));
  *o_rows = HostTensor(DType::kF64, {B, R, H, D});
  *dq_rows = HostTensor(DType::kF64, {B, R, H, D});
  *lse_rows = HostTensor(DType::kF64, {B, H, R});
  std::copy(buf.begin(), buf.begin() + block, o_rows->data<double>());
  std::copy(buf.begin() + block, buf.begin() + 2 * block, dq_rows->data<double>());
  std::copy(buf.begin() + 2 * block, buf.end(), lse_rows->data<double>());
  return Status::Ok();
}

HostTensor to_f64(const HostTensor& t) {
  HostTensor f64(DType::kF64, std::vector<int64_t>(t.view().shape.begin(), t.view().shape.begin() + t.view().ndim));
  convert(t.view().data, t.view().dtype, f64.view().data, DType::kF64, t.numel());
  return f64;
}

// max |a - b| over the given rows (sequence along seq_dim; every row when none are given);
// equal infinities count as 0. `got` is contiguous; `want` is fp64, of the same shape, or with
// want_compact of the given rows alone in list order (the query-side oracle's layout). Only
// the given rows are read: a million-token tensor checked on 16 rows converts just those.
double max_error_on_rows(const HostTensor& got, const HostTensor& want, int seq_dim,
                         const std::vector<int64_t>& rows, bool want_compact = false) {
  const TensorView& v = got.view();
  const int64_t S = v.shape[seq_dim], inner = v.strides[seq_dim], outer = got.numel() / (S * inner);
  std::vector<int64_t> chosen = rows;
  if (chosen.empty())
    for (int64_t r = 0; r < S; ++r) chosen.push_back(r);
  const int64_t count = static_cast<int64_t>(chosen.size());
  const double* y = want.data<double>();
  double worst = 0;
#pragma omp parallel reduction(max : worst)
  {
    std::vector<double> x(inner);  // one row, converted; per thread (an LSE row is one value)
#pragma omp for collapse(2) schedule(static)
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t r = 0; r < count; ++r) {
        const int64_t base = (o * S + chosen[r]) * inner;
        const double* w = y + (want_compact ? (o * count + r) * inner : base);
        convert(static_cast<const char*>(v.data) + base * dtype_size(v.dtype), v.dtype, x.data(), DType::kF64,
                inner);
        for (int64_t e = 0; e < inner; ++e) {
          if (x[e] == w[e]) continue;
          const double d = std::abs(x[e] - w[e]);
          worst = std::isnan(d) ? INFINITY : std::max(worst, d);
        }
      }
  }
  return worst;
}

// ||got - want|| / ||want|| (Frobenius) of two [B, S, H, D] tensors of any dtypes, in total and
// per block of rows x heads, so that a disagreement shows where it lies (a zigzag chunk, a head
// group). Rows are converted one at a time: million-token tensors need no fp64 copies. NaN
// makes an error infinite.
struct BlockErrors {
  int64_t row_block = 0, head_block = 0;  // block sizes
  int row_blocks = 0, head_blocks = 0;
  std::vector<double> diff2, ref2;  // per block, row-block major
  static double ratio(double d2, double r2) {
    return std::isnan(d2) ? INFINITY : std::sqrt(d2) / std::max(std::sqrt(r2), 1e-30);
  }
  double total() const {
    double d = 0, r = 0;
    for (size_t i = 0; i < diff2.size(); ++i) d += diff2[i], r += ref2[i];
    return ratio(d, r);
  }
  double at(int rb, int hb) const { return ratio(diff2[rb * head_blocks + hb], ref2[rb * head_blocks + hb]); }
};

BlockErrors relative_errors(const HostTensor& got, const HostTensor& want, int row_blocks, int head_blocks) {
  const TensorView& g = got.view();
  const int64_t B = g.shape[0], S = g.shape[1], H = g.shape[2], D = g.shape[3];
  BlockErrors e;
  e.row_block = (S + row_blocks - 1) / row_blocks, e.head_block = (H + head_blocks - 1) / head_blocks;
  e.row_blocks = int((S + e.row_block - 1) / e.row_block), e.head_blocks = int((H + e.head_block - 1) / e.head_block);
  e.diff2.assign(size_t(e.row_blocks) * e.head_blocks, 0.0);
  e.ref2 = e.diff2;
  // The elements of one row's block of heads: [first, first + n) of the row's H * D.
  const auto at = [&](const HostTensor& t, int64_t row, int64_t first) {
    return static_cast<const char*>(t.view().data) + (row * H * D + first) * dtype_size(t.view().dtype);
  };
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int rb = 0; rb < e.row_blocks; ++rb)
    for (int hb = 0; hb < e.head_blocks; ++hb) {
      const int64_t first = hb * e.head_block * D, n = (std::min(H, (hb + 1) * e.head_block) - hb * e.head_block) * D;
      std::vector<double> a(n), b(n);
      double d2 = 0, r2 = 0;
      for (int64_t bi = 0; bi < B; ++bi)
        for (int64_t i = rb * e.row_block; i < std::min(S, (rb + 1) * e.row_block); ++i) {
          convert(at(got, bi * S + i, first), g.dtype, a.data(), DType::kF64, n);
          convert(at(want, bi * S + i, first), want.view().dtype, b.data(), DType::kF64, n);
          for (int64_t x = 0; x < n; ++x) {
            d2 += (a[x] - b[x]) * (a[x] - b[x]);
            r2 += b[x] * b[x];
          }
        }
      e.diff2[rb * e.head_blocks + hb] = d2, e.ref2[rb * e.head_blocks + hb] = r2;
    }
  return e;
}

std::vector<int64_t> sample_rows(int64_t S, int64_t count, uint64_t seed) {
  if (count >= S) return {};
  std::vector<int64_t> rows{0, S - 1};
  for (int64_t i = 1; i + 1 < count / 2; ++i) rows.push_back(i * (S - 1) / (count / 2));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, S - 1);
  while (static_cast<int64_t>(rows.size()) < count) rows.push_back(pick(rng));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// The query rows the oracle-row checks (--check rows, and single's oracle) compare: sampled,
// or every row when as many are asked for.
std::vector<int64_t> checked_query_rows(const AttnOptions& o) {
  std::vector<int64_t> rows = sample_rows(o.seq, o.sample_rows, o.seed + 1);
  if (rows.empty())
    for (int64_t i = 0; i < o.seq; ++i) rows.push_back(i);
  return rows;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f %s", b, units[u]);
  return buf;
}

// Progress lines go to stderr so stdout stays the table and the JSON.
// Each line carries the seconds since the first one, so a long run shows where its time goes.
void progress(const std::string& text) {
  static const auto start = Clock::now();
  std::fprintf(stderr, "[seqpar %7.1f s] %s\n", std::chrono::duration<double>(Clock::now() - start).count(),
               text.c_str());
}

// What one rank computed: its shard of every output (host memory) and the pass times.
struct RankOutputs {
  HostTensor out, lse, dq, dk, dv;
  double times[2] = {0, 0};
  RingStats fwd_stats;
  int head_groups = 1;
};

// This rank's rows of q, k, v and dO (all rows on a one-rank layout).
struct Inputs {
  HostTensor q, k, v, dout;
};

Inputs local_inputs(const Job& job, const Layout& layout, int rank) {
  const std::vector<int64_t>* rows = &layout.positions(rank);
  return {make_input(job, kQ, job.opt.heads, rows), make_input(job, kK, job.kv_heads, rows),
          make_input(job, kV, job.kv_heads, rows), make_input(job, kDout, job.opt.heads, rows)};
}

// How blocks travel between CPU ranks: every tensor in the compute dtype, the pack carries D.
BlockBytes cpu_block_bytes(const Job& job) {
  return {job.opt.batch, job.opt.heads, job.kv_heads, job.opt.head_dim, job.dtype, job.dtype, job.dtype, true};
}

// Forward + backward on CPU ranks (fp32/fp64 host tensors), through the single algorithm API.
Status compute_cpu(Communicator& comm, const Job& job, const AttentionPlan& plan, const Inputs& in,
                   RankOutputs* r) {
  const AttnOptions& o = job.opt;
  const int me = comm.rank();
  const int64_t B = o.batch, H = o.heads, Hkv = job.kv_heads, D = o.head_dim, n = plan.layout.local_len(me);
  const DType t = job.dtype;
  r->out = HostTensor(t, {B, n, H, D});
  r->lse = HostTensor(t, {B, H, n});
  r->dq = HostTensor(t, {B, n, H, D});
  r->dk = HostTensor(t, {B, n, Hkv, D});
  r->dv = HostTensor(t, {B, n, Hkv, D});
  const ShardTensors tensors{in.q.view(), in.k.view(), in.v.view(), r->out.view(), r->lse.view(),
                             in.dout.view(), r->dq.view(), r->dk.view(), r->dv.view()};
  SP_RETURN_IF_ERROR(comm.barrier());
  auto t0 = Clock::now();
  PassStats stats;
  SP_RETURN_IF_ERROR(run_forward_cpu(comm, plan, tensors, &stats));
  r->fwd_stats.pairs_computed = stats.pairs_computed;
  r->fwd_stats.pairs_skipped = plan.layout.ranks() - stats.pairs_computed;
  r->times[0] = std::chrono::duration<double>(Clock::now() - t0).count();
  SP_RETURN_IF_ERROR(comm.barrier());
  if (me == 0) progress("running backward");
  t0 = Clock::now();
  SP_RETURN_IF_ERROR(run_backward_cpu(comm, plan, tensors));
  r->times[1] = std::chrono::duration<double>(Clock::now() - t0).count();
  return Status::Ok();
}

// Forward + backward on GPU ranks (bf16/fp16 device tensors), results copied to the host.
// `in` is released as it is uploaded unless keep_inputs (the single-GPU check's whole inputs,
// which the oracle reads afterwards); `who` prefixes the progress lines.
Status compute_cuda(Communicator& comm, const Job& job, const Layout& layout,
                    const AttentionParams& params, BackwardSchedule schedule, Inputs& in,
                    bool keep_inputs, const std::string& who, RankOutputs* r) {
#ifndef SEQPAR_HAVE_CUDA
  (void)comm, (void)job, (void)layout, (void)params, (void)schedule, (void)in, (void)keep_inputs,
      (void)who, (void)r;
  return SP_STATUS(StatusCode::kUnsupported, "seqpar was built without CUDA");
#else
  const AttnOptions& o = job.opt;
  const int me = comm.rank();
  const int64_t B = o.batch, H = o.heads, Hkv = job.kv_heads, D = o.head_dim, n = layout.local_len(me);
  const DType t = job.dtype;
  auto upload = [&](HostTensor& host) -> StatusOr<DeviceTensor> {
    auto dev = to_device(host);
    if (!keep_inputs) host = HostTensor();
    return dev;
  };
  SP_ASSIGN_OR_RETURN(DeviceTensor q, upload(in.q));
  SP_ASSIGN_OR_RETURN(DeviceTensor k, upload(in.k));
  SP_ASSIGN_OR_RETURN(DeviceTensor v, upload(in.v));
  SP_ASSIGN_OR_RETURN(DeviceTensor dout, upload(in.dout));
  SP_ASSIGN_OR_RETURN(DeviceTensor out, device_zeros(t, {B, n, H, D}));
  SP_ASSIGN_OR_RETURN(DeviceTensor lse, device_zeros(DType::kF32, {B, H, n}));
  SP_ASSIGN_OR_RETURN(DeviceTensor dq, device_zeros(t, {B, n, H, D}));
  SP_ASSIGN_OR_RETURN(DeviceTensor dk, device_zeros(t, {B, n, Hkv, D}));
  SP_ASSIGN_OR_RETURN(DeviceTensor dv, device_zeros(t, {B, n, Hkv, D}));
  GpuRingOptions options;
  options.head_groups = o.head_groups;
  options.max_call_rows = o.max_call_rows;
  GpuRingContext ctx(options);
  cudaStream_t stream = nullptr;  // a stream of our own, ordered only by explicit events
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
    return SP_STATUS(StatusCode::kInternal, "cannot create a CUDA stream");
  struct StreamOwner {
    cudaStream_t s;
    ~StreamOwner() {
      if (!device_abandoned()) (void)cudaStreamDestroy(s);
    }
  } owner{stream};
  // The uploads and zeroing above ran on the legacy stream, which ours does not wait for.
  if (cudaDeviceSynchronize() != cudaSuccess)
    return SP_STATUS(StatusCode::kInternal, "CUDA error while preparing the inputs");
  SP_RETURN_IF_ERROR(comm.barrier());
  auto t0 = Clock::now();
  SP_RETURN_IF_ERROR(gpu_ring_attention_forward(comm, layout, params, q.view, k.view, v.view, out.view,
                                                lse.view, ctx, stream, &r->fwd_stats));
  SP_RETURN_IF_ERROR(comm.synchronize(stream));
  r->times[0] = std::chrono::duration<double>(Clock::now() - t0).count();
  SP_RETURN_IF_ERROR(comm.barrier());
  if (me == 0) progress(who + "running backward");
  // Fault injection for the failure tests: this rank stops here, as if it hung.
  if (const char* stall = std::getenv("SEQPAR_FAULT_STALL_RANK"); stall && std::atoi(stall) == me) {
    progress("rank " + std::to_string(me) + " stalling (SEQPAR_FAULT_STALL_RANK)");
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  t0 = Clock::now();
  SP_RETURN_IF_ERROR(gpu_attention_backward(comm, layout, params, schedule, q.view, k.view, v.view,
                                            out.view, lse.view, dout.view, dq.view, dk.view, dv.view,
                                            ctx, stream));
  SP_RETURN_IF_ERROR(comm.synchronize(stream));
  r->times[1] = std::chrono::duration<double>(Clock::now() - t0).count();
  r->head_groups = ctx.counters.head_groups;
  SP_ASSIGN_OR_RETURN(r->out, to_host(out.view));
  SP_ASSIGN_OR_RETURN(r->lse, to_host(lse.view));
  SP_ASSIGN_OR_RETURN(r->dq, to_host(dq.view));
  SP_ASSIGN_OR_RETURN(r->dk, to_host(dk.view));
  SP_ASSIGN_OR_RETURN(r->dv, to_host(dv.view));
  return Status::Ok();
#endif
}

// The whole job on one rank; rank 0 checks, prints and returns the exit code in *exit_code.
Status run_rank(Communicator& comm, const Job& job, int* exit_code) {
  omp_set_num_threads(job.threads_per_rank);
  const AttnOptions& o = job.opt;
  const int me = comm.rank(), P = comm.size();
  SP_ASSIGN_OR_RETURN(const LayoutKind kind, parse_layout(o.layout));
  SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(kind, o.seq, P));
  const int64_t B = o.batch, H = o.heads, Hkv = job.kv_heads, D = o.head_dim;
  const DType t = job.dtype;
  const bool on_gpu = o.device == "cuda";
  AttentionParams params;
  params.mask = job.mask;

  // GPU ranks: ring and burst share the forward (K/V travel) and differ in the backward.
  BackwardSchedule schedule = o.algo == "burst" ? BackwardSchedule::kBurst : BackwardSchedule::kRing;
#ifdef SEQPAR_HAVE_CUDA
  const bool own_kernels = on_gpu && gpu_ring_uses_own_kernels(GpuRingOptions{}, t, D, params);
#else
  const bool own_kernels = false;
#endif
  if (on_gpu && o.algo == "auto") schedule = choose_gpu_backward(layout, params, B, H, Hkv, D, t, own_kernels);
  // CPU ranks: any algorithm, planned once; every rank's schedule for the byte walk.
  std::optional<AttentionPlan> plan;
  std::vector<RankSchedule> schedules;
  if (!on_gpu) {
    SP_ASSIGN_OR_RETURN(plan, plan_attention({o.algo, {o.ranks_per_node}}, layout, params, cpu_block_bytes(job), me,
                                             cpu_kernel_backend()));
    schedules = all_rank_schedules(*plan->algorithm, plan->request);
  }
  const std::string algo_used = on_gpu ? backward_schedule_name(schedule) : plan->algorithm->name;
  if (me == 0) {
    progress("running the forward on " + std::to_string(P) + (on_gpu ? " GPU ranks" : " ranks"));
    if (o.algo == "auto")
      progress(on_gpu ? "auto chose the " + algo_used + " backward (fewer bytes for H=" + std::to_string(H) +
                            ", H_kv=" + std::to_string(Hkv) + ")"
                      : plan->choice);
  }
  RankOutputs result;
  {
    Inputs in = local_inputs(job, layout, me);
    SP_RETURN_IF_ERROR(on_gpu ? compute_cuda(comm, job, layout, params, schedule, in, false, "", &result)
                              : compute_cpu(comm, job, *plan, in, &result));
  }
  const HostTensor &out = result.out, &lse = result.lse, &dq = result.dq, &dk = result.dk, &dv = result.dv;
  double* times = result.times;
  const RingStats& fwd_stats = result.fwd_stats;

  // Everything below is bookkeeping, counted apart from the algorithm's traffic.
  const CommCounters counters = comm.counters();
  const PhaseScope other(comm, Phase::kOther);
  SP_RETURN_IF_ERROR(comm.all_reduce(times, 2, DType::kF64, ReduceOp::kMax));
  const Topology topology{o.ranks_per_node};
  int64_t inter = 0;  // sent to ranks of other nodes, both passes
  for (int peer = 0; peer < static_cast<int>(counters.sent_to.size()); ++peer)
    if (topology.node_of(peer) != topology.node_of(me))
      inter += counters.sent_to[peer][0] + counters.sent_to[peer][1];
  int64_t mine[5] = {counters.sent(Phase::kForward), counters.sent(Phase::kBackward),
                     fwd_stats.pairs_computed, fwd_stats.pairs_skipped, inter};
  std::vector<int64_t> per_rank(5 * P);
  SP_RETURN_IF_ERROR(comm.all_gather(mine, per_rank.data(), sizeof(mine)));
  const double score_flops = double(B) * H * double(o.seq) * o.seq * D;
  std::string check_mode = o.check;
  if (check_mode == "auto")
    check_mode = score_flops <= kFullCheckLimit     ? "full"
                 : score_flops <= kSampledCheckLimit ? "sampled"
                                                     : "none";
  // The global tensors (and inputs) are needed to check or to dump; --check rows needs the
  // sampled rows alone.
  const bool need_global = (check_mode != "none" && check_mode != "rows") || !o.dump_dir.empty();
  HostTensor g_o, g_lse, g_dq, g_dk, g_dv;
  if (need_global) {
    if (me == 0) progress("gathering the results");
    SP_RETURN_IF_ERROR(gather_on_rank0(comm, layout, out, 1, &g_o));
    SP_RETURN_IF_ERROR(gather_on_rank0(comm, layout, lse, 2, &g_lse));
    SP_RETURN_IF_ERROR(gather_on_rank0(comm, layout, dq, 1, &g_dq));
    SP_RETURN_IF_ERROR(gather_on_rank0(comm, layout, dk, 1, &g_dk));
    SP_RETURN_IF_ERROR(gather_on_rank0(comm, layout, dv, 1, &g_dv));
  }
  std::vector<int64_t> picked;  // --check rows: the sampled query rows, and the ranks' results there
  HostTensor picked_o, picked_lse, picked_dq;
  if (check_mode == "rows") {
    picked = checked_query_rows(o);
    SP_RETURN_IF_ERROR(rows_from_owners(comm, layout, picked, out, lse, dq, &picked_o, &picked_lse, &picked_dq));
  }
  if (me != 0) return Status::Ok();

  // ---- rank 0: check, report --------------------------------------------------------------
  omp_set_num_threads(std::max(1u, std::thread::hardware_concurrency()));
  if (o.check == "auto" && check_mode == "none")
    progress("problem too large for the fp64 oracle: not checked (--check rows checks sampled query rows at "
             "O(rows x S) cost; sampled or single force the others)");
  SP_ASSIGN_OR_RETURN(const Layout whole, Layout::create(LayoutKind::kContiguous, o.seq, 1));
  Inputs global;
  if (need_global) {
    progress("making the whole inputs");
    global = local_inputs(job, whole, 0);
  }
  const HostTensor &gq = global.q, &gk = global.k, &gv = global.v, &gdo = global.dout;
  ReferenceRows rows;
  if (check_mode == "sampled") {
    rows.query_rows = sample_rows(o.seq, o.sample_rows, o.seed + 1);
    rows.key_rows = sample_rows(o.seq, o.sample_rows, o.seed + 2);
  }
  nlohmann::ordered_json errors;
  bool check_ok = true;
  const bool low_precision = t == DType::kBF16 || t == DType::kF16;
  const double tolerance = t == DType::kF64 ? 1e-10 : low_precision ? kLowPrecisionRelativeTolerance : 1e-4;
  // Low precision: errors relative to the largest reference value of each tensor.
  auto error = [&](const HostTensor& got, const HostTensor& want, int seq_dim,
                   const std::vector<int64_t>& on_rows, bool want_compact = false) {
    double scale = 1.0;
    if (low_precision) {
      scale = 0;
      const double* w = want.data<double>();
#pragma omp parallel for reduction(max : scale) schedule(static)
      for (int64_t e = 0; e < want.numel(); ++e)
        if (std::isfinite(w[e])) scale = std::max(scale, std::abs(w[e]));
      scale = std::max(scale, 1e-30);
    }
    return max_error_on_rows(got, want, seq_dim, on_rows, want_compact) / scale;
  };
  nlohmann::ordered_json oracle_errors;  // --check single: both results on sampled query rows
  nlohmann::ordered_json disagreeing = nlohmann::json::array();  // --check single: blocks past tolerance
  std::string single_error;  // --check single: why the single-GPU run failed, if it did
  if (check_mode == "single") {
    // The same problem on this GPU alone, as one rank: every step local, no exchange.
    progress("checking against the single-GPU result (every row)");
    const auto t_check = Clock::now();
    auto alone = make_local_communicators(1);
    RankOutputs single;
    // The whole problem's tensors, and the executor's workspace cap, must fit on this GPU;
    // when they cannot, only the oracle rows check the ranks.
    const double needed = double(B) * double(o.seq) * D * (4.0 * H + 4.0 * Hkv) * dtype_size(t) +
                          double(GpuRingOptions{}.workspace_limit_bytes);
    double free_bytes = needed;
#ifdef SEQPAR_HAVE_CUDA
    size_t free_now = 0, total_now = 0;
    if (cudaMemGetInfo(&free_now, &total_now) == cudaSuccess) free_bytes = double(free_now);
#endif
    Status ran = SP_STATUS(StatusCode::kUnsupported,
                           "skipped: the whole problem needs about " + human_bytes(needed) + " of GPU memory, " +
                               human_bytes(free_bytes) + " free");
    if (needed <= free_bytes)
      ran = compute_cuda(*alone[0], job, whole, params, BackwardSchedule::kRing, global, true, "single GPU: ",
                         &single);
    if (!ran.ok()) {  // the distributed results still get their oracle rows and their report
      progress("no single-GPU result: " + ran.to_string());
      single_error = ran.to_string();
      check_ok = check_ok && needed > free_bytes;  // too large is no failure; a failed run is
    }
    if (ran.ok()) {  // in blocks of 2P equal row ranges by the head groups the ranks used
      const std::pair<const char*, std::pair<const HostTensor*, const HostTensor*>> tensors[] = {
          {"o", {&g_o, &single.out}}, {"dq", {&g_dq, &single.dq}}, {"dk", {&g_dk, &single.dk}}, {"dv", {&g_dv, &single.dv}}};
      for (const auto& [name, pair] : tensors) {
        const BlockErrors e = relative_errors(*pair.first, *pair.second, 2 * P, result.head_groups);
        errors[name] = e.total();
        for (int rb = 0; rb < e.row_blocks; ++rb)
          for (int hb = 0; hb < e.head_blocks; ++hb)
            if (!(e.at(rb, hb) <= tolerance))
              disagreeing.push_back({{"tensor", name}, {"rows", {rb * e.row_block, std::min(o.seq, (rb + 1) * e.row_block)}},
                                     {"heads", {hb * e.head_block, (hb + 1) * e.head_block}}, {"relative_err", e.at(rb, hb)}});
      }
      errors["lse"] = max_error_on_rows(g_lse, to_f64(single.lse), 2, {});
    }
    for (auto& [name, err] : errors.items())
      check_ok = check_ok && err.get<double>() <= (name == "lse" ? kSingleLseTolerance : tolerance);
    // Should the two disagree, the fp64 oracle on sampled query rows (O, LSE and dQ, at
    // O(rows * S) cost) says which is wrong; the distributed result must also pass it.
    rows.query_rows = checked_query_rows(o);
    rows.query_side_only = true;
    progress("and against the fp64 oracle on " + std::to_string(rows.query_rows.size()) + " query rows");
    SP_ASSIGN_OR_RETURN(const ReferenceResult ref,
                        reference_attention(gq.view(), gk.view(), gv.view(), gdo.view(), params, rows));
    const std::pair<const char*, std::array<const HostTensor*, 3>> results[] = {
        {"ranks", {&g_o, &g_lse, &g_dq}}, {"single", {&single.out, &single.lse, &single.dq}}};
    for (const auto& [who, got] : results) {
      if (std::string(who) == "single" && !ran.ok()) continue;
      oracle_errors[who]["o"] = error(*got[0], ref.o, 1, rows.query_rows, true);
      oracle_errors[who]["lse"] = error(*got[1], ref.lse, 2, rows.query_rows, true);
      oracle_errors[who]["dq"] = error(*got[2], ref.dq, 1, rows.query_rows, true);
    }
    for (auto& [name, err] : oracle_errors["ranks"].items()) check_ok = check_ok && err.get<double>() <= tolerance;
    progress("single-GPU check took " +
             std::to_string(std::chrono::duration<double>(Clock::now() - t_check).count()) + " s");
  } else if (check_mode == "rows") {
    // The oracle over the sampled query rows alone, at their global positions: their rows of
    // q and dO, every row of k and v (read row by row), O(rows x S) work.
    progress("checking " + std::to_string(picked.size()) + " sampled query rows against the fp64 oracle (O, LSE, dQ)");
    const auto t_check = Clock::now();
    const HostTensor q_rows = make_input(job, kQ, H, &picked), do_rows = make_input(job, kDout, H, &picked);
    const HostTensor k_all = make_input(job, kK, Hkv, nullptr), v_all = make_input(job, kV, Hkv, nullptr);
    AttentionParams at_rows = params;
    at_rows.q_positions = picked.data();
    rows.query_side_only = true;
    for (int64_t r = 0; r < static_cast<int64_t>(picked.size()); ++r) rows.query_rows.push_back(r);
    SP_ASSIGN_OR_RETURN(const ReferenceResult ref, reference_attention(q_rows.view(), k_all.view(), v_all.view(),
                                                                       do_rows.view(), at_rows, rows));
    errors["o"] = error(picked_o, ref.o, 1, {});
    errors["lse"] = error(picked_lse, ref.lse, 2, {});
    errors["dq"] = error(picked_dq, ref.dq, 1, {});
    for (auto& [name, err] : errors.items()) check_ok = check_ok && err.get<double>() <= tolerance;
    progress("oracle check took " + std::to_string(std::chrono::duration<double>(Clock::now() - t_check).count()) +
             " s");
  } else if (check_mode != "none") {
    progress("checking against the fp64 oracle (" + check_mode +
                      (check_mode == "sampled" ? ", " + std::to_string(rows.query_rows.size()) +
                                                     " query and " +
                                                     std::to_string(rows.key_rows.size()) + " key rows"
                                               : std::string()) + ")");
    const auto t_check = Clock::now();
    SP_ASSIGN_OR_RETURN(ReferenceResult ref,
                        reference_attention(gq.view(), gk.view(), gv.view(), gdo.view(), params, rows));
    errors["o"] = error(g_o, ref.o, 1, rows.query_rows);
    errors["lse"] = error(g_lse, ref.lse, 2, rows.query_rows);
    errors["dq"] = error(g_dq, ref.dq, 1, rows.query_rows);
    errors["dk"] = error(g_dk, ref.dk, 1, rows.key_rows);
    errors["dv"] = error(g_dv, ref.dv, 1, rows.key_rows);
    for (auto& [name, err] : errors.items()) check_ok = check_ok && err.get<double>() <= tolerance;
    progress("oracle check took " +
                      std::to_string(std::chrono::duration<double>(Clock::now() - t_check).count()) + " s");
  }

  nlohmann::ordered_json sent_fwd = nlohmann::json::array(), sent_bwd = nlohmann::json::array();
  nlohmann::ordered_json want_fwd = nlohmann::json::array(), want_bwd = nlohmann::json::array();
  bool bytes_ok = true;
  nlohmann::ordered_json sent_inter = nlohmann::json::array(), want_inter = nlohmann::json::array();
  for (int r = 0; r < P; ++r) {
    TrafficBytes want;
    int64_t walked_inter = 0;
    if (on_gpu) {
      want = gpu_expected_bytes(layout, r, schedule, params, B, H, Hkv, D, t, own_kernels);
    } else {  // walked from the schedule's steps
      const WalkedBytes f = walk_bytes(schedules[r].forward, r, layout, plan->block_bytes, topology);
      const WalkedBytes b = walk_bytes(schedules[r].backward, r, layout, plan->block_bytes, topology);
      want = {f.total, b.total};
      walked_inter = f.by_link[1] + b.by_link[1];
    }
    sent_fwd.push_back(per_rank[5 * r]);
    sent_bwd.push_back(per_rank[5 * r + 1]);
    want_fwd.push_back(want.forward);
    want_bwd.push_back(want.backward);
    sent_inter.push_back(per_rank[5 * r + 4]);
    want_inter.push_back(walked_inter);
    bytes_ok = bytes_ok && want.forward == per_rank[5 * r] && want.backward == per_rank[5 * r + 1] &&
               (on_gpu || walked_inter == per_rank[5 * r + 4]);
  }
  const double fwd_flops = 4.0 * B * H * D * visible_pairs(job.mask, o.seq);
  const double bwd_flops = 2.5 * fwd_flops;

  if (!o.dump_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.dump_dir, ec);
    SP_CHECK_ARG(!ec, "cannot create dump directory " + o.dump_dir + ": " + ec.message());
    const std::pair<const char*, const HostTensor*> files[] = {
        {"q", &gq}, {"k", &gk}, {"v", &gv}, {"dO", &gdo}, {"O", &g_o},
        {"LSE", &g_lse}, {"dQ", &g_dq}, {"dK", &g_dk}, {"dV", &g_dv}};
    for (const auto& [name, tensor] : files)
      SP_RETURN_IF_ERROR(write_npy(o.dump_dir + "/" + name + ".npy", *tensor));
    progress("wrote q, k, v, dO, O, LSE, dQ, dK, dV (global token order) to " + o.dump_dir);
  }

  std::printf(on_gpu ? "seqpar attn: %s (%s backward), %s" : "seqpar attn: %s (%s), %s layout, %s mask, %d ranks (%s, %d OpenMP thread%s per rank)\n",
              o.algo.c_str(), algo_used.c_str(), o.layout.c_str(), job.mask.describe().c_str(), P,
              job.comm_backend.c_str(), job.threads_per_rank, job.threads_per_rank > 1 ? "s" : "");
  std::printf("problem: B=%ld S=%ld H=%ld H_kv=%ld D=%ld %s\n", long(B), long(o.seq), long(H),
              long(Hkv), long(D), dtype_name(t));
  std::printf("%-10s %10s %12s %16s %16s %6s\n", "pass", "time (s)", "GFLOP/s", "sent/rank (max)",
              "expected (max)", "bytes");
  for (int pass = 0; pass < 2; ++pass) {
    int64_t sent_max = 0, want_max = 0;
    for (int r = 0; r < P; ++r) {
      sent_max = std::max<int64_t>(sent_max, per_rank[5 * r + pass]);
      want_max = std::max<int64_t>(want_max, pass ? want_bwd[r].get<int64_t>() : want_fwd[r].get<int64_t>());
    }
    std::printf("%-10s %10.3f %12.2f %16s %16s %6s\n", pass ? "backward" : "forward", times[pass],
                (pass ? bwd_flops : fwd_flops) / times[pass] / 1e9, human_bytes(sent_max).c_str(),
                human_bytes(want_max).c_str(), bytes_ok ? "equal" : "DIFFER");
  }
  std::string pairs;
  for (int r = 0; r < P; ++r) pairs += (r ? " " : "") + std::to_string(per_rank[5 * r + 2]);
  std::printf("forward block pairs computed per rank: %s (of %d)\n", pairs.c_str(), P);
  if (check_mode == "none") {
    std::printf("check: skipped (--check none)\n");
  } else if (check_mode == "single") {
    if (single_error.empty())
      std::printf("vs the single-GPU result, every row: |error| / |reference| (Frobenius) O %.2e  dQ %.2e  "
                  "dK %.2e  dV %.2e (tolerance %.0e); max |error| LSE %.2e (tolerance %.0e)\n",
                  errors["o"].get<double>(), errors["dq"].get<double>(), errors["dk"].get<double>(),
                  errors["dv"].get<double>(), tolerance, errors["lse"].get<double>(), kSingleLseTolerance);
    else
      std::printf("no single-GPU result (%s): the oracle rows alone check the ranks\n", single_error.c_str());
    for (const auto& [who, err] : oracle_errors.items())
      std::printf("max |error| / max |reference| vs fp64 oracle on %zu query rows, %s: O %.2e  LSE %.2e  "
                  "dQ %.2e\n", rows.query_rows.size(), who.c_str(), err["o"].get<double>(),
                  err["lse"].get<double>(), err["dq"].get<double>());
    for (size_t i = 0; i < std::min<size_t>(disagreeing.size(), 12); ++i) {
      const auto& d = disagreeing[i];
      std::printf("  disagrees: %s rows [%ld, %ld) heads [%ld, %ld): %.2e\n", d["tensor"].get<std::string>().c_str(),
                  long(d["rows"][0]), long(d["rows"][1]), long(d["heads"][0]), long(d["heads"][1]),
                  d["relative_err"].get<double>());
    }
    const auto passes_oracle = [&](const char* who) {
      if (!oracle_errors.contains(who)) return false;
      for (const auto& [name, err] : oracle_errors[who].items())
        if (!(err.get<double>() <= tolerance)) return false;
      return true;
    };
    if (!disagreeing.empty() && passes_oracle("ranks") != passes_oracle("single"))
      std::printf("the oracle rows side with the %s result\n", passes_oracle("ranks") ? "ranks'" : "single-GPU");
    std::printf("check (the ranks within both tolerances): %s\n", check_ok ? "PASS" : "FAIL");
  } else if (check_mode == "rows") {
    std::printf("max |error|%s vs fp64 oracle (%zu sampled query rows): O %.2e  LSE %.2e  dQ %.2e  "
                "(tolerance %.0e): %s\n",
                low_precision ? " / max |reference|" : "", picked.size(), errors["o"].get<double>(),
                errors["lse"].get<double>(), errors["dq"].get<double>(), tolerance, check_ok ? "PASS" : "FAIL");
  } else {
    std::printf("max |error|%s vs fp64 oracle (%s): O %.2e  LSE %.2e  dQ %.2e  dK %.2e  dV %.2e  "
                "(tolerance %.0e): %s\n",
                low_precision ? " / max |reference|" : "", check_mode.c_str(), errors["o"].get<double>(), errors["lse"].get<double>(),
                errors["dq"].get<double>(), errors["dk"].get<double>(), errors["dv"].get<double>(),
                tolerance, check_ok ? "PASS" : "FAIL");
  }
  if (o.json) {
    nlohmann::ordered_json j;
    j["algo"] = o.algo;
    j[on_gpu ? "backward_schedule" : "algorithm"] = algo_used;
    if (!on_gpu) j["ranks_per_node"] = o.ranks_per_node;
    j["layout"] = o.layout;
    j["mask"] = job.mask.describe();
    j["ranks"] = P;
    j["comm"] = job.comm_backend;
    j["device"] = o.device;
    j["dtype"] = dtype_name(t);
    j["batch"] = B;
    j["seq"] = o.seq;
    j["heads"] = H;
    j["kv_heads"] = Hkv;
    j["head_dim"] = D;
    j["threads_per_rank"] = job.threads_per_rank;
    if (on_gpu) j["head_groups"] = result.head_groups;
    j["fwd_s"] = times[0];
    j["bwd_s"] = times[1];
    j["fwd_gflops"] = fwd_flops / times[0] / 1e9;
    j["bwd_gflops"] = bwd_flops / times[1] / 1e9;
    j["check"] = check_mode;
    j["check_rows"] = check_mode == "sampled" ? int64_t(rows.query_rows.size())
                      : check_mode == "rows"  ? int64_t(picked.size())
                                              : o.seq;  // single: all
    if (check_mode == "single") {
      j["relative_err"] = errors;  // LSE: max |error|
      j["lse_tolerance"] = kSingleLseTolerance;
      j["oracle_query_rows"] = int64_t(rows.query_rows.size());
      j["oracle_err"] = oracle_errors;  // max |error| / max |reference| on those rows
      j["disagreeing_blocks"] = disagreeing;  // (tensor, rows, heads: K/V heads for dk, dv) past tolerance
      if (!single_error.empty()) j["single_error"] = single_error;
    } else {
      j["max_abs_err"] = errors;
    }
    j["tolerance"] = tolerance;
    j["check_passed"] = check_ok;
    j["bytes_sent_per_rank"] = {{"forward", sent_fwd}, {"backward", sent_bwd}};
    j["bytes_expected_per_rank"] = {{"forward", want_fwd}, {"backward", want_bwd}};
    if (!on_gpu) j["inter_node_bytes_per_rank"] = {{"sent", sent_inter}, {"walked", want_inter}};
    j["bytes_match"] = bytes_ok;
    nlohmann::ordered_json computed = nlohmann::json::array();
    for (int r = 0; r < P; ++r) computed.push_back(per_rank[5 * r + 2]);
    j["fwd_pairs_computed_per_rank"] = computed;
    std::printf("%s\n", j.dump().c_str());
  }
  std::fflush(stdout);
  *exit_code = check_ok && bytes_ok ? 0 : 1;
  return Status::Ok();
}

StatusOr<Job> resolve(const AttnOptions& opt, bool ranks_given, bool under_mpi, bool under_torchrun) {
  Job job;
  job.opt = opt;
  const bool gpu_algo = opt.algo == "ring" || opt.algo == "burst" || opt.algo == "auto";
  SP_CHECK_ARG(opt.algo == "auto" || find_algorithm(opt.algo),
               "unknown algorithm '" + opt.algo + "' (available: " + algorithm_names() + "|auto)");
  SP_CHECK_SUPPORTED(opt.device != "cuda" || gpu_algo,
                     "GPU ranks run ring, burst and auto so far; " + opt.algo + " runs on CPU ranks");
  SP_CHECK_ARG(opt.ranks_per_node >= 0, "--ranks-per-node must be positive (0: one node)");
  SP_CHECK_ARG(opt.device == "cpu" || opt.device == "cuda",
               "unknown device '" + opt.device + "' (available: cpu, cuda)");
  const bool on_gpu = opt.device == "cuda";
  if (on_gpu) {
    SP_CHECK_SUPPORTED(nccl_available() && cuda_device_count() > 0,
                       cuda_device_count() == 0 ? "--device cuda: no CUDA GPU is visible"
                                                : "--device cuda: this build has no NCCL");
  }
  job.opt.dtype = opt.dtype.empty() ? (on_gpu ? "bf16" : "fp32") : opt.dtype;
  SP_ASSIGN_OR_RETURN(job.dtype, parse_dtype(job.opt.dtype));
  if (on_gpu)
    SP_CHECK_SUPPORTED(job.dtype == DType::kBF16 || job.dtype == DType::kF16,
                       "GPU ranks compute in bf16 or fp16, not " + job.opt.dtype);
  else
    SP_CHECK_SUPPORTED(job.dtype == DType::kF32 || job.dtype == DType::kF64,
                       "CPU ranks compute in fp32 or fp64; " + job.opt.dtype + " needs --device cuda");
  SP_CHECK_ARG(opt.batch >= 1 && opt.heads >= 1 && opt.head_dim >= 1 && opt.seq >= 1,
               "--batch, --heads, --head-dim and --seq must be positive");
  job.kv_heads = opt.kv_heads > 0 ? opt.kv_heads : opt.heads;
  SP_CHECK_ARG(opt.heads % job.kv_heads == 0,
               "--heads (" + std::to_string(opt.heads) + ") must be divisible by --kv-heads (" +
                   std::to_string(job.kv_heads) + ")");
  SP_CHECK_ARG(opt.max_call_rows >= 0, "--max-call-rows must be 0 (no limit) or positive");
  SP_CHECK_ARG(opt.head_groups >= 0 && (opt.head_groups == 0 || job.kv_heads % opt.head_groups == 0),
               "--head-groups must divide the K/V heads (" + std::to_string(job.kv_heads) + ")");
  SP_CHECK_ARG(opt.check == "auto" || opt.check == "full" || opt.check == "sampled" ||
                   opt.check == "rows" || opt.check == "single" || opt.check == "none",
               "--check must be auto, full, sampled, rows, single or none");
  SP_CHECK_ARG(opt.check != "single" || on_gpu,
               "--check single compares with the single-GPU result: it needs --device cuda");
  SP_ASSIGN_OR_RETURN(job.mask, parse_mask(opt.mask, opt.seq));
  SP_ASSIGN_OR_RETURN(const LayoutKind kind, parse_layout(opt.layout));
  if (under_mpi || under_torchrun) {
    const char* size = std::getenv(under_mpi ? "OMPI_COMM_WORLD_SIZE" : "WORLD_SIZE");
    const int world = size ? std::atoi(size) : 0;
    SP_CHECK_ARG(!ranks_given || world == 0 || world == opt.ranks,
                 "--ranks " + std::to_string(opt.ranks) + " but the launcher started " +
                     std::to_string(world) + " processes; drop --ranks or make them agree");
    job.ranks = world > 0 ? world : opt.ranks;
    job.comm_backend = on_gpu ? (under_mpi ? "nccl, mpi processes" : "nccl, torchrun processes")
                              : "mpi processes";
    SP_CHECK_SUPPORTED(on_gpu || under_mpi, "torchrun-style launches need --device cuda (NCCL)");
  } else if (on_gpu) {
    const int gpus = cuda_device_count();
    job.ranks = ranks_given ? opt.ranks : gpus;
    SP_CHECK_ARG(job.ranks >= 1 && job.ranks <= gpus,
                 "--ranks " + std::to_string(job.ranks) + " but " + std::to_string(gpus) +
                     " GPUs are visible (one rank per GPU)");
    job.comm_backend = "nccl, a thread per GPU";
  } else {
    SP_CHECK_ARG(opt.ranks >= 1 && opt.ranks <= 1024, "--ranks must be between 1 and 1024");
    job.ranks = opt.ranks;
    job.comm_backend = "local threads";
  }
  SP_RETURN_IF_ERROR(Layout::create(kind, opt.seq, job.ranks).status());
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  const char* local_size = std::getenv(under_mpi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "LOCAL_WORLD_SIZE");
  const int ranks_here = (under_mpi || under_torchrun) && local_size ? std::max(1, std::atoi(local_size))
                                                                     : job.ranks;
  job.threads_per_rank = opt.threads_per_rank > 0 ? opt.threads_per_rank
                                                  : std::max(1, cores / ranks_here);
  return job;
}

// Ends a failed multi-process GPU run at once: a peer may be gone, and tearing down CUDA and
// NCCL state could wait on it.
[[noreturn]] void exit_failed_gpu_rank(int rank, const Status& s) {
  std::fprintf(stderr, "seqpar attn: rank %d: error: %s\n", rank, s.to_string().c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(1);
}

}  // namespace

int run_attn(const AttnOptions& options, bool ranks_given) {
  const bool under_mpi = launched_by_mpi();
  const bool under_torchrun = !under_mpi && launched_by_torchrun() && options.device == "cuda";
  auto job = resolve(options, ranks_given, under_mpi, under_torchrun);
  if (!job.ok()) {
    std::fprintf(stderr, "seqpar attn: error: %s\n", job.status().to_string().c_str());
    return 2;
  }
  // The plan (the algorithm refusing this problem is a bad argument) and --print-schedule.
  {
    const AttnOptions& o = job->opt;
    const auto layout = Layout::create(parse_layout(o.layout).value(), o.seq, job->ranks).value();
    AttentionParams params;
    params.mask = job->mask;
    const int shown = std::max(0, o.print_schedule);
    const std::string algo = o.device == "cuda" && o.algo == "auto" ? "ring" : o.algo;
    auto plan = plan_attention({algo, {o.ranks_per_node}}, layout, params, cpu_block_bytes(job.value()),
                               std::min(shown, job->ranks - 1), cpu_kernel_backend());
    if (!plan.ok()) {
      std::fprintf(stderr, "seqpar attn: error: %s\n", plan.status().to_string().c_str());
      return 2;
    }
    if (o.print_schedule >= 0) {
      if (o.print_schedule >= job->ranks) {
        std::fprintf(stderr, "seqpar attn: error: --print-schedule %d but there are %d ranks\n", o.print_schedule,
                     job->ranks);
        return 2;
      }
      const Topology topology{o.ranks_per_node};
      std::printf("%s (%s)%s: rank %d of %d, %s layout, %s mask\n", plan->algorithm->name, plan->algorithm->summary,
                  plan->choice.empty() ? "" : (" [" + plan->choice + "]").c_str(), shown, job->ranks, o.layout.c_str(),
                  job->mask.describe().c_str());
      for (Pass pass : {Pass::kForward, Pass::kBackward}) {
        const WalkedBytes w = walk_bytes(plan->schedule.pass(pass), shown, layout, plan->block_bytes, topology);
        std::printf("%s: %d pair%s, sends %ld bytes (intra %ld, inter %ld)\n%s", pass == Pass::kForward ? "forward" : "backward",
                    count_computes(plan->schedule.pass(pass)), count_computes(plan->schedule.pass(pass)) == 1 ? "" : "s",
                    long(w.total), long(w.by_link[0]), long(w.by_link[1]),
                    describe_steps(plan->schedule.pass(pass), topology, shown).c_str());
      }
      return 0;
    }
  }
  int exit_code = 1;
  const bool on_gpu = job->opt.device == "cuda";
  if (on_gpu) nccl_exit_process_on_failure(true);
  if (under_mpi || under_torchrun) {
    auto comm = on_gpu ? (under_mpi ? make_nccl_communicator_mpi() : make_nccl_communicator_env())
                       : make_mpi_world_communicator();
    if (!comm.ok()) {
      std::fprintf(stderr, "seqpar attn: error: %s\n", comm.status().to_string().c_str());
      return 1;
    }
    exit_code = 0;
    const Status s = run_rank(*comm.value(), job.value(), &exit_code);
    if (!s.ok()) {
      if (on_gpu) exit_failed_gpu_rank(comm.value()->rank(), s);
      std::fprintf(stderr, "seqpar attn: rank %d: error: %s\n", comm.value()->rank(),
                   s.to_string().c_str());
      comm.value()->abort(s.message());  // the other ranks must not wait for this one
      return 1;
    }
    return exit_code;
  }
  auto each_rank = [&](Communicator& comm) { return run_rank(comm, job.value(), &exit_code); };
  const Status s = on_gpu ? run_nccl_local_ranks(job->ranks, each_rank)
                          : run_local_ranks(job->ranks, each_rank);
  if (!s.ok()) {
    std::fprintf(stderr, "seqpar attn: error: %s\n", s.to_string().c_str());
    return 1;
  }
  return exit_code;
}

void add_attn_command(CLI::App& app, AttnOptions& o, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "attn",
      "Run distributed attention forward + backward on N ranks and check it against the fp64 "
      "oracle. Ranks are threads of this process, or MPI processes when started by mpirun.\n"
      "Exit code: 0 when the check passes and measured bytes equal the formula, 1 when not, "
      "2 for bad arguments.");
  std::string algo_help = "CPU ranks: one of";
  for (const Algorithm* a : all_algorithms()) algo_help += std::string("\n  ") + a->name + ": " + a->summary;
  algo_help += "\n  auto: the busiest rank computes the fewest pairs, then sends the fewest bytes"
               "\nGPU ranks: ring, burst, auto (the backward that moves fewer bytes)";
  cmd->add_option("--algo", o.algo, algo_help)->capture_default_str();
  cmd->add_option("--ranks-per-node", o.ranks_per_node,
                  "ranks per node (the double ring's inner ring; bytes split intra/inter); 0: one node")
      ->capture_default_str();
  cmd->add_option("--print-schedule", o.print_schedule, "print this rank's steps (forward, backward) and exit");
  cmd->add_option("--layout", o.layout, "sequence layout: contiguous, zigzag, striped")
      ->capture_default_str();
  cmd->add_option("--mask", o.mask,
                  "full | causal | window:L,R | docs:N (causal inside N documents) | "
                  "bigbird:W,G,R[,B=N] (block-sparse on N-token blocks, default 64: W window "
                  "blocks each side, G global, R random a row) | bigbird-causal:W,G,R[,B=N] | "
                  "blocks:PATH | blocks-causal:PATH (pattern file: 'block_size N', then one row "
                  "of 0/1 per query block)")
      ->capture_default_str();
  cmd->add_option("--seq", o.seq, "total sequence length (need not divide by the ranks)")
      ->capture_default_str();
  cmd->add_option("--batch", o.batch, "batch size")->capture_default_str();
  cmd->add_option("--heads", o.heads, "query heads")->capture_default_str();
  cmd->add_option("--kv-heads", o.kv_heads, "key/value heads (GQA/MQA); default: --heads");
  cmd->add_option("--head-dim", o.head_dim, "head dimension")->capture_default_str();
  CLI::Option* ranks = cmd->add_option("--ranks", o.ranks, "ranks (threads); under mpirun: the "
                                                           "process count; cuda: default all GPUs")
                           ->capture_default_str();
  cmd->add_option("--dtype", o.dtype, "fp32 or fp64 on CPU (default fp32); bf16 or fp16 on cuda "
                                      "(default bf16)");
  cmd->add_option("--device", o.device, "cpu, or cuda: one rank per GPU (a thread each; or "
                                        "processes under mpirun or torchrun), NCCL between them")
      ->capture_default_str();
  cmd->add_option("--head-groups", o.head_groups, "cuda: process the heads in this many groups "
                                                  "(less workspace); default: the fewest whose workspace fits in seven q "
                                                  "shards and 16 GiB");
  cmd->add_option("--max-call-rows", o.max_call_rows, "cuda: no cuDNN call spans more query or key "
                                                     "rows than this (0: no limit); also the single-GPU "
                                                     "check's calls")
      ->capture_default_str();
  cmd->add_option("--threads-per-rank", o.threads_per_rank, "OpenMP threads per rank (default: "
                                                            "cores / ranks)");
  cmd->add_option("--check", o.check, "auto | full | sampled | rows | single | none: the fp64 oracle on "
                                      "every row or on sampled rows (auto samples when the problem is "
                                      "large, and skips the check when too large); rows: O, LSE and dQ "
                                      "of sampled query rows alone, at O(rows x S) cost, for the "
                                      "largest runs; single (cuda): the whole problem on rank 0's GPU "
                                      "alone, every row")
      ->capture_default_str();
  cmd->add_option("--sample-rows", o.sample_rows, "query and key rows checked when sampling")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "seed of the random inputs")->capture_default_str();
  cmd->add_flag("--json", o.json, "also print one JSON object with the results");
  cmd->add_option("--dump", o.dump_dir, "write q, k, v, dO, O, LSE, dQ, dK, dV as .npy (global order)");
  cmd->callback([&o, exit_code, ranks] { *exit_code = run_attn(o, ranks->count() > 0); });
}

}  // namespace seqpar::app
