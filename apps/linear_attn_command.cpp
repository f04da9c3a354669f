// `seqpar linear-attn`: builds a random problem, runs LASP (chain or all-gather) forward +
// backward on thread ranks, or on MPI processes when started by mpirun (as `seqpar attn` and
// `seqpar train` do), gathers the results on rank 0, checks them against the fp64 recurrent
// oracle, compares each rank's bytes with the walk of its passes, and prints a table and
// optionally JSON.
#include "linear_attn_command.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "npy.hpp"
#include "rank_gather.hpp"
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
  int ranks = 1;
  int threads_per_rank = 1;
  bool under_mpi = false;
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

// The processes mpirun started (0 where the launcher does not say).
int mpi_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* size = std::getenv(var)) return std::atoi(size);
  return 0;
}

// Under mpirun the ranks are the processes: --ranks may only repeat their count.
StatusOr<Job> resolve(const LinearAttnOptions& opt, bool ranks_given, bool under_mpi) {
  Job job;
  job.opt = opt;
  job.under_mpi = under_mpi;
  SP_ASSIGN_OR_RETURN(job.algo, parse_lasp_algorithm(opt.algo));
  // The report checks the final state and the bytes against LASP's walk, which ulysses has not.
  SP_CHECK_ARG(job.algo != LaspAlgorithm::kUlysses,
               "--algo ulysses is not LASP: it runs in seqpar train (--linear-sp ulysses) for now");
  SP_CHECK_ARG(opt.dtype == "fp32" || opt.dtype == "fp64", "--dtype must be fp32 or fp64 (CPU ranks)");
  job.dtype = opt.dtype == "fp64" ? DType::kF64 : DType::kF32;
  SP_CHECK_ARG(opt.batch >= 1 && opt.heads >= 1 && opt.dk >= 1 && opt.dv >= 1 && opt.seq >= 1,
               "--batch, --heads, --dk, --dv and --seq must be positive");
  job.kv_heads = opt.kv_heads > 0 ? opt.kv_heads : opt.heads;
  SP_CHECK_ARG(opt.heads % job.kv_heads == 0, "--heads (" + std::to_string(opt.heads) +
                                                  ") must be divisible by --kv-heads (" +
                                                  std::to_string(job.kv_heads) + ")");
  job.ranks = opt.ranks;
  int ranks_here = opt.ranks;
  if (under_mpi) {
    const int world = mpi_world_size();
    SP_CHECK_ARG(!ranks_given || world == 0 || world == opt.ranks,
                 "--ranks " + std::to_string(opt.ranks) + " but mpirun started " + std::to_string(world) +
                     " processes; drop --ranks or make them agree");
    if (world > 0) job.ranks = world;
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    ranks_here = local ? std::max(1, std::atoi(local)) : 1;
  }
  SP_CHECK_ARG(job.ranks >= 1 && job.ranks <= 1024, "--ranks must be between 1 and 1024");
  SP_CHECK_ARG(opt.seq >= job.ranks, "--seq (" + std::to_string(opt.seq) + ") must be at least --ranks (" +
                                         std::to_string(job.ranks) + "): every rank needs a token");
  SP_ASSIGN_OR_RETURN(job.params.decay, parse_decays(opt.decay));
  job.params.scale = opt.scale;
  job.params.chunk = opt.chunk;
  SP_RETURN_IF_ERROR(validate_linear_params(job.params, opt.heads));
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  job.threads_per_rank = std::max(1, cores / ranks_here);
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

// The whole problem's inputs (every process makes them from the seed; threads share them).
struct Inputs {
  HostTensor q, k, v, dout;
};

// The results gathered on rank 0, in global token order.
struct Results {
  HostTensor o, dq, dk, dv, final_state;
};

// What each rank tells rank 0 for the report.
struct RankFigures {
  int64_t sent[2] = {0, 0};  // bytes, forward and backward
  double seconds[2] = {0, 0};
  int64_t state_bytes = 0;
  int32_t ran = 0;  // LaspAlgorithm
};

// Rank 0's report: the table, the check, the dump, the JSON; *exit_code 0 when the check (if
// asked) passes and every rank's bytes equal the walk of its passes, else 1.
Status report(const Job& job, const Inputs& in, const Results& res, const std::vector<RankFigures>& figures,
              int* exit_code) {
  const LinearAttnOptions& o = job.opt;
  const int64_t B = o.batch, S = o.seq, H = o.heads, Hkv = job.kv_heads;
  const int P = int(figures.size());
  const LaspAlgorithm ran = static_cast<LaspAlgorithm>(figures[0].ran);
  const int64_t state_bytes = figures[0].state_bytes;
  nlohmann::ordered_json sent{{"forward", nlohmann::json::array()}, {"backward", nlohmann::json::array()}};
  nlohmann::ordered_json expected = sent;
  bool bytes_ok = true;
  double seconds[2] = {0, 0};
  std::printf("seqpar linear-attn: %s (ran %s), %d ranks (%s, %d OpenMP thread%s each), chunk %ld\n", o.algo.c_str(),
              lasp_algorithm_name(ran), P, job.under_mpi ? "mpi processes" : "local threads", job.threads_per_rank,
              job.threads_per_rank > 1 ? "s" : "", long(o.chunk));
  std::printf("problem: B=%ld S=%ld H=%ld H_kv=%ld d_k=%ld d_v=%ld %s, decay %s, scale %g; one state message %ld B\n",
              long(B), long(S), long(H), long(Hkv), long(o.dk), long(o.dv), dtype_name(job.dtype), o.decay.c_str(),
              o.scale, long(state_bytes));
  std::printf("%5s %14s %14s %14s %14s\n", "rank", "fwd sent (B)", "walked", "bwd sent (B)", "walked");
  for (int r = 0; r < P; ++r) {
    const LaspTraffic want = lasp_walked_bytes(ran, P, r, state_bytes);
    const RankFigures& f = figures[r];
    sent["forward"].push_back(f.sent[0]), sent["backward"].push_back(f.sent[1]);
    expected["forward"].push_back(want.forward), expected["backward"].push_back(want.backward);
    bytes_ok = bytes_ok && f.sent[0] == want.forward && f.sent[1] == want.backward;
    std::printf("%5d %14ld %14ld %14ld %14ld\n", r, long(f.sent[0]), long(want.forward), long(f.sent[1]),
                long(want.backward));
    for (int pass = 0; pass < 2; ++pass) seconds[pass] = std::max(seconds[pass], f.seconds[pass]);
  }
  std::printf("time: forward %.4f s, backward %.4f s (slowest rank); bytes %s\n", seconds[0], seconds[1],
              bytes_ok ? "equal the walk of the passes" : "DIFFER from the walk of the passes");

  const double tolerance = job.dtype == DType::kF64 ? 1e-10 : 1e-4;
  nlohmann::ordered_json errors;
  bool check_ok = true;
  if (o.check) {
    const TensorView none{};
    SP_ASSIGN_OR_RETURN(const LinearReferenceResult ref,
                        linear_attention_reference(in.q.view(), in.k.view(), in.v.view(), none, in.dout.view(), none,
                                                   job.params, LinearOracleForm::kRecurrent));
    errors["o"] = relative_error(res.o, ref.o);
    errors["final_state"] = relative_error(res.final_state, ref.state_out);
    errors["dq"] = relative_error(res.dq, ref.dq);
    errors["dk"] = relative_error(res.dk, ref.dk);
    errors["dv"] = relative_error(res.dv, ref.dv);
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
        {"q", &in.q}, {"k", &in.k}, {"v", &in.v}, {"dO", &in.dout}, {"O", &res.o},
        {"dQ", &res.dq}, {"dK", &res.dk}, {"dV", &res.dv}, {"final_state", &res.final_state}};
    for (const auto& [name, tensor] : files) SP_RETURN_IF_ERROR(write_npy(o.dump_dir + "/" + name + ".npy", *tensor));
    std::fprintf(stderr, "wrote q, k, v, dO, O, dQ, dK, dV, final_state (global order) to %s\n", o.dump_dir.c_str());
  }
  if (o.json) {
    nlohmann::ordered_json j;
    j["algo"] = o.algo;
    j["algo_ran"] = lasp_algorithm_name(ran);
    j["ranks"] = P;
    j["launch"] = job.under_mpi ? "mpi" : "threads";
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
    j["bytes_expected_per_rank"] = expected;  // walked from each rank's passes
    j["bytes_match"] = bytes_ok;
    std::printf("%s\n", j.dump().c_str());
  }
  std::fflush(stdout);
  *exit_code = check_ok && bytes_ok ? 0 : 1;
  return Status::Ok();
}

