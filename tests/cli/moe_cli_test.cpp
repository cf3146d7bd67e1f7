// Mixture-of-Experts models at the command line: `alloy check` prints their exact totals, and
// every command that would plan, simulate, train, profile or convert one refuses it by name.
#include <gtest/gtest.h>

#include "../common/test_util.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

using testing::alloy;
using testing::CommandResult;
using testing::TempDir;

TEST(MoeCli, CheckPrintsTotalAndActiveCounts) {
  const CommandResult r = alloy("check --model mixtral-8x7b");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("46,702,792,704"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("12,879,925,248"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("8 routed experts of width 14336, 2 per token"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("active per token"), std::string::npos) << r.output;
  const CommandResult tiny = alloy("check --model tiny-moe");
  ASSERT_EQ(tiny.exit_code, 0) << tiny.output;
  EXPECT_NE(tiny.output.find("276,416"), std::string::npos) << tiny.output;
  EXPECT_NE(tiny.output.find("202,688"), std::string::npos) << tiny.output;
}

void expect_moe_refused(const std::string& args) {
  const CommandResult r = alloy(args);
  EXPECT_EQ(r.exit_code, kExitBadInput) << args << "\n" << r.output;
  EXPECT_NE(r.output.find("Mixture-of-Experts models (model tiny-moe: 4 experts, 2 per token) are not planned or "
                          "trained yet"),
            std::string::npos)
      << args << "\n" << r.output;
  EXPECT_NE(r.output.find("alloy check --model tiny-moe"), std::string::npos) << args << "\n" << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << args << "\n" << r.output;
}

TEST(MoeCli, PlanTrainAndProfileRefuseMoe) {
  TempDir dir;
  expect_moe_refused("plan --model tiny-moe --cluster local-cpu-1 -o " + dir.path() + "/plan.json");
  expect_moe_refused("train --model tiny-moe --data " + dir.path() + "/tokens.bin --steps 1");
  expect_moe_refused("profile --model tiny-moe --cluster local-cpu-1 -o " + dir.path() + "/profile.json");
}

TEST(MoeCli, ImportHfRefusesMoe) {
  TempDir dir;
  const CommandResult r = alloy("import-hf " + dir.path() + "/model.safetensors " + std::string(ALLOY_SOURCE_DIR) +
                                "/examples/models/mixtral-8x7b.json -o " + dir.path() + "/imported");
  EXPECT_EQ(r.exit_code, kExitBadInput) << r.output;
  EXPECT_NE(r.output.find("Mixture-of-Experts models (model mixtral-8x7b: 8 experts, 2 per token)"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace alloy
