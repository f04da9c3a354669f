// The training engine on CPU ranks: the whole model's fp64 gradient against finite differences;
// a tiny model's loss and every parameter gradient with the sequence split over P in {1, 2, 4}
// ranks, every layout, every checkpointing policy, equal to the P = 1 run (fp32 round-off);
// save at step 5 + resume to step 10 equal to a straight run bit for bit; the embedded recall
// task learned across ranks; offloaded checkpoints the same bits; ZeRO-3's store gathering ahead;
// bad input refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <random>

#include "model/sharded_weights.hpp"
#include "seqpar/safetensors.hpp"
#include "seqpar/trainer.hpp"
#include "train_test_util.hpp"

namespace seqpar {
namespace {

// The presets have their namesakes' parameter counts (Llama-3.2-1B, tied; Llama-3-8B, untied).
TEST(Train, PresetsHaveTheirModelsParameterCounts) {
  EXPECT_EQ(parameter_count(model_preset("1b").value()), 1235814400);
  EXPECT_EQ(parameter_count(model_preset("8b").value()), 8030261248);
  EXPECT_FALSE(model_preset("8b").value().tied);
  EXPECT_FALSE(model_preset("70b").ok());
}

TEST(Train, WholeModelGradientMatchesFiniteDifferencesInFp64) {
  ModelConfig c = tiny();
  c.tied = false;
  std::vector<float> init(size_t(parameter_count(c)));
  init_parameters(c, 5, init.data());
  std::vector<double> params(init.begin(), init.end());
  for (auto& p : params) p *= 4;  // larger weights: attention far from uniform (scores x16)
  expect_gradient_matches_finite_differences(c, params, LayoutKind::kZigzag, 3);
}

TEST(Train, SplitSequenceEqualsOneRankForEveryLayoutAndPolicy) {
  const ModelConfig c = tiny();
  std::vector<float> params(size_t(parameter_count(c)));
  init_parameters(c, 9, params.data());
  for (auto& p : params) p *= 2;
  const int64_t seq = 64;
  double loss1 = 0;
  std::vector<float> grad1;
  ASSERT_TRUE(loss_and_grad(c, params, 1, LayoutKind::kContiguous, Checkpointing::kNone, "ring", seq, &loss1, &grad1).ok());
  for (int P : {2, 4})
    for (LayoutKind layout : {LayoutKind::kContiguous, LayoutKind::kZigzag, LayoutKind::kStriped})
      for (Checkpointing policy :
           {Checkpointing::kNone, Checkpointing::kFull, Checkpointing::kAttention, Checkpointing::kSequence}) {
        SCOPED_TRACE("P=" + std::to_string(P) + " " + layout_name(layout) + " " + checkpointing_name(policy));
        double loss = 0;
        std::vector<float> grad;
        const Status s = loss_and_grad(c, params, P, layout, policy, "auto", seq, &loss, &grad);
        if (policy == Checkpointing::kSequence && layout != LayoutKind::kStriped) {  // refused, with the reason
          EXPECT_NE(s.message().find("needs the striped layout"), std::string::npos) << s.to_string();
          continue;
        }
        ASSERT_TRUE(s.ok()) << s.to_string();
        EXPECT_NEAR(loss, loss1, 1e-5 * loss1);
        std::string which;
        EXPECT_LT(worst_tensor_error(c, grad, grad1, &which), 1e-5) << which;
      }
}

TEST(Train, ResumeContinuesBitForBit) {
  const TrainOptions o = small_run(10);
  const std::string path = (std::filesystem::temp_directory_path() / "seqpar_resume_test.ckpt").string();
  std::vector<double> straight, first, second;
  std::vector<float> p_straight, p_first, p_resumed;
  ASSERT_TRUE(train(o, 2, 10, "", "", &straight, &p_straight).ok());
  ASSERT_TRUE(train(o, 2, 5, "", path, &first, &p_first).ok());
  ASSERT_TRUE(train(o, 2, 10, path, "", &second, &p_resumed).ok());
  std::filesystem::remove(path);
  ASSERT_EQ(first.size() + second.size(), straight.size());
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i], straight[i]) << "step " << i;
  for (size_t i = 0; i < second.size(); ++i) EXPECT_EQ(second[i], straight[5 + i]) << "step " << 5 + i;
  EXPECT_EQ(p_resumed, p_straight);  // every bit
}

