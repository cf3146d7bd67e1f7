// `alloy plan`, `explain`, `simulate` and `report` as a user runs them: every shipped cluster
// plans, simulates and reports; bad requests and hand-broken plans end in clear errors.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"
#include "spec/cluster.hpp"

namespace alloy {
namespace {

using testing::CommandResult;
using testing::run_command;
using testing::TempDir;

using testing::alloy;

const std::string kPretrain = std::string(ALLOY_SOURCE_DIR) + "/examples/train/llama-pretrain.yaml";

// A model that suits the cluster: LLaMA-2-7B for GPU clusters, a small GPT for CPU ranks.
std::string model_for(const std::string& cluster) {
  return cluster.rfind("local-cpu", 0) == 0 ? "small-gpt" : "llama-2-7b";
}

std::string train_for(const TempDir& dir, const std::string& cluster) {
  if (cluster.rfind("local-cpu", 0) == 0) return dir.write("cpu.yaml", "seq_len: 128\nglobal_batch: 16\nprecision: fp32\n");
  return kPretrain;
}

TEST(PlanCli, EveryShippedClusterPlansSimulatesAndReports) {
  TempDir dir;
  for (const auto& cluster : cluster_preset_names()) {
    std::string plan = dir.path() + "/" + cluster + ".json";
    CommandResult planned =
        alloy("plan --model " + model_for(cluster) + " --cluster " + cluster + " --train " + train_for(dir, cluster) + " -o " + plan);
    ASSERT_EQ(planned.exit_code, 0) << cluster << "\n" << planned.output;
    EXPECT_NE(planned.output.find("tokens/s"), std::string::npos) << planned.output;
    EXPECT_NE(planned.output.find("Runner-ups"), std::string::npos) << cluster << "\n" << planned.output;

    CommandResult explained = alloy("explain " + plan);
    EXPECT_EQ(explained.exit_code, 0) << explained.output;
    EXPECT_NE(explained.output.find("total on device"), std::string::npos) << explained.output;

    std::string trace = dir.path() + "/" + cluster + ".trace.json";
    CommandResult simulated = alloy("simulate --plan " + plan + " --trace " + trace);
    ASSERT_EQ(simulated.exit_code, 0) << cluster << "\n" << simulated.output;
    nlohmann::json events = nlohmann::json::parse(testing::read_text(trace));
    EXPECT_GT(events["traceEvents"].size(), 10u) << cluster;

    std::string html = dir.path() + "/" + cluster + ".html";
    CommandResult reported = alloy("report " + plan + " -o " + html);
    ASSERT_EQ(reported.exit_code, 0) << reported.output;
    EXPECT_NE(testing::read_text(html).find("<svg"), std::string::npos) << cluster;
  }
}

TEST(PlanCli, PinnedLayoutIsEvaluated) {
  CommandResult r = alloy("plan --model llama-2-7b --cluster a100-8 --train " + kPretrain +
                          " --tp 2 --pp 2 --dp 2 --schedule 1f1b --micro-batch 4 --zero 1 --recompute full --no-offload");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("1f1b"), std::string::npos) << r.output;
}

struct BadRequest {
  const char* name;
  std::string args;
  const char* expect;
};

TEST(PlanCli, BadRequestsExitTwo) {
  const BadRequest cases[] = {
      {"unknown objective", "--model llama-2-7b --cluster a100-8 --objective speed", "objective"},
      {"fits nothing", "--model llama-2-70b --cluster local-cpu-2", "memory"},
      {"batch not divisible", "--model llama-2-7b --cluster a100-8 --global-batch 10 --micro-batch 3", "batch"},
      {"unknown schedule", "--model llama-2-7b --cluster a100-8 --schedule zigzag", "schedule"},
      {"bad layer split", "--model llama-2-7b --cluster a100-8 --layer-split 10,x", "layer-split"},
      {"more chunks than layers", "--model llama-2-7b --cluster a100-8 --pp 8 --schedule interleaved --chunks 5",
       "a layer per chunk"},
  };
  for (const auto& c : cases) {
    CommandResult r = alloy("plan " + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.name << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.name << "\n" << r.output;
    EXPECT_NE(r.output.find("fix:"), std::string::npos) << c.name << "\n" << r.output;
  }
}

class BrokenPlans : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.path() + "/plan.json";
    CommandResult r = alloy("plan --model llama-2-7b --cluster a100-v100 --train " + kPretrain + " -o " + path_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    plan_ = nlohmann::json::parse(testing::read_text(path_));
  }
  // Writes an edited copy of the plan and runs `simulate` on it.
  CommandResult simulate_edited(const nlohmann::json& plan, const std::string& extra = "") {
    std::string edited = dir_.write("edited.json", plan.dump(2));
    return alloy("simulate --plan " + edited + " " + extra);
  }
  TempDir dir_;
  std::string path_;
  nlohmann::json plan_;
};

TEST_F(BrokenPlans, PlanForAnotherModelOrCluster) {
  CommandResult model = simulate_edited(plan_, "--model llama-2-13b");
  EXPECT_EQ(model.exit_code, 2) << model.output;
  EXPECT_NE(model.output.find("model"), std::string::npos) << model.output;
  CommandResult cluster = simulate_edited(plan_, "--cluster h100-a100-l4");
  EXPECT_EQ(cluster.exit_code, 2) << cluster.output;
  EXPECT_NE(cluster.output.find("cluster"), std::string::npos) << cluster.output;
}

TEST_F(BrokenPlans, LayerMissing) {
  nlohmann::json plan = plan_;
  plan["stages"][0]["chunks"][0][1] = plan["stages"][0]["chunks"][0][1].get<int>() - 1;
  CommandResult r = simulate_edited(plan);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("stages[0]"), std::string::npos) << r.output;
}

