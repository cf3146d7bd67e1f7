// `alloy plan` and `alloy explain` on ZeRO 2-3's gradient strategy: each stage says whether it
// shards its gradients or accumulates them in full and why; pins that cannot apply exit 2 or
// are noted in the plan.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"

namespace alloy {
namespace {

using testing::alloy;
using testing::CommandResult;
using testing::TempDir;

const std::string kExamples = std::string(ALLOY_SOURCE_DIR) + "/examples";

TEST(GradientCli, PinsThatCannotShardExitTwo) {
  const struct {
    const char* args;
    const char* expect;
  } cases[] = {
      {"--model gpt2 --cluster h200-1 --zero 3", "the cluster has one device"},
      {"--model gpt2 --cluster a100-8 --dp 1 --zero 2", "--dp 1 gives every stage one replica"},
      {"--model llama-2-7b --cluster a100-8 --tp 4 --pp 2 --zero 3", "leave every stage one replica"},
      {"--model gpt2 --cluster a100-8 --zero 1 --gradients shard", "--zero 1 keeps gradients whole"},
      {"--model gpt2 --cluster h200-1 --gradients full", "applies to ZeRO 2-3 over data-parallel replicas"},
      {"--model gpt2 --cluster a100-8 --gradients half", "--gradients"},
  };
  for (const auto& c : cases) {
    const CommandResult r = alloy(std::string("plan ") + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find("fix:"), std::string::npos) << c.args << "\n" << r.output;
  }
}

TEST(GradientCli, PinnedZeroOnAStageOfOneReplicaIsNoted) {
  TempDir dir;
  const std::string train = dir.write("cpu.yaml", "seq_len: 64\nglobal_batch: 8\nprecision: fp32\n");
  const CommandResult r = alloy("plan --model small-gpt --cluster local-cpu-3 --zero 3 --pp 2 --no-simulate --train " + train);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--zero 3 not applied to stage 0: it has one replica (dp 1), nothing to shard over, so it "
                          "runs as ZeRO 0"),
            std::string::npos)
      << r.output;
}

TEST(GradientCli, TightMemoryShardsAndTheExplanationSaysWhy) {
  TempDir dir;
  const std::string plan = dir.path() + "/plan.json";
  const CommandResult r = alloy("plan --model llama-2-7b --cluster " + kExamples + "/clusters/a100-36gb-8.yaml --train " +
                                kExamples + "/train/llama-galvatron.yaml -o " + plan);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(" shard "), std::string::npos) << "the grads column\n" << r.output;
  EXPECT_NE(r.output.find("shards gradients: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GiB less per device"), std::string::npos) << r.output;
  const CommandResult explained = alloy("explain " + plan);
  EXPECT_EQ(explained.exit_code, 0) << explained.output;
  EXPECT_NE(explained.output.find("shards gradients: "), std::string::npos) << explained.output;
}

TEST(GradientCli, ExplainPricesAHandSetStrategyAgainstTheOther) {
  TempDir dir;
  const std::string train = dir.write("cpu.yaml", "seq_len: 64\nglobal_batch: 16\nprecision: fp32\n");
  const std::string planned = dir.path() + "/planned.json";
  // Four CPU ranks with ample memory and four micro-batches: sharding would only add time.
  const CommandResult r = alloy("plan --model small-gpt --cluster local-cpu-4 --pp 1 --dp 4 --zero 2 --num-micro-batches 4 "
                                "--no-simulate --train " + train + " -o " + planned);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("stage 0 accumulates gradients in full: sharding would hold"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("and memory fits"), std::string::npos) << r.output;

  nlohmann::json plan = nlohmann::json::parse(testing::read_text(planned));
  plan.erase("predicted");
  for (auto& stage : plan["stages"]) {
    stage.erase("predicted");
    stage["shard_gradients"] = true;
  }
  const CommandResult explained = alloy("explain " + dir.write("by-hand.json", plan.dump(2)));
  EXPECT_EQ(explained.exit_code, 0) << explained.output;
  EXPECT_NE(explained.output.find("priced by the cost model"), std::string::npos) << explained.output;
  EXPECT_NE(explained.output.find("stage 0 shards gradients: "), std::string::npos) << explained.output;
  EXPECT_NE(explained.output.find("ms of reduce-scatter per step"), std::string::npos) << explained.output;
}

}  // namespace
}  // namespace alloy
