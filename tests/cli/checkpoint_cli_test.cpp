// `alloy train --checkpoint` as a user meets it on one rank: bad --keep-checkpoints, an edited
// manifest, a folder in the older per-rank format and one with no committed save are each
// refused with exit status 2 and a message that says what to do; SIGINT saves and exits 130.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include <fmt/format.h>

#include "../common/test_util.hpp"

namespace alloy {
namespace {

using testing::alloy;
using testing::CommandResult;
using testing::TempDir;

class CheckpointCli : public ::testing::Test {
 protected:
  void SetUp() override {
    CommandResult tok = alloy(fmt::format("tokenize {}/examples/data/fsf_licenses.txt -o {}/data.bin", ALLOY_SOURCE_DIR,
                                          dir_.path()));
    ASSERT_EQ(tok.exit_code, 0) << tok.output;
  }
  std::string train(int steps, const std::string& extra) const {
    return fmt::format("train --model tiny-gpt --data {}/data.bin --batch 4 --seq-len 32 --threads 1 --no-progress "
                       "--steps {} --checkpoint {} {}",
                       dir_.path(), steps, ck(), extra);
  }
  std::string ck() const { return dir_.path() + "/ck"; }

  TempDir dir_;
};

TEST_F(CheckpointCli, KeepCheckpointsBelowOneIsRefused) {
  CommandResult r = alloy(train(2, "--keep-checkpoints 0"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--keep-checkpoints"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("keep at least 1"), std::string::npos) << r.output;
}

TEST_F(CheckpointCli, EditedManifestStepIsRefusedNotResumed) {
  ASSERT_EQ(alloy(train(4, "--checkpoint-every 2")).exit_code, 0);
  const std::string latest = ck() + "/latest.json";
  const std::string original = testing::read_text(latest);
  for (const char* step : {"-5", "2"}) {
    std::ofstream(latest) << std::regex_replace(original, std::regex("\"step\": 4"), std::string("\"step\": ") + step);
    CommandResult r = alloy(train(6, "--resume"));
    EXPECT_EQ(r.exit_code, 2) << step << "\n" << r.output;
    EXPECT_NE(r.output.find("damaged or was edited"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("latest.json"), std::string::npos) << r.output;
  }
  std::ofstream(latest) << original;
  CommandResult r = alloy(train(6, "--resume"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("steps 5..6"), std::string::npos) << r.output;
}

TEST_F(CheckpointCli, OlderFormatAndUncommittedFoldersSayHowToProceed) {
  std::filesystem::create_directories(ck() + "/rank-00000");
  std::ofstream(ck() + "/rank-00000/checkpoint.json") << "{}";
  CommandResult old = alloy(train(2, "--resume"));
  EXPECT_EQ(old.exit_code, 2) << old.output;
  EXPECT_NE(old.output.find("older format"), std::string::npos) << old.output;
  EXPECT_NE(old.output.find("start afresh"), std::string::npos) << old.output;

  std::filesystem::remove_all(ck());
  std::filesystem::create_directories(ck() + "/step-00000003/rank-00000");
  CommandResult none = alloy(train(2, "--resume"));
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("no committed checkpoint"), std::string::npos) << none.output;
}

TEST_F(CheckpointCli, SigintSavesTheStepAndExits130) {
  const std::string out = dir_.path() + "/out.txt";
  // A shell in the background starts the run, notes its pid and, when it ends, its exit status.
  ASSERT_EQ(std::system(fmt::format("sh -c '{} {} > {} 2>&1 & echo $! > {}/pid; wait $!; echo $? > {}/rc' &", ALLOY_BINARY,
                                    train(100000, ""), out, dir_.path(), dir_.path())
                            .c_str()),
            0);
  for (int i = 0; i < 200 && testing::read_text(dir_.path() + "/pid").empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const int pid = std::stoi(testing::read_text(dir_.path() + "/pid"));
  for (int i = 0; i < 200 && testing::read_text(ck() + "/.lock").empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  kill(pid, SIGINT);
  std::smatch saved;
  std::string text;
  for (int i = 0; i < 200; ++i, std::this_thread::sleep_for(std::chrono::milliseconds(50))) {
    text = testing::read_text(out);
    if (std::regex_search(text, saved, std::regex("received SIGINT on rank 0 at step (\\d+); saved checkpoint step (\\d+)")))
      break;
  }
  ASSERT_FALSE(saved.empty()) << text;
  EXPECT_EQ(saved[1], saved[2]);
  for (int i = 0; i < 200 && testing::read_text(dir_.path() + "/rc").empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(testing::read_text(dir_.path() + "/rc"), "130\n");
  CommandResult resumed = alloy(train(std::stoi(saved[1]) + 1, "--resume"));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("steps {}..", std::stoi(saved[1]) + 1)), std::string::npos) << resumed.output;
}

}  // namespace
}  // namespace alloy
