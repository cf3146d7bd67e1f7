// Pipeline stages, interleaved chunks, recomputation, ZeRO 1-2 and uneven replicas on GPU ranks
// through `alloy train --device cuda --plan`: ranks sharing this machine's GPU (activations, their gradients and the
// gradient sums through host memory) follow the one-GPU run of the same global batch step by
// step. The tolerance, 1% of each step's loss, is the one the data-parallel replicas keep: every
// layout computes the same bf16 products, and only the order of fp32 sums (micro-batches,
// replicas, the tied embedding's two copies) differs between them. And a stage over its memory
// cap stops the run as a smaller GPU would.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"
#include "cuda_test_util.hpp"

namespace alloy {
namespace {

struct Layout {
  const char* name;
  int ranks;
  const char* pins;           // alloy plan's options
  const char* replicas = "";  // a JSON list of stage 0's replicas' shares, written into the plan
};

// small-gpt's tokens, a cluster of `ranks` H200s, a training file and the plan `pins` make
// for them, in a folder of their own.
struct PlannedRun {
  PlannedRun(int ranks, const std::string& pins) {
    testing::mpi_test_environment_set();
    const std::string text = std::string(ALLOY_SOURCE_DIR) + "/examples/data/fsf_licenses.txt";
    EXPECT_EQ(testing::alloy("tokenize " + text + " -o " + dir.path() + "/data.bin").exit_code, 0);
    cluster = dir.write("h200s.yaml", fmt::format("name: h200s\nnodes:\n  - {{name: n, count: 1, device: h200-sxm, "
                                                  "devices_per_node: {}, host_memory: 64GiB, host_link: 25GB/s}}\n",
                                                  ranks));
    train = dir.write("train.yaml", "seq_len: 128\nglobal_batch: 16\nsteps: 8\nlearning_rate: 3.0e-4\n");
    plan = dir.path() + "/plan.json";
    planned = testing::alloy("plan --model small-gpt --cluster " + cluster + " --train " + train + " " + pins +
                             " --no-offload -o " + plan);
  }
  // Stage 0's replicas take the shares of `replicas` ([{"sequences": 11}, ...]) of each micro-batch.
  void share_unevenly(const std::string& replicas) const {
    nlohmann::json p = nlohmann::json::parse(testing::read_text(plan));
    nlohmann::json& stage = p["stages"][0];
    stage["replicas"] = nlohmann::json::parse(replicas);
    for (nlohmann::json& replica : stage["replicas"]) replica["device_type"] = stage["device_type"];
    std::ofstream(plan) << p.dump(1);
  }
  std::string common() const {
    return " --model small-gpt --data " + dir.path() + "/data.bin --train " + train + " --no-progress";
  }
  // The plan on `ranks` ranks sharing GPU 0, their gradients and hidden states through host memory.
  testing::CommandResult train_on_gpus(int ranks, const std::string& options) const {
    return testing::run_command(fmt::format("mpirun -np {} {} train --device cuda --gpu 0 --gpu-comm host --plan {} "
                                            "--cluster {}{} {}",
                                            ranks, ALLOY_BINARY, plan, cluster, common(), options),
                                120);
  }
  testing::TempDir dir;
  std::string cluster, train, plan;
  testing::CommandResult planned;
};

class GpuLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(GpuLayouts, FollowOneGpu) {
  ALLOY_REQUIRE_GPU();
  const Layout& layout = GetParam();
  const PlannedRun run(layout.ranks, layout.pins);
  ASSERT_EQ(run.planned.exit_code, 0) << run.planned.output;
  if (*layout.replicas != '\0') run.share_unevenly(layout.replicas);
  const auto one = testing::alloy("train --device cuda" + run.common() + " --log " + run.dir.path() + "/one.jsonl");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto many = run.train_on_gpus(layout.ranks, "--log " + run.dir.path() + "/many.jsonl");
  ASSERT_EQ(many.exit_code, 0) << many.output;
  EXPECT_NE(many.output.find(fmt::format("over {} rank(s)", layout.ranks)), std::string::npos) << many.output;
  EXPECT_NE(many.output.find("step time: predicted"), std::string::npos) << many.output;
  const size_t report = many.output.find("trained small-gpt");
  if (report != std::string::npos) std::cout << many.output.substr(report) << "\n";
  const std::vector<double> a = testing::logged(run.dir.path() + "/one.jsonl", "loss");
  const std::vector<double> b = testing::logged(run.dir.path() + "/many.jsonl", "loss");
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 0.01 * a[i]) << layout.name << ", step " << i + 1;
}

// A stage whose GPU arena is capped below what it holds stops the whole run with one line per
// rank naming the rank, what asked for memory and how many bytes, as a device of that size would.
TEST(GpuMemoryCap, AStageOverItsCapStopsTheRunNamingRankTermAndBytes) {
  ALLOY_REQUIRE_GPU();
  const PlannedRun run(2, "--pp 2 --dp 1 --tp 1 --zero 0 --schedule 1f1b --micro-batch 4");
  ASSERT_EQ(run.planned.exit_code, 0) << run.planned.output;
  const auto capped = run.train_on_gpus(2, "--memory-cap 40MiB");
  EXPECT_EQ(capped.exit_code, 2) << capped.output;
  EXPECT_NE(capped.output.find("error on rank"), std::string::npos) << capped.output;
  EXPECT_NE(capped.output.find("out of device memory on h200-sxm"), std::string::npos) << capped.output;
  EXPECT_NE(capped.output.find("bytes) with"), std::string::npos) << capped.output;
  EXPECT_NE(capped.output.find("of a 40.00 MiB capacity"), std::string::npos) << capped.output;
}

INSTANTIATE_TEST_SUITE_P(
    Plans, GpuLayouts,
    ::testing::Values(Layout{"pp2_1f1b", 2, "--pp 2 --dp 1 --tp 1 --zero 0 --schedule 1f1b --micro-batch 4"},
                      Layout{"pp2_gpipe", 2, "--pp 2 --dp 1 --tp 1 --zero 0 --schedule gpipe --micro-batch 4"},
                      Layout{"pp2_interleaved", 2,
                             "--pp 2 --dp 1 --tp 1 --zero 0 --schedule interleaved --chunks 2 --micro-batch 2"},
                      Layout{"pp2_full_recompute", 2,
                             "--pp 2 --dp 1 --tp 1 --zero 0 --schedule 1f1b --micro-batch 4 --recompute full"},
                      Layout{"dp2_zero1", 2, "--pp 1 --dp 2 --tp 1 --zero 1"},
                      Layout{"pp2_dp2_zero1", 4, "--pp 2 --dp 2 --tp 1 --zero 1 --schedule 1f1b --micro-batch 2"},
                      Layout{"dp2_zero2_full_gradients", 2, "--pp 1 --dp 2 --tp 1 --zero 2 --gradients full"},
                      Layout{"pp2_dp2_zero2_full_gradients", 4,
                             "--pp 2 --dp 2 --tp 1 --zero 2 --gradients full --schedule 1f1b --micro-batch 2"},
                      Layout{"dp2_uneven_pieces", 2, "--pp 1 --dp 2 --tp 1 --zero 0",
                             R"([{"sequences": 10}, {"sequences": 6, "pieces": 2}])"},
                      Layout{"dp2_uneven_zero1", 2, "--pp 1 --dp 2 --tp 1 --zero 1",
                             R"([{"sequences": 11}, {"sequences": 5}])"}),
    [](const ::testing::TestParamInfo<Layout>& param_info) { return std::string(param_info.param.name); });

}  // namespace
}  // namespace alloy
