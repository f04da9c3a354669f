// The trainer on a GPU (TrainOptions::device = kCuda) against the same trainer on the CPU (fp32)
// from the same weights and batch: the first step's loss and every parameter's gradient agree
// within bf16 training's error; thread ranks sharing the GPU, and ranks on two GPUs (NCCL), agree
// with one rank; the checkpointing policies give the same loss; a few steps lower the loss;
// data-parallel groups and ZeRO 1-3 follow the CPU run as closely as one GPU rank does (the bf16
// rule of CONVENTIONS.md, the fp32 CPU run standing for the oracle); two runs from one seed are
// the same bits, and a run resumed from its checkpoint equals a straight one bit for bit;
// linear-attention (TNL) and hybrid models follow the CPU run too, under LASP and under its
// ulysses baseline; so do packed documents on the documents layout, which changes with every
// batch; checkpoints offloaded to host memory give the same bits as kept on the device; the tiled
// MLP follows the CPU run as the untiled one does, with a lower peak.
// Skipped without a GPU (the two-GPU cases without two GPUs and NCCL).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>

#include "seqpar/gpu.hpp"
#include "seqpar/trainer.hpp"
#include "seqpar/nccl_comm.hpp"

namespace seqpar {
namespace {

TrainOptions options(int64_t steps) {
  TrainOptions o;
  o.device = DeviceKind::kCuda;
  o.model.vocab = 64, o.model.hidden = 256, o.model.layers = 2, o.model.heads = 4, o.model.kv_heads = 2,
  o.model.ffn = 512;  // head dim 64: our kernels and cuDNN both take it
  o.data = "recall";
  o.seq = 512, o.batch = 2, o.steps = steps;
  o.optimizer.total_steps = steps, o.optimizer.warmup_steps = 2;
  return o;
}

struct Record {
  std::vector<double> losses;
  std::vector<float> first_gradient;  // where the stage keeps it whole (ZeRO 0 and 1)
  std::vector<float> weights;         // after the last step
};

using Launcher = Status (*)(int, const std::function<Status(Communicator&)>&);

// Trains on `ranks` ranks started by `launch`: threads sharing the GPU (run_local_ranks) or a
// thread per GPU (run_nccl_local_ranks). `resume`: a checkpoint to start from; `save`: where to
// write one at the end.
Status run(const TrainOptions& o, int ranks, Record* out, Launcher launch = run_local_ranks,
           const std::string& resume = "", const std::string& save = "") {
  std::mutex mu;
  return launch(ranks, [&](Communicator& comm) -> Status {
    SP_ASSIGN_OR_RETURN(auto trainer, Trainer::create(o, comm));
    if (!resume.empty()) SP_RETURN_IF_ERROR(trainer->load(resume));
    while (trainer->steps_done() < o.steps) {
      StepReport r;
      SP_RETURN_IF_ERROR(trainer->step(&r));
      if (comm.rank() != 0) continue;
      std::lock_guard lock(mu);
      out->losses.push_back(r.loss);
      if (r.step == 0 && o.zero_stage < 2) {
        SP_ASSIGN_OR_RETURN(out->first_gradient, trainer->last_gradient());
      }
    }
    if (!save.empty()) SP_RETURN_IF_ERROR(trainer->save(save));
    SP_ASSIGN_OR_RETURN(std::vector<float> weights, trainer->gather_parameters());  // every rank
    if (comm.rank() == 0) out->weights = std::move(weights);
    return Status::Ok();
  });
}
TrainOptions on_cpu(TrainOptions o) {
  o.device = DeviceKind::kCpu;
  return o;
}

// Relative Frobenius difference of each parameter tensor; the worst one.
double worst(const ModelConfig& c, const std::vector<float>& got, const std::vector<float>& want, std::string* which) {
  double w = 0;
  for (const ParamInfo& p : parameter_table(c)) {
    double d = 0, n = 0;
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i)
      d += std::pow(double(got[size_t(i)]) - want[size_t(i)], 2), n += std::pow(double(want[size_t(i)]), 2);
    const double e = std::sqrt(d / std::max(n, 1e-60));
    if (e > w) w = e, *which = p.name;
  }
  return w;
}

class GpuTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(GpuTrain, FirstStepMatchesTheCpuTrainer) {
  const TrainOptions o = options(1);
  Record cpu, gpu;
  ASSERT_TRUE(run(on_cpu(o), 1, &cpu).ok());
  const Status s = run(o, 1, &gpu);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_NEAR(gpu.losses[0], cpu.losses[0], 1e-2 * cpu.losses[0]);
  std::string which;
  EXPECT_LT(worst(o.model, gpu.first_gradient, cpu.first_gradient, &which), 5e-2) << which;
}

TEST_F(GpuTrain, RanksSharingTheGpuMatchOneRankAndPoliciesAgree) {
  TrainOptions o = options(1);
  Record one, two;
  ASSERT_TRUE(run(o, 1, &one).ok());  // zigzag
  const Status s = run(o, 2, &two);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_NEAR(two.losses[0], one.losses[0], 1e-2 * one.losses[0]);
  std::string which;
  EXPECT_LT(worst(o.model, two.first_gradient, one.first_gradient, &which), 5e-2) << which;
  o.layout = LayoutKind::kStriped;  // the sequence policy's layout; the others' results are the same
  one = {};
  ASSERT_TRUE(run(o, 1, &one).ok());
  for (Checkpointing policy : {Checkpointing::kFull, Checkpointing::kAttention, Checkpointing::kSequence}) {
    o.checkpointing = policy;
    Record r;
    ASSERT_TRUE(run(o, 1, &r).ok()) << checkpointing_name(policy);
    EXPECT_NEAR(r.losses[0], one.losses[0], 1e-5 * one.losses[0]) << checkpointing_name(policy);
    EXPECT_LT(worst(o.model, r.first_gradient, one.first_gradient, &which), 1e-2) << checkpointing_name(policy) << " " << which;
  }
}

TEST_F(GpuTrain, RanksOnTwoGpusMatchOneRank) {
  if (!nccl_available() || cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs and NCCL";
  const TrainOptions o = options(3);
  Record one, two;
  ASSERT_TRUE(run(o, 1, &one).ok());
  const Status s = run(o, 2, &two, run_nccl_local_ranks);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_EQ(two.losses.size(), one.losses.size());
  for (size_t i = 0; i < one.losses.size(); ++i) EXPECT_NEAR(two.losses[i], one.losses[i], 1e-2 * one.losses[i]) << i;
  std::string which;
  EXPECT_LT(worst(o.model, two.first_gradient, one.first_gradient, &which), 5e-2) << which;
}

TEST_F(GpuTrain, LossFallsOverSteps) {
  TrainOptions o = options(30);
  o.optimizer.lr = 3e-3;
  o.data = "text:" + std::string(SEQPAR_SOURCE_DIR) + "/README.md";
  o.model.vocab = 256;
  Record r;
  const Status s = run(o, 1, &r);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_LT(r.losses.back(), 0.75 * r.losses.front()) << r.losses.front() << " -> " << r.losses.back();
}

// The largest difference between two runs' losses.
double loss_error(const Record& a, const Record& b) {
  double e = 0;
  for (size_t i = 0; i < std::min(a.losses.size(), b.losses.size()); ++i) e = std::max(e, std::fabs(a.losses[i] - b.losses[i]));
  return e;
}

// The CPU trainer's run of `o` (the oracle's stand-in) and how far one GPU rank's is from it.
struct Reference {
  Record cpu;
  double weights = 0, losses = 0;  // one GPU rank's worst tensor and largest loss difference
};
void reference(const TrainOptions& o, Reference* ref) {
  Record one;
  ASSERT_TRUE(run(on_cpu(o), 1, &ref->cpu).ok());
  ASSERT_TRUE(run(o, 1, &one).ok());
  std::string which;
  ref->weights = worst(o.model, one.weights, ref->cpu.weights, &which), ref->losses = loss_error(one, ref->cpu);
  ASSERT_GT(ref->weights, 0) << "bf16 training equal to fp32's: the comparison says nothing";
}

// Data-parallel groups and ZeRO over thread ranks sharing the GPU (2 groups x 2 sequence ranks),
// 5 steps: the weights and losses are at most twice as far from the CPU trainer's (fp32, one rank,
// the same global batch) as one GPU rank's are.
TEST_F(GpuTrain, DataParallelAndZeroFollowTheCpuRunAsOneGpuRankDoes) {
  TrainOptions o = options(5);
  o.batch = 4;
  Reference ref;
  ASSERT_NO_FATAL_FAILURE(reference(o, &ref));
  std::string which;
  o.batch = 2, o.data_parallel = 2;
  for (int stage : {0, 1, 2, 3}) {
    o.zero_stage = stage;
    Record r;
    const Status s = run(o, 4, &r);
    ASSERT_TRUE(s.ok()) << "ZeRO " << stage << ": " << s.to_string();
    EXPECT_LE(worst(o.model, r.weights, ref.cpu.weights, &which), 2 * ref.weights) << "ZeRO " << stage << " " << which;
    EXPECT_LE(loss_error(r, ref.cpu), 2 * ref.losses + 1e-6) << "ZeRO " << stage;
  }
}

// An untied LM head (the 8b preset's) with ZeRO-3 over two thread ranks sharing the GPU follows
// the CPU trainer's run as one GPU rank does.
TEST_F(GpuTrain, UntiedHeadWithZero3FollowsTheCpuRun) {
  TrainOptions o = options(5);
  o.model.tied = false;
  Reference ref;
  ASSERT_NO_FATAL_FAILURE(reference(o, &ref));
  o.zero_stage = 3;
  Record r;
  const Status s = run(o, 2, &r);
  ASSERT_TRUE(s.ok()) << s.to_string();
  std::string which;
  EXPECT_LE(worst(o.model, r.weights, ref.cpu.weights, &which), 2 * ref.weights) << which;
  EXPECT_LE(loss_error(r, ref.cpu), 2 * ref.losses + 1e-6);
}

// Linear-attention models (issue 39): TNL's mixer in every layer, or a hybrid whose last layer is
// softmax attention; head dim 64 (the CUDA LASP kernels take 64 or 128) and the contiguous
// layout LASP needs.
TrainOptions linear_options(int64_t steps, bool hybrid) {
  TrainOptions o = options(steps);
  o.model.mixers.assign(size_t(o.model.layers), MixerKind::kLinear);
  if (hybrid) o.model.mixers.back() = MixerKind::kSoftmax;
  o.layout = LayoutKind::kContiguous;
  return o;
}

// The first step of o (one step) on `ranks` thread ranks sharing the GPU follows the CPU trainer's
// on one rank (FirstStepMatchesTheCpuTrainer's bounds), and checkpointing (which keeps each
// linear layer's o and context) gives the same step.
void expect_first_step_follows_the_cpu(TrainOptions o, int ranks) {
  Record cpu, gpu;
  ASSERT_TRUE(run(on_cpu(o), 1, &cpu).ok());
  Status s = run(o, ranks, &gpu);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_NEAR(gpu.losses[0], cpu.losses[0], 1e-2 * cpu.losses[0]);
  std::string which;
  EXPECT_LT(worst(o.model, gpu.first_gradient, cpu.first_gradient, &which), 5e-2) << which;
  for (Checkpointing policy : {Checkpointing::kFull, Checkpointing::kAttention}) {
    o.checkpointing = policy;
    Record r;
    s = run(o, ranks, &r);
    ASSERT_TRUE(s.ok()) << checkpointing_name(policy) << ": " << s.to_string();
    EXPECT_NEAR(r.losses[0], gpu.losses[0], 1e-5 * gpu.losses[0]) << checkpointing_name(policy);
    EXPECT_LT(worst(o.model, r.first_gradient, gpu.first_gradient, &which), 1e-2)
        << checkpointing_name(policy) << " " << which;
  }
}

// A TNL model and a hybrid on the GPU follow the CPU trainer (fp32): the first step's loss and
// gradient as FirstStepMatchesTheCpuTrainer's; over 5 steps, two thread ranks sharing the GPU
// (LASP's state chain between them) are at most twice as far from the CPU run as one GPU rank
// is; checkpointing (which keeps each linear layer's o and LASP context) gives the same step.
TEST_F(GpuTrain, LinearAttentionModelsFollowTheCpuRun) {
  for (bool hybrid : {false, true}) {
    SCOPED_TRACE(hybrid ? "hybrid" : "tnl");
    ASSERT_NO_FATAL_FAILURE(expect_first_step_follows_the_cpu(linear_options(1, hybrid), 1));
    const TrainOptions steps = linear_options(5, hybrid);
    Reference ref;
    ASSERT_NO_FATAL_FAILURE(reference(steps, &ref));
    Record two;
    std::string which;
    const Status s = run(steps, 2, &two);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_LE(worst(steps.model, two.weights, ref.cpu.weights, &which), 2 * ref.weights) << which;
    EXPECT_LE(loss_error(two, ref.cpu), 2 * ref.losses + 1e-6);
  }
}

// The LASP paper's ulysses baseline for the linear layers (--linear-sp ulysses; 4 heads, 2 a
// rank): over two thread ranks sharing the GPU, the first step follows the CPU trainer as one GPU
// rank's does (FirstStepMatchesTheCpuTrainer's bounds), checkpointing (o kept: no all-to-all in
// the recompute) gives the same step, and 5 steps stay within twice one GPU rank's distance from
// the CPU run; over two GPUs (NCCL) too, where there are two.
TEST_F(GpuTrain, LinearAttentionUlyssesFollowsTheCpuRun) {
  for (bool hybrid : {false, true}) {
    SCOPED_TRACE(hybrid ? "hybrid" : "tnl");
    TrainOptions o = linear_options(1, hybrid);
    o.linear_sp = LaspAlgorithm::kUlysses;
    ASSERT_NO_FATAL_FAILURE(expect_first_step_follows_the_cpu(o, 2));
    TrainOptions steps = linear_options(5, hybrid);
    Reference ref;
    ASSERT_NO_FATAL_FAILURE(reference(steps, &ref));
    steps.linear_sp = LaspAlgorithm::kUlysses;
    for (Launcher launch : {Launcher(run_local_ranks), Launcher(run_nccl_local_ranks)}) {
      const bool nccl = launch == Launcher(run_nccl_local_ranks);
      if (nccl && (!nccl_available() || cuda_device_count() < 2)) continue;
      Record two;
      std::string which;
      const Status s = run(steps, 2, &two, launch);
      ASSERT_TRUE(s.ok()) << (nccl ? "two GPUs: " : "") << s.to_string();
      EXPECT_LE(worst(steps.model, two.weights, ref.cpu.weights, &which), 2 * ref.weights)
          << (nccl ? "two GPUs " : "") << which;
      EXPECT_LE(loss_error(two, ref.cpu), 2 * ref.losses + 1e-6) << (nccl ? "two GPUs" : "");
    }
  }
}

// The same over two GPUs (NCCL): two data-parallel groups of one GPU each, and ZeRO-3 over two
// sequence-parallel GPUs.
TEST_F(GpuTrain, DataParallelAndZeroOnTwoGpus) {
  if (!nccl_available() || cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs and NCCL";
  TrainOptions o = options(5);
  o.batch = 4;
  Reference ref;
  ASSERT_NO_FATAL_FAILURE(reference(o, &ref));
  std::string which;
  for (auto [groups, stage] : {std::pair{2, 2}, {1, 3}}) {
    TrainOptions t = o;
    t.batch = o.batch / groups, t.data_parallel = groups, t.zero_stage = stage;
    Record r;
    const Status s = run(t, 2, &r, run_nccl_local_ranks);
    ASSERT_TRUE(s.ok()) << groups << " groups, ZeRO " << stage << ": " << s.to_string();
    EXPECT_LE(worst(o.model, r.weights, ref.cpu.weights, &which), 2 * ref.weights) << groups << " groups " << which;
    EXPECT_LE(loss_error(r, ref.cpu), 2 * ref.losses + 1e-6) << groups << " groups";
  }
}

// With deterministic set, two runs from one seed give the same bits, and a run saved at step 5
// and resumed by a new trainer equals a straight run to step 10 bit for bit: one rank, and ZeRO-3
// over two data-parallel thread ranks. The CPU trainer reads the GPU's file.
TEST_F(GpuTrain, RunsRepeatAndResumeBitForBit) {
  const std::string path = ::testing::TempDir() + "/seqpar_gpu_resume.ckpt";
  for (auto [ranks, stage] : {std::pair{1, 0}, {2, 3}}) {
    TrainOptions o = options(10);
    o.batch = 2, o.data_parallel = ranks, o.zero_stage = stage;
    o.deterministic = true;
    Record straight, again, first_half, resumed;
    ASSERT_TRUE(run(o, ranks, &straight).ok());
    ASSERT_TRUE(run(o, ranks, &again).ok());
    EXPECT_EQ(again.losses, straight.losses) << ranks << " ranks";
    EXPECT_TRUE(again.weights == straight.weights) << ranks << " ranks: two runs from one seed differ";
    TrainOptions half = o;
    half.steps = 5;  // the schedule still ends at step 10
    ASSERT_TRUE(run(half, ranks, &first_half, run_local_ranks, "", path).ok());
    const Status s = run(o, ranks, &resumed, run_local_ranks, path);
    ASSERT_TRUE(s.ok()) << s.to_string();
    first_half.losses.insert(first_half.losses.end(), resumed.losses.begin(), resumed.losses.end());
    EXPECT_EQ(first_half.losses, straight.losses) << ranks << " ranks";
    EXPECT_TRUE(resumed.weights == straight.weights) << ranks << " ranks: the resumed run differs";
  }
  TrainOptions o = on_cpu(options(10));
  auto comms = make_local_communicators(1);
  auto cpu = Trainer::create(o, *comms[0]).value();
  const Status read = cpu->load(path);
  ASSERT_TRUE(read.ok()) << read.to_string();
  EXPECT_EQ(cpu->steps_done(), 5);
}

// ZeRO-3's overlap (the next unit's gather and each gradient's reduce-scatter on a second stream)
// only moves when the bytes move: with deterministic set, 4 steps give the same losses and
// weights, every bit, as the collectives in line; over NCCL on two GPUs where there are two (the
// collectives then really run beside the compute), else two thread ranks sharing the GPU. An
// untied head, so the store's units are the embedding, the layers and the head.
TEST_F(GpuTrain, Zero3OverlapGivesTheBitsOfTheCollectivesInLine) {
  const bool nccl = nccl_available() && cuda_device_count() >= 2;
  TrainOptions o = options(4);
  o.model.tied = false;
  o.batch = 2, o.data_parallel = 2, o.zero_stage = 3;
  o.deterministic = true;
  Record overlapped, in_line;
  const Launcher launch = nccl ? Launcher(run_nccl_local_ranks) : Launcher(run_local_ranks);
  Status s = run(o, 2, &overlapped, launch);
  ASSERT_TRUE(s.ok()) << s.to_string();
  o.zero_overlap = false;
  s = run(o, 2, &in_line, launch);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(overlapped.losses, in_line.losses) << (nccl ? "NCCL" : "thread ranks");
  EXPECT_TRUE(overlapped.weights == in_line.weights) << (nccl ? "NCCL" : "thread ranks");
}

// --offload-checkpoints only moves bytes: with deterministic set, 3 steps with the kept
// checkpoints in pinned host memory (copied out and back on a stream of their own) give the same
// losses and final weights, every bit, as 3 steps with them in device memory: policies attention
// and full, softmax and hybrid (linear layers but the last) models of 4 layers, 1 rank and 2 thread
// ranks sharing the GPU (ZeRO-3 over them).
TEST_F(GpuTrain, OffloadedCheckpointsGiveTheSameBits) {
  for (int ranks : {1, 2})
    for (Checkpointing policy : {Checkpointing::kAttention, Checkpointing::kFull})
      for (bool hybrid : {false, true}) {
        const std::string what = std::to_string(ranks) + " ranks, " + checkpointing_name(policy) +
                                 (hybrid ? ", hybrid" : ", softmax");
        SCOPED_TRACE(what);
        TrainOptions o = options(3);
        o.model.layers = 4;
        if (hybrid) {
          o.model.mixers.assign(4, MixerKind::kLinear);
          o.model.mixers.back() = MixerKind::kSoftmax;
          o.layout = LayoutKind::kContiguous;
        }
        o.checkpointing = policy;
        o.zero_stage = ranks == 2 ? 3 : 0;
        o.deterministic = true;
        Record kept, again, offloaded;
        Status s = run(o, ranks, &kept);
        ASSERT_TRUE(s.ok()) << s.to_string();
        ASSERT_TRUE(run(o, ranks, &again).ok());  // else a difference below could be the run's own
        if (again.losses != kept.losses || again.weights != kept.weights) {
          ADD_FAILURE() << what << ": two runs without offloading differ, so the bits say nothing here";
          continue;
        }
        o.offload_checkpoints = true;
        s = run(o, ranks, &offloaded);
        ASSERT_TRUE(s.ok()) << s.to_string();
        EXPECT_EQ(offloaded.losses, kept.losses);
        EXPECT_TRUE(offloaded.weights == kept.weights) << what << ": the offloaded run's weights differ";
      }
}

// The tiles (--tile-tokens; issue 39): 5 steps with the MLP, and a linear mixer's backward before
// LASP, run 100 of a rank's 1024 rows at a time (11 tiles, the last short), the MLP's inner
// activations recomputed tile by tile in the backward, follow the CPU trainer's untiled run at
// most twice as far as the untiled GPU run on as many ranks does: softmax and linear (tnl) models, attention
// checkpointing offloaded to host memory (the tnl-1b run's flags), one rank and 2 thread ranks
// sharing the GPU (ZeRO-3 over them); and the device's peak falls (the MLP's [rows, ffn] arrays
// no longer kept nor made for all rows at once).
// --profile on a GPU (events on the pass's stream): a hybrid model's every kind of work is timed,
// the kinds and the gaps make up the pass's span within the step's wall clock, and the run keeps
// its bits (deterministic, so two runs compare).
TEST_F(GpuTrain, ProfileTimesTheStepWithoutChangingIt) {
  TrainOptions o = options(2);
  o.model.mixers = {MixerKind::kLinear, MixerKind::kSoftmax};
  o.layout = LayoutKind::kContiguous;
  o.deterministic = true;
  Record plain, profiled;
  Status s = run(o, 2, &plain);
  ASSERT_TRUE(s.ok()) << s.to_string();
  o.profile = true;
  s = run(o, 2, &profiled);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(profiled.losses, plain.losses);
  EXPECT_TRUE(profiled.weights == plain.weights);
  s = run_local_ranks(1, [&](Communicator& comm) -> Status {
    SP_ASSIGN_OR_RETURN(auto trainer, Trainer::create(o, comm));
    StepReport r;
    SP_RETURN_IF_ERROR(trainer->step(&r));
    EXPECT_EQ(r.work_ms.size(), 11u);
    if (r.work_ms.size() != 11u) return Status::Ok();
    double ops = 0;
    for (size_t i = 0; i + 2 < r.work_ms.size(); ++i) {
      EXPECT_GE(r.work_ms[i].second, 0.0) << r.work_ms[i].first;
      ops += r.work_ms[i].second;
    }
    for (size_t i : {0, 1, 2, 3, 7, 8})  // attention, products, lm_head, norms, linear_mixer, casts
      EXPECT_GT(r.work_ms[i].second, 0.0) << r.work_ms[i].first;
    EXPECT_NEAR(ops + r.work_ms[9].second, r.work_ms[10].second, 1e-3);
    EXPECT_GE(r.work_ms[9].second, -1e-3);  // events on one stream: the ops do not overlap
    EXPECT_LE(r.work_ms[10].second, r.seconds * 1e3);
    return Status::Ok();
  });
  ASSERT_TRUE(s.ok()) << s.to_string();
}

TEST_F(GpuTrain, TiledMlpFollowsTheCpuRunAsUntiledDoes) {
  for (bool linear : {false, true})
    for (int ranks : {1, 2}) {
      const std::string what = std::string(linear ? "tnl" : "softmax") + ", " + std::to_string(ranks) + " ranks";
      SCOPED_TRACE(what);
      TrainOptions o = linear ? linear_options(5, false) : options(5);
      o.model.ffn = 2048;  // the MLP's arrays dominate, as in tnl-1b
      o.checkpointing = Checkpointing::kAttention;
      o.offload_checkpoints = true;
      o.tile_tokens = 0;
      Reference ref;
      ASSERT_NO_FATAL_FAILURE(reference(o, &ref));
      o.zero_stage = ranks == 2 ? 3 : 0;
      std::string which;
      if (ranks > 1) {  // the bound: the untiled run on as many ranks (ZeRO-3's sums round otherwise)
        Record untiled;
        ASSERT_TRUE(run(o, ranks, &untiled).ok());
        ref.weights = worst(o.model, untiled.weights, ref.cpu.weights, &which);
        ref.losses = loss_error(untiled, ref.cpu);
      }
      o.tile_tokens = 100;
      Record r;
      const Status s = run(o, ranks, &r);
      ASSERT_TRUE(s.ok()) << s.to_string();
      EXPECT_LE(worst(o.model, r.weights, ref.cpu.weights, &which), 2 * ref.weights) << what << " " << which;
      EXPECT_LE(loss_error(r, ref.cpu), 2 * ref.losses + 1e-6) << what;
    }
  // One rank, one step each, in a trainer of its own: the device's peak with tiles is lower.
  TrainOptions o = linear_options(1, false);
  o.model.ffn = 2048, o.seq = 8192, o.batch = 1;
  o.checkpointing = Checkpointing::kAttention;
  o.offload_checkpoints = true;
  int64_t peak[2] = {0, 0};
  for (int tiled : {0, 1}) {
    o.tile_tokens = tiled ? 1024 : 0;
    auto comms = make_local_communicators(1);
    auto trainer = Trainer::create(o, *comms[0]);
    ASSERT_TRUE(trainer.ok()) << trainer.status().to_string();
    StepReport r;
    ASSERT_TRUE(trainer.value()->step(&r).ok());
    peak[tiled] = trainer.value()->peak_device_bytes();
  }
  // Untiled, a layer's backward holds g, u (bf16) and act, dact, dg, du: 8192 rows x 2048 x
  // (2 + 2 + 2 + 4 + 2 + 2) bytes = 224 MiB, where tiled it holds one tile's eighth of it.
  EXPECT_LT(peak[1], peak[0] - (128 << 20)) << peak[0] << " -> " << peak[1];
}

// A checkpoint continues on another number of GPUs (issue 38): 4 steps on one GPU, 3 on two
// (ZeRO-3 over the sequence ranks), and, where four GPUs are visible, 3 on four (2 data-parallel
// groups x 2 sequence ranks, ZeRO-3), each part resuming from the last one's file. The global
// batch is the same throughout, so the chained run is held to the bf16 rule against the CPU
// trainer's straight run: at most twice as far from it as a straight run on one GPU is.
TEST_F(GpuTrain, ResumesOnAnotherNumberOfGpus) {
  if (!nccl_available() || cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs and NCCL";
  const bool four = cuda_device_count() >= 4;
  TrainOptions o = options(four ? 10 : 7);
  o.batch = 4;
  Reference ref;
  ASSERT_NO_FATAL_FAILURE(reference(o, &ref));
  const std::string path = ::testing::TempDir() + "/seqpar_gpu_resize.ckpt";
  struct Part {
    int gpus, groups, stage, until;
  };
  std::vector<Part> parts{{1, 1, 0, 4}, {2, 1, 3, 7}};
  if (four) parts.push_back({4, 2, 3, 10});
  Record chained;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Part& p = parts[i];
    TrainOptions t = o;  // the schedule (total steps) is the whole run's
    t.batch = o.batch / p.groups, t.data_parallel = p.groups, t.zero_stage = p.stage;
    t.steps = p.until;
    Record r;
    const Status s = run(t, p.gpus, &r, p.gpus > 1 ? run_nccl_local_ranks : run_local_ranks, i ? path : "", path);
    ASSERT_TRUE(s.ok()) << p.gpus << " GPUs: " << s.to_string();
    chained.losses.insert(chained.losses.end(), r.losses.begin(), r.losses.end());
    chained.weights = r.weights;
  }
  ASSERT_EQ(chained.losses.size(), ref.cpu.losses.size());
  std::string which;
  EXPECT_LE(worst(o.model, chained.weights, ref.cpu.weights, &which), 2 * ref.weights) << which;
  EXPECT_LE(loss_error(chained, ref.cpu), 2 * ref.losses + 1e-6);
}

// Packed documents (issue 37) on the documents layout, each step's documents balanced over 2 and
// 3 thread ranks sharing the GPU: 5 steps as close to the CPU trainer's (one rank, fp32) as one
// GPU rank is (at most twice as far), the layout changing with every batch.
TEST_F(GpuTrain, PackedDocumentsOnTheDocumentsLayoutFollowTheCpuRun) {
  TrainOptions o = options(5);
  o.data = "text:" + std::string(SEQPAR_SOURCE_DIR) + "/README.md";
  o.model.vocab = 256;
  o.pack_eod = 10;  // every line a document
  o.seq = 768, o.batch = 1;
  Reference ref;
  ASSERT_NO_FATAL_FAILURE(reference(o, &ref));
  o.layout = LayoutKind::kDocuments;
  for (int ranks : {2, 3}) {
    Record r;
    const Status s = run(o, ranks, &r);
    ASSERT_TRUE(s.ok()) << ranks << " ranks: " << s.to_string();
    std::string which;
    EXPECT_LE(worst(o.model, r.weights, ref.cpu.weights, &which), 2 * ref.weights) << ranks << " ranks " << which;
    EXPECT_LE(loss_error(r, ref.cpu), 2 * ref.losses + 1e-6) << ranks << " ranks";
  }
}

TEST_F(GpuTrain, RefusesWhatItCannotDo) {
  TrainOptions o = options(1);
  auto comms = make_local_communicators(1);
  o.checkpointing = Checkpointing::kSequence;  // zigzag: refused with the reason
  EXPECT_NE(Trainer::create(o, *comms[0]).status().message().find("needs the striped layout"), std::string::npos);
  o = linear_options(1, false);
  o.layout = LayoutKind::kZigzag;  // LASP needs the contiguous layout
  EXPECT_NE(Trainer::create(o, *comms[0]).status().message().find("needs the contiguous layout"), std::string::npos);
  o = options(1);
  o.zero_stage = 4;
  EXPECT_EQ(Trainer::create(o, *comms[0]).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace seqpar
