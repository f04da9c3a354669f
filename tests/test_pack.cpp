// Packed documents in the model (ShardBatch::documents; seqpar train --pack). In fp64, three
// sequences packed with documents of random lengths (1 to the whole sequence) and split over P in
// {1, 2, 3} ranks, every layout, ring, Burst and the planner's choice, give the loss and every
// parameter's gradient of the same documents run one by one, each its own sequence on one rank
// with RoPE from 0 (RoPE is relative, so restarting it per document changes only round-off; it
// matters in low precision at large positions). pack_documents ends documents at the end token
// and stops counting that token's target; the trainer packs, and its attention sends less than
// without documents.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <random>

#include "seqpar/trainer.hpp"

namespace seqpar {
namespace {

ModelConfig tiny() {
  ModelConfig c;
  c.vocab = 32, c.hidden = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ffn = 48;
  c.tied = false;
  return c;
}

struct Packed {
  std::vector<std::vector<int32_t>> inputs, targets;
  std::vector<std::vector<int64_t>> documents;  // offsets per sequence, ending at its length
};

// Three sequences of n tokens: the first with documents of 1, 1, 11, 17 and n - 30 tokens, the
// second cut at random, the third one document. Each document's last target is not counted (the
// next token belongs to another document).
Packed make_packed(int64_t n, int64_t vocab) {
  std::mt19937_64 rng(2026);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(vocab) - 1);
  Packed p;
  p.documents = {{0, 1, 2, 13, 30, n}, {0}};
  std::bernoulli_distribution cut(0.15);
  for (int64_t i = 1; i < n; ++i)
    if (cut(rng)) p.documents[1].push_back(i);
  p.documents[1].push_back(n);
  p.documents.push_back({0, n});
  for (const std::vector<int64_t>& docs : p.documents) {
    std::vector<int32_t> in(static_cast<size_t>(n)), tg(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) in[size_t(i)] = tok(rng), tg[size_t(i)] = tok(rng);
    for (size_t d = 1; d < docs.size(); ++d) tg[size_t(docs[d] - 1)] = -1;
    p.inputs.push_back(in), p.targets.push_back(tg);
  }
  return p;
}

// The summed loss and gradient of the packed batch over P ranks.
Status packed_run(const ModelConfig& c, const std::vector<double>& params, const Packed& p, int P, LayoutKind kind,
                  const std::string& algo, double* loss, std::vector<double>* grad) {
  const int64_t n = int64_t(p.inputs[0].size());
  SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(kind, n, P));
  grad->assign(params.size(), 0.0);
  *loss = 0;
  std::mutex mu;
  return run_local_ranks(P, [&](Communicator& comm) -> Status {
    SP_ASSIGN_OR_RETURN(auto model, Transformer<double>::create(c, Checkpointing::kNone, PlanOptions(algo), layout,
                                                                int64_t(p.inputs.size()), comm));
    ShardBatch shard = shard_batch(layout, comm.rank(), p.inputs, p.targets);
    add_documents(&shard, p.documents, false);
    std::vector<double> g(params.size(), 0.0);
    StepLoss l;
    SP_RETURN_IF_ERROR(model->forward_backward(params.data(), g.data(), shard, 1.0, &l));
    std::lock_guard lock(mu);
    for (size_t i = 0; i < g.size(); ++i) (*grad)[i] += g[i];
    *loss += l.loss_sum;
    return Status::Ok();
  });
}

// The same documents one by one: each its own sequence on one rank.
Status per_document_run(const ModelConfig& c, const std::vector<double>& params, const Packed& p, double* loss,
                        std::vector<double>* grad) {
  grad->assign(params.size(), 0.0);
  *loss = 0;
  auto comms = make_local_communicators(1);
  for (size_t s = 0; s < p.inputs.size(); ++s) {
    const std::vector<int64_t>& docs = p.documents[s];
    for (size_t d = 0; d + 1 < docs.size(); ++d) {
      const auto from = docs[d], to = docs[d + 1];
      SP_ASSIGN_OR_RETURN(const Layout layout, Layout::create(LayoutKind::kContiguous, to - from, 1));
      SP_ASSIGN_OR_RETURN(auto model, Transformer<double>::create(c, Checkpointing::kNone, PlanOptions("ring"), layout,
                                                                  1, *comms[0]));
      const std::vector<std::vector<int32_t>> in{{p.inputs[s].begin() + from, p.inputs[s].begin() + to}},
          tg{{p.targets[s].begin() + from, p.targets[s].begin() + to}};
      StepLoss l;
      SP_RETURN_IF_ERROR(model->forward_backward(params.data(), grad->data(), shard_batch(layout, 0, in, tg), 1.0, &l));
      *loss += l.loss_sum;
    }
  }
  return Status::Ok();
}

