// Bad input to the commands that move runs and weights between layouts, clusters and formats:
// each refuses with what is wrong, where, and what to do, and writes nothing it should not.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "../common/test_util.hpp"

namespace alloy {
namespace {

using testing::alloy;
using testing::CommandResult;
using testing::TempDir;

const std::string kHf = std::string(ALLOY_SOURCE_DIR) + "/tests/io/hf/";

TEST(ElasticCli, ReplanNeedsACheckpointThatSaysWhatItHolds) {
  TempDir dir;
  // No checkpoint at all.
  CommandResult none = alloy(fmt::format("replan --checkpoint {}/nothing --cluster local-cpu-2", dir.path()));
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("checkpoint folder not found"), std::string::npos) << none.output;
  // An imported checkpoint has weights but no plan.json with the training setup.
  const std::string ck = dir.path() + "/imported";
  ASSERT_EQ(alloy(fmt::format("import-hf {}tiny_gpt2/model.safetensors -o {}", kHf, ck)).exit_code, 0);
  CommandResult no_plan = alloy(fmt::format("replan --checkpoint {} --cluster local-cpu-2", ck));
  EXPECT_EQ(no_plan.exit_code, 2) << no_plan.output;
  EXPECT_NE(no_plan.output.find("plan.json"), std::string::npos) << no_plan.output;
  EXPECT_NE(no_plan.output.find("alloy train --checkpoint"), std::string::npos) << no_plan.output;
}

TEST(ElasticCli, ImportRefusesAFolderInUseAndMissingConfig) {
  TempDir dir;
  const std::string busy = dir.write("notes.txt", "keep me");
  CommandResult into_busy = alloy(fmt::format("import-hf {}tiny_gpt2/model.safetensors -o {}", kHf, dir.path()));
  EXPECT_EQ(into_busy.exit_code, 2) << into_busy.output;
  EXPECT_NE(into_busy.output.find("not empty"), std::string::npos) << into_busy.output;
  EXPECT_EQ(testing::read_text(busy), "keep me");
  const std::string lone = dir.path() + "/lone";
  std::filesystem::create_directories(lone);
  std::filesystem::copy_file(kHf + "tiny_gpt2/model.safetensors", lone + "/model.safetensors");
  CommandResult no_config = alloy(fmt::format("import-hf {}/model.safetensors -o {}/out", lone, dir.path()));
  EXPECT_EQ(no_config.exit_code, 2) << no_config.output;
  EXPECT_NE(no_config.output.find("config.json"), std::string::npos) << no_config.output;
  // export-hf of a folder that is no checkpoint.
  CommandResult not_a_checkpoint = alloy(fmt::format("export-hf {} -o {}/hf --model {}tiny_gpt2/config.json", lone,
                                                     dir.path(), kHf));
  EXPECT_EQ(not_a_checkpoint.exit_code, 2) << not_a_checkpoint.output;
  EXPECT_NE(not_a_checkpoint.output.find("latest.json"), std::string::npos) << not_a_checkpoint.output;
}

}  // namespace
}  // namespace alloy
