// `seqpar attn` (attn_command.hpp): resolves the options, prints a schedule when asked, starts
// the ranks, and on each runs compute -> collect -> check -> report (attn_compute, attn_check,
// attn_report).
#include "attn_command.hpp"

#include <omp.h>

#include <cstdio>
#include <filesystem>

#include "attn_check.hpp"
#include "attn_report.hpp"
#include "npy.hpp"
#include "seqpar/nccl_comm.hpp"

namespace seqpar::app {
namespace {

AttentionParams params_of(const Job& job) {
  AttentionParams params;
  params.mask = job.mask;
  return params;
}

// --print-schedule R: the plan's steps for rank R (the CPU backend's block sizes), no run.
int print_schedule(const Job& job, const Layout& layout) {
  const AttnOptions& o = job.opt;
  if (o.print_schedule >= job.ranks) {
    std::fprintf(stderr, "seqpar attn: error: --print-schedule %d but there are %d ranks\n", o.print_schedule,
                 job.ranks);
    return 2;
  }
  const int shown = o.print_schedule;
  auto plan = plan_attention(plan_options(job, o.algo), layout, params_of(job), cpu_block_bytes(job), shown,
                             cpu_kernel_backend());
  if (!plan.ok()) {
    std::fprintf(stderr, "seqpar attn: error: %s\n", plan.status().to_string().c_str());
    return 2;
  }
  const Topology topology{o.ranks_per_node};
  std::printf("%s (%s)%s: rank %d of %d, %s layout, %s mask\n", plan->algorithm->name, plan->algorithm->summary,
              plan->choice.empty() ? "" : (" [" + plan->choice + "]").c_str(), shown, job.ranks, o.layout.c_str(),
              job.mask.describe().c_str());
  for (Pass pass : {Pass::kForward, Pass::kBackward}) {
    const std::vector<Step>& steps = plan->schedule.pass(pass);
    const WalkedBytes w = walk_bytes(steps, shown, layout, plan->block_bytes, topology, plan->schedule.head_parts);
    std::printf("%s: %.3g shard pairs of all heads, sends %ld bytes (intra %ld, inter %ld)\n%s",
                pass == Pass::kForward ? "forward" : "backward",
                compute_work(steps, plan->request, plan->schedule.head_parts), long(w.total), long(w.by_link[0]),
                long(w.by_link[1]), describe_steps(steps, topology, shown).c_str());
  }
  return 0;
}

Status dump_npy(const std::string& dir, const Inputs& g, const Collected& c) {
  const std::pair<const char*, const HostTensor*> files[] = {{"q", &g.q},   {"k", &g.k},     {"v", &g.v},
                                                              {"dO", &g.dout}, {"O", &c.o},   {"LSE", &c.lse},
                                                              {"dQ", &c.dq}, {"dK", &c.dk}, {"dV", &c.dv}};
  for (const auto& [name, tensor] : files) SP_RETURN_IF_ERROR(write_npy(dir + "/" + name + ".npy", *tensor));
  progress("wrote q, k, v, dO, O, LSE, dQ, dK, dV (global token order) to " + dir);
  return Status::Ok();
}

// The whole job on one rank; rank 0 checks, prints and sets *exit_code.
Status run_rank(Communicator& comm, const Job& job, int* exit_code) {
  omp_set_num_threads(job.threads_per_rank);
  const AttnOptions& o = job.opt;
  const int me = comm.rank(), P = comm.size();
  SP_ASSIGN_OR_RETURN(const LayoutKind kind, parse_layout(o.layout));
  const AttentionParams params = params_of(job);
  SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(kind, o.seq, P, params.mask.doc_offsets));
  if (me == 0) progress("running the forward on " + std::to_string(P) + (job.on_gpu ? " GPU ranks" : " ranks"));
  RankRun run;
  {
    Inputs in = local_inputs(job, layout, me);
    SP_RETURN_IF_ERROR(job.on_gpu ? run_gpu_rank(comm, job, layout, params, o.algo, in, false, "", &run)
                                  : run_cpu_rank(comm, job, layout, params, o.algo, in, &run));
  }
  if (me == 0 && !run.plan->choice.empty()) progress(run.plan->choice);

