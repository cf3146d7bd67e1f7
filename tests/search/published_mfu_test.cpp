// A predicted MFU above the best published for the devices is flagged in the plan's notes.
#include <gtest/gtest.h>

#include <algorithm>

#include "../support/specs.hpp"
#include "search/planner.hpp"

namespace alloy {
namespace {

// LLaMA-2-7B on one node of eight H100-like devices reaching `matmul_efficiency` of their
// peak, whose best published MFU is `best_mfu` (0: none known), at `precision`.
Plan plan_on_h100s(double matmul_efficiency, double best_mfu, Precision precision = Precision::Precision_bf16) {
  DeviceType h100 = testing::h100();
  h100.matmul_efficiency = matmul_efficiency;
  h100.best_published_mfu = best_mfu;
  const ClusterSpec cluster = testing::cluster("h100-node", {h100}, {{0, 1, 8}});
  SearchOptions o;
  o.runner_ups = 0;
  TrainSpec train = testing::train(2048, 16);
  train.precision = precision;
  return plan_search(CostModel(testing::llama2_7b(), cluster, train), o).plan;
}

bool warns_of_published_mfu(const Plan& plan) {
  return std::any_of(plan.notes.begin(), plan.notes.end(),
                     [](const std::string& n) { return n.find("above the best published") != std::string::npos; });
}

TEST(PublishedMfu, APredictionAboveTheBestPublishedIsFlagged) {
  const Plan optimistic = plan_on_h100s(0.95, 0.47);
  ASSERT_GT(optimistic.mfu, 0.47);
  ASSERT_TRUE(warns_of_published_mfu(optimistic));
  const auto note = std::find_if(optimistic.notes.begin(), optimistic.notes.end(), [](const std::string& n) {
    return n.find("above the best published") != std::string::npos;
  });
  EXPECT_NE(note->find("on h100 (47.0%"), std::string::npos) << *note;
  EXPECT_NE(note->find("alloy profile"), std::string::npos) << *note;
}

TEST(PublishedMfu, NoFlagBelowItOrWithoutAPublishedFigure) {
  const Plan modest = plan_on_h100s(0.30, 0.47);
  ASSERT_LT(modest.mfu, 0.47);
  EXPECT_FALSE(warns_of_published_mfu(modest));
  EXPECT_FALSE(warns_of_published_mfu(plan_on_h100s(0.95, 0)));
}

// The published figures are of 16-bit training: an fp32 run's MFU (against its fp32 peak) is
// not compared with them.
TEST(PublishedMfu, OnlySixteenBitRunsAreCompared) {
  const Plan fp32 = plan_on_h100s(0.95, 0.01, Precision::Precision_fp32);
  ASSERT_GT(fp32.mfu, 0.01);
  EXPECT_FALSE(warns_of_published_mfu(fp32));
}

}  // namespace
}  // namespace alloy