// The whole job on one rank (a thread or a process); rank 0 gathers, checks and reports.
Status run_rank(Communicator& comm, const Job& job, const Inputs& in, int* exit_code) {
  omp_set_num_threads(job.threads_per_rank);
  const LinearAttnOptions& o = job.opt;
  const int me = comm.rank();
  SP_CHECK_ARG(comm.size() == job.ranks, "the communicator has " + std::to_string(comm.size()) + " ranks, the job " +
                                             std::to_string(job.ranks));
  SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(LayoutKind::kContiguous, o.seq, comm.size()));
  const int64_t n = layout.local_len(me), B = o.batch, H = o.heads, Hkv = job.kv_heads;
  auto local = [&](const HostTensor& global, int64_t heads, int64_t dim) -> StatusOr<HostTensor> {
    HostTensor t(job.dtype, {B, n, heads, dim});
    SP_RETURN_IF_ERROR(layout.shard(global.view(), 1, me, t.view()));
    return t;
  };
  SP_ASSIGN_OR_RETURN(const HostTensor q, local(in.q, H, o.dk));
  SP_ASSIGN_OR_RETURN(const HostTensor k, local(in.k, Hkv, o.dk));
  SP_ASSIGN_OR_RETURN(const HostTensor v, local(in.v, Hkv, o.dv));
  SP_ASSIGN_OR_RETURN(const HostTensor dout, local(in.dout, H, o.dv));
  HostTensor out(job.dtype, {B, n, H, o.dv}), dq(job.dtype, {B, n, H, o.dk});
  HostTensor dk(job.dtype, {B, n, Hkv, o.dk}), dv(job.dtype, {B, n, Hkv, o.dv});
  RankFigures mine;
  LaspContext ctx;
  SP_RETURN_IF_ERROR(comm.barrier());
  auto t0 = Clock::now();
  SP_RETURN_IF_ERROR(lasp_forward(comm, layout, job.params, job.algo, q.view(), k.view(), v.view(), out.view(), &ctx));
  mine.seconds[0] = std::chrono::duration<double>(Clock::now() - t0).count();
  SP_RETURN_IF_ERROR(comm.barrier());
  t0 = Clock::now();
  SP_RETURN_IF_ERROR(lasp_backward(comm, layout, job.params, &ctx, q.view(), k.view(), v.view(), dout.view(),
                                   dq.view(), dk.view(), dv.view()));
  mine.seconds[1] = std::chrono::duration<double>(Clock::now() - t0).count();
  mine.sent[0] = comm.counters().sent(Phase::kForward), mine.sent[1] = comm.counters().sent(Phase::kBackward);
  mine.state_bytes = ctx.state_bytes();
  mine.ran = static_cast<int32_t>(ctx.algorithm);

  // Everything below is bookkeeping, counted apart from the algorithm's traffic.
  const PhaseScope other(comm, Phase::kOther);
  std::vector<RankFigures> figures(comm.size());
  SP_RETURN_IF_ERROR(comm.all_gather(&mine, figures.data(), sizeof(mine)));
  Results res;
  SP_RETURN_IF_ERROR(gather_on_rank0(comm, layout, out, 1, &res.o));
  SP_RETURN_IF_ERROR(gather_on_rank0(comm, layout, dq, 1, &res.dq));
  SP_RETURN_IF_ERROR(gather_on_rank0(comm, layout, dk, 1, &res.dk));
  SP_RETURN_IF_ERROR(gather_on_rank0(comm, layout, dv, 1, &res.dv));
  const int last = comm.size() - 1;
  if (me == last) {
    SP_ASSIGN_OR_RETURN(res.final_state, lasp_state_out_on_host(ctx));
  }
  if (last > 0 && (me == last || me == 0)) {  // the final state leaves the last rank for rank 0
    if (me == 0) res.final_state = HostTensor(job.dtype, {B, H, o.dk, o.dv});
    const SendSpec to_root{0, res.final_state.view().data, res.final_state.bytes()};
    const RecvSpec from_last{last, res.final_state.view().data, res.final_state.bytes()};
    SP_RETURN_IF_ERROR(me == 0 ? comm.exchange({}, {&from_last, 1}) : comm.exchange({&to_root, 1}, {}));
  }
  return me == 0 ? report(job, in, res, figures, exit_code) : Status::Ok();
}

