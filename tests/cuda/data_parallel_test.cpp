// Data parallelism over GPUs through `alloy train --device cuda`: two ranks (sharing this
// machine's GPU, so their gradients go through host memory) follow the one-GPU run of the same
// global batch step by step, with and without a plan; and plans the CUDA backend does not run
// are refused before anything is allocated.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../common/test_util.hpp"
#include "cuda_test_util.hpp"

namespace alloy {
namespace {

class GpuDataParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::mpi_test_environment_set();
    const std::string text = std::string(ALLOY_SOURCE_DIR) + "/examples/data/fsf_licenses.txt";
    ASSERT_EQ(testing::alloy("tokenize " + text + " -o " + dir.path() + "/data.bin").exit_code, 0);
  }
  std::string common() const {
    return "--model small-gpt --data " + dir.path() + "/data.bin --train " + std::string(ALLOY_SOURCE_DIR) +
           "/examples/train/tiny-cpu.yaml --steps 8 --seq-len 128 --lr 3e-4 --no-progress";
  }
  testing::TempDir dir;
};

TEST_F(GpuDataParallel, TwoReplicasFollowOneGpu) {
  ALLOY_REQUIRE_GPU();
  const auto one = testing::alloy("train --device cuda --batch 16 " + common() + " --log " + dir.path() + "/one.jsonl");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto two = testing::run_command("mpirun -np 2 " + std::string(ALLOY_BINARY) + " train --device cuda --gpu 0 " +
                                            "--gpu-comm host --batch 16 " + common() + " --log " + dir.path() + "/two.jsonl",
                                        300);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("over 2 rank(s)"), std::string::npos) << two.output;
  const std::vector<double> a = testing::logged(dir.path() + "/one.jsonl", "loss");
  const std::vector<double> b = testing::logged(dir.path() + "/two.jsonl", "loss");
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u) << "only rank 0 writes the log";
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 0.01 * a[i]) << "step " << i + 1;
}

TEST_F(GpuDataParallel, RunsADataParallelPlanAndRefusesOthers) {
  ALLOY_REQUIRE_GPU();
  const std::string cluster = dir.write("h200-2.yaml", "name: h200-2\nnodes:\n  - {name: n, count: 1, device: h200-sxm, "
                                                       "devices_per_node: 2, host_memory: 64GiB, host_link: 25GB/s}\n");
  const std::string train = dir.write("train.yaml", "seq_len: 128\nglobal_batch: 16\nsteps: 8\nlearning_rate: 3.0e-4\n");
  const std::string plan = dir.path() + "/dp.json";
  ASSERT_EQ(testing::alloy("plan --model small-gpt --cluster " + cluster + " --train " + train +
                           " --dp 2 --tp 1 --pp 1 --zero 0 --no-offload -o " + plan)
                .exit_code,
            0);
  const auto run = testing::run_command("mpirun -np 2 " + std::string(ALLOY_BINARY) + " train --device cuda --gpu 0 " +
                                            "--gpu-comm host --plan " + plan + " --cluster " + cluster +
                                            " --model small-gpt --data " + dir.path() + "/data.bin --train " + train +
                                            " --no-progress",
                                        300);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("step time: predicted"), std::string::npos) << run.output;

  const std::string tp_plan = dir.path() + "/tp.json";
  ASSERT_EQ(testing::alloy("plan --model small-gpt --cluster " + cluster + " --train " + train +
                           " --tp 2 --dp 1 --pp 1 --no-offload -o " + tp_plan)
                .exit_code,
            0);
  const auto refused = testing::run_command("mpirun -np 2 " + std::string(ALLOY_BINARY) + " train --device cuda --gpu 0 " +
                                                "--gpu-comm host --plan " + tp_plan + " --cluster " + cluster +
                                                " --model small-gpt --data " + dir.path() + "/data.bin --train " + train,
                                            120);
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("which the cuda backend does not run"), std::string::npos) << refused.output;
}

}  // namespace
}  // namespace alloy
