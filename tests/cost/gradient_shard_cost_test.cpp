// Cost model of ZeRO 2-3's two gradient strategies: sharded (reduce-scatter after every
// micro-batch, keep the member's shard and the parts in use) against accumulated in full
// (reduce-scatter once per step): memory, exposed sync and the bucket cut.
#include <algorithm>

#include <gtest/gtest.h>

#include "../support/specs.hpp"
#include "cost/cost_model.hpp"
#include "hw/catalog.hpp"
#include "spec/units.hpp"

namespace alloy {
namespace {

// One stage of every block of a model over `dp` replicas of one micro-batch sequence.
struct OneStage {
  CostModel cost;
  StageShape shape;
  StageUnitCosts unit;

  OneStage(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train, int dp)
      : cost(model, cluster, train) {
    std::vector<int> ids;
    for (int i = 0; i < dp; ++i) ids.push_back(i);
    shape = cost.stage_shape(ids, 1, dp, 1);
    unit = cost.unit_costs(shape, false);
  }

  StageChoice choice(int zero, bool shard, int micro_batches) const {
    StageChoice c;
    c.blocks = static_cast<int>(cost.model().num_layers);
    c.zero = zero;
    c.shard_gradients = shard;
    c.micro_batches = micro_batches;
    c.has_embedding = c.has_head = true;
    return c;
  }
  MemoryBreakdown memory(int zero, bool shard, int micro_batches = 8) const {
    return cost.stage_memory(shape, unit, choice(zero, shard, micro_batches), 1, false);
  }
  double sync_seconds(int zero, bool shard, int micro_batches) const {
    return cost.stage_gradient_sync_seconds(shape, unit, choice(zero, shard, micro_batches));
  }
};

OneStage llama_on_a100s(int dp = 8) {
  return OneStage(testing::llama2_7b(), testing::cluster("a100x8", {testing::a100_80()}, {{0, 1, 8}}),
                  testing::train(4096, 64), dp);
}

TEST(GradientShardCost, ShardedGradientsAreTheShardPlusTwoParts) {
  const OneStage s = llama_on_a100s();
  const ModelParameterCounts n = model_parameter_counts(s.cost.model());
  // bf16 with fp32 master weights: gradients in fp32. A LLaMA-2-7B block's fp32 gradients
  // (770 MiB) outgrow the 64 MiB bucket, so every bucket of the schedule is one block; the first
  // one cut (the last block with the final norm and the head) is the largest. The backward
  // writes them in parts of at most the bucket size (64 MiB of fp32): the shard plus two parts
  // (one filling, one on the network).
  const double params = static_cast<double>(n.total);
  const double largest = static_cast<double>(n.per_block + n.final_norm + n.lm_head);
  const StageBuckets buckets = s.cost.stage_gradient_buckets(s.shape, s.unit, s.choice(2, true, 8));
  EXPECT_EQ(buckets.count, 32);
  EXPECT_DOUBLE_EQ(buckets.largest_bytes, largest * 4);
  EXPECT_DOUBLE_EQ(buckets.last_bytes, static_cast<double>(n.per_block + n.embedding) * 4);
  const double part_bytes = 64 * kMiB;
  for (int zero : {2, 3}) {
    const MemoryBreakdown sharded = s.memory(zero, true), full = s.memory(zero, false);
    EXPECT_DOUBLE_EQ(full.gradients_bytes, params * 4) << "accumulated in full: every gradient, fp32";
    EXPECT_NEAR(sharded.gradients_bytes, params / 8 * 4 + 2 * part_bytes, 1e-6 * params);
    EXPECT_LT(sharded.gradients_bytes, full.gradients_bytes / 6);
    EXPECT_LT(sharded.total_bytes(), full.total_bytes());
    // Only gradients change.
    EXPECT_DOUBLE_EQ(sharded.total_bytes() - sharded.gradients_bytes - sharded.communication_buffers_bytes -
                         sharded.allocator_margin_bytes,
                     full.total_bytes() - full.gradients_bytes - full.communication_buffers_bytes -
                         full.allocator_margin_bytes);
  }
  // ZeRO 0-1 and a single replica have nothing to shard over: the flag changes nothing.
  EXPECT_DOUBLE_EQ(s.memory(1, true).gradients_bytes, s.memory(1, false).gradients_bytes);
  const OneStage alone = llama_on_a100s(1);
  EXPECT_DOUBLE_EQ(alone.memory(3, true).gradients_bytes, alone.memory(3, false).gradients_bytes);
}

TEST(GradientShardCost, ASmallStageHasOneLivePart) {
  // small-gpt's gradients fit one 64 MiB bucket, written as one part: the shard plus that part
  // (its tied table inside it, nothing live beside it).
  const OneStage s(model_load("small-gpt"), cluster_load("local-cpu-4", catalog_builtin()), testing::train(64, 8,
                   Precision::Precision_fp32), 4);
  const StageBuckets buckets = s.cost.stage_gradient_buckets(s.shape, s.unit, s.choice(2, true, 2));
  ASSERT_EQ(buckets.count, 1);
  const double params = s.memory(2, false).gradients_bytes / 4;
  EXPECT_NEAR(s.memory(2, true).gradients_bytes, (params / 4 + buckets.largest_bytes / 4) * 4, 1e-6 * params);
}

TEST(GradientShardCost, SmallerBucketsLowerTheShardedPeak) {
  TrainSpec train = testing::train(1024, 16);
  const ModelSpec model = testing::gpt2("gpt", 8, 1024, 16, 1000, 1024);
  const ClusterSpec cluster = testing::cluster("a100x8", {testing::a100_80()}, {{0, 1, 8}});
  train.gradient_bucket_mib = 256;
  const OneStage large(model, cluster, train, 8);
  train.gradient_bucket_mib = 16;
  const OneStage small(model, cluster, train, 8);
  EXPECT_LT(small.memory(2, true).gradients_bytes, large.memory(2, true).gradients_bytes);
  EXPECT_DOUBLE_EQ(small.memory(2, false).gradients_bytes, large.memory(2, false).gradients_bytes);
}

TEST(GradientShardCost, ShardingReducesEveryMicroBatchAndNeverCostsLess) {
  const OneStage s = llama_on_a100s();
  for (int zero : {2, 3})
    for (int m : {1, 2, 8, 32}) EXPECT_GE(s.sync_seconds(zero, true, m), s.sync_seconds(zero, false, m));
  // One micro-batch: both reduce once.
  EXPECT_DOUBLE_EQ(s.sync_seconds(2, true, 1), s.sync_seconds(2, false, 1));
  // Accumulating reduces once per step whatever the micro-batch count.
  EXPECT_DOUBLE_EQ(s.sync_seconds(3, false, 1), s.sync_seconds(3, false, 32));
}

TEST(GradientShardCost, CpuRanksPayEveryEarlierReduceScatterInFull) {
  // Collectives reduce on the cores that compute: each earlier micro-batch's reduce-scatter adds
  // its whole time; over a slow network on GPUs the part the next passes do not hide shows.
  const OneStage cpu(model_load("small-gpt"), cluster_load("local-cpu-4", catalog_builtin()),
                     testing::train(64, 8, Precision::Precision_fp32), 4);
  const double one = cpu.sync_seconds(2, true, 2) - cpu.sync_seconds(2, false, 2);
  EXPECT_GT(one, 0);
  EXPECT_NEAR(cpu.sync_seconds(2, true, 4) - cpu.sync_seconds(2, false, 4), 3 * one, 1e-12);
  EXPECT_NEAR(cpu.sync_seconds(3, true, 4) - cpu.sync_seconds(3, false, 4), 3 * one, 1e-12);
}

TEST(GradientShardCost, Bf16OnTheWireHalvesAnFp32ReduceScatterOnly) {
  // fp32 training on CPU ranks: the reduce-scatter's time is its bytes over the link, so sending
  // bf16 halves it (less the fixed latency); ZeRO 0-1 all-reduce the gradients as they are.
  TrainSpec train = testing::train(64, 8, Precision::Precision_fp32);
  const ClusterSpec cpus = cluster_load("local-cpu-4", catalog_builtin());
  const OneStage fp32(model_load("small-gpt"), cpus, train, 4);
  train.gradient_communication = Precision::Precision_bf16;
  const OneStage bf16(model_load("small-gpt"), cpus, train, 4);
  for (int zero : {2, 3})
    for (bool shard : {false, true}) {
      const double full = fp32.sync_seconds(zero, shard, 2), half = bf16.sync_seconds(zero, shard, 2);
      EXPECT_LT(half, full) << "zero " << zero;
      EXPECT_GT(half, 0.25 * full) << "zero " << zero;
    }
  for (int zero : {0, 1}) EXPECT_DOUBLE_EQ(bf16.sync_seconds(zero, false, 2), fp32.sync_seconds(zero, false, 2));
  // bf16 training beside fp32 master weights accumulates and reduces fp32 gradients: bf16 on
  // the wire halves them too. Without master weights they are bf16 already: nothing changes.
  const ClusterSpec a100s = testing::cluster("a100x8", {testing::a100_80()}, {{0, 1, 8}});
  TrainSpec mixed = testing::train(4096, 64);
  const OneStage a(testing::llama2_7b(), a100s, mixed, 8);
  mixed.gradient_communication = Precision::Precision_bf16;
  const OneStage b(testing::llama2_7b(), a100s, mixed, 8);
  EXPECT_LT(b.sync_seconds(2, true, 8), a.sync_seconds(2, true, 8));
  TrainSpec pure = testing::train(4096, 64);
  pure.master_weights_fp32 = false;
  const OneStage c(testing::llama2_7b(), a100s, pure, 8);
  pure.gradient_communication = Precision::Precision_bf16;
  const OneStage d(testing::llama2_7b(), a100s, pure, 8);
  EXPECT_DOUBLE_EQ(c.sync_seconds(2, true, 8), d.sync_seconds(2, true, 8));
}

TEST(GradientShardCost, TiedTableStaysWholeInTheShard) {
  // GPT-2's table tied between the first and last stage is synchronised whole: the first stage's
  // shard holds it whole, as its parameters and optimizer state do.
  const ModelSpec model = testing::gpt2("gpt", 4, 768, 12, 50257, 1024);
  const ClusterSpec cluster = testing::cluster("a100x8", {testing::a100_80()}, {{0, 1, 8}});
  const CostModel cost{model, cluster, testing::train(1024, 16)};
  const StageShape shape = cost.stage_shape({0, 1}, 1, 2, 1);
  const StageUnitCosts unit = cost.unit_costs(shape, false);
  StageChoice c;
  c.blocks = 2;
  c.has_embedding = true;
  c.zero = 2;
  c.micro_batches = 4;
  const double full = cost.stage_memory(shape, unit, c, 1, true).gradients_bytes;
  c.shard_gradients = true;
  const double sharded = cost.stage_memory(shape, unit, c, 1, true).gradients_bytes;
  const StageBuckets buckets = cost.stage_gradient_buckets(shape, unit, c);
  const double table = 50257.0 * 768 * 4;
  // Two parts live (A100s reduce beside compute): 16-bit bucket bytes written as fp32, capped at
  // the 64 MiB bucket size.
  const double live = 2.0 * std::min(buckets.largest_bytes / 2 * 4, 64 * kMiB);
  EXPECT_NEAR(sharded, (full - table) / 2 + table + live, 1e-6 * full);
}

}  // namespace
}  // namespace alloy