// Every process makes the same inputs from the seed.
Inputs make_inputs(const Job& job) {
  const LinearAttnOptions& o = job.opt;
  const int64_t B = o.batch, S = o.seq, H = o.heads, Hkv = job.kv_heads;
  return {random_input(job, {B, S, H, o.dk}, 1), random_input(job, {B, S, Hkv, o.dk}, 2),
          random_input(job, {B, S, Hkv, o.dv}, 3), random_input(job, {B, S, H, o.dv}, 4)};
}

}  // namespace

int run_linear_attn(const LinearAttnOptions& options, bool ranks_given) {
  const bool under_mpi = launched_by_mpi();
  auto job = resolve(options, ranks_given, under_mpi);
  if (!job.ok()) {
    std::fprintf(stderr, "seqpar linear-attn: error: %s\n", job.status().to_string().c_str());
    return 2;
  }
  const Inputs inputs = make_inputs(job.value());
  int exit_code = 1;
  if (under_mpi) {
    auto comm = make_mpi_world_communicator();
    if (!comm.ok()) {
      std::fprintf(stderr, "seqpar linear-attn: error: %s\n", comm.status().to_string().c_str());
      return 1;
    }
    exit_code = 0;
    const Status s = run_rank(*comm.value(), job.value(), inputs, &exit_code);
    if (!s.ok()) {
      std::fprintf(stderr, "seqpar linear-attn: rank %d: error: %s\n", comm.value()->rank(), s.to_string().c_str());
      comm.value()->abort(s.message());  // the other ranks must not wait for this one
      return 1;
    }
    return exit_code;
  }
  const Status s = run_local_ranks(job->ranks, [&](Communicator& comm) {
    return run_rank(comm, job.value(), inputs, &exit_code);
  });
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
      "backward over N ranks (threads, or MPI processes when started by mpirun) with LASP, checked against the fp64 "
      "oracle.\n"
      "Exit code: 0 when the check (if asked) passes and each rank's bytes equal the walk of its passes, 1 when not, 2 "
      "for bad arguments.");
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
  CLI::Option* ranks = cmd->add_option("--ranks", o.ranks, "ranks (threads of this process); under mpirun: the process count")
                           ->capture_default_str();
  cmd->add_option("--dtype", o.dtype, "fp32 or fp64")->capture_default_str();
  cmd->add_option("--seed", o.seed, "seed of the random inputs")->capture_default_str();
  cmd->add_flag("--check", o.check, "compare O, the final state, dQ, dK, dV with the fp64 oracle (recurrent form)");
  cmd->add_flag("--json", o.json, "also print one JSON object with the results");
  cmd->add_option("--dump", o.dump_dir, "write q, k, v, dO, O, dQ, dK, dV, final_state as .npy (global order)");
  cmd->callback([&o, exit_code, ranks] { *exit_code = run_linear_attn(o, ranks->count() > 0); });
}

}  // namespace seqpar::app
