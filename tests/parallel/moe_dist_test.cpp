// Mixture-of-Experts training on several CPU ranks against one rank: expert parallelism (each
// member holding some experts, tokens exchanged by all-to-all), data parallelism with the
// load-balancing loss over every replica's tokens, pipeline stages, tensor and sequence
// parallelism, uneven expert counts, ZeRO 1-2 and recomputation; losses and final weights must match the one-rank run of the
// same micro-batches. Also resume, and what is refused (moe_zero3_test.cpp: ZeRO 3, sharded gradients and offload).
#include <gtest/gtest.h>

#include "moe_dist_fixture.hpp"
#include "runtime/io/checkpoint_commit.hpp"

namespace alloy::testing {
namespace {

using MoeDistTest = MoeDistFixture;

TEST_F(MoeDistTest, ExpertParallelOnTwoRanksMatchesOneRank) {
  expect_matches_one_rank(moe_plan({{1, 2, 0, {3}}}, 2, 2), "ep2");
}

TEST_F(MoeDistTest, DataParallelWithoutExpertParallelismMatchesOneRank) {
  expect_matches_one_rank(moe_plan({{1, 2, 0, {3}}}, 2, 1), "dp2");
}

TEST_F(MoeDistTest, FourReplicasInTwoExpertGroupsMatchOneRank) {
  expect_matches_one_rank(moe_plan({{1, 4, 0, {3}}}, 2, 2), "dp4-ep2");
}

TEST_F(MoeDistTest, PipelineStagesWithExpertParallelismMatchOneRank) {
  // Stage 0: the dense block and an MoE block; stage 1: an MoE block and the head.
  expect_matches_one_rank(moe_plan({{1, 2, 0, {2}}, {1, 2, 0, {1}}}, 4, 2), "pp2-dp2-ep2");
}

TEST_F(MoeDistTest, PerBlockBalanceOverPipelineStagesMatchesOneRank) {
  // DeepSeek's form: each MoE block's own f and P (over the stage's replicas), the blocks' terms
  // added over the stages; the pooled tiny-moe's tests above pool them over the stages instead.
  std::string yaml = read_text(tiny_moe_path());
  yaml.replace(yaml.find("name: tiny-moe"), 14, "name: moe-per-block");
  yaml.replace(yaml.find("balance_loss: pooled"), 20, "balance_loss: per_block");
  model_path_ = dir_->write("moe-per-block.yaml", yaml);
  expect_matches_one_rank(moe_plan({{1, 2, 0, {2}}, {1, 2, 0, {1}}}, 4, 2), "per-block-pp2-dp2-ep2");
  model_path_ = tiny_moe_path();
}

TEST_F(MoeDistTest, InterleavedChunksWithExpertParallelismMatchOneRank) {
  // tiny-moe with four blocks: two stages of two chunks of one block each.
  std::string yaml = read_text(tiny_moe_path());
  yaml.replace(yaml.find("name: tiny-moe"), 14, "name: moe-4");
  yaml.replace(yaml.find("layers: 3"), 9, "layers: 4");
  model_path_ = dir_->write("moe-4.yaml", yaml);
  const Plan plan = moe_plan({{1, 2, 0, {1, 1}}, {1, 2, 0, {1, 1}}}, 2, 2, {}, Schedule::Schedule_interleaved);
  expect_matches_one_rank(plan, "interleaved-dp2-ep2");
  model_path_ = tiny_moe_path();
}

TEST_F(MoeDistTest, UnevenExpertsPerMemberMatchOneRank) {
  const Plan plan = moe_plan({{1, 2, 0, {3}}}, 2, 2, {3, 1});
  expect_matches_one_rank(plan, "dp2-ep2-experts-3-1");
  // Unequal shares of each micro-batch (3 and 1 of its 4 sequences): f_e and P_e still count every token once.
  expect_matches_one_rank(with_uneven_replicas(plan, 0, {3, 1}), "dp2-ep2-shares-3-1");
  // Each member holds and saves only its experts: 0-2 on rank 0, 3 on rank 1 (of both MoE blocks).
  const std::string ck = dir_->path() + "/experts-3-1-ck";
  ASSERT_EQ(run_command(train_command(plan, "experts-3-1-ck", 1, "--checkpoint " + ck), 120).exit_code, 0);
  for (int rank = 0; rank < 2; ++rank) {
    SafetensorsFile f = safetensors_open(checkpoint_rank_dir(ck, 1, rank) + "/model.safetensors");
    for (int layer = 1; layer < 3; ++layer)
      for (int e = 0; e < 4; ++e) {
        const bool held = rank == 0 ? e < 3 : e == 3;
        const std::string name = fmt::format("layers.{}.mlp.experts.{}.down.weight", layer, e);
        EXPECT_EQ(f.entry_find(name) != nullptr, held) << "rank " << rank << ": " << name;
      }
    EXPECT_NE(f.entry_find("layers.1.mlp.router.weight"), nullptr) << "rank " << rank;
  }
}

TEST_F(MoeDistTest, ZeroAndRecomputationWithExpertParallelismMatchOneRank) {
  expect_matches_one_rank(moe_plan({{1, 4, 1, {3}}}, 2, 2), "dp4-ep2-zero1");
  expect_matches_one_rank(moe_plan({{1, 4, 2, {3}}}, 2, 2), "dp4-ep2-zero2");
  Plan sharded = moe_plan({{1, 2, 2, {3}}}, 2, 1);
  sharded.stages[0].shard_gradients = true;
  expect_matches_one_rank(sharded, "dp2-zero2-sharded-gradients");
  TestStage recomputed{1, 2, 0, {3}};
  recomputed.recompute = {Recompute::Recompute_full, Recompute::Recompute_full, Recompute::Recompute_selective};
  expect_matches_one_rank(moe_plan({recomputed}, 2, 2), "dp2-ep2-recompute");
}

TEST_F(MoeDistTest, TensorParallelismWithExpertsReplicatedOverItMatchesOneRank) {
  expect_matches_one_rank(moe_plan({{2, 1, 0, {3}}}, 2, 1), "tp2");
  TestStage sequence_parallel{2, 2, 0, {3}};
  sequence_parallel.sequence_parallel = true;
  expect_matches_one_rank(moe_plan({sequence_parallel}, 2, 2), "tp2-sp-dp2-ep2");

}

TEST_F(MoeDistTest, ExpertParallelRunResumesExactly) {
  // Each rank's experts with their moments per tensor, and under ZeRO 2 packed with its pieces.
  const std::vector<std::pair<Plan, std::string>> plans = {{moe_plan({{1, 2, 0, {3}}}, 2, 2), "ep"},
                                                           {moe_plan({{1, 2, 2, {3}}}, 2, 2), "ep-zero2"}};
  for (const auto& [plan, name] : plans) {
    const std::string ck = dir_->path() + "/" + name + "-ck";
    const std::string full_log = dir_->path() + "/" + name + "-full.jsonl";
    const std::string part_log = dir_->path() + "/" + name + "-part.jsonl";
    ASSERT_EQ(run_command(train_command(plan, name + "-full", 6, "--log " + full_log), 120).exit_code, 0);
    ASSERT_EQ(run_command(train_command(plan, name + "-part", 3, fmt::format("--checkpoint {} --log {}", ck, part_log)), 120)
                  .exit_code,
              0);
    CommandResult resumed =
        run_command(train_command(plan, name + "-part", 6, fmt::format("--checkpoint {} --resume --log {}", ck, part_log)), 120);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    for (const char* key : {"loss", "aux_loss"}) {
      const std::vector<double> full = losses(full_log, key), part = losses(part_log, key);
      ASSERT_EQ(full.size(), 6u);
      ASSERT_EQ(part.size(), 6u);
      for (size_t i = 0; i < full.size(); ++i) EXPECT_DOUBLE_EQ(full[i], part[i]) << name << " " << key << " step " << i + 1;
    }
  }
}

TEST_F(MoeDistTest, CheckpointOfOneExpertSplitResumesUnderAnother) {
  // ep 2 for three steps, then every expert on each replica (ep 1), then experts split 3 + 1: each
  // resume reshards the experts' parameters and moments by name, and the run goes on as one would.
  const Plan ep2 = moe_plan({{1, 2, 0, {3}}}, 2, 2);
  const Plan ep1 = moe_plan({{1, 2, 0, {3}}}, 2, 1);
  const Plan ep2_uneven = moe_plan({{1, 2, 0, {3}}}, 2, 2, {3, 1});
  const std::string ck = dir_->path() + "/split-ck";
  const std::string full_log = dir_->path() + "/split-full.jsonl", part_log = dir_->path() + "/split-part.jsonl";
  ASSERT_EQ(run_command(train_command(ep2, "split-full", 9, "--log " + full_log), 120).exit_code, 0);
  ASSERT_EQ(run_command(train_command(ep2, "split-part", 3, fmt::format("--checkpoint {} --log {}", ck, part_log)), 120).exit_code, 0);
  const std::string resume = fmt::format("--checkpoint {} --resume --log {}", ck, part_log);
  CommandResult r = run_command(train_command(ep1, "split-ep1", 6, resume), 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command(train_command(ep2_uneven, "split-3-1", 9, resume), 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> full = losses(full_log), part = losses(part_log);
  ASSERT_EQ(full.size(), 9u);
  ASSERT_EQ(part.size(), 9u);
  for (size_t i = 0; i < full.size(); ++i) EXPECT_NEAR(full[i], part[i], 1e-6 * std::abs(full[i])) << "step " << i + 1;
}

// The cost model prices what an expert-parallel member's arena holds at its peak, in the last MoE
// block's backward: the routing and expert activations (the arrived rows' buffers rounded up as
// the runtime rounds them) and the backward's buffers (the gradients of the experts' outputs and
// gathered inputs, the arrived gradients, their reordered copy and the experts' input
// gradients). The plan's arena memory per device is within 3% of the fullest member's peak.
TEST_F(MoeDistTest, PredictedMemoryOfAnExpertParallelRunMatchesItsArenaPeak) {
  EXPECT_NEAR(predicted_over_measured_peak(moe_plan({{1, 2, 0, {3}}}, 1, 2), "ep2-memory"), 1.0, 0.03);
}

// Under tensor parallelism every tp rank holds the router and the experts (routed and shared)
// whole and runs them on all of its replica's rows: the cost model prices them so, and the
// plan's arena memory per device is within 3% of the ranks' measured peak (+0.4%; pricing them
// split over tp, as the dense part is, put it 30.9% below).
TEST_F(MoeDistTest, PredictedMemoryOfATensorParallelRunCountsTheReplicatedExperts) {
  EXPECT_NEAR(predicted_over_measured_peak(moe_plan({{2, 1, 0, {3}}}, 1, 1), "tp2-memory"), 1.0, 0.03);
}

TEST_F(MoeDistTest, UnsupportedCombinationsAreRefusedBeforeTheFirstStepNamingTheField) {
  const std::vector<std::pair<Plan, std::string>> cases = {
      {with_uneven_replicas(moe_plan({{1, 2, 0, {3}}}, 2, 2), 0, {2, 2}, {2, 1}), "stages[0].replicas"},
      {moe_plan({{1, 2, 0, {3}}}, 2, 2, {2, 1}), "experts_per_member"},  // 3 of 4 experts
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    CommandResult r = run_command(train_command(cases[i].first, fmt::format("refused-{}", i), 2, ""), 120);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(cases[i].second), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("step 1"), std::string::npos) << r.output;
  }
  // ep 4 does not divide six experts.
  std::string yaml = read_text(tiny_moe_path());
  yaml.replace(yaml.find("experts: 4"), 10, "experts: 6");
  model_path_ = dir_->write("moe-6.yaml", yaml);
  CommandResult r = run_command(train_command(moe_plan({{1, 4, 0, {3}}}, 2, 4), "refused-ep", 2, ""), 120);
  model_path_ = tiny_moe_path();
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("stages[0].ep"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace alloy::testing
