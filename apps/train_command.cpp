// `seqpar train` (train_command.hpp): options -> TrainOptions, the ranks, the step lines, the
// checkpoints and the loss plot; the command line itself is train_command_cli.cpp.
#include "train_command.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "seqpar/nccl_comm.hpp"
#include "seqpar/safetensors.hpp"
#include "seqpar/trainer.hpp"
#include "train_checkpoints.hpp"
#include "train_profile_report.hpp"

namespace seqpar::app {
namespace {

std::atomic<bool> g_stopped_by_termination{false};  // the run saved and stopped on SIGTERM

StatusOr<TrainOptions> resolve(const TrainCliOptions& c, int ranks) {
  SP_CHECK_ARG(c.device == "cpu" || c.device == "cuda", "unknown device '" + c.device + "' (cpu or cuda)");
#ifndef SEQPAR_HAVE_CUDA
  SP_CHECK_SUPPORTED(c.device == "cpu", "seqpar was built without CUDA: --device cpu");
#endif
  SP_CHECK_ARG(c.lm_head_chunk >= 0, "--lm-head-chunk must not be negative (0: all rows at once)");
  SP_CHECK_ARG(c.tile_tokens >= -1, "--tile-tokens takes rows, 0 (all rows at once) or -1 (the default: 8192 under a checkpointing policy)");
  TrainOptions o;
  o.device = c.device == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu;
  if (!c.config.empty()) {
    SP_ASSIGN_OR_RETURN(o.model, load_model_config(c.config));
  } else {
    SP_ASSIGN_OR_RETURN(o.model, model_preset(c.model));
  }
  if (c.vocab > 0) o.model.vocab = c.vocab;
  SP_RETURN_IF_ERROR(o.model.validate());
  SP_CHECK_ARG(c.seq >= 2 && c.batch >= 1 && c.steps >= 1, "--seq must be at least 2, --batch and --steps positive");
  SP_CHECK_ARG(c.save_every >= 0, "--save-every must not be negative");
  SP_CHECK_ARG(c.save_every == 0 || !c.save.empty() || !c.checkpoint_dir.empty(),
               "--save-every needs --save PATH or --checkpoint-dir DIR");
  SP_CHECK_ARG(c.resume != "auto" || !c.checkpoint_dir.empty(), "--resume auto needs --checkpoint-dir DIR");
  SP_CHECK_ARG(c.save.empty() || c.checkpoint_dir.empty(), "--save and --checkpoint-dir: take one");
  SP_CHECK_ARG(c.keep >= 0, "--keep must not be negative (0: keep every checkpoint)");
  o.data = c.data;
  o.seq = c.seq, o.batch = c.batch, o.steps = c.steps;
  o.data_parallel = c.data_parallel, o.zero_stage = c.zero, o.zero_overlap = c.zero_overlap;
  SP_CHECK_ARG(c.data_parallel >= 1 && ranks % c.data_parallel == 0,
               "--data-parallel " + std::to_string(c.data_parallel) + " must divide the " + std::to_string(ranks) + " ranks");
  o.algorithm = c.algo;
  SP_CHECK_ARG(c.ulysses >= 0, "--ulysses must be positive (0: the largest the heads allow)");
  o.ulysses = c.ulysses;
  o.ring_algorithm = c.ring_algo;
  SP_ASSIGN_OR_RETURN(o.linear_sp, parse_lasp_algorithm(c.linear_sp));
  const std::string layout = c.layout != "auto" ? c.layout : o.model.has_linear_layers() ? "contiguous" : "zigzag";
  SP_ASSIGN_OR_RETURN(o.layout, parse_layout(layout));
  SP_RETURN_IF_ERROR(Layout::create(o.layout, c.seq, ranks / c.data_parallel, {}).status());
  o.ranks_per_node = c.ranks_per_node;
  SP_ASSIGN_OR_RETURN(o.checkpointing, parse_checkpointing(c.checkpointing));
  SP_CHECK_ARG(!c.offload_checkpoints || o.checkpointing != Checkpointing::kNone,
               "--offload-checkpoints moves what a checkpointing policy keeps to host memory: it needs "
               "--checkpointing full, attention or sequence, not none");
  o.offload_checkpoints = c.offload_checkpoints;
  SP_CHECK_ARG(c.offload_keep_layers == 1 || c.offload_checkpoints,
               "--offload-keep-layers says which checkpoints stay on the device when --offload-checkpoints moves "
               "the rest to host memory: give both");
  SP_CHECK_ARG(c.offload_keep_layers >= 1 && c.offload_keep_layers <= o.model.layers,
               "--offload-keep-layers must be between 1 and the model's " + std::to_string(o.model.layers) +
                   " layers, got " + std::to_string(c.offload_keep_layers));
  o.offload_keep_layers = c.offload_keep_layers;
  o.optimizer.lr = c.lr;
  o.optimizer.warmup_steps = c.warmup;
  o.optimizer.total_steps = c.steps;
  o.optimizer.weight_decay = c.weight_decay;
  o.optimizer.clip_norm = c.clip;
  SP_RETURN_IF_ERROR(validate_adamw(o.optimizer));
  o.seed = c.seed;
  o.lm_head_chunk = c.lm_head_chunk;
  o.tile_tokens = c.tile_tokens;
  o.deterministic = c.deterministic;
  o.profile = c.profile;
  o.progress_s = c.progress;
  SP_CHECK_ARG(c.pack >= -1, "--pack takes a token id (the end-of-document token)");
  SP_CHECK_ARG(c.pack < 0 || c.pack < o.model.vocab, "--pack " + std::to_string(c.pack) +
                                                        " is outside the model's vocabulary of " + std::to_string(o.model.vocab));
  SP_CHECK_ARG(c.pack >= 0 || !c.pack_global_positions, "--pack-global-positions needs --pack");
  o.pack_eod = c.pack, o.pack_global_positions = c.pack_global_positions;
  SP_CHECK_ARG(c.dump_dir.empty() || c.zero < 2, "--dump records the whole gradient, which ZeRO 2 and 3 do not keep");
  for (const std::string* dir : {&c.dump_dir, &c.export_dir}) {
    if (dir->empty()) continue;
    std::error_code ec;
    std::filesystem::create_directories(*dir, ec);
    SP_CHECK_ARG(!ec, "cannot create the folder " + *dir + ": " + ec.message());
  }
  return o;
}

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", double(bytes) / (1 << 20));
  return buf;
}

// The loss curve as a small standalone SVG (a polyline over step and loss axes).
Status write_plot(const std::string& path, const std::vector<double>& losses, const std::string& title) {
  std::ofstream out(path);
  SP_CHECK_ARG(out.good(), "cannot write the plot " + path);
  const double W = 640, H = 360, L = 60, R = 20, T = 30, Bm = 40;
  const double top = *std::max_element(losses.begin(), losses.end()) * 1.05;
  const double n = double(std::max<size_t>(2, losses.size()) - 1);
  out << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' font-family='sans-serif' font-size='12'>\n"
      << "<rect width='100%' height='100%' fill='white'/>\n<text x='" << L << "' y='18'>" << title << "</text>\n"
      << "<line x1='" << L << "' y1='" << H - Bm << "' x2='" << W - R << "' y2='" << H - Bm << "' stroke='black'/>\n"
      << "<line x1='" << L << "' y1='" << T << "' x2='" << L << "' y2='" << H - Bm << "' stroke='black'/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double v = top * i / 4, y = H - Bm - (H - Bm - T) * i / 4;
    out << "<text x='" << L - 6 << "' y='" << y + 4 << "' text-anchor='end'>" << std::round(v * 100) / 100 << "</text>\n";
  }
  out << "<text x='" << (W + L) / 2 << "' y='" << H - 8 << "' text-anchor='middle'>step (0 to " << losses.size() - 1
      << ")</text>\n<polyline fill='none' stroke='#1f77b4' stroke-width='1.5' points='";
  for (size_t i = 0; i < losses.size(); ++i)
    out << L + (W - L - R) * double(i) / n << "," << H - Bm - (H - Bm - T) * std::max(0.0, losses[i]) / top << " ";
  out << "'/>\n</svg>\n";
  SP_CHECK_ARG(out.good(), "writing the plot " + path + " failed");
  return Status::Ok();
}

