// The tiled MLP and linear mixer backward (--tile-tokens, layer_pass.hpp; issues 39 and 36) on
// CPU ranks, for the Llama tiny preset and tnl-tiny, in fp32 and fp64, every checkpointing policy
// that linear layers take: with 7 or 32 rows at a time the loss and every gradient agree with the
// untiled pass to the dtype's round-off, not bit for bit: OpenBLAS's product gives a row bits that
// depend on how many rows the call has (its kernels for a block's tail rows round otherwise;
// 32-row tiles of 120 rows change about half the tensors' bits, 7-row tiles all), and the tiled
// products' weight gradients (the MLP's, the mixer's output) sum over the rows tile by tile. One
// tile holding every row changes no bit. The activations counted fall by exactly the MLP's kept
// arrays; training with tiles follows training without.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "seqpar/trainer.hpp"
#include "train_test_util.hpp"

namespace seqpar {
namespace {

template <class T>
void expect_tiles_agree_to_round_off(const std::string& preset, double round_off) {
  const ModelConfig c = model_preset(preset).value();
  std::vector<float> init(size_t(parameter_count(c)));
  init_parameters(c, 9, init.data());
  const std::vector<T> params(init.begin(), init.end());
  const int64_t seq = 60;  // 2 sequences: 120 rows on one rank, 60 on each of two
  for (int P : {1, 2})
    for (Checkpointing policy : {Checkpointing::kNone, Checkpointing::kAttention, Checkpointing::kFull}) {
      const auto run = [&](int64_t tile, double* loss, std::vector<T>* grad) {
        const Status s =
            loss_and_grad(c, params, P, LayoutKind::kContiguous, policy, "ring", seq, loss, grad, LaspAlgorithm::kAuto, tile);
        ASSERT_TRUE(s.ok()) << s.to_string();
      };
      double untiled_loss = 0;
      std::vector<T> untiled;
      ASSERT_NO_FATAL_FAILURE(run(0, &untiled_loss, &untiled));
      for (int64_t tile : {7, 32, 1000}) {  // uneven tiles, and one holding every row
        SCOPED_TRACE(preset + " P=" + std::to_string(P) + " " + checkpointing_name(policy) + " tile " +
                     std::to_string(tile));
        double loss = 0;
        std::vector<T> grad;
        ASSERT_NO_FATAL_FAILURE(run(tile, &loss, &grad));
        if (tile >= 2 * seq) {
          EXPECT_EQ(loss, untiled_loss);
          EXPECT_TRUE(grad == untiled) << "one tile of every row is the untiled arithmetic";
          continue;
        }
        EXPECT_NEAR(loss, untiled_loss, round_off * untiled_loss);
        std::string which;
        EXPECT_LE(worst_tensor_error(c, grad, untiled, &which), round_off) << which;
        EXPECT_FALSE(grad == untiled) << "no bit moved: did the tiles run?";
      }
    }
}

TEST(TrainTiled, TiledGradientsAgreeToRoundOffInFp32) {
  expect_tiles_agree_to_round_off<float>("tiny", 1e-5);
  expect_tiles_agree_to_round_off<float>("tnl-tiny", 1e-5);
}

TEST(TrainTiled, TiledGradientsAgreeToRoundOffInFp64) {
  expect_tiles_agree_to_round_off<double>("tiny", 1e-12);
  expect_tiles_agree_to_round_off<double>("tnl-tiny", 1e-12);
}

// The trainer with --tile-tokens 16 (16 tiles of a rank's 256 rows) over 5 steps, tnl and
// softmax, one rank and 2 (ZeRO-3): the losses and the weights within fp32 round-off; the activations counted under attention checkpointing fall by exactly the MLP's kept
// arrays of one layer (h2 [rows, hidden], g and u [rows, ffn], rstd2 [rows]), all that a tiled
// MLP no longer keeps.
TEST(TrainTiled, TrainingWithTilesFollowsTrainingWithout) {
  for (bool linear : {false, true})
    for (int P : {1, 2}) {
      SCOPED_TRACE(std::string(linear ? "tnl" : "softmax") + " P=" + std::to_string(P));
      TrainOptions o = small_run(5);
      o.checkpointing = Checkpointing::kAttention;
      o.zero_stage = P == 2 ? 3 : 0;
      if (linear) {
        o.model.mixers.assign(size_t(o.model.layers), MixerKind::kLinear);
        o.layout = LayoutKind::kContiguous;
      }
      std::vector<double> untiled_losses, tiled_losses;
      std::vector<float> untiled_params, tiled_params;
      o.tile_tokens = 0;
      Status s = train(o, P, 5, "", "", &untiled_losses, &untiled_params);
      ASSERT_TRUE(s.ok()) << s.to_string();
      o.tile_tokens = 16;
      s = train(o, P, 5, "", "", &tiled_losses, &tiled_params);
      ASSERT_TRUE(s.ok()) << s.to_string();
      ASSERT_EQ(tiled_losses.size(), untiled_losses.size());
      for (size_t i = 0; i < tiled_losses.size(); ++i)
        EXPECT_NEAR(tiled_losses[i], untiled_losses[i], 1e-5 * untiled_losses[i]) << "step " << i;
      EXPECT_LT(worst_param_error(o.model, tiled_params, untiled_params), 1e-4);
    }
  TrainOptions o = small_run(1);
  o.checkpointing = Checkpointing::kAttention;
  auto comms = make_local_communicators(1);
  int64_t counted[2] = {0, 0};
  for (int tiled : {0, 1}) {
    o.tile_tokens = tiled ? 16 : 0;
    auto trainer = Trainer::create(o, *comms[0]);
    ASSERT_TRUE(trainer.ok()) << trainer.status().to_string();
    StepReport r;
    ASSERT_TRUE(trainer.value()->step(&r).ok());
    counted[tiled] = r.activation_bytes;
  }
  const int64_t rows = o.batch * o.seq;
  EXPECT_EQ(counted[0] - counted[1], rows * (o.model.hidden + 2 * o.model.ffn + 1) * int64_t(sizeof(float)));
  o.tile_tokens = -2;
  EXPECT_NE(Trainer::create(o, *comms[0]).status().message().find("the MLP's tile must be"), std::string::npos);
  // The default: tiles under a checkpointing policy, none without one.
  o.tile_tokens = -1;
  EXPECT_EQ(o.tile_rows(), 8192);
  o.checkpointing = Checkpointing::kNone;
  EXPECT_EQ(o.tile_rows(), 0);
}

}  // namespace
}  // namespace seqpar
