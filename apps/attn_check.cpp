// `seqpar attn`'s check (attn_check.hpp): gathering, the oracle comparisons, and the
// single-GPU comparison by blocks of rows and heads.
#include "attn_check.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>
#include <unordered_map>

#include "attn_report.hpp"
#include "rank_gather.hpp"
#include "seqpar/comm.hpp"
#include "seqpar/gpu.hpp"

namespace seqpar::app {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

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

// max |error| of `got` against the fp64 `want`, relative to max |want| in bf16/fp16.
double error_of(DType dtype, const HostTensor& got, const HostTensor& want, int seq_dim,
                const std::vector<int64_t>& on_rows, bool want_compact = false) {
  double scale = 1.0;
  if (dtype == DType::kBF16 || dtype == DType::kF16) {
    scale = 0;
    const double* w = want.data<double>();
#pragma omp parallel for reduction(max : scale) schedule(static)
    for (int64_t e = 0; e < want.numel(); ++e)
      if (std::isfinite(w[e])) scale = std::max(scale, std::abs(w[e]));
    scale = std::max(scale, 1e-30);
  }
  return max_error_on_rows(got, want, seq_dim, on_rows, want_compact) / scale;
}

// --check single: the whole problem on this GPU alone, as one rank (every step local), compared
// block by block with the ranks' result; then both against the oracle's sampled query rows,
// which say which one is wrong should they disagree.
Status check_single(const Job& job, const AttentionParams& params, const Collected& c, int head_groups, int P,
                    Inputs& whole_inputs, CheckResult* r) {
  const AttnOptions& o = job.opt;
  progress("checking against the single-GPU result (every row)");
  const auto t0 = Clock::now();
  SP_ASSIGN_OR_RETURN(const Layout whole, Layout::create(LayoutKind::kContiguous, o.seq, 1));
  // The whole problem's tensors and the executor's workspace cap must fit on this GPU; when they
  // cannot, only the oracle rows check the ranks.
  const double needed = double(o.batch) * double(o.seq) * o.head_dim * (4.0 * o.heads + 4.0 * job.kv_heads) *
                            dtype_size(job.dtype) + double(PlanOptions{}.workspace_limit_bytes);
  const double free_bytes = double(cuda_free_memory());
  RankRun single;
  Status ran = SP_STATUS(StatusCode::kUnsupported, "skipped: the whole problem needs about " + human_bytes(needed) +
                                                       " of GPU memory, " + human_bytes(free_bytes) + " free");
  if (needed <= free_bytes) {
    auto alone = make_local_communicators(1);
    ran = run_gpu_rank(*alone[0], job, whole, params, "ring", whole_inputs, /*keep_inputs=*/true, "single GPU: ",
                       &single);
  }
  if (!ran.ok()) {  // the distributed results still get their oracle rows and their report
    progress("no single-GPU result: " + ran.to_string());
    r->single_error = ran.to_string();
    r->ok = r->ok && needed > free_bytes;  // too large is no failure; a failed run is
  } else {  // in blocks of 2P equal row ranges by the head groups the ranks used
    const std::pair<const char*, std::pair<const HostTensor*, const HostTensor*>> tensors[] = {
        {"o", {&c.o, &single.out}}, {"dq", {&c.dq, &single.dq}}, {"dk", {&c.dk, &single.dk}}, {"dv", {&c.dv, &single.dv}}};
    for (const auto& [name, pair] : tensors) {
      const BlockErrors e = relative_errors(*pair.first, *pair.second, 2 * P, head_groups);
      r->errors[name] = e.total();
      for (int rb = 0; rb < e.row_blocks; ++rb)
        for (int hb = 0; hb < e.head_blocks; ++hb)
          if (!(e.at(rb, hb) <= r->tolerance))
            r->disagreeing.push_back({{"tensor", name},
                                      {"rows", {rb * e.row_block, std::min(o.seq, (rb + 1) * e.row_block)}},
                                      {"heads", {hb * e.head_block, (hb + 1) * e.head_block}},
                                      {"relative_err", e.at(rb, hb)}});
    }
    r->errors["lse"] = max_error_on_rows(c.lse, to_f64(single.lse), 2, {});
  }
  for (auto& [name, err] : r->errors.items())
    r->ok = r->ok && err.get<double>() <= (name == "lse" ? kSingleLseTolerance : r->tolerance);
  ReferenceRows rows;
  rows.query_rows = checked_query_rows(o);
  rows.query_side_only = true;
  r->oracle_rows = int64_t(rows.query_rows.size());
  progress("and against the fp64 oracle on " + std::to_string(rows.query_rows.size()) + " query rows");
  const Inputs& g = whole_inputs;
  SP_ASSIGN_OR_RETURN(const ReferenceResult ref,
                      reference_attention(g.q.view(), g.k.view(), g.v.view(), g.dout.view(), params, rows));
  const std::pair<const char*, std::array<const HostTensor*, 3>> results[] = {
      {"ranks", {&c.o, &c.lse, &c.dq}}, {"single", {&single.out, &single.lse, &single.dq}}};
  for (const auto& [who, got] : results) {
    if (std::string(who) == "single" && !ran.ok()) continue;
    r->oracle_errors[who]["o"] = error_of(job.dtype, *got[0], ref.o, 1, rows.query_rows, true);
    r->oracle_errors[who]["lse"] = error_of(job.dtype, *got[1], ref.lse, 2, rows.query_rows, true);
    r->oracle_errors[who]["dq"] = error_of(job.dtype, *got[2], ref.dq, 1, rows.query_rows, true);
  }
  for (auto& [name, err] : r->oracle_errors["ranks"].items()) r->ok = r->ok && err.get<double>() <= r->tolerance;
  r->rows_checked = o.seq;
  progress("single-GPU check took " + std::to_string(seconds_since(t0)) + " s");
  return Status::Ok();
}

// --check rows: the oracle over the sampled query rows alone, at their global positions: their
// rows of q and dO, every row of k and v, O(rows x S) work.
Status check_rows(const Job& job, const AttentionParams& params, const Collected& c, CheckResult* r) {
  progress("checking " + std::to_string(c.rows.size()) + " sampled query rows against the fp64 oracle (O, LSE, dQ)");
  const auto t0 = Clock::now();
  const HostTensor q_rows = make_input(job, kQ, job.opt.heads, &c.rows);
  const HostTensor do_rows = make_input(job, kDout, job.opt.heads, &c.rows);
  const HostTensor k_all = make_input(job, kK, job.kv_heads, nullptr), v_all = make_input(job, kV, job.kv_heads, nullptr);
  AttentionParams at_rows = params;
  at_rows.q_positions = c.rows.data();
  ReferenceRows rows;
  rows.query_side_only = true;
  for (int64_t i = 0; i < static_cast<int64_t>(c.rows.size()); ++i) rows.query_rows.push_back(i);
  SP_ASSIGN_OR_RETURN(const ReferenceResult ref,
                      reference_attention(q_rows.view(), k_all.view(), v_all.view(), do_rows.view(), at_rows, rows));
  r->errors["o"] = error_of(job.dtype, c.rows_o, ref.o, 1, {});
  r->errors["lse"] = error_of(job.dtype, c.rows_lse, ref.lse, 2, {});
  r->errors["dq"] = error_of(job.dtype, c.rows_dq, ref.dq, 1, {});
  r->rows_checked = int64_t(c.rows.size());
  progress("oracle check took " + std::to_string(seconds_since(t0)) + " s");
  return Status::Ok();
}

// --check full or sampled: the oracle on the whole inputs, compared on every row or on the
// sampled query and key rows.
Status check_whole(const Job& job, const AttentionParams& params, const Collected& c, const Inputs& g,
                   CheckResult* r) {
  ReferenceRows rows;
  if (r->mode == "sampled") {
    rows.query_rows = sample_rows(job.opt.seq, job.opt.sample_rows, job.opt.seed + 1);
    rows.key_rows = sample_rows(job.opt.seq, job.opt.sample_rows, job.opt.seed + 2);
  }
  progress("checking against the fp64 oracle (" + r->mode +
           (r->mode == "sampled" ? ", " + std::to_string(rows.query_rows.size()) + " query and " +
                                       std::to_string(rows.key_rows.size()) + " key rows"
                                 : std::string()) +
           ")");
  const auto t0 = Clock::now();
  SP_ASSIGN_OR_RETURN(const ReferenceResult ref,
                      reference_attention(g.q.view(), g.k.view(), g.v.view(), g.dout.view(), params, rows));
  r->errors["o"] = error_of(job.dtype, c.o, ref.o, 1, rows.query_rows);
  r->errors["lse"] = error_of(job.dtype, c.lse, ref.lse, 2, rows.query_rows);
  r->errors["dq"] = error_of(job.dtype, c.dq, ref.dq, 1, rows.query_rows);
  r->errors["dk"] = error_of(job.dtype, c.dk, ref.dk, 1, rows.key_rows);
  r->errors["dv"] = error_of(job.dtype, c.dv, ref.dv, 1, rows.key_rows);
  r->rows_checked = rows.query_rows.empty() ? job.opt.seq : int64_t(rows.query_rows.size());
  r->key_rows = rows.key_rows.empty() ? job.opt.seq : int64_t(rows.key_rows.size());
  progress("oracle check took " + std::to_string(seconds_since(t0)) + " s");
  return Status::Ok();
}

}  // namespace