// --dump DIR: what another implementation needs to replay the run and compare: config.json,
// the starting weights, every step's batch (batches.safetensors, I32 inputs_N / targets_N), the
// first step's summed gradient (grads_step0.safetensors, parameter names), and run.json (the
// optimizer's settings and our losses).
struct RunRecord {
  std::vector<NamedArray> batches;
  nlohmann::ordered_json losses = nlohmann::json::array();
};

NamedArray int_array(const std::string& name, const std::vector<std::vector<int32_t>>& rows) {
  NamedArray a{name, "I32", {int64_t(rows.size()), int64_t(rows.front().size())}, {}};
  for (const auto& r : rows) {
    const char* p = reinterpret_cast<const char*>(r.data());
    a.bytes.insert(a.bytes.end(), p, p + r.size() * sizeof(int32_t));
  }
  return a;
}

Status write_record(const std::string& dir, const TrainOptions& o, const RunRecord& rec) {
  SP_RETURN_IF_ERROR(save_safetensors(dir + "/batches.safetensors", rec.batches));
  const nlohmann::ordered_json run = {{"seq", o.seq},
                                      {"batch", o.batch * o.data_parallel},
                                      {"lr", o.optimizer.lr},
                                      {"beta1", o.optimizer.beta1},
                                      {"beta2", o.optimizer.beta2},
                                      {"eps", o.optimizer.eps},
                                      {"weight_decay", o.optimizer.weight_decay},
                                      {"clip_norm", o.optimizer.clip_norm},
                                      {"warmup_steps", o.optimizer.warmup_steps},
                                      {"total_steps", o.optimizer.total_steps},
                                      {"min_lr_ratio", o.optimizer.min_lr_ratio},
                                      {"losses", rec.losses}};
  std::ofstream out(dir + "/run.json");
  out << run.dump(2) << "\n";
  SP_CHECK_ARG(out.good(), "cannot write " + dir + "/run.json");
  return Status::Ok();
}