TEST(Pack, PackedDocumentsEqualTheDocumentsRunOneByOneInFp64) {
  const ModelConfig c = tiny();
  std::vector<float> init(size_t(parameter_count(c)));
  init_parameters(c, 9, init.data());
  std::vector<double> params(init.begin(), init.end());
  for (double& x : params) x *= 4;  // attention far from uniform
  const Packed p = make_packed(36, c.vocab);
  double want_loss = 0;
  std::vector<double> want;
  ASSERT_TRUE(per_document_run(c, params, p, &want_loss, &want).ok());
  double scale = 0;
  for (double g : want) scale = std::max(scale, std::fabs(g));
  for (LayoutKind kind : {LayoutKind::kContiguous, LayoutKind::kZigzag, LayoutKind::kStriped})
    for (int P : {1, 2, 3})
      for (const char* algo : {"ring", "burst", "auto"}) {
        double loss = 0;
        std::vector<double> grad;
        const Status s = packed_run(c, params, p, P, kind, algo, &loss, &grad);
        ASSERT_TRUE(s.ok()) << algo << " P=" << P << ": " << s.to_string();
        EXPECT_NEAR(loss, want_loss, 1e-10 * std::fabs(want_loss)) << algo << " P=" << P << " layout " << int(kind);
        double worst = 0;
        for (size_t i = 0; i < grad.size(); ++i) worst = std::max(worst, std::fabs(grad[i] - want[i]));
        EXPECT_LT(worst, 1e-10 * scale) << algo << " P=" << P << " layout " << int(kind);
      }
}

TEST(Pack, DocumentsEndAtTheEndTokenWhoseTargetIsNotCounted) {
  const std::vector<int32_t> in{5, 9, 0, 3, 0, 0, 7, 8};
  std::vector<int32_t> tg{9, 0, 3, 0, 0, 7, 8, 2};
  EXPECT_EQ(pack_documents(in, &tg, 0), (std::vector<int64_t>{0, 3, 5, 6, 8}));
  EXPECT_EQ(tg, (std::vector<int32_t>{9, 0, -1, 0, -1, -1, 8, 2}));
  std::vector<int32_t> last{1, 2};
  EXPECT_EQ(pack_documents({4, 0}, &last, 0), (std::vector<int64_t>{0, 2}));  // an end token at the end
  EXPECT_EQ(last, (std::vector<int32_t>{1, -1}));
  ShardBatch b;
  b.batch = 1, b.seq = 4, b.positions = {0, 3, 5, 7};
  add_documents(&b, {{0, 3, 5, 6, 8}}, false);
  EXPECT_EQ(b.rope_positions, (std::vector<int64_t>{0, 0, 0, 1}));
  add_documents(&b, {{0, 3, 5, 6, 8}}, true);
  EXPECT_TRUE(b.rope_positions.empty());
}