// --offload-checkpoints only moves bytes: with it the losses and the parameters after 3 steps
// are the same bits as without, for every policy that keeps something, softmax and linear
// layers, 1 and 2 ranks (ZeRO 3 on 2); the activations counted fall (the host copies are not
// device bytes); the policy none is refused.
TEST(Train, OffloadedCheckpointsGiveTheSameBits) {
  for (int P : {1, 2})
    for (Checkpointing policy : {Checkpointing::kFull, Checkpointing::kAttention, Checkpointing::kSequence})
      for (bool hybrid : {false, true}) {
        if (hybrid && policy == Checkpointing::kSequence) continue;  // linear layers need the contiguous layout
        SCOPED_TRACE("P=" + std::to_string(P) + " " + checkpointing_name(policy) + (hybrid ? " hybrid" : ""));
        TrainOptions o = small_run(3);
        o.model.layers = 4;
        o.checkpointing = policy;
        o.zero_stage = P == 2 ? 3 : 0;
        if (policy == Checkpointing::kSequence) o.layout = LayoutKind::kStriped;
        if (hybrid) {  // linear layers but the last: their kept o comes back too
          o.model.mixers.assign(4, MixerKind::kLinear);
          o.model.mixers[3] = MixerKind::kSoftmax;
          o.layout = LayoutKind::kContiguous;
        }
        std::vector<double> kept_losses, offloaded_losses;
        std::vector<float> kept_params, offloaded_params;
        Status s = train(o, P, 3, "", "", &kept_losses, &kept_params);
        ASSERT_TRUE(s.ok()) << s.to_string();
        o.offload_checkpoints = true;
        s = train(o, P, 3, "", "", &offloaded_losses, &offloaded_params);
        ASSERT_TRUE(s.ok()) << s.to_string();
        EXPECT_EQ(offloaded_losses, kept_losses);  // every bit
        EXPECT_EQ(offloaded_params, kept_params);
      }
  TrainOptions o = small_run(1);
  o.model.layers = 4;
  o.checkpointing = Checkpointing::kAttention;
  auto comms = make_local_communicators(1);
  // Not offloaded; offloaded with the last 1, 2 and 3 layers kept on the device.
  int64_t counted[4] = {0, 0, 0, 0};
  std::vector<double> losses[4];
  for (int run : {0, 1, 2, 3}) {
    o.offload_checkpoints = run > 0;
    o.offload_keep_layers = std::max(run, 1);
    auto trainer = Trainer::create(o, *comms[0]);
    ASSERT_TRUE(trainer.ok()) << trainer.status().to_string();
    StepReport r;
    ASSERT_TRUE(trainer.value()->step(&r).ok());
    counted[run] = r.activation_bytes;
    losses[run].push_back(r.loss);
    losses[run].push_back(r.grad_norm);  // the backward's, through the restored checkpoints
  }
  // At most two layers' checkpoints are counted rather than four: two fewer of a layer's x_in,
  // o and LSE, 4 sequences x 64 rows x (32 + 32 + 4 heads) fp32. The layer before the last is on
  // the device at the peak either way (the last layer's forward runs before its copy is dropped,
  // and it is back for the last layer's backward), so keeping two costs nothing there; three
  // keep one more.
  const int64_t layer = 4 * 64 * (32 + 32 + 4) * int64_t(sizeof(float));
  EXPECT_EQ(counted[0] - counted[1], 2 * layer);
  EXPECT_EQ(counted[2], counted[1]);
  EXPECT_EQ(counted[0] - counted[3], layer);
  for (int run : {1, 2, 3}) EXPECT_EQ(losses[run], losses[0]) << "run " << run;
  o.offload_keep_layers = 0;
  EXPECT_NE(Trainer::create(o, *comms[0]).status().message().find("at least 1"), std::string::npos);
  o.offload_keep_layers = 1;
  o.checkpointing = Checkpointing::kNone;
  EXPECT_NE(Trainer::create(o, *comms[0]).status().message().find("not none"), std::string::npos);
}