// Model FLOPs of a step, PaLM's count: 6 N per token for the parameters, plus per token and
// layer 6 d S for causal softmax attention (12 d S halved), or 12 d D for linear attention (its
// recurrent form: q S and the state's k^T v update, 2 D^2 each per head, times 3 for the
// backward), N the parameters, d the hidden size, D the head size, S the sequence. Counting the
// softmax term for a linear layer would credit it with work it never does (MFU over 100%).
double step_flops(const TrainOptions& o) {
  const ModelConfig& m = o.model;
  const double tokens = double(o.batch) * double(o.seq);
  double mixer_per_token = 0;
  for (int64_t l = 0; l < m.layers; ++l)
    mixer_per_token += m.mixer(l) == MixerKind::kLinear ? 12.0 * double(m.hidden) * double(m.head_dim())
                                                        : 6.0 * double(m.hidden) * double(o.seq);
  return 6.0 * double(parameter_count(m)) * tokens + mixer_per_token * tokens;
}
// H200 / H100 dense bf16 peak (989 TFLOP/s), as DESIGN.md's anchors count MFU.
constexpr double kPeakFlops = 989e12;

// `gpus`: the GPUs the ranks run on (MFU is per GPU; thread ranks sharing one GPU count one).
Status train_rank(Communicator& comm, const TrainCliOptions& c, const TrainOptions& o, int threads, int gpus) {
  omp_set_num_threads(threads);
  const bool lead = comm.rank() == 0;
  SP_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::create(o, comm));
  if (!c.init_from.empty()) {
    SP_ASSIGN_OR_RETURN(const std::vector<float> weights, load_model_safetensors(c.init_from, o.model));
    SP_RETURN_IF_ERROR(trainer->set_parameters(weights));
  }
  std::string resume = c.resume;
  if (resume == "auto") {  // the newest checkpoint that reads whole; none: from the start
    SP_ASSIGN_OR_RETURN(resume, agreed_checkpoint(comm, c.checkpoint_dir, parameter_count(o.model)));
    if (resume.empty() && lead)
      std::fprintf(stderr, "seqpar train: no whole checkpoint in %s: starting from step 0\n", c.checkpoint_dir.c_str());
  }
  if (!resume.empty()) SP_RETURN_IF_ERROR(trainer->load(resume));
  // Saves where the options say: the --save file, or the next numbered one in --checkpoint-dir
  // (the oldest beyond --keep removed). Every rank calls it.
  std::string last_saved = c.save;
  const auto save = [&]() -> Status {
    if (c.checkpoint_dir.empty() && c.save.empty()) return Status::Ok();
    if (!c.checkpoint_dir.empty()) last_saved = checkpoint_path(c.checkpoint_dir, trainer->steps_done());
    SP_RETURN_IF_ERROR(trainer->save(last_saved));
    if (lead && !c.checkpoint_dir.empty()) prune_checkpoints(c.checkpoint_dir, c.keep, trainer->steps_done());
    return Status::Ok();
  };
  if (!c.checkpoint_dir.empty() && lead) {
    std::error_code ec;
    std::filesystem::create_directories(c.checkpoint_dir, ec);
    SP_CHECK_ARG(!ec, "cannot make the checkpoint folder " + c.checkpoint_dir + ": " + ec.message());
  }
  SP_RETURN_IF_ERROR(comm.barrier());
  RunRecord record;
  if (!c.dump_dir.empty()) {
    SP_ASSIGN_OR_RETURN(const std::vector<float> initial, trainer->gather_parameters());  // every rank
    if (lead) {
      SP_RETURN_IF_ERROR(write_hf_config(c.dump_dir + "/config.json", o.model));
      SP_RETURN_IF_ERROR(save_model_safetensors(c.dump_dir + "/initial.safetensors", o.model, initial.data()));
    }
  }
  if (lead) {
    const AttentionPlan& plan = trainer->attention_plan();
    // What runs each layer's token mixer: the softmax schedule (and why auto chose it), LASP (or
    // its ulysses baseline).
    std::string mixers;
    if (o.model.has_softmax_layers())
      mixers = std::string(plan.algorithm->name) + " attention" + (plan.choice.empty() ? "" : ": " + plan.choice);
    if (o.model.has_linear_layers())
      mixers += std::string(mixers.empty() ? "" : "; ") + (o.linear_sp == LaspAlgorithm::kAuto ? "LASP" : c.linear_sp) +
                " for the linear-attention layers";
    std::fprintf(stderr, "seqpar train: %s, %ld parameters; data %s; %d group(s) of %ld sequences x %ld tokens a step, "
                         "each over %d ranks (%s layout, %s); checkpointing %s%s; ZeRO %d\n",
                 o.model.describe().c_str(), long(parameter_count(o.model)), c.data.c_str(), o.data_parallel,
                 long(o.batch), long(o.seq), comm.size() / o.data_parallel, layout_name(o.layout), mixers.c_str(),
                 checkpointing_name(o.checkpointing), o.offload_checkpoints ? " (offloaded to host memory)" : "",
                 o.zero_stage);
    if (trainer->steps_done() > 0) std::fprintf(stderr, "resumed from %s at step %ld\n", resume.c_str(), long(trainer->steps_done()));
  }
  std::vector<double> losses;
  while (trainer->steps_done() < o.steps) {
    StepReport r;
    const Status s = trainer->step(&r);
    if (!s.ok()) {
      if (lead && !last_saved.empty())
        std::fprintf(stderr, "seqpar train: the last good checkpoint is %s\n", last_saved.c_str());
      return s;
    }
    losses.push_back(r.loss);
    if (lead && !c.dump_dir.empty()) {
      const std::string n = std::to_string(r.step);
      record.batches.push_back(int_array("inputs_" + n, trainer->last_inputs()));
      record.batches.push_back(int_array("targets_" + n, trainer->last_targets()));
      record.losses.push_back(r.loss);
      if (r.step == 0) {
        SP_ASSIGN_OR_RETURN(const std::vector<float> grad, trainer->last_gradient());
        SP_RETURN_IF_ERROR(save_model_safetensors(c.dump_dir + "/grads_step0.safetensors", o.model, grad.data()));
      }
    }
    if (lead) {
      if (c.json) {
        const nlohmann::ordered_json j = {{"step", r.step}, {"loss", r.loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm},
                                          {"tokens", r.tokens}, {"seconds", r.seconds},
                                          {"tokens_per_s", double(r.tokens) / r.seconds},
                                          {"activation_bytes", r.activation_bytes}, {"bytes_sent", r.bytes_sent}};
        nlohmann::ordered_json line = j;
        if (!r.work_ms.empty()) line["work_ms"] = work_object(r);
        if (c.device == "cuda") {
          line["device_peak_bytes"] = r.activation_bytes;
          line["gpus"] = gpus;
          line["mfu_989"] = step_flops(o) / r.seconds / kPeakFlops / gpus;
        }
        std::printf("%s\n", line.dump().c_str());
      } else {
        std::printf("step %4ld/%ld  loss %.4f  lr %.2e  |g| %.3f  %.0f tokens/s  %s %s  sent %s\n",
                    long(r.step + 1), long(o.steps), r.loss, r.lr, r.grad_norm, double(r.tokens) / r.seconds,
                    o.device == DeviceKind::kCuda ? "device peak" : "activations", mib(r.activation_bytes).c_str(), mib(r.bytes_sent).c_str());
        if (!r.work_ms.empty()) std::printf("  work: %s\n", work_line(r).c_str());
      }
      std::fflush(stdout);
    }
    const bool due = c.save_every > 0 && trainer->steps_done() % c.save_every == 0;
    if (due) SP_RETURN_IF_ERROR(save());
    SP_ASSIGN_OR_RETURN(const bool stop, termination_requested(comm));
    if (stop) {  // preempted: save (unless just saved) and stop, every rank at this step
      if (!due) SP_RETURN_IF_ERROR(save());
      if (lead)
        std::fprintf(stderr, "seqpar train: SIGTERM: stopped after step %ld%s%s\n", long(trainer->steps_done()),
                     last_saved.empty() ? " (nothing saved: no --save or --checkpoint-dir)" : "; saved ",
                     last_saved.c_str());
      g_stopped_by_termination = true;
      return Status::Ok();
    }
  }
  if (!(c.save_every > 0 && o.steps % c.save_every == 0)) SP_RETURN_IF_ERROR(save());
  if (lead && !c.dump_dir.empty()) SP_RETURN_IF_ERROR(write_record(c.dump_dir, o, record));
  std::vector<float> final_weights;
  if (!c.export_dir.empty()) {  // every rank
    SP_ASSIGN_OR_RETURN(final_weights, trainer->gather_parameters());
  }
  if (lead && !c.export_dir.empty()) {
    SP_RETURN_IF_ERROR(write_hf_config(c.export_dir + "/config.json", o.model));
    SP_RETURN_IF_ERROR(save_model_safetensors(c.export_dir + "/model.safetensors", o.model, final_weights.data()));
    std::fprintf(stderr, "seqpar train: wrote %s/model.safetensors and config.json (transformers: "
                         "LlamaForCausalLM.from_pretrained)\n", c.export_dir.c_str());
  }
  if (lead && !c.plot.empty() && !losses.empty()) {
    SP_RETURN_IF_ERROR(write_plot(c.plot, losses, "seqpar train: loss, " + c.data + ", " + std::to_string(o.seq) +
                                                     " tokens over " + std::to_string(comm.size()) + " ranks"));
    std::fprintf(stderr, "seqpar train: wrote the loss curve to %s\n", c.plot.c_str());
  }
  return Status::Ok();
}

}  // namespace

