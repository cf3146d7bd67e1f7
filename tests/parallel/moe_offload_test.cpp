// Mixture-of-Experts blocks offloaded to host memory under expert parallelism: each member's
// routed experts of an offloaded block (its share, laid out after the shard's other tensors) live
// in host memory with the rest of the block, come to the device through the offload window and
// have their gradients reduced there over the expert-data-parallel group. Losses and final weights
// must match the one-rank run of the same micro-batches, and the cost model's arena memory the
// measured peak.
#include <gtest/gtest.h>

#include "moe_dist_fixture.hpp"

namespace alloy::testing {
namespace {

class MoeOffloadTest : public MoeDistFixture {
 protected:
  // `plan` with `blocks` (per block of stage `stage`) offloaded, fetched one use ahead.
  static Plan offloading_weights(Plan plan, const std::vector<bool>& blocks, int stage = 0) {
    PlanStage& st = plan.stages[static_cast<size_t>(stage)];
    st.offload = blocks;
    st.offload_prefetch_depth = 1;
    return plan;
  }
};

// Both MoE blocks (1 and 2) in host memory, dp 2 = ep 2: each member's two experts are its own.
// ZeRO 0 sums the experts' gradients over expert-dp at the optimizer (a group of one here);
// ZeRO 1 reduce-scatters the dense parts over dp, a place at a time.
TEST_F(MoeOffloadTest, OffloadedBlocksWithExpertParallelismOnTwoRanksMatchOneRank) {
  const std::vector<bool> moe_blocks = {false, true, true};
  expect_matches_one_rank(offloading_weights(moe_plan({{1, 2, 0, {3}}}, 2, 2), moe_blocks), "dp2-ep2-offload");
  expect_matches_one_rank(offloading_weights(moe_plan({{1, 2, 1, {3}}}, 2, 2), {false, false, true}), "dp2-ep2-zero1-offload");
}

// dp 4, ep 2: the two members holding the same experts sum their gradients in host memory (ZeRO
// 0 at the optimizer; ZeRO 2 in the experts' own buckets, each member updating its piece there;
// ZeRO 3 gathers the resident block only). Uneven experts (3 + 1) give the members slots of
// different sizes.
TEST_F(MoeOffloadTest, OffloadedBlocksWithExpertParallelismOnFourRanksMatchOneRank) {
  const std::vector<bool> moe_blocks = {false, true, true};
  expect_matches_one_rank(offloading_weights(moe_plan({{1, 4, 0, {3}}}, 2, 2), moe_blocks), "dp4-ep2-offload");
  expect_matches_one_rank(offloading_weights(moe_plan({{1, 4, 2, {3}}}, 2, 2), moe_blocks), "dp4-ep2-zero2-offload");
  expect_matches_one_rank(offloading_weights(moe_plan({{1, 4, 3, {3}}}, 2, 2), {false, true, false}), "dp4-ep2-zero3-offload");
  expect_matches_one_rank(offloading_weights(moe_plan({{1, 4, 1, {3}}}, 2, 2, {3, 1}), moe_blocks),
                          "dp4-ep2-zero1-offload-experts-3-1");
}

// Two stages of dp 2 and ep 2, each offloading its MoE block, with 4 micro-batches in 1F1B.
TEST_F(MoeOffloadTest, OffloadedBlocksOverTwoStagesWithExpertParallelismMatchOneRank) {
  Plan plan = offloading_weights(moe_plan({{1, 2, 1, {2}}, {1, 2, 1, {1}}}, 4, 2), {false, true});
  expect_matches_one_rank(offloading_weights(plan, {true}, 1), "pp2-dp2-ep2-offload");
}

// The window holds a whole block with this member's experts: the cost model prices it with the
// member's share of the experts, as the device arena's peak shows.
TEST_F(MoeOffloadTest, PredictedMemoryOfOffloadedBlocksWithExpertParallelismMatchesItsArenaPeak) {
  EXPECT_NEAR(predicted_over_measured_peak(offloading_weights(moe_plan({{1, 2, 0, {3}}}, 1, 2), {false, true, true}),
                                           "dp2-ep2-offload-memory"),
              1.0, 0.03);
  EXPECT_NEAR(predicted_over_measured_peak(offloading_weights(moe_plan({{1, 4, 2, {3}}}, 1, 2), {false, true, false}),
                                           "dp4-ep2-zero2-offload-memory"),
              1.0, 0.03);
}

}  // namespace
}  // namespace alloy::testing
