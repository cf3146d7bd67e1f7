// Mixture-of-Experts training where the expert weights are made to fit: ZeRO 3 (the routed
// experts a member owns sharded over their expert-dp group, the rest over dp), sharded gradients
// under expert parallelism (the experts' buckets reduce-scattered over expert-dp, the others over
// dp) and MoE blocks offloaded to host memory. Losses and final weights must match the one-rank
// run of the same micro-batches; the cost model's arena memory must match the measured peak
// (moe_offload_test.cpp: weight offload under expert parallelism).
#include <gtest/gtest.h>

#include "moe_dist_fixture.hpp"

namespace alloy::testing {
namespace {

class MoeZero3Test : public MoeDistFixture {
 protected:
  // `plan` with `blocks` (per block of stage 0) offloaded, fetched one use ahead.
  static Plan offloading(Plan plan, const std::vector<bool>& blocks, bool activations = false) {
    PlanStage& st = plan.stages[0];
    (activations ? st.offload_activations : st.offload) = blocks;
    st.offload_prefetch_depth = 1;
    return plan;
  }
  static Plan sharding_gradients(Plan plan) {
    for (PlanStage& st : plan.stages) st.shard_gradients = true;
    return plan;
  }
};

TEST_F(MoeZero3Test, Zero3WithoutExpertParallelismMatchesOneRank) {
  expect_matches_one_rank(moe_plan({{1, 2, 3, {3}}}, 2, 1), "dp2-zero3");
  expect_matches_one_rank(moe_plan({{1, 4, 3, {3}}}, 2, 1), "dp4-zero3");
}

TEST_F(MoeZero3Test, Zero3WithExpertParallelismMatchesOneRank) {
  // dp 2 = ep 2: each member's experts are its own (expert-dp of one); dp 4, ep 2: each member's
  // experts are sharded over the two members that hold them.
  expect_matches_one_rank(moe_plan({{1, 2, 3, {3}}}, 2, 2), "dp2-ep2-zero3");
  expect_matches_one_rank(moe_plan({{1, 4, 3, {3}}}, 2, 2), "dp4-ep2-zero3");
  expect_matches_one_rank(moe_plan({{1, 4, 3, {3}}}, 2, 2, {3, 1}), "dp4-ep2-zero3-experts-3-1");
  expect_matches_one_rank(moe_plan({{1, 2, 3, {2}}, {1, 2, 3, {1}}}, 4, 2), "pp2-dp2-ep2-zero3");
}

TEST_F(MoeZero3Test, ShardedGradientsWithExpertParallelismMatchOneRank) {
  expect_matches_one_rank(sharding_gradients(moe_plan({{1, 2, 2, {3}}}, 2, 2)), "dp2-ep2-zero2-sharded");
  expect_matches_one_rank(sharding_gradients(moe_plan({{1, 4, 2, {3}}}, 2, 2)), "dp4-ep2-zero2-sharded");
  expect_matches_one_rank(sharding_gradients(moe_plan({{1, 4, 3, {3}}}, 2, 2)), "dp4-ep2-zero3-sharded");
  expect_matches_one_rank(sharding_gradients(moe_plan({{1, 2, 2, {2}}, {1, 2, 2, {1}}}, 4, 2)), "pp2-dp2-ep2-zero2-sharded");
}

// Each member's pieces of the dense weights and of its experts, with their moments, are saved and
// loaded as they were: the resumed run goes on exactly as the uninterrupted one.
TEST_F(MoeZero3Test, Zero3WithExpertParallelismResumesExactly) {
  const Plan plan = sharding_gradients(moe_plan({{1, 4, 3, {3}}}, 2, 2));
  const std::string ck = dir_->path() + "/zero3-ep-ck";
  const std::string full_log = dir_->path() + "/zero3-ep-full.jsonl", part_log = dir_->path() + "/zero3-ep-part.jsonl";
  ASSERT_EQ(run_command(train_command(plan, "zero3-ep-full", 6, "--log " + full_log), 120).exit_code, 0);
  ASSERT_EQ(run_command(train_command(plan, "zero3-ep-part", 3, fmt::format("--checkpoint {} --log {}", ck, part_log)), 120)
                .exit_code,
            0);
  const CommandResult resumed =
      run_command(train_command(plan, "zero3-ep-part", 6, fmt::format("--checkpoint {} --resume --log {}", ck, part_log)), 120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::vector<double> full = losses(full_log), part = losses(part_log);
  ASSERT_EQ(full.size(), 6u);
  ASSERT_EQ(part.size(), 6u);
  for (size_t i = 0; i < full.size(); ++i) EXPECT_DOUBLE_EQ(full[i], part[i]) << "step " << i + 1;
}

TEST_F(MoeZero3Test, OffloadedMoeBlocksMatchOneRank) {
  // Both MoE blocks (1 and 2) in host memory: weights, gradients and moments, dense and experts.
  const std::vector<bool> moe_blocks = {false, true, true};
  expect_matches_one_rank(offloading(moe_plan({{1, 1, 0, {3}}}, 2, 1), moe_blocks), "offload-moe");
  expect_matches_one_rank(offloading(moe_plan({{1, 2, 3, {3}}}, 2, 1), moe_blocks), "dp2-zero3-offload-moe");
  expect_matches_one_rank(offloading(moe_plan({{1, 2, 0, {3}}}, 2, 2), moe_blocks, true), "dp2-ep2-offload-activations");
}

// ZeRO 3 over dp 4 with ep 2: each member holds a quarter of the dense weights, half of its two
// experts, their moments and gradients, and gathers a block at a time (two in flight).
TEST_F(MoeZero3Test, PredictedMemoryOfZero3WithExpertParallelismMatchesItsArenaPeak) {
  EXPECT_NEAR(predicted_over_measured_peak(moe_plan({{1, 4, 3, {3}}}, 1, 2), "dp4-ep2-zero3-memory"), 1.0, 0.03);
  EXPECT_NEAR(predicted_over_measured_peak(sharding_gradients(moe_plan({{1, 4, 2, {3}}}, 1, 2)), "dp4-ep2-sharded-memory"),
              1.0, 0.03);
}

TEST_F(MoeZero3Test, PredictedMemoryOfOffloadedMoeBlocksMatchesItsArenaPeak) {
  EXPECT_NEAR(predicted_over_measured_peak(offloading(moe_plan({{1, 1, 0, {3}}}, 1, 1), {false, true, true}), "offload-memory"),
              1.0, 0.03);
}

}  // namespace
}  // namespace alloy::testing