int run_train(const TrainCliOptions& c) {
  const bool gpu = c.device == "cuda";
  if (c.gpus != 0 && (!gpu || c.gpus < 1 || c.ranks_given)) {
    std::fprintf(stderr, "seqpar train: error: --gpus %d: it takes a positive count with --device cuda, in place of "
                         "--ranks (one rank per GPU)\n", c.gpus);
    return 2;
  }
  const bool under_mpi = launched_by_mpi();
  if (gpu && under_mpi) {
    std::fprintf(stderr, "seqpar train: error: GPU training under mpirun is not built yet (use torchrun, or --gpus "
                         "N for one process driving N GPUs)\n");
    return 2;
  }
  // Under torchrun each process is one rank: on GPUs its NCCL communicator is bootstrapped from
  // the launcher's variables (as seqpar attn does); on CPUs the ranks join a TCP mesh.
  const bool under_torchrun = !under_mpi && launched_by_torchrun();
  // A GPU rank per device: a lost peer must end this process rather than hang it.
  if ((gpu && under_torchrun) || c.gpus > 0) nccl_exit_process_on_failure(true);
  std::unique_ptr<Communicator> world;
  if (under_mpi || under_torchrun) {
    auto comm = under_mpi ? make_mpi_world_communicator()
                : gpu     ? make_nccl_communicator_env()
                          : make_tcp_world_communicator();
    if (!comm.ok()) {
      std::fprintf(stderr, "seqpar train: error: %s\n", comm.status().to_string().c_str());
      return 1;
    }
    world = std::move(comm).value();
  }
  // On a GPU one rank is the default; --gpus N puts a rank on each of N GPUs; --ranks N makes N
  // thread ranks share the one GPU (for testing schedules).
  const int ranks = world ? world->size() : c.gpus > 0 ? c.gpus : (gpu && !c.ranks_given ? 1 : c.ranks);
  if (!world && (ranks < 1 || ranks > 256)) {
    std::fprintf(stderr, "seqpar train: error: --ranks must be between 1 and 256\n");
    return 2;
  }
  auto options = resolve(c, ranks);
  if (!options.ok()) {
    std::fprintf(stderr, "seqpar train: error: %s\n", options.status().to_string().c_str());
    return 2;
  }
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  const int threads = c.threads_per_rank > 0 ? c.threads_per_rank : std::max(1, cores / (world ? 1 : ranks));
  model::set_blas_threads(world || ranks == 1 ? threads : 1);
  catch_termination();  // SIGTERM: save and stop at the end of the step
  const auto rank_fn = [&](Communicator& comm) -> Status {
    return train_rank(comm, c, options.value(), threads, gpu ? (world || c.gpus > 0 ? ranks : 1) : 0);
  };
  const Status s = world         ? rank_fn(*world)
                   : c.gpus > 0 ? run_nccl_local_ranks(c.gpus, rank_fn)
                                : run_local_ranks(ranks, rank_fn);
  if (!s.ok()) {
    std::fprintf(stderr, "seqpar train: error: %s\n", s.to_string().c_str());
    if (world) world->abort(s.message());
    return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kUnsupported ? 2 : 1;
  }
  return g_stopped_by_termination ? kTerminatedExit : 0;
}

}  // namespace seqpar::app
