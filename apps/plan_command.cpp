// `seqpar plan` (plan_command.hpp): options, the planner's call, the table or JSON.
#include "plan_command.hpp"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "planner/planner.hpp"
#include "seqpar/schedule.hpp"
#ifdef SEQPAR_HAVE_MODEL
#include "seqpar/backend.hpp"
#include "seqpar/model.hpp"
#endif

namespace seqpar::app {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

void print_table(const planner::Cluster& cluster, const planner::Problem& problem, const planner::PlanTable& t,
                 bool with_step) {
  std::printf("cluster %s: %d GPU(s), %d a node; S = %lld, B = %lld, H = %lld, H_kv = %lld, D = %lld, mask %s\n",
              cluster.name.c_str(), cluster.gpus(), cluster.gpus_per_node, (long long)problem.seq,
              (long long)problem.batch, (long long)problem.heads, (long long)problem.kv_heads,
              (long long)problem.head_dim, problem.mask.c_str());
  std::printf("%-34s %6s %11s %11s %10s %10s %10s %5s %4s%s\n", "algorithm", "groups", "fwd ms", "bwd ms",
              "intra GiB", "inter GiB", "peak GiB", "fits", "sim", with_step ? "     step s" : "");
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const planner::PlanRow& r = t.rows[i];
    const planner::Prediction& p = r.prediction;
    if (!p.refusal.empty()) {
      std::printf("%-34s refused: %s\n", r.candidate.label().c_str(), p.refusal.c_str());
      continue;
    }
    std::printf("%-34s %6d %11.3f %11.3f %10.3f %10.3f %10.3f %5s %4d", r.candidate.label().c_str(),
                r.candidate.head_groups, p.fwd_s * 1e3, p.bwd_s * 1e3, p.link_bytes[0] / kGiB,
                p.link_bytes[1] / kGiB, (p.tensor_bytes + p.extra_bytes()) / kGiB, p.fits ? "yes" : "no",
                p.simulated_ranks);
    if (with_step) std::printf(" %10.3f", r.step_s);
    std::printf("%s\n", int(i) == t.pick ? "   <- pick" : "");
  }
  std::printf("pick: %s\n", t.why.c_str());
}

nlohmann::json table_json(const planner::Cluster& cluster, const planner::Problem& problem,
                          const planner::PlanTable& t) {
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const planner::PlanRow& r = t.rows[i];
    const planner::Prediction& p = r.prediction;
    nlohmann::json row = {{"algorithm", r.candidate.algorithm}, {"label", r.candidate.label()},
                          {"ulysses", r.candidate.ulysses},      {"ring", r.candidate.ring},
                          {"head_groups", r.candidate.head_groups},
                          {"layout", layout_name(r.candidate.layout)}, {"pick", int(i) == t.pick}};
    if (!p.refusal.empty()) {
      row["refusal"] = p.refusal;
    } else {
      row.update({{"fwd_ms", p.fwd_s * 1e3}, {"bwd_ms", p.bwd_s * 1e3}, {"fwdbwd_ms", p.total_s() * 1e3},
                  {"bytes_per_rank", {{"forward", p.fwd_bytes}, {"backward", p.bwd_bytes}}},
                  {"bytes_per_link", {{"intra", p.link_bytes[0]}, {"inter", p.link_bytes[1]}}},
                  {"peak_block_bytes", p.peak_block_bytes}, {"workspace_bytes", p.workspace_bytes},
                  {"peak_extra_bytes", p.extra_bytes()}, {"tensor_bytes", p.tensor_bytes},
                  {"fits", p.fits}, {"simulated_ranks", p.simulated_ranks}, {"step_s", r.step_s}});
    }
    rows.push_back(row);
  }
  return {{"kind", "seqpar_plan"}, {"cluster", cluster.name}, {"gpus", cluster.gpus()},
          {"gpus_per_node", cluster.gpus_per_node}, {"seq", problem.seq}, {"batch", problem.batch},
          {"heads", problem.heads}, {"kv_heads", problem.kv_heads}, {"head_dim", problem.head_dim},
          {"mask", problem.mask}, {"pick", t.pick >= 0 ? t.rows[size_t(t.pick)].candidate.label() : ""},
          {"why", t.why}, {"rows", rows}};
}

}  // namespace