// --profile: every kind of work is reported (a hybrid model has each), each is non-negative, the
// ops and the time between them make up the pass's span, which the step's wall clock contains;
// and the run is the same bits with it as without.
TEST(Train, ProfileTimesEachKindOfWorkWithoutChangingTheRun) {
  TrainOptions o = small_run(2);
  o.model.layers = 2;
  o.model.mixers = {MixerKind::kLinear, MixerKind::kSoftmax};
  o.layout = LayoutKind::kContiguous;
  std::vector<double> plain_losses, profiled_losses;
  std::vector<float> plain_params, profiled_params;
  Status s = train(o, 2, 2, "", "", &plain_losses, &plain_params);
  ASSERT_TRUE(s.ok()) << s.to_string();
  o.profile = true;
  s = train(o, 2, 2, "", "", &profiled_losses, &profiled_params);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(profiled_losses, plain_losses);
  EXPECT_EQ(profiled_params, plain_params);
  auto comms = make_local_communicators(1);
  o.layout = LayoutKind::kContiguous;
  auto trainer = Trainer::create(o, *comms[0]);
  ASSERT_TRUE(trainer.ok()) << trainer.status().to_string();
  StepReport r;
  ASSERT_TRUE(trainer.value()->step(&r).ok());
  const std::vector<std::string> kinds{"attention", "products", "lm_head", "norms", "rope", "swiglu",
                                       "embedding", "linear_mixer", "casts", "between_ops", "pass"};
  ASSERT_EQ(r.work_ms.size(), kinds.size());
  double ops = 0;
  for (size_t i = 0; i < kinds.size(); ++i) {
    EXPECT_EQ(r.work_ms[i].first, kinds[i]);
    EXPECT_GE(r.work_ms[i].second, 0.0) << kinds[i];
    if (i + 2 < kinds.size()) ops += r.work_ms[i].second;
  }
  for (const char* done : {"attention", "products", "lm_head", "norms", "embedding", "linear_mixer"})
    EXPECT_GT(r.work_ms[size_t(std::find(kinds.begin(), kinds.end(), done) - kinds.begin())].second, 0.0) << done;
  EXPECT_NEAR(ops + r.work_ms[kinds.size() - 2].second, r.work_ms.back().second, 1e-9);
  EXPECT_LE(r.work_ms.back().second, r.seconds * 1e3);
  o.profile = false;
  auto quiet = Trainer::create(o, *comms[0]);
  ASSERT_TRUE(quiet.ok());
  ASSERT_TRUE(quiet.value()->step(&r).ok());
  EXPECT_TRUE(r.work_ms.empty());
}

// A long step's progress lines: rank 0 alone, one a layer of each phase at --progress 0, in the
// order the phase runs them; none at the default 30 s for a step this short, none below 0.
TEST(Train, ProgressLinesSayWhereRankZerosPassIs) {
  TrainOptions o = small_run(2);
  o.model.layers = 3;
  o.checkpointing = Checkpointing::kFull;
  const auto lines_of = [&](double every_s) {
    o.progress_s = every_s;
    std::vector<double> losses;
    std::vector<float> params;
    testing::internal::CaptureStderr();
    const Status s = train(o, 2, 2, "", "", &losses, &params);
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_TRUE(s.ok()) << s.to_string();
    std::vector<std::string> lines;
    for (size_t at = 0, end; (end = err.find('\n', at)) != std::string::npos; at = end + 1)
      if (err.compare(at, 19, "seqpar train: step ") == 0) lines.push_back(err.substr(at, end - at));
    return lines;
  };
  const std::vector<std::string> every = lines_of(0);
  ASSERT_EQ(every.size(), 2u * 2u * 3u);  // 2 steps x (3 forward + 3 backward) layers, rank 0 only
  EXPECT_EQ(every[0].rfind("seqpar train: step 0: forward, 1 of 3 layers (", 0), 0u) << every[0];
  EXPECT_EQ(every[2].rfind("seqpar train: step 0: forward, 3 of 3 layers", 0), 0u) << every[2];
  EXPECT_EQ(every[5].rfind("seqpar train: step 0: backward, 3 of 3 layers", 0), 0u) << every[5];
  EXPECT_EQ(every[6].rfind("seqpar train: step 1: forward, 1 of 3 layers", 0), 0u) << every[6];
  EXPECT_TRUE(lines_of(30).empty());
  EXPECT_TRUE(lines_of(-1).empty());
}

