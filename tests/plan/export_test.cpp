// Exports to Megatron-LM and DeepSpeed: uniform plans come out exactly; what a heterogeneous
// plan needs beyond them is listed, never silently dropped.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "hw/catalog.hpp"
#include "plan/export.hpp"
#include "search/planner.hpp"

namespace alloy {
namespace {

struct ExportCase {
  ModelSpec model = model_load("llama-2-7b");
  ClusterSpec cluster;
  TrainSpec train;
  explicit ExportCase(const std::string& cluster_name) : cluster(cluster_load(cluster_name, catalog_builtin())) {
    train.seq_len = 2048;
    train.global_batch_sequences = 64;
  }
  Plan search(const SearchOptions& options) const { return plan_search(CostModel(model, cluster, train), options).plan; }
};

TEST(PlanExport, UniformPlanIsExactInMegatron) {
  ExportCase s("a100-8");
  SearchOptions o;
  o.tp = 2;
  o.pp = 2;
  o.dp = 2;
  o.zero = 1;
  o.schedule = Schedule::Schedule_1f1b;
  o.recompute = Recompute::Recompute_full;
  o.allow_offload = false;
  o.layer_split = {16, 16};
  Plan plan = s.search(o);
  PlanExport e = plan_export_megatron(plan, s.model, s.train);
  EXPECT_TRUE(e.exact()) << plan_export_render(e, "megatron");
  for (const char* arg : {"--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 2",
                          "--use-distributed-optimizer", "--recompute-granularity full", "--global-batch-size 64",
                          "--swiglu", "--normalization RMSNorm"}) {
    EXPECT_NE(e.text.find(arg), std::string::npos) << arg << "\n" << e.text;
  }
  // Megatron's micro-batch is per replica.
  EXPECT_NE(e.text.find(fmt::format("--micro-batch-size {}", plan.micro_batch_sequences / 2)), std::string::npos) << e.text;
}

TEST(PlanExport, UnevenFirstAndLastStagesUseMegatronFlags) {
  ExportCase s("a100-8");
  SearchOptions o;
  o.pp = 4;
  o.tp = 1;
  o.dp = 2;
  o.schedule = Schedule::Schedule_1f1b;
  o.layer_split = {7, 8, 8, 9};
  o.allow_offload = false;
  Plan plan = s.search(o);
  PlanExport e = plan_export_megatron(plan, s.model, s.train);
  EXPECT_NE(e.text.find("--decoder-first-pipeline-num-layers 7"), std::string::npos) << e.text;
  EXPECT_NE(e.text.find("--decoder-last-pipeline-num-layers 9"), std::string::npos) << e.text;
}

// 32 layers on 4 stages of 8 in 3 chunks: 3, 3 and 2 layers, which Megatron's one
// layers-per-chunk flag cannot express.
TEST(PlanExport, UnequalChunksAreListedAsUnsupported) {
  ExportCase s("a100-8");
  SearchOptions o;
  o.pp = 4;
  o.tp = 1;
  o.dp = 2;
  o.schedule = Schedule::Schedule_interleaved;
  o.virtual_chunks = 3;
  o.num_micro_batches = 8;
  o.layer_split = {8, 8, 8, 8};
  o.allow_offload = false;
  const Plan plan = s.search(o);
  ASSERT_EQ(plan.stages[0].chunks[2].size(), 2);
  const PlanExport e = plan_export_megatron(plan, s.model, s.train);
  EXPECT_FALSE(e.exact());
  EXPECT_NE(plan_export_render(e, "megatron").find("unequal layer counts"), std::string::npos)
      << plan_export_render(e, "megatron");
  EXPECT_NE(e.text.find("--num-layers-per-virtual-pipeline-stage 3"), std::string::npos) << e.text;
}

TEST(PlanExport, HeterogeneousPlanListsWhatCannotBeExpressed) {
  ExportCase s("a100-v100");
  s.train.global_batch_sequences = 256;
  // Stages of different device types (uneven replicas over both types are another case).
  SearchOptions o;
  o.allow_uneven_dp = false;
  Plan plan = s.search(o);
  for (const PlanExport& e : {plan_export_megatron(plan, s.model, s.train), plan_export_deepspeed(plan, s.model, s.train)}) {
    EXPECT_FALSE(e.exact());
    bool mentions_types = false;
    for (const auto& u : e.unsupported) mentions_types |= u.find("device types") != std::string::npos;
    EXPECT_TRUE(mentions_types) << plan_export_render(e, "target");
  }
}

TEST(PlanExport, DeepSpeedBatchArithmeticHolds) {
  ExportCase s("a100-8");
  SearchOptions o;
  o.pp = 1;
  o.tp = 1;
  o.zero = 2;
  o.recompute = Recompute::Recompute_full;  // DeepSpeed checkpoints whole blocks only
  o.allow_offload = false;
  Plan plan = s.search(o);
  PlanExport e = plan_export_deepspeed(plan, s.model, s.train);
  nlohmann::json config = nlohmann::json::parse(e.text);
  const int dp = plan.stages[0].dp;
  EXPECT_EQ(config["train_batch_size"].get<int64_t>(), 64);
  EXPECT_EQ(config["train_micro_batch_size_per_gpu"].get<int64_t>() * config["gradient_accumulation_steps"].get<int64_t>() * dp,
            64);
  EXPECT_EQ(config["zero_optimization"]["stage"].get<int>(), 2);
  EXPECT_TRUE(e.exact()) << plan_export_render(e, "deepspeed");
}

}  // namespace
}  // namespace alloy
