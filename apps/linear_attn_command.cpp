// `seqpar linear-attn`: builds a random problem, runs LASP (chain or all-gather) forward +
// backward on threads as ranks, checks the gathered results against the fp64 recurrent oracle,
// compares each rank's bytes with the formula, and prints a table and optionally JSON.
#include "linear_attn_command.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "npy.hpp"
#include "seqpar/lasp.hpp"

namespace seqpar::app {
namespace {

using Clock = std::chrono::steady_clock;

struct Job {
  LinearAttnOptions opt;
  DType dtype = DType::kF32;
  LaspAlgorithm algo = LaspAlgorithm::kChain;
  LinearAttentionParams params;
  int64_t kv_heads = 0;
  int threads_per_rank = 1;
};

StatusOr<std::vector<double>> parse_decays(const std::string& text) {
  std::vector<double> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    double value = 0;
    try {
      value = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SP_CHECK_ARG(used > 0 && used == item.size(), "--decay: '" + item + "' is not a number");
    values.push_back(value);
  }
  SP_CHECK_ARG(!values.empty(), "--decay needs a value");
  return values;
}

StatusOr<Job> resolve(const LinearAttnOptions& opt) {
  Job job;
  job.opt = opt;
  SP_ASSIGN_OR_RETURN(job.algo, parse_lasp_algorithm(opt.algo));
  SP_CHECK_ARG(opt.dtype == "fp32" || opt.dtype == "fp64", "--dtype must be fp32 or fp64 (CPU ranks)");
  job.dtype = opt.dtype == "fp64" ? DType::kF64 : DType::kF32;
  SP_CHECK_ARG(opt.batch >= 1 && opt.heads >= 1 && opt.dk >= 1 && opt.dv >= 1 && opt.seq >= 1,
               "--batch, --heads, --dk, --dv and --seq must be positive");
  job.kv_heads = opt.kv_heads > 0 ? opt.kv_heads : opt.heads;
  SP_CHECK_ARG(opt.heads % job.kv_heads == 0, "--heads (" + std::to_string(opt.heads) +
                                                  ") must be divisible by --kv-heads (" +
                                                  std::to_string(job.kv_heads) + ")");
  SP_CHECK_ARG(opt.ranks >= 1 && opt.ranks <= 1024, "--ranks must be between 1 and 1024");
  SP_CHECK_ARG(opt.seq >= opt.ranks, "--seq (" + std::to_string(opt.seq) + ") must be at least --ranks (" +
                                         std::to_string(opt.ranks) + "): every rank needs a token");
  SP_ASSIGN_OR_RETURN(job.params.decay, parse_decays(opt.decay));
  job.params.scale = opt.scale;
  job.params.chunk = opt.chunk;
  SP_RETURN_IF_ERROR(validate_linear_params(job.params, opt.heads));
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  job.threads_per_rank = std::max(1, cores / opt.ranks);
  return job;
}

HostTensor random_input(const Job& job, const std::vector<int64_t>& shape, uint64_t stream) {
  HostTensor f64(DType::kF64, shape);
  std::mt19937_64 rng(job.opt.seed * 0x9E3779B97F4A7C15ull + stream);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  for (int64_t i = 0; i < f64.numel(); ++i) f64.data<double>()[i] = dist(rng);
  HostTensor out(job.dtype, shape);
  convert(f64.view().data, DType::kF64, out.view().data, job.dtype, f64.numel());
  return out;
}

// max |got - want| / max(1, max |want|).
double relative_error(const HostTensor& got, const HostTensor& want) {
  std::vector<double> g(static_cast<size_t>(got.numel()));
  convert(got.view().data, got.view().dtype, g.data(), DType::kF64, g.size());
  double err = 0, ref = 1;
  for (size_t i = 0; i < g.size(); ++i) {
    const double w = want.data<double>()[i], d = std::abs(g[i] - w);
    err = std::isnan(d) ? INFINITY : std::max(err, d);
    ref = std::max(ref, std::abs(w));
  }
  return err / ref;
}

struct Global {
  HostTensor q, k, v, dout, o, dq, dk, dv, final_state;
};

struct RankReport {
  CommCounters counters;
  double seconds[2] = {0, 0};
  LaspAlgorithm ran = LaspAlgorithm::kChain;
};

Status run_rank(Communicator& comm, const Job& job, Global* g, std::vector<RankReport>* reports) {
  omp_set_num_threads(job.threads_per_rank);
  const LinearAttnOptions& o = job.opt;
  const int me = comm.rank();
  SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(LayoutKind::kContiguous, o.seq, comm.size()));
  const int64_t n = layout.local_len(me), B = o.batch, H = o.heads, Hkv = job.kv_heads;
  auto local = [&](const HostTensor& global, int64_t heads, int64_t dim) -> StatusOr<HostTensor> {
    HostTensor t(job.dtype, {B, n, heads, dim});
    SP_RETURN_IF_ERROR(layout.shard(global.view(), 1, me, t.view()));
    return t;
  };
  SP_ASSIGN_OR_RETURN(const HostTensor q, local(g->q, H, o.dk));
  SP_ASSIGN_OR_RETURN(const HostTensor k, local(g->k, Hkv, o.dk));
  SP_ASSIGN_OR_RETURN(const HostTensor v, local(g->v, Hkv, o.dv));
  SP_ASSIGN_OR_RETURN(const HostTensor dout, local(g->dout, H, o.dv));
  HostTensor out(job.dtype, {B, n, H, o.dv}), dq(job.dtype, {B, n, H, o.dk});
  HostTensor dk(job.dtype, {B, n, Hkv, o.dk}), dv(job.dtype, {B, n, Hkv, o.dv});
  RankReport& report = (*reports)[me];
  LaspContext ctx;
  SP_RETURN_IF_ERROR(comm.barrier());
  auto t0 = Clock::now();
  SP_RETURN_IF_ERROR(lasp_forward(comm, layout, job.params, job.algo, q.view(), k.view(), v.view(), out.view(), &ctx));
  report.seconds[0] = std::chrono::duration<double>(Clock::now() - t0).count();
  SP_RETURN_IF_ERROR(comm.barrier());
  t0 = Clock::now();
  SP_RETURN_IF_ERROR(lasp_backward(comm, layout, job.params, ctx, q.view(), k.view(), v.view(), dout.view(),
                                   dq.view(), dk.view(), dv.view()));
  report.seconds[1] = std::chrono::duration<double>(Clock::now() - t0).count();
  report.counters = comm.counters();
  report.ran = ctx.algorithm;
  SP_RETURN_IF_ERROR(layout.unshard(out.view(), 1, me, g->o.view()));
  SP_RETURN_IF_ERROR(layout.unshard(dq.view(), 1, me, g->dq.view()));
  SP_RETURN_IF_ERROR(layout.unshard(dk.view(), 1, me, g->dk.view()));
  SP_RETURN_IF_ERROR(layout.unshard(dv.view(), 1, me, g->dv.view()));
  if (me == comm.size() - 1) g->final_state = ctx.state_out;
  return Status::Ok();
}

// Runs, checks and reports; *exit_code 0 when the check (if asked) passes and the bytes equal
// the formula, else 1.
Status run_job(const Job& job, int* exit_code) {
  const LinearAttnOptions& o = job.opt;
  const int64_t B = o.batch, S = o.seq, H = o.heads, Hkv = job.kv_heads;
  Global g{random_input(job, {B, S, H, o.dk}, 1), random_input(job, {B, S, Hkv, o.dk}, 2),
           random_input(job, {B, S, Hkv, o.dv}, 3), random_input(job, {B, S, H, o.dv}, 4),
           HostTensor(job.dtype, {B, S, H, o.dv}), HostTensor(job.dtype, {B, S, H, o.dk}),
           HostTensor(job.dtype, {B, S, Hkv, o.dk}), HostTensor(job.dtype, {B, S, Hkv, o.dv}), HostTensor()};
  std::vector<RankReport> reports(o.ranks);
  SP_RETURN_IF_ERROR(run_local_ranks(o.ranks, [&](Communicator& comm) { return run_rank(comm, job, &g, &reports); }));
  const LaspAlgorithm ran = reports[0].ran;

  const int64_t state_bytes = lasp_state_bytes(B, H, o.dk, o.dv, job.dtype);
  nlohmann::ordered_json sent{{"forward", nlohmann::json::array()}, {"backward", nlohmann::json::array()}};
  nlohmann::ordered_json expected = sent;
  bool bytes_ok = true;
  double seconds[2] = {0, 0};
  std::printf("seqpar linear-attn: %s (ran %s), %d ranks (local threads, %d OpenMP thread%s each), chunk %ld\n",
              o.algo.c_str(), lasp_algorithm_name(ran), o.ranks, job.threads_per_rank,
              job.threads_per_rank > 1 ? "s" : "", long(o.chunk));
  std::printf("problem: B=%ld S=%ld H=%ld H_kv=%ld d_k=%ld d_v=%ld %s, decay %s, scale %g; one state message %ld B\n",
              long(B), long(S), long(H), long(Hkv), long(o.dk), long(o.dv), dtype_name(job.dtype), o.decay.c_str(),
              o.scale, long(state_bytes));
  std::printf("%5s %14s %14s %14s %14s\n", "rank", "fwd sent (B)", "expected", "bwd sent (B)", "expected");
  for (int r = 0; r < o.ranks; ++r) {
    const LaspTraffic want = lasp_expected_bytes(ran, o.ranks, r, state_bytes);
    const CommCounters& c = reports[r].counters;
    sent["forward"].push_back(c.sent(Phase::kForward)), sent["backward"].push_back(c.sent(Phase::kBackward));
    expected["forward"].push_back(want.forward), expected["backward"].push_back(want.backward);
    bytes_ok = bytes_ok && c.sent(Phase::kForward) == want.forward && c.sent(Phase::kBackward) == want.backward;
    std::printf("%5d %14ld %14ld %14ld %14ld\n", r, long(c.sent(Phase::kForward)), long(want.forward),
                long(c.sent(Phase::kBackward)), long(want.backward));
    for (int pass = 0; pass < 2; ++pass) seconds[pass] = std::max(seconds[pass], reports[r].seconds[pass]);
  }
  std::printf("time: forward %.4f s, backward %.4f s (slowest rank); bytes %s\n", seconds[0], seconds[1],
              bytes_ok ? "equal the formula" : "DIFFER from the formula");

  const double tolerance = job.dtype == DType::kF64 ? 1e-10 : 1e-4;
  nlohmann::ordered_json errors;
  bool check_ok = true;
  if (o.check) {
    const TensorView none{};
    SP_ASSIGN_OR_RETURN(const LinearReferenceResult ref,
                        linear_attention_reference(g.q.view(), g.k.view(), g.v.view(), none, g.dout.view(), none,
                                                   job.params, LinearOracleForm::kRecurrent));
    errors["o"] = relative_error(g.o, ref.o);
    errors["final_state"] = relative_error(g.final_state, ref.state_out);
    errors["dq"] = relative_error(g.dq, ref.dq);
    errors["dk"] = relative_error(g.dk, ref.dk);
    errors["dv"] = relative_error(g.dv, ref.dv);
    for (const auto& [name, err] : errors.items()) check_ok = check_ok && err.get<double>() <= tolerance;
    std::printf("max |error| / max(1, max |reference|) vs the fp64 oracle: O %.2e  final state %.2e  dQ %.2e  "
                "dK %.2e  dV %.2e (tolerance %.0e): %s\n",
                errors["o"].get<double>(), errors["final_state"].get<double>(), errors["dq"].get<double>(),
                errors["dk"].get<double>(), errors["dv"].get<double>(), tolerance, check_ok ? "PASS" : "FAIL");
  } else {
    std::printf("check: skipped (no --check)\n");
  }
  if (!o.dump_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.dump_dir, ec);
    SP_CHECK_ARG(!ec, "cannot create dump directory " + o.dump_dir + ": " + ec.message());
    const std::pair<const char*, const HostTensor*> files[] = {
        {"q", &g.q}, {"k", &g.k}, {"v", &g.v}, {"dO", &g.dout}, {"O", &g.o},
        {"dQ", &g.dq}, {"dK", &g.dk}, {"dV", &g.dv}, {"final_state", &g.final_state}};
    for (const auto& [name, tensor] : files) SP_RETURN_IF_ERROR(write_npy(o.dump_dir + "/" + name + ".npy", *tensor));
    std::fprintf(stderr, "wrote q, k, v, dO, O, dQ, dK, dV, final_state (global order) to %s\n", o.dump_dir.c_str());
  }
  if (o.json) {
    nlohmann::ordered_json j;
    j["algo"] = o.algo;
    j["algo_ran"] = lasp_algorithm_name(ran);
    j["ranks"] = o.ranks;
    j["dtype"] = dtype_name(job.dtype);
    j["batch"] = B, j["seq"] = S, j["heads"] = H, j["kv_heads"] = Hkv, j["dk"] = o.dk, j["dv"] = o.dv;
    j["decay"] = job.params.decay;
    j["scale"] = o.scale;
    j["chunk"] = o.chunk;
    j["fwd_s"] = seconds[0], j["bwd_s"] = seconds[1];
    j["check"] = o.check;
    if (o.check) j["max_rel_err"] = errors, j["tolerance"] = tolerance;
    j["check_passed"] = check_ok;
    j["state_message_bytes"] = state_bytes;
    j["bytes_sent_per_rank"] = sent;
    j["bytes_expected_per_rank"] = expected;
    j["bytes_match"] = bytes_ok;
    std::printf("%s\n", j.dump().c_str());
  }
  std::fflush(stdout);
  *exit_code = check_ok && bytes_ok ? 0 : 1;
  return Status::Ok();
}

}  // namespace

