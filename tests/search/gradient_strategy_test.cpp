// The planner's gradient strategy under ZeRO 2-3 (a per-stage search dimension): sharded where
// memory is tight, accumulated in full where memory is ample and sharding would cost time, the
// plan's notes saying why, and pins it cannot apply refused or noted.
#include <gtest/gtest.h>

#include <algorithm>

#include <fmt/format.h>

#include "../support/specs.hpp"
#include "hw/catalog.hpp"
#include "search/explain.hpp"
#include "search/planner.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy {
namespace {

ClusterSpec example_cluster(const std::string& name) {
  return cluster_load(std::string(ALLOY_SOURCE_DIR) + "/examples/clusters/" + name + ".yaml", catalog_builtin());
}

bool has_note(const Plan& plan, const std::string& text) {
  return std::any_of(plan.notes.begin(), plan.notes.end(),
                     [&](const std::string& n) { return n.find(text) != std::string::npos; });
}

int recomputed_blocks(const Plan& plan) {
  int n = 0;
  for (const PlanStage& st : plan.stages)
    n += static_cast<int>(std::count_if(st.recompute.begin(), st.recompute.end(),
                                        [](Recompute r) { return r != Recompute::Recompute_none; }));
  return n;
}

// LLaMA-2-7B on 8 A100s capped at 36 GB, 16 sequences of 2048 (examples/clusters/a100-36gb-8.yaml):
// accumulated in full, the gradients alone take 12.5 GiB of a device at tp 2.
TEST(GradientStrategy, ShardsWhenMemoryIsTight) {
  const ClusterSpec cluster = example_cluster("a100-36gb-8");
  CostModel cost(testing::llama2_7b(), cluster, testing::train(2048, 16));
  SearchOptions o;
  o.tp = 2;
  o.dp = 4;
  o.pp = 1;
  o.zero = 3;
  o.num_micro_batches = 2;
  o.allow_uneven_dp = false;
  const Plan sharded = plan_search(cost, o).plan;
  ASSERT_EQ(sharded.stages.size(), 1u);
  EXPECT_TRUE(sharded.stages[0].gradients_sharded());
  EXPECT_EQ(recomputed_blocks(sharded), 0);
  EXPECT_TRUE(has_note(sharded, "stage 0 shards gradients")) << plan_render_text(sharded);
  // Pinned in full, the same layout needs recomputation to fit, and is slower.
  o.shard_gradients = false;
  const Plan full = plan_search(cost, o).plan;
  EXPECT_FALSE(full.stages[0].gradients_sharded());
  EXPECT_GT(recomputed_blocks(full), 0);
  EXPECT_GT(full.step_seconds, sharded.step_seconds);
  EXPECT_LE(plan_memory_ratio(sharded), 1.0);
}

// small-gpt on four CPU ranks with ample memory: each extra reduce-scatter costs its whole time
// on CPU ranks, so with several micro-batches the planner accumulates in full.
TEST(GradientStrategy, AccumulatesInFullWhenMemoryIsAmpleAndShardingCostsTime) {
  const ClusterSpec cluster = example_cluster("local-cpu-4");
  CostModel cost(model_load("small-gpt"), cluster, testing::train(64, 16, Precision::Precision_fp32));
  SearchOptions o;
  o.dp = 4;
  o.pp = 1;
  o.zero = 2;
  o.num_micro_batches = 4;
  const Plan plan = plan_search(cost, o).plan;
  ASSERT_EQ(plan.stages.size(), 1u);
  EXPECT_EQ(plan.stages[0].zero, 2);
  EXPECT_FALSE(plan.stages[0].gradients_sharded());
  EXPECT_TRUE(has_note(plan, "stage 0 accumulates gradients in full: sharding would hold")) << plan_render_text(plan);
  EXPECT_TRUE(has_note(plan, "ms of reduce-scatter per step, and memory fits")) << plan_render_text(plan);
  // With one micro-batch both cost the same, and small-gpt's gradients are one bucket: sharding
  // would hold that bucket beside the shard, more than the full buffer, so the tie stays full.
  o.num_micro_batches = 1;
  const Plan one = plan_search(cost, o).plan;
  EXPECT_FALSE(one.stages[0].gradients_sharded());
  EXPECT_TRUE(has_note(one, "GiB more per device at no extra time")) << plan_render_text(one);
}

// LLaMA-2-7B pre-training on the shipped A100 + V100 cluster, 64 micro-batches a step, the
// reduce-scatters sending bf16: on the A100s sharding adds a few hundred ms to a 42 s step,
// under 1% of their compute, so they shard and each holds its shard and a part or two instead
// of all its stage's gradients (16.6 GiB less). A stage where the reduce-scatters would cost
// more than 1% keeps the full buffer and says so, with the time it saves.
TEST(GradientStrategy, ShardsWhenAccumulatingSavesUnderOnePercent) {
  TrainSpec train = train_load(std::string(ALLOY_SOURCE_DIR) + "/examples/train/llama-pretrain.yaml");
  train.gradient_communication = Precision::Precision_bf16;
  CostModel cost(testing::llama2_7b(), example_cluster("a100-v100"), train);
  const Plan plan = plan_search(cost, {}).plan;
  int sharded = 0;
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    const PlanStage& st = plan.stages[i];
    ASSERT_GE(st.zero, 2) << plan_render_text(plan);
    ASSERT_GE(st.dp, 8);
    if (!st.gradients_sharded()) {
      EXPECT_TRUE(has_note(plan, fmt::format("stage {} accumulates gradients in full: sharding would hold", i)))
          << plan_render_text(plan);
      continue;
    }
    ++sharded;
    for (const MemoryTerm& t : st.memory) {
      if (t.name == "gradients") {
        EXPECT_LE(t.bytes, 2.0 * kGiB) << st.device_type;
      }
    }
  }
  EXPECT_GE(sharded, 1) << plan_render_text(plan);
  // Accumulating in full is faster by less than 1%.
  SearchOptions full_pin;
  full_pin.shard_gradients = false;
  const Plan full = plan_search(cost, full_pin).plan;
  EXPECT_LE(full.step_seconds, plan.step_seconds);
  EXPECT_LT(plan.step_seconds, 1.01 * full.step_seconds);
}