// seqpar train --pack on text: every line a document. The step counts no target after an end
// token, and the attention, skipping the blocks no query can see, sends less than unpacked.
TEST(Pack, TheTrainerPacksLines) {
  TrainOptions o;
  o.model = tiny();
  o.model.vocab = 256;
  o.data = "text:" + std::string(SEQPAR_SOURCE_DIR) + "/README.md";
  o.seq = 512, o.batch = 2, o.steps = 2;
  o.layout = LayoutKind::kZigzag;
  int64_t sent[2] = {0, 0};
  for (int packed : {0, 1}) {
    o.pack_eod = packed ? 10 : -1;
    std::mutex mu;
    const Status s = run_local_ranks(3, [&](Communicator& comm) -> Status {
      SP_ASSIGN_OR_RETURN(auto t, Trainer::create(o, comm));
      StepReport r;
      SP_RETURN_IF_ERROR(t->step(&r));
      SP_CHECK_ARG(std::isfinite(r.loss), "the loss is not finite");
      if (comm.rank() != 0) return Status::Ok();
      std::lock_guard lock(mu);
      sent[packed] = r.bytes_sent;
      const auto& in = t->last_inputs();
      const auto& tg = t->last_targets();
      for (size_t q = 0; q < in.size(); ++q)
        for (size_t i = 0; i < in[q].size(); ++i)
          if (packed && in[q][i] == 10) SP_CHECK_ARG(tg[q][i] == -1, "an end token's target was counted");
      return Status::Ok();
    });
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  EXPECT_LT(sent[1], sent[0]) << "packed " << sent[1] << " bytes, unpacked " << sent[0];
}

// seqpar train --pack --layout documents: each step's layout is made from its sequence's documents
// (the busiest rank's causal work near the mean), and training on it equals training on one rank:
// 3 ranks against one, and 2 data-parallel groups of 2 ranks against 2 groups of one, over 4
// steps (fp32 round-off). Without --pack, or with more than one sequence a group, it is refused with the reason.
TEST(Pack, TheTrainerBalancesEachStepsDocuments) {
  TrainOptions o;
  o.model = tiny();
  o.model.vocab = 256;
  o.data = "text:" + std::string(SEQPAR_SOURCE_DIR) + "/README.md";
  o.seq = 384, o.batch = 1, o.steps = 4;
  o.optimizer.total_steps = 4;
  o.pack_eod = 10;
  o.layout = LayoutKind::kDocuments;
  const auto run = [&](const TrainOptions& opts, int P, std::vector<double>* losses, std::vector<float>* params,
                       std::vector<int64_t>* tokens_per_rank) {
    std::mutex mu;
    return run_local_ranks(P, [&](Communicator& comm) -> Status {
      SP_ASSIGN_OR_RETURN(auto t, Trainer::create(opts, comm));
      for (int64_t step = 0; step < opts.steps; ++step) {
        StepReport r;
        SP_RETURN_IF_ERROR(t->step(&r));
        const Layout& layout = t->attention_plan().layout;
        SP_CHECK_ARG(layout.kind() == LayoutKind::kDocuments && layout.doc_offsets().size() > 2,
                     "the step ran on another layout than its documents'");
        std::lock_guard lock(mu);
        if (comm.rank() == 0) losses->push_back(r.loss);
        if (comm.rank() == 0 && step == opts.steps - 1)
          for (int q = 0; q < layout.ranks(); ++q) tokens_per_rank->push_back(layout.local_len(q));
      }
      SP_ASSIGN_OR_RETURN(std::vector<float> all, t->gather_parameters());
      if (comm.rank() == 0) *params = std::move(all);
      return Status::Ok();
    });
  };
  std::vector<double> one, three;
  std::vector<float> p_one, p_three;
  std::vector<int64_t> tokens_one, tokens_three;
  Status s = run(o, 1, &one, &p_one, &tokens_one);
  ASSERT_TRUE(s.ok()) << s.to_string();
  s = run(o, 3, &three, &p_three, &tokens_three);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_EQ(three.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(three[i], one[i], 1e-5 * one[i]) << "step " << i;
  double worst = 0;
  for (size_t i = 0; i < p_one.size(); ++i) worst = std::max(worst, double(std::fabs(p_three[i] - p_one[i])));
  EXPECT_LT(worst, 1e-5);
  ASSERT_EQ(tokens_three.size(), 3u);
  EXPECT_EQ(tokens_three[0] + tokens_three[1] + tokens_three[2], o.seq);
  // Two data-parallel groups (a sequence each, each its own layout) of 2 ranks, against the same
  // two groups of one rank each.
  TrainOptions dp = o;
  dp.data_parallel = 2;
  std::vector<double> dp_one, dp_four;
  std::vector<float> p_dp_one, p_dp_four;
  std::vector<int64_t> unused;
  ASSERT_TRUE(run(dp, 2, &dp_one, &p_dp_one, &unused).ok());
  s = run(dp, 4, &dp_four, &p_dp_four, &unused);
  ASSERT_TRUE(s.ok()) << s.to_string();
  for (size_t i = 0; i < dp_one.size(); ++i) EXPECT_NEAR(dp_four[i], dp_one[i], 1e-5 * dp_one[i]) << "step " << i;
  auto comms = make_local_communicators(1);
  TrainOptions bad = o;
  bad.pack_eod = -1;
  EXPECT_NE(Trainer::create(bad, *comms[0]).status().message().find("needs --pack"), std::string::npos);
  bad = o;
  bad.batch = 2;
  EXPECT_NE(Trainer::create(bad, *comms[0]).status().message().find("--batch 1"), std::string::npos);
}

}  // namespace
}  // namespace seqpar