// The recall task: the query (last position) and the key (second quarter) sit on different
// ranks (zigzag, 2 ranks), and the key is one of 8 uniformly: ln 8 = 2.08 is the best a model
// can do without reading the key; below 0.5 the query's attention found it across ranks.
TEST(Train, RecallTaskIsLearnedAcrossRanks) {
  TrainOptions o = small_run(150);
  o.model = model_preset("tiny").value();
  o.seq = 128, o.batch = 32;
  o.optimizer.warmup_steps = 10;
  std::vector<double> losses;
  std::vector<float> params;
  const Status s = train(o, 2, o.steps, "", "", &losses, &params);
  ASSERT_TRUE(s.ok()) << s.to_string();
  double last = 0;
  for (size_t i = losses.size() - 10; i < losses.size(); ++i) last += losses[i] / 10;
  EXPECT_LT(last, 0.5) << "mean loss of the last 10 steps (from " << losses.front() << ")";
}

// The trainer over Ulysses x ring (u = 2, Burst across the groups; --ulysses, --ring-algo) and
// Attention2D trains the same model as over the ring: same losses and parameters.
TEST(Train, UlyssesRingAndAttention2DTrainAsTheRing) {
  TrainOptions o = small_run(3);
  o.layout = LayoutKind::kStriped;
  o.algorithm = "ring";
  std::vector<double> ring_losses;
  std::vector<float> ring_params;
  ASSERT_TRUE(train(o, 4, 3, "", "", &ring_losses, &ring_params).ok());
  for (const char* algo : {"ulysses-ring", "attention2d"}) {
    SCOPED_TRACE(algo);
    o.algorithm = algo, o.ulysses = 2, o.ring_algorithm = "burst";
    std::vector<double> losses;
    std::vector<float> params;
    const Status s = train(o, 4, 3, "", "", &losses, &params);
    ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_EQ(losses.size(), ring_losses.size());
    for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], ring_losses[i], 1e-5 * ring_losses[i]);
    double worst = 0;
    for (size_t i = 0; i < params.size(); ++i) worst = std::max(worst, double(std::abs(params[i] - ring_params[i])));
    EXPECT_LT(worst, 1e-5);
  }
}