int run_plan(const PlanCliOptions& o) {
  StatusOr<planner::Cluster> cluster = planner::load_cluster(o.cluster);
  if (!cluster.ok()) {
    std::fprintf(stderr, "seqpar plan: %s\n", cluster.status().message().c_str());
    return 2;
  }
  if (!o.write_cluster.empty()) std::ofstream(o.write_cluster) << planner::cluster_to_json(cluster.value()) << "\n";
  planner::Problem problem;
  problem.seq = o.seq, problem.batch = o.batch, problem.heads = o.heads;
  problem.kv_heads = o.kv_heads > 0 ? o.kv_heads : o.heads, problem.head_dim = o.head_dim, problem.mask = o.mask;
  problem.wire.pack_has_delta =
      o.backend == "hopper" || (o.backend == "auto" && !auto_backward_from_o(problem.head_dim));
  planner::PlannerOptions options;
  options.algorithms = o.algos;
  options.head_groups = o.head_groups;
  options.ulysses = o.ulysses;
  options.ring_algorithm = o.ring_algo;
  options.cost.max_simulated_ranks = o.max_simulated_ranks;
  if (!o.layout.empty()) {
    StatusOr<LayoutKind> kind = parse_layout(o.layout);
    if (!kind.ok()) {
      std::fprintf(stderr, "seqpar plan: %s\n", kind.status().message().c_str());
      return 2;
    }
    options.layout = kind.value();
  }
  if (!o.model.empty()) {
#ifdef SEQPAR_HAVE_MODEL
    StatusOr<ModelConfig> m = model_preset(o.model);
    if (!m.ok()) m = load_model_config(o.model);
    if (!m.ok()) {
      std::fprintf(stderr, "seqpar plan: %s\n", m.status().message().c_str());
      return 2;
    }
    problem.heads = m->heads, problem.kv_heads = m->kv_heads, problem.head_dim = m->head_dim();
    options.model = {m->layers, m->hidden, m->ffn, m->vocab};
#else
    std::fprintf(stderr, "seqpar plan: --model needs the training engine (built without BLAS)\n");
    return 2;
#endif
  }
  if (problem.seq <= 0 || problem.heads <= 0 || problem.kv_heads <= 0 || problem.heads % problem.kv_heads) {
    std::fprintf(stderr, "seqpar plan: need S > 0 and query heads a multiple of K/V heads\n");
    return 2;
  }
  const planner::PlanTable table = planner::plan_table(cluster.value(), problem, options);
  if (o.json) std::cout << table_json(cluster.value(), problem, table).dump() << "\n";
  else print_table(cluster.value(), problem, table, options.model.layers > 0);
  return table.pick >= 0 ? 0 : 1;
}

void add_plan_command(CLI::App& app, PlanCliOptions& o, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "plan", "predict time, bytes and memory of every algorithm and grid on a cluster, and pick one");
  cmd->add_option("--cluster", o.cluster, "preset (h100x2, h100x4, h200x2, h200x4, generic:N) or a cluster JSON file")
      ->capture_default_str();
  cmd->add_option("--model", o.model, "model preset or JSON (sets heads, K/V heads, head dim; adds a step)");
  cmd->add_option("--seq", o.seq, "total tokens of the sequence")->capture_default_str();
  cmd->add_option("--batch", o.batch, "sequences")->capture_default_str();
  cmd->add_option("--heads", o.heads, "query heads")->capture_default_str();
  cmd->add_option("--kv-heads", o.kv_heads, "K/V heads (0: as many as query heads)")->capture_default_str();
  cmd->add_option("--head-dim", o.head_dim, "head dim")->capture_default_str();
  cmd->add_option("--mask", o.mask, "full | causal | window:L,R | docs:N | docs-lognormal:M[,SIGMA[,SEED]]")
      ->capture_default_str();
  cmd->add_option("--layout", o.layout,
                  "every candidate on this layout: contiguous, zigzag, striped, documents (the documents layout "
                  "of the mask's documents, as the executors build it); default: each algorithm's own");
  cmd->add_option("--backend", o.backend,
                  "the GPU backend whose query packs the backward moves: auto (D; O at head dims where its table puts "
                  "cuDNN's backward first), cudnn (O) or hopper (D)")
      ->check(CLI::IsMember({"auto", "cudnn", "hopper"}))
      ->capture_default_str();
  cmd->add_option("--algos", o.algos, "only these algorithms (comma list)")->delimiter(',');
  cmd->add_option("--head-groups", o.head_groups, "head groups (0: the fewest that fit)")->capture_default_str();
  cmd->add_option("--ulysses", o.ulysses,
                  "ulysses-ring: only this Ulysses degree, any the algorithm takes (a measured "
                  "run's); 0: each proper degree whose groups stay in a node")
      ->capture_default_str();
  cmd->add_option("--ring-algo", o.ring_algo,
                  "ulysses-ring: only this ring-family algorithm across the groups (default: "
                  "ring-return and burst-return)");
  cmd->add_option("--max-simulated-ranks", o.max_simulated_ranks,
                  "simulate whole up to this many ranks; beyond, fold and extrapolate")
      ->capture_default_str();
  cmd->add_option("--write-cluster", o.write_cluster, "write the cluster description as JSON here");
  cmd->add_flag("--json", o.json, "one JSON object instead of the table");
  cmd->callback([&o, exit_code] { *exit_code = run_plan(o); });
}

}  // namespace seqpar::app