int run_linear_attn(const LinearAttnOptions& options) {
  auto job = resolve(options);
  if (!job.ok()) {
    std::fprintf(stderr, "seqpar linear-attn: error: %s\n", job.status().to_string().c_str());
    return 2;
  }
  int exit_code = 1;
  const Status s = run_job(job.value(), &exit_code);
  if (!s.ok()) {
    std::fprintf(stderr, "seqpar linear-attn: error: %s\n", s.to_string().c_str());
    return 1;
  }
  return exit_code;
}

void add_linear_attn_command(CLI::App& app, LinearAttnOptions& o, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "linear-attn",
      "Causal linear attention with per-head decay (o_i = scale sum_{j<=i} lambda^(i-j) (q_i.k_j) v_j), forward + "
      "backward over N ranks (threads) with LASP, checked against the fp64 oracle.\n"
      "Exit code: 0 when the check (if asked) passes and each rank's bytes equal the formula, 1 when not, 2 for "
      "bad arguments.");
  cmd->add_option("--algo", o.algo, "lasp (state chain), lasp2 (all-gather of state contributions), auto "
                                    "(latency/bandwidth model; picks lasp over this communicator's ring collectives)")
      ->capture_default_str();
  cmd->add_option("--seq", o.seq, "total sequence length (need not divide by the ranks)")->capture_default_str();
  cmd->add_option("--batch", o.batch, "batch size")->capture_default_str();
  cmd->add_option("--heads", o.heads, "query heads")->capture_default_str();
  cmd->add_option("--kv-heads", o.kv_heads, "key/value heads (GQA/MQA); default: --heads");
  cmd->add_option("--dk", o.dk, "query/key head dimension")->capture_default_str();
  cmd->add_option("--dv", o.dv, "value head dimension")->capture_default_str();
  cmd->add_option("--decay", o.decay, "lambda in (0, 1]: one value, or a comma list with one per query head")
      ->capture_default_str();
  cmd->add_option("--scale", o.scale, "output scale")->capture_default_str();
  cmd->add_option("--chunk", o.chunk, "chunk length of the CPU kernel")->capture_default_str();
  cmd->add_option("--ranks", o.ranks, "ranks (threads of this process)")->capture_default_str();
  cmd->add_option("--dtype", o.dtype, "fp32 or fp64")->capture_default_str();
  cmd->add_option("--seed", o.seed, "seed of the random inputs")->capture_default_str();
  cmd->add_flag("--check", o.check, "compare O, the final state, dQ, dK, dV with the fp64 oracle (recurrent form)");
  cmd->add_flag("--json", o.json, "also print one JSON object with the results");
  cmd->add_option("--dump", o.dump_dir, "write q, k, v, dO, O, dQ, dK, dV, final_state as .npy (global order)");
  cmd->callback([&o, exit_code] { *exit_code = run_linear_attn(o); });
}

}  // namespace seqpar::app