  // Everything below is bookkeeping, counted apart from the algorithm's traffic.
  const CommCounters counters = comm.counters();
  const PhaseScope other(comm, Phase::kOther);
  SP_RETURN_IF_ERROR(comm.all_reduce(run.times, 2, DType::kF64, ReduceOp::kMax));
  const Topology topology{o.ranks_per_node};
  RankFigures mine;
  mine.sent[0] = counters.sent(Phase::kForward), mine.sent[1] = counters.sent(Phase::kBackward);
  mine.pairs = run.fwd_stats.pairs_computed;
  for (int peer = 0; peer < static_cast<int>(counters.sent_to.size()); ++peer)
    if (topology.node_of(peer) != topology.node_of(me)) mine.inter += counters.sent_to[peer][0] + counters.sent_to[peer][1];
  std::vector<RankFigures> figures(P);
  SP_RETURN_IF_ERROR(comm.all_gather(&mine, figures.data(), sizeof(mine)));
  Collected collected;
  SP_RETURN_IF_ERROR(collect_results(comm, job, layout, run, &collected));
  if (me != 0) return Status::Ok();

  Inputs whole;
  if (job.need_global) {
    progress("making the whole inputs");
    SP_ASSIGN_OR_RETURN(const Layout one, Layout::create(LayoutKind::kContiguous, o.seq, 1));
    whole = local_inputs(job, one, 0);
  }
  SP_ASSIGN_OR_RETURN(const CheckResult check, check_results(job, params, collected, whole, run.plan->head_groups, P));
  if (!o.dump_dir.empty()) SP_RETURN_IF_ERROR(dump_npy(o.dump_dir, whole, collected));
  const bool bytes_ok = print_report(job, run, figures, run.times, check);
  *exit_code = check.ok && bytes_ok ? 0 : 1;
  return Status::Ok();
}

// Ends a failed multi-process GPU run at once: a peer may be gone, and tearing down CUDA and
// NCCL state could wait on it.
[[noreturn]] void exit_failed_gpu_rank(int rank, const Status& s) {
  std::fprintf(stderr, "seqpar attn: rank %d: error: %s\n", rank, s.to_string().c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(1);
}

// Whether the algorithm takes this problem (refused: a bad argument, exit 2).
Status check_plan(const Job& job, const Layout& layout) {
  return plan_attention(plan_options(job, job.opt.algo), layout, params_of(job), cpu_block_bytes(job), 0,
                        cpu_kernel_backend())
      .status();
}

}  // namespace

int run_attn(const AttnOptions& options, bool ranks_given) {
  const bool under_mpi = launched_by_mpi();
  const bool under_torchrun = !under_mpi && launched_by_torchrun() && options.device == "cuda";
  auto job = resolve_job(options, ranks_given, under_mpi, under_torchrun);
  Status planned = job.status();
  std::optional<Layout> layout;
  if (planned.ok()) {
    layout = Layout::create(parse_layout(job->opt.layout).value(), job->opt.seq, job->ranks, job->mask.doc_offsets)
                 .value();
    planned = check_plan(job.value(), *layout);
  }
  if (!planned.ok()) {
    std::fprintf(stderr, "seqpar attn: error: %s\n", planned.to_string().c_str());
    return 2;
  }
  if (job->opt.print_schedule >= 0) return print_schedule(job.value(), *layout);
  layout.reset();

  int exit_code = 1;
  const bool on_gpu = job->on_gpu;
  if (on_gpu && job->launch != Launch::kSharedGpu) nccl_exit_process_on_failure(true);
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
      std::fprintf(stderr, "seqpar attn: rank %d: error: %s\n", comm.value()->rank(), s.to_string().c_str());
      comm.value()->abort(s.message());  // the other ranks must not wait for this one
      return 1;
    }
    return exit_code;
  }
  auto each_rank = [&](Communicator& comm) { return run_rank(comm, job.value(), &exit_code); };
  const Status s = on_gpu && job->launch == Launch::kThreads ? run_nccl_local_ranks(job->ranks, each_rank)
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
      "Run distributed attention forward + backward on N ranks and check it against the fp64 oracle. Ranks are "
      "threads of this process, or MPI processes when started by mpirun.\n"
      "Exit code: 0 when the check passes and measured bytes equal the bytes walked from the schedule, 1 when "
      "not, 2 for bad arguments.");
  add_attn_options(*cmd, o);
  CLI::Option* ranks = cmd->get_option("--ranks");
  cmd->callback([&o, exit_code, ranks] { *exit_code = run_attn(o, ranks->count() > 0); });
}

}  // namespace seqpar::app