TEST(GradientStrategy, OneMicroBatchShardsWhereThatHoldsLess) {
  // LLaMA-2-7B over 8 A100s: 32 buckets, the shard and two of them hold far less than the
  // full buffer, for the same single reduce-scatter.
  CostModel cost(testing::llama2_7b(), example_cluster("a100-8"), testing::train(2048, 16));
  SearchOptions o;
  o.dp = 8;
  o.pp = 1;
  o.zero = 2;
  o.num_micro_batches = 1;
  const Plan plan = plan_search(cost, o).plan;
  EXPECT_TRUE(plan.stages[0].gradients_sharded());
  EXPECT_TRUE(has_note(plan, "GiB less per device at no extra time")) << plan_render_text(plan);
}

TEST(GradientStrategy, NotesPriceTheOtherStrategy) {
  const ClusterSpec cluster = example_cluster("local-cpu-4");
  CostModel cost(model_load("small-gpt"), cluster, testing::train(64, 16, Precision::Precision_fp32));
  SearchOptions o;
  o.dp = 4;
  o.pp = 1;
  o.zero = 2;
  o.num_micro_batches = 4;
  o.shard_gradients = true;
  const Plan sharded = plan_search(cost, o).plan;
  ASSERT_TRUE(sharded.stages[0].gradients_sharded());
  o.shard_gradients = false;
  const Plan full = plan_search(cost, o).plan;
  ASSERT_FALSE(full.stages[0].gradients_sharded());
  const double ms = (sharded.stages[0].gradient_sync_seconds - full.stages[0].gradient_sync_seconds) * 1e3;
  ASSERT_GT(ms, 0.05);
  const std::vector<std::string> notes = gradient_strategy_notes(sharded, cost);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find(fmt::format("for +{:.1f} ms of reduce-scatter per step", ms)), std::string::npos) << notes[0];
}

TEST(GradientStrategy, ZeroPinWithOneReplicaIsRefused) {
  CostModel one_device(model_load("gpt2"), example_cluster("h200-1"), testing::train(1024, 8));
  SearchOptions o;
  o.zero = 3;
  try {
    plan_search(one_device, o);
    FAIL() << "ZeRO 3 on one device";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("nothing to shard"), std::string::npos) << e.message();
    EXPECT_EQ(e.where().field, "--zero");
    EXPECT_NE(e.hint().find("drop --zero"), std::string::npos);
  }
  CostModel eight(testing::llama2_7b(), example_cluster("a100-8"), testing::train(2048, 16));
  o.dp = 1;
  EXPECT_THROW(plan_search(eight, o), Error);
  o = {};
  o.zero = 1;
  o.shard_gradients = true;
  EXPECT_THROW(plan_search(eight, o), Error) << "ZeRO 1 keeps gradients whole";
}

TEST(GradientStrategy, ZeroPinOnAStageOfOneReplicaIsNoted) {
  // Three devices of three types in two stages: a stage holds one type, so one replica each.
  // Other layouts could shard (uneven data parallelism over all three), so this is the planner's
  // choice, and the plan says what it did instead.
  CostModel cost(model_load("small-gpt"), example_cluster("local-cpu-3"), testing::train(64, 8, Precision::Precision_fp32));
  SearchOptions o;
  o.zero = 3;
  o.pp = 2;
  const Plan plan = plan_search(cost, o).plan;
  ASSERT_EQ(plan.stages.size(), 2u);
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    EXPECT_EQ(plan.stages[s].dp, 1);
    EXPECT_EQ(plan.stages[s].zero, 0);
    EXPECT_TRUE(has_note(plan, fmt::format("--zero 3 not applied to stage {}", s))) << plan_render_text(plan);
  }
  // Three stages leave no layout with two replicas: refused.
  o.pp = 3;
  EXPECT_THROW(plan_search(cost, o), Error);
}

}  // namespace
}  // namespace alloy