// Two data-parallel groups of two sequence ranks, each with its own 2 sequences, train as one
// rank on all 4 sequences; ZeRO stages 1, 2 and 3 give the parameters of no ZeRO after 5 steps.
TEST(Train, DataParallelGroupsAndZeroMatchOneRank) {
  TrainOptions o = small_run(5);
  o.batch = 4;
  std::vector<double> l_one, l_dp;
  std::vector<float> p_one, p_dp;
  ASSERT_TRUE(train(o, 1, 5, "", "", &l_one, &p_one).ok());
  o.batch = 2, o.data_parallel = 2;
  const Status s = train(o, 4, 5, "", "", &l_dp, &p_dp);
  ASSERT_TRUE(s.ok()) << s.to_string();
  for (size_t i = 0; i < l_one.size(); ++i) EXPECT_NEAR(l_dp[i], l_one[i], 1e-5 * l_one[i]) << "step " << i;
  EXPECT_LT(worst_param_error(o.model, p_dp, p_one), 1e-5);
  for (int stage : {1, 2, 3}) {
    o.zero_stage = stage;
    std::vector<double> l_zero;
    std::vector<float> p_zero;
    const Status z = train(o, 4, 5, "", "", &l_zero, &p_zero);
    ASSERT_TRUE(z.ok()) << z.to_string();
    EXPECT_LT(worst_param_error(o.model, p_zero, p_dp), 1e-6) << "ZeRO " << stage;
    if (stage == 3) {  // the store's overlap (gathers ahead, sums on a lane) moves the same bits
      TrainOptions in_line = o;
      in_line.zero_overlap = false;
      std::vector<double> l_in_line;
      std::vector<float> p_in_line;
      ASSERT_TRUE(train(in_line, 4, 5, "", "", &l_in_line, &p_in_line).ok());
      EXPECT_EQ(l_in_line, l_zero);
      EXPECT_EQ(p_in_line, p_zero);
    }
  }
  // Resuming a ZeRO-3 run from its checkpoint (parameters and moments gathered into the file) is
  // exact too.
  const std::string path = (std::filesystem::temp_directory_path() / "seqpar_zero_resume.ckpt").string();
  std::vector<double> a, b;
  std::vector<float> p_straight, p_part, p_resumed;
  ASSERT_TRUE(train(o, 4, 5, "", "", &a, &p_straight).ok());
  ASSERT_TRUE(train(o, 4, 3, "", path, &b, &p_part).ok());
  ASSERT_TRUE(train(o, 4, 5, path, "", &b, &p_resumed).ok());
  std::filesystem::remove(path);
  EXPECT_EQ(p_resumed, p_straight);
}

// ZeRO-3's store on two thread ranks, four units of a 101-element flat array: every unit's weights
// come back whole and every rank's gradient slice gets the sum over the ranks, pass after pass.
// With the overlap, from the second pass on the unit that followed in the last pass is gathered
// ahead: 5 of the 7 calls of a pass in the same order (not the first, nor a unit still held), and
// a pass in another order still gets the right weights, using a gather left in flight when its
// unit comes later (3). Without it, nothing is gathered ahead.
TEST(Train, ShardedWeightsGatherTheLastPassNextUnitAhead) {
  using Unit = std::pair<int64_t, int64_t>;
  const int64_t count = 101, slice = 51;
  const Unit u0{0, 10}, u1{10, 40}, u2{40, 70}, u3{70, 101};
  const std::vector<Unit> forward{u0, u1, u2, u3}, other{u0, u2, u1, u3}, backward{u3, u2, u1};
  for (bool overlap : {true, false}) {
    std::mutex mu;
    std::vector<int64_t> ahead;  // rank 0's count after each pass
    const Status s = run_local_ranks(2, [&](Communicator& comm) -> Status {
      const auto mem = model::make_host_training_memory();
      std::vector<float> compute(static_cast<size_t>(slice)), grads(static_cast<size_t>(slice), 0.0f);
      for (int64_t i = 0; i < slice; ++i) {
        const int64_t g = comm.rank() * slice + i;
        compute[size_t(i)] = g < count ? 0.5f * float(g) + 1 : 0.0f;
      }
      model::ShardedWeights store(comm, *mem, slice, compute.data(), grads.data(), overlap);
      const auto check = [&](Unit u) -> StatusOr<const float*> {
        SP_ASSIGN_OR_RETURN(const void* w, store.weights(u.first, u.second));
        const float* f = static_cast<const float*>(w);
        for (int64_t i = u.first; i < u.second; ++i)
          SP_CHECK_ARG(f[i - u.first] == 0.5f * float(i) + 1, "unit at " + std::to_string(u.first) +
                                                                  ": element " + std::to_string(i) + " is wrong");
        return f;
      };
      for (const std::vector<Unit>* first : {&forward, &forward, &other}) {
        for (Unit u : *first) {
          SP_RETURN_IF_ERROR(check(u).status());
          SP_RETURN_IF_ERROR(store.release(u.first, u.second));
        }
        for (Unit u : backward) {
          SP_RETURN_IF_ERROR(check(u).status());
          SP_ASSIGN_OR_RETURN(void* g, store.gradient(u.first, u.second));
          for (int64_t i = u.first; i < u.second; ++i) static_cast<float*>(g)[i - u.first] = float((comm.rank() + 1) * i);
          SP_RETURN_IF_ERROR(store.gradient_done(u.first, u.second));
          SP_RETURN_IF_ERROR(store.release(u.first, u.second));
        }
        SP_RETURN_IF_ERROR(store.end_pass());
        if (comm.rank() == 0) {
          std::lock_guard lock(mu);
          ahead.push_back(store.gathered_ahead());
        }
      }
      // Three passes of the units 10..101, each rank adding (rank + 1) * i: 3 * 3 * i in the slice.
      for (int64_t i = 0; i < slice; ++i) {
        const int64_t g = comm.rank() * slice + i;
        const float want = g >= 10 && g < count ? float(9 * g) : 0.0f;
        SP_CHECK_ARG(grads[size_t(i)] == want, "gradient of element " + std::to_string(g) + ": " +
                                                  std::to_string(grads[size_t(i)]) + ", want " + std::to_string(want));
      }
      return Status::Ok();
    });
    ASSERT_TRUE(s.ok()) << s.to_string();
    const std::vector<int64_t> want = overlap ? std::vector<int64_t>{0, 5, 8} : std::vector<int64_t>{0, 0, 0};
    EXPECT_EQ(ahead, want) << (overlap ? "overlap" : "in line");
  }
}

