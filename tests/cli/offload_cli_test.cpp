// Offload through the CLI: a device too small for the model makes `alloy plan` offload with a
// reported prefetch depth and host memory; --prefetch-depth pins the depth; a node whose host
// memory cannot hold the offload is refused by `plan`, `explain` and `simulate` with the fix;
// data-parallel stages offload, and pinned sharded gradients that cannot fit without it say why.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"

namespace alloy {
namespace {

using testing::CommandResult;
using testing::TempDir;

using testing::alloy;

class OffloadCli : public ::testing::Test {
 protected:
  // One 8 GiB device on a node with `host_memory` of host memory.
  std::string cluster(const std::string& file, const std::string& host_memory) {
    return dir_.write(file, "name: small-gpu-node\n"
                            "device_types:\n"
                            "  small-gpu: {base: a100-80gb-sxm, memory: 8GiB}\n"
                            "nodes:\n"
                            "  - name: small-nodes\n"
                            "    device: small-gpu\n"
                            "    devices_per_node: 1\n"
                            "    host_memory: " + host_memory + "\n");
  }
  // 0.9B parameters: about 16 GB of weights, gradients and Adam states.
  std::string model() {
    return dir_.write("model.yaml", "name: llama-0.9b\nfamily: llama\nlayers: 16\nhidden_size: 2048\nheads: 16\n"
                                    "ffn_hidden_size: 5632\nvocab_size: 32000\nmax_seq_len: 1024\n");
  }
  std::string train() { return dir_.write("train.yaml", "seq_len: 1024\nglobal_batch: 8\nprecision: bf16\n"); }
  std::string plan_args(const std::string& cluster_path) {
    return "plan --no-simulate --model " + model() + " --cluster " + cluster_path + " --train " + train();
  }

  TempDir dir_;
};

TEST_F(OffloadCli, PlanOffloadsAndReportsDepthHostMemoryAndCopies) {
  const std::string plan = dir_.path() + "/plan.json";
  CommandResult r = alloy(plan_args(cluster("roomy.yaml", "256GiB")) + " --prefetch-depth 2 -o " + plan);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("layers, depth 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("of host memory per node (of 256 GiB)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("host copies add"), std::string::npos) << r.output;
  const nlohmann::json saved = nlohmann::json::parse(testing::read_text(plan));
  for (const auto& stage : saved["stages"]) {
    EXPECT_EQ(stage["offload_prefetch_depth"].get<int>(), 2);
    EXPECT_GT(stage["predicted"]["memory_bytes"]["host_offload"].get<double>(), 0);
    EXPECT_GT(stage["predicted"]["memory_bytes"]["offload_window"].get<double>(), 0);
  }
  EXPECT_GT(saved["predicted"]["host_offload_bytes_per_node"].get<double>(), 0);

  CommandResult explained = alloy("explain " + plan);
  ASSERT_EQ(explained.exit_code, 0) << explained.output;
  EXPECT_NE(explained.output.find("of host memory per node"), std::string::npos) << explained.output;

  // The same plan on nodes with 2 GiB of host memory (the fingerprint does not cover it): the
  // saved plan is refused before anything runs.
  const std::string cramped = cluster("cramped.yaml", "2GiB");
  CommandResult simulated = alloy("simulate --plan " + plan + " --model " + model() + " --cluster " + cramped);
  EXPECT_EQ(simulated.exit_code, 2) << simulated.output;
  EXPECT_NE(simulated.output.find("host memory"), std::string::npos) << simulated.output;
  CommandResult checked = alloy("explain " + plan + " --model " + model() + " --cluster " + cramped);
  EXPECT_EQ(checked.exit_code, 2) << checked.output;
  EXPECT_NE(checked.output.find("which has 2.0 GiB"), std::string::npos) << checked.output;
}

TEST_F(OffloadCli, HostMemoryTooSmallForTheNeededOffloadIsRefused) {
  CommandResult r = alloy(plan_args(cluster("tiny-host.yaml", "4GiB")));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("GiB of host memory per node"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("has 4 GiB"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("host_memory"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("add devices"), std::string::npos) << r.output;
}

TEST_F(OffloadCli, DataParallelStagesOffloadAndPinnedShardedGradientsSaySo) {
  const std::string pair = dir_.write("pair.yaml", "name: small-gpu-pair\n"
                                                   "device_types:\n"
                                                   "  small-gpu: {base: a100-80gb-sxm, memory: 8GiB}\n"
                                                   "nodes:\n"
                                                   "  - {name: pair, device: small-gpu, devices_per_node: 2, "
                                                   "host_memory: 256GiB}\n");
  const std::string plan = dir_.path() + "/dp-plan.json";
  CommandResult r = alloy(plan_args(pair) + " --dp 2 --pp 1 -o " + plan);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json stage = nlohmann::json::parse(testing::read_text(plan))["stages"][0];
  EXPECT_EQ(stage["dp"].get<int>(), 2);
  EXPECT_GE(stage["zero"].get<int>(), 1);  // the host keeps each member's share of the moments
  EXPECT_FALSE(stage["shard_gradients"].get<bool>());
  EXPECT_GT(stage["predicted"]["memory_bytes"]["host_offload"].get<double>(), 0);
  EXPECT_NE(r.output.find("its offloaded layers sum theirs in host memory"), std::string::npos) << r.output;

  CommandResult sharded = alloy(plan_args(pair) + " --dp 2 --pp 1 --zero 2 --gradients shard");
  EXPECT_EQ(sharded.exit_code, 2) << sharded.output;
  EXPECT_NE(sharded.output.find("drop --gradients shard"), std::string::npos) << sharded.output;
}

TEST_F(OffloadCli, PrefetchDepthOutOfRangeIsRefused) {
  CommandResult r = alloy(plan_args(cluster("roomy.yaml", "256GiB")) + " --prefetch-depth 9");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("prefetch depth"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace alloy
