// Checkpoints of a 4-rank job under mpirun: a rank killed in the middle of a save leaves the
// previous checkpoint, which resumes onto the uninterrupted run's losses, and a write failure on
// one rank fails the save on all; a stop signal on one rank ends every rank after the same step
// with a checkpoint of it; a second writer is refused.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"
#include "dist_plans.hpp"
#include "hw/catalog.hpp"
#include "runtime/io/checkpoint_commit.hpp"

namespace alloy::testing {
namespace {

class CheckpointStopTest : public DistGptSuite<CheckpointStopTest> {
 protected:
  static void SetUpTestSuite() {
    DistGptSuite::SetUpTestSuite();
    if (::testing::Test::HasFatalFailure()) return;
    // Two pipeline stages of two replicas each: 4 ranks.
    plan_path_ = dir_->path() + "/pp2-dp2.json";
    plan_save(test_plan(model_load(gpt_path_), cluster_load(cluster_path_, catalog_builtin()),
                        {{1, 2, 0, {3}}, {1, 2, 0, {3}}}, Schedule::Schedule_1f1b, 2),
              plan_path_);
  }

  static std::string train_command(int steps, const std::string& extra) {
    return fmt::format(
        "mpirun -np 4 --oversubscribe --bind-to none {} train --model {} --data {} --train {}/dist-train.yaml "
        "--steps {} --no-progress --plan {} --cluster {} {}",
        ALLOY_BINARY, gpt_path_, data_, dir_->path(), steps, plan_path_, cluster_path_, extra);
  }

  // Losses by step from a JSON-lines log.
  static std::map<int64_t, double> losses(const std::string& log) {
    std::map<int64_t, double> out;
    std::istringstream in(read_text(log));
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      out[j.at("step").get<int64_t>()] = j.at("loss").get<double>();
    }
    return out;
  }

  static inline std::string plan_path_;
};

TEST_F(CheckpointStopTest, RankKilledDuringSaveLeavesThePreviousCheckpointWhichResumesExactly) {
  const std::string ck = dir_->path() + "/ck-killed", full = dir_->path() + "/full.jsonl",
                    part = dir_->path() + "/part.jsonl";
  ASSERT_EQ(run_command(train_command(8, "--log " + full), 120).exit_code, 0);
  // Rank 2 dies after writing its weights of step 6 and before its optimizer state.
  CommandResult killed =
      run_command("env ALLOY_FAULT=killsave:2:6 " + train_command(8, fmt::format("--checkpoint {} --checkpoint-every 2", ck)), 120);
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_NE(killed.output.find("rank 2 kills itself while saving step 6"), std::string::npos) << killed.output;
  EXPECT_EQ(checkpoint_manifest_read(ck).step, 4);
  EXPECT_TRUE(std::filesystem::exists(checkpoint_step_dir(ck, 6)));  // the unfinished save, ignored

  CommandResult resumed = run_command(train_command(8, fmt::format("--checkpoint {} --resume --log {}", ck, part)), 120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("steps 5..8"), std::string::npos) << resumed.output;
  const std::map<int64_t, double> expected = losses(full), got = losses(part);
  ASSERT_EQ(got.size(), 4u);
  for (const auto& [step, loss] : got) EXPECT_DOUBLE_EQ(loss, expected.at(step)) << "step " << step;
  EXPECT_EQ(checkpoint_manifest_read(ck).step, 8);
  // The resumed run saves only at its end: step 4 stays, the unfinished step 6 is gone.
  EXPECT_EQ(checkpoint_manifest_read(ck).steps_kept, (std::vector<int64_t>{4, 8}));
  EXPECT_FALSE(std::filesystem::exists(checkpoint_step_dir(ck, 6)));
}

TEST_F(CheckpointStopTest, WriteFailureOnOneRankFailsTheSaveOnEveryRankAndKeepsThePreviousCheckpoint) {
  const std::string ck = dir_->path() + "/ck-failed";
  CommandResult r =
      run_command("env ALLOY_FAULT=failsave:1:4 " + train_command(8, fmt::format("--checkpoint {} --checkpoint-every 2", ck)), 120);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  int reports = 0;
  for (size_t at = r.output.find("injected write failure in the checkpoint of step 4"); at != std::string::npos;
       at = r.output.find("injected write failure in the checkpoint of step 4", at + 1))
    ++reports;
  EXPECT_EQ(reports, 4) << r.output;  // every rank says which rank failed, and exits normally
  EXPECT_EQ(checkpoint_manifest_read(ck).step, 2);
  CommandResult resumed = run_command(train_command(3, fmt::format("--checkpoint {} --resume", ck)), 120);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("steps 3..3"), std::string::npos) << resumed.output;
}

TEST_F(CheckpointStopTest, SigtermOnOneRankStopsEveryRankAfterTheStepWithACheckpoint) {
  const std::string ck = dir_->path() + "/ck-term";
  const auto start = std::chrono::steady_clock::now();
  CommandResult r = run_command("env ALLOY_FAULT=term:2:3 " + train_command(1000, "--checkpoint " + ck), 60);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.output;
  EXPECT_LT(seconds, 10.0) << r.output;
  EXPECT_NE(r.output.find(fmt::format("alloy: received SIGTERM on rank 2 at step 3; saved checkpoint step 3 to {}; "
                                      "resume with --resume",
                                      ck)),
            std::string::npos)
      << r.output;
  EXPECT_EQ(checkpoint_manifest_read(ck).step, 3);

  CommandResult resumed = run_command(train_command(5, fmt::format("--checkpoint {} --resume", ck)), 120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("steps 4..5"), std::string::npos) << resumed.output;
}

TEST_F(CheckpointStopTest, SignalWithoutCheckpointFolderSaysNothingWasSaved) {
  CommandResult r = run_command("env ALLOY_FAULT=term:1:2 " + train_command(1000, ""), 60);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.output;
  EXPECT_NE(r.output.find("received SIGTERM on rank 1 at step 2; nothing was saved (no --checkpoint)"), std::string::npos)
      << r.output;
}

TEST_F(CheckpointStopTest, SecondWriterIsRefusedWhileTheFirstHoldsTheFolder) {
  const std::string ck = dir_->path() + "/ck-locked", pid_file = dir_->path() + "/first.pid";
  const std::string first = fmt::format("{} train --model {} --data {} --train {}/dist-train.yaml --steps 100000 "
                                        "--batch {} --seq-len {} --no-progress --checkpoint {}",
                                        ALLOY_BINARY, gpt_path_, data_, dir_->path(), kTestGlobalBatch, kTestSeqLen, ck);
  ASSERT_EQ(std::system(fmt::format("{} > {}/first.txt 2>&1 & echo $! > {}", first, dir_->path(), pid_file).c_str()), 0);
  for (int i = 0; i < 200 && read_text(ck + "/.lock").find("pid") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CommandResult second = run_command(train_command(2, "--checkpoint " + ck), 60);
  const int first_pid = std::stoi(read_text(pid_file));
  kill(first_pid, SIGTERM);
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_NE(second.output.find("another run is writing checkpoints into this folder (pid " + std::to_string(first_pid)),
            std::string::npos)
      << second.output;
  // The first run stops at a step boundary and saves on SIGTERM.
  for (int i = 0; i < 200 && read_text(dir_->path() + "/first.txt").find("received") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_NE(read_text(dir_->path() + "/first.txt").find("received SIGTERM on rank 0"), std::string::npos)
      << read_text(dir_->path() + "/first.txt");
}

}  // namespace
}  // namespace alloy::testing