// Weights written as safetensors (Llama naming) read back exactly; a file for another shape, or
// without a tensor, is refused by name; the header is what the format says.
TEST(Train, SafetensorsRoundTripAndRefusals) {
  ModelConfig c = tiny();
  c.tied = false;
  std::vector<float> params(size_t(parameter_count(c)));
  init_parameters(c, 3, params.data());
  const std::string path = (std::filesystem::temp_directory_path() / "seqpar_weights.safetensors").string();
  ASSERT_TRUE(save_model_safetensors(path, c, params.data()).ok());
  auto back = load_model_safetensors(path, c);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back.value(), params);
  auto arrays = load_safetensors(path);
  ASSERT_TRUE(arrays.ok());
  EXPECT_EQ(arrays->size(), parameter_table(c).size());
  EXPECT_EQ(arrays->front().name, "model.embed_tokens.weight");
  EXPECT_EQ(arrays->back().name, "lm_head.weight");
  EXPECT_EQ(arrays->back().shape, (std::vector<int64_t>{c.vocab, c.hidden}));
  ModelConfig wider = c;
  wider.ffn = 64;
  EXPECT_NE(load_model_safetensors(path, wider).status().message().find("another shape"), std::string::npos);
  ModelConfig deeper = c;
  deeper.layers = 3;
  EXPECT_NE(load_model_safetensors(path, deeper).status().message().find("has no model.layers.2"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(Train, RefusesBadInput) {
  TrainOptions o = small_run(5);
  o.model.heads = 3;
  auto comms = make_local_communicators(1);
  EXPECT_NE(Trainer::create(o, *comms[0]).status().message().find("divisible"), std::string::npos);
  o = small_run(5);
  o.model.vocab = 16;  // the recall task's tokens go up to 63
  EXPECT_NE(Trainer::create(o, *comms[0]).status().message().find("raise --vocab"), std::string::npos);
  o = small_run(5);
  o.data = "tokens:/no/such/seqpar/file.bin";
  EXPECT_NE(Trainer::create(o, *comms[0]).status().message().find("cannot read"), std::string::npos);
  EXPECT_EQ(parse_checkpointing("most").status().code(), StatusCode::kInvalidArgument);
  o = small_run(5);
  o.data_parallel = 2;  // one rank cannot form two groups
  EXPECT_NE(Trainer::create(o, *comms[0]).status().message().find("equal data-parallel groups"), std::string::npos);
  o = small_run(5);
  o.zero_stage = 4;
  EXPECT_NE(Trainer::create(o, *comms[0]).status().message().find("does not exist"), std::string::npos);
}

}  // namespace
}  // namespace seqpar