Status collect_results(Communicator& comm, const Job& job, const Layout& layout, const RankRun& run, Collected* c) {
  if (job.need_global) {
    if (comm.rank() == 0) progress("gathering the results");
    SP_RETURN_IF_ERROR(gather_on_rank0(comm, layout, run.out, 1, &c->o));
    SP_RETURN_IF_ERROR(gather_on_rank0(comm, layout, run.lse, 2, &c->lse));
    SP_RETURN_IF_ERROR(gather_on_rank0(comm, layout, run.dq, 1, &c->dq));
    SP_RETURN_IF_ERROR(gather_on_rank0(comm, layout, run.dk, 1, &c->dk));
    SP_RETURN_IF_ERROR(gather_on_rank0(comm, layout, run.dv, 1, &c->dv));
  }
  if (job.check_mode == "rows") {
    c->rows = checked_query_rows(job.opt);
    SP_RETURN_IF_ERROR(
        rows_from_owners(comm, layout, c->rows, run.out, run.lse, run.dq, &c->rows_o, &c->rows_lse, &c->rows_dq));
  }
  return Status::Ok();
}

StatusOr<CheckResult> check_results(const Job& job, const AttentionParams& params, const Collected& c,
                                    Inputs& whole, int head_groups, int ranks) {
  CheckResult r;
  r.mode = job.check_mode;
  const bool low_precision = job.dtype == DType::kBF16 || job.dtype == DType::kF16;
  r.tolerance = job.dtype == DType::kF64 ? 1e-10 : low_precision ? kLowPrecisionRelativeTolerance : 1e-4;
  if (r.mode == "none") {
    if (job.opt.check == "auto")
      progress("problem too large for the fp64 oracle: not checked (--check rows checks sampled query rows at "
               "O(rows x S) cost; sampled or single force the others)");
    return r;
  }
  omp_set_num_threads(std::max(1u, std::thread::hardware_concurrency()));
  if (r.mode == "rows") {
    SP_RETURN_IF_ERROR(check_rows(job, params, c, &r));
  } else if (r.mode == "single") {
    SP_RETURN_IF_ERROR(check_single(job, params, c, head_groups, ranks, whole, &r));
    return r;  // its tolerances differ per tensor: already applied
  } else {
    SP_RETURN_IF_ERROR(check_whole(job, params, c, whole, &r));
  }
  for (auto& [name, err] : r.errors.items()) r.ok = r.ok && err.get<double>() <= r.tolerance;
  return r;
}

}  // namespace seqpar::app
