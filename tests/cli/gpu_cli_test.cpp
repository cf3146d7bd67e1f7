// The GPU commands' bad input, checked where CI runs (no GPU, with or without the CUDA build):
// each ends in exit 2 with a message that names the option and says what to do.
#include <gtest/gtest.h>

#include <string>

#include "../common/test_util.hpp"

namespace alloy {
namespace {

using testing::alloy;
using testing::TempDir;

std::string data_file(const TempDir& dir) {
  const std::string text = std::string(ALLOY_SOURCE_DIR) + "/examples/data/fsf_licenses.txt";
  EXPECT_EQ(alloy("tokenize " + text + " -o " + dir.path() + "/data.bin").exit_code, 0);
  return dir.path() + "/data.bin";
}

TEST(GpuCli, NoUsableGpuIsOneClearLine) {
  TempDir dir;
  const auto r = alloy("train --device cuda --model tiny-gpt --data " + data_file(dir) + " --steps 2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  // Either this build has no CUDA backend, or the machine has no driver or GPU.
  const bool explained = r.output.find("without the CUDA backend") != std::string::npos ||
                         r.output.find("no CUDA GPU is usable here") != std::string::npos;
  EXPECT_TRUE(explained) << r.output;
  EXPECT_NE(r.output.find("--device"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fix:"), std::string::npos) << r.output;
}

TEST(GpuCli, UnknownDeviceAndUnsupportedOptionsAreRefused) {
  TempDir dir;
  const std::string data = data_file(dir);
  const auto device = alloy("train --device tpu --model tiny-gpt --data " + data);
  EXPECT_EQ(device.exit_code, 2) << device.output;
  EXPECT_NE(device.output.find("unknown device 'tpu'"), std::string::npos) << device.output;
  const auto profile = alloy("profile --device cuda --model tiny-gpt --cluster local-cpu-2 -o " + dir.path() + "/p.json");
  EXPECT_EQ(profile.exit_code, 2) << profile.output;
}

TEST(GpuCli, PlansTheCudaBackendCannotRunAreRefusedBeforeAnyGpuWork) {
  TempDir dir;
  const std::string data = data_file(dir);
  const std::string cluster = dir.write("h200-2.yaml", "name: h200-2\nnodes:\n  - {name: n, count: 1, device: h200-sxm, "
                                                       "devices_per_node: 2, host_memory: 64GiB, host_link: 25GB/s}\n");
  const std::string train = dir.write("train.yaml", "seq_len: 128\nglobal_batch: 16\nsteps: 2\n");
  const std::string plan = dir.path() + "/tp.json";
  ASSERT_EQ(alloy("plan --model small-gpt --cluster " + cluster + " --train " + train +
                  " --tp 2 --dp 1 --pp 1 --no-offload -o " + plan)
                .exit_code,
            0);
  const auto r = alloy("train --device cuda --plan " + plan + " --cluster " + cluster + " --model small-gpt --data " +
                       data + " --train " + train);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  // Refused from the plan alone, before the GPU is opened: the same line with or without one.
  EXPECT_NE(r.output.find("stage 0 asks for tensor parallelism (tp 2), which the cuda backend does not run"),
            std::string::npos) << r.output;
}

// A plan priced in another precision than the cuda backend computes in is named before the GPU
// is opened (in a build with the backend); a bf16 plan says nothing.
TEST(GpuCli, APlanInAPrecisionTheBackendDoesNotComputeInIsNamed) {
  TempDir dir;
  const std::string data = data_file(dir);
  const std::string cluster = dir.write("h200-1.yaml", "name: h200-1\nnodes:\n  - {name: n, count: 1, device: h200-sxm, "
                                                       "devices_per_node: 1, host_memory: 64GiB, host_link: 25GB/s}\n");
  for (const std::string precision : {"fp32", "bf16"}) {
    const std::string train = dir.write(precision + ".yaml", "seq_len: 128\nglobal_batch: 16\nsteps: 2\nprecision: " + precision + "\n");
    const std::string plan = dir.path() + "/" + precision + ".json";
    ASSERT_EQ(alloy("plan --model small-gpt --cluster " + cluster + " --train " + train + " --no-offload -o " + plan).exit_code, 0);
    const auto r = alloy("train --device cuda --plan " + plan + " --cluster " + cluster + " --data " + data);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    if (r.output.find("without the CUDA backend") != std::string::npos) GTEST_SKIP() << "this build has no cuda backend";
    const bool noted = r.output.find("the cuda backend computes in bf16 with fp32 master weights; " + plan + " names fp32") !=
                       std::string::npos;
    EXPECT_EQ(noted, precision == "fp32") << r.output;
  }
}

}  // namespace
}  // namespace alloy
