// `alloy train --checkpoint` as a user meets it on one rank: bad --keep-checkpoints, an edited
// manifest, a folder in the older per-rank format and one with no committed save are each
// refused with exit status 2 and a message that says what to do; SIGINT saves and exits 130, and a
// second signal exits at once.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
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
  EXPECT_NE(r.output.find("in [1,"), std::string::npos) << r.output;
}

TEST_F(CheckpointCli, EditedManifestStepIsRefusedNotResumed) {
  ASSERT_EQ(alloy(train(4, "--checkpoint-every 2")).exit_code, 0);
  const std::string latest = ck() + "/latest.json";
  const std::string original = testing::read_text(latest);
  for (const char* step : {"-5", "2"}) {
    std::string edited = original;
    const size_t at = edited.find("\"step\": 4");
    ASSERT_NE(at, std::string::npos) << original;
    edited.replace(at, 9, std::string("\"step\": ") + step);
    std::ofstream(latest) << edited;
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

// Polls `path` (every 50 ms, up to 10 s) until it is not empty; returns its text.
std::string text_awaited(const std::string& path) {
  std::string text;
  for (int i = 0; i < 200 && (text = testing::read_text(path)).empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return text;
}

// Starts `alloy ARGS` in the background once it holds the checkpoint lock; returns its pid. A
// shell notes the pid in DIR/pid and, when the run ends, its exit status in DIR/rc.
int alloy_started(const TempDir& dir, const std::string& args, const std::string& ck) {
  const std::string command = fmt::format("sh -c '{} {} > {}/out.txt 2>&1 & echo $! > {}/pid; wait $!; echo $? > {}/rc' &",
                                          ALLOY_BINARY, args, dir.path(), dir.path(), dir.path());
  if (std::system(command.c_str()) != 0) return -1;
  const int pid = std::stoi(text_awaited(dir.path() + "/pid"));
  text_awaited(ck + "/.lock");
  return pid;
}

TEST_F(CheckpointCli, SigintSavesTheStepAndExits130) {
  const std::string out = dir_.path() + "/out.txt";
  const int pid = alloy_started(dir_, train(100000, ""), ck());
  ASSERT_GT(pid, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  kill(pid, SIGINT);
  // "received SIGINT on rank 0 at step N; saved checkpoint step M ..."
  const std::string said = "received SIGINT on rank 0 at step ";
  long long step = -1, saved = -2;
  std::string text;
  for (int i = 0; i < 200; ++i, std::this_thread::sleep_for(std::chrono::milliseconds(50))) {
    text = testing::read_text(out);
    const size_t at = text.find(said);
    if (at != std::string::npos &&
        std::sscanf(text.c_str() + at + said.size(), "%lld; saved checkpoint step %lld", &step, &saved) == 2)
      break;
  }
  ASSERT_GE(step, 1) << text;
  EXPECT_EQ(step, saved) << text;
  EXPECT_EQ(text_awaited(dir_.path() + "/rc"), "130\n");
  CommandResult resumed = alloy(train(static_cast<int>(step) + 1, "--resume"));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("steps {}..", step + 1)), std::string::npos) << resumed.output;
}

// A step of small-gpt takes seconds: both signals arrive within it, and the second ends the run
// without waiting for the step.
TEST_F(CheckpointCli, SecondSignalExitsAtOnceWithoutSaving) {
  const int pid = alloy_started(dir_,
                                fmt::format("train --model small-gpt --data {}/data.bin --batch 16 --seq-len 128 "
                                            "--threads 1 --no-progress --steps 1000 --checkpoint {}",
                                            dir_.path(), ck()),
                                ck());
  ASSERT_GT(pid, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  kill(pid, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // two pending SIGTERMs would merge into one
  kill(pid, SIGTERM);
  EXPECT_EQ(text_awaited(dir_.path() + "/rc"), "143\n");
  const std::string out = testing::read_text(dir_.path() + "/out.txt");
  EXPECT_NE(out.find("second stop signal: exiting now, without saving this step"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(ck() + "/latest.json"));
}

}  // namespace
}  // namespace alloy