// A chunk of no layers is named, whatever the stage's other chunks hold.
TEST_F(BrokenPlans, EmptyChunk) {
  nlohmann::json plan = plan_;
  const int last = static_cast<int>(plan["stages"].size()) - 1;
  nlohmann::json& chunk = plan["stages"][last]["chunks"][0];
  chunk[1] = chunk[0].get<int>();
  CommandResult r = simulate_edited(plan);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(fmt::format("stages[{}].chunks[0]", last)), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("empty layer range"), std::string::npos) << r.output;
}

TEST_F(BrokenPlans, DeviceUsedTwice) {
  nlohmann::json plan = plan_;
  plan["stages"][1]["device_ids"][0] = plan["stages"][0]["device_ids"][0];
  CommandResult r = simulate_edited(plan);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("device"), std::string::npos) << r.output;
}

TEST_F(BrokenPlans, HandEditedPlanOverMemory) {
  // No recomputation and micro-batches eight times as large: the activations no longer fit,
  // whatever the file's stale predictions say.
  constexpr int kGrowth = 8;
  nlohmann::json plan = plan_;
  ASSERT_EQ(plan["num_micro_batches"].get<int>() % kGrowth, 0);
  for (auto& stage : plan["stages"]) {
    for (auto& level : stage["recompute"]) level = "none";
    // Under uneven data parallelism every replica's share grows too.
    if (stage.contains("replicas"))
      for (auto& replica : stage["replicas"]) replica["sequences"] = replica["sequences"].get<int>() * kGrowth;
  }
  plan["micro_batch_sequences"] = plan["micro_batch_sequences"].get<int>() * kGrowth;
  plan["num_micro_batches"] = plan["num_micro_batches"].get<int>() / kGrowth;
  CommandResult r = simulate_edited(plan);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("memory"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stages["), std::string::npos) << r.output;
}

// A plan written by hand carries no predictions: `explain` prices it with the cost model, or
// says it is unpriced and why, and never prints the missing predictions as zeros.
TEST(PlanCli, ExplainPricesAHandWrittenPlanOrSaysItIsUnpriced) {
  TempDir dir;
  const std::string planned = dir.path() + "/planned.json";
  const std::string train = dir.write("cpu.yaml", "seq_len: 64\nglobal_batch: 8\nprecision: fp32\n");
  CommandResult r = alloy("plan --model tiny-llama --cluster local-cpu-2 --no-simulate --train " + train + " -o " + planned);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json plan = nlohmann::json::parse(testing::read_text(planned));
  ASSERT_TRUE(plan.contains("inputs")) << "alloy plan -o keeps what the plan was made for";
  plan.erase("predicted");
  plan.erase("inputs");  // a plan written by hand carries neither
  for (auto& stage : plan["stages"]) stage.erase("predicted");
  const std::string by_hand = dir.write("by-hand.json", plan.dump(2));

  CommandResult priced = alloy("explain " + by_hand);
  EXPECT_EQ(priced.exit_code, 0) << priced.output;
  EXPECT_NE(priced.output.find("priced by the cost model"), std::string::npos) << priced.output;
  EXPECT_EQ(priced.output.find("step 0.000 s"), std::string::npos) << priced.output;
  EXPECT_EQ(priced.output.find(" 0 tokens/s"), std::string::npos) << priced.output;
  EXPECT_NE(priced.output.find("total on device"), std::string::npos) << priced.output;

  plan["model"]["name"] = "my-own-model";
  const std::string renamed = dir.write("renamed.json", plan.dump(2));
  CommandResult unpriced = alloy("explain " + renamed);
  EXPECT_EQ(unpriced.exit_code, 0) << unpriced.output;
  EXPECT_NE(unpriced.output.find("unpriced: the plan file carries no predictions"), std::string::npos) << unpriced.output;
  EXPECT_NE(unpriced.output.find("'my-own-model'"), std::string::npos) << unpriced.output;
  EXPECT_NE(unpriced.output.find("--model"), std::string::npos) << unpriced.output;
  EXPECT_EQ(unpriced.output.find("fwd ms"), std::string::npos) << unpriced.output;
  EXPECT_EQ(unpriced.output.find("0.00"), std::string::npos) << unpriced.output;

  CommandResult named = alloy("explain " + renamed + " --model tiny-llama");
  EXPECT_EQ(named.exit_code, 0) << named.output;
  EXPECT_NE(named.output.find("priced by the cost model"), std::string::npos) << named.output;

  CommandResult other = alloy("explain " + renamed + " --model tiny-gpt");
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_NE(other.output.find("--model tiny-gpt is not the model the plan was made for ('my-own-model': the "
                              "architectures differ)"),
            std::string::npos)
      << other.output;
}

}  // namespace
}  // namespace alloy
