// A NaN gradient injected on one rank (ALLOY_FAULT=nan:R:S) stops `alloy train` at that step on
// one rank and on four MPI ranks (a pipeline, tensor parallelism in a pipeline, and data
// parallelism under ZeRO 1): exit 3, the step and tensor named once, the last checkpoint left as
// it was and finite. Also bad-step tolerance and non-finite settings refused up front.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "../common/test_util.hpp"
#include "dist_plans.hpp"
#include "hw/catalog.hpp"
#include "runtime/io/checkpoint.hpp"
#include "runtime/io/checkpoint_commit.hpp"
#include "runtime/io/safetensors.hpp"
#include "runtime/parallel/agree.hpp"

namespace alloy::testing {
namespace {

constexpr int kGuardSteps = 6;

class NonFiniteRunTest : public DistGptSuite<NonFiniteRunTest> {
 protected:

  static std::string train_args(const std::string& checkpoint) {
    return fmt::format(
        "train --model {} --data {} --train {}/dist-train.yaml --steps {} --no-progress "
        "--checkpoint {} --checkpoint-every 2",
        gpt_path_, data_, dir_->path(), kGuardSteps, checkpoint);
  }
  static std::string one_rank(const std::string& checkpoint, const std::string& extra = "") {
    return fmt::format("{} {} --batch {} --seq-len {} {}", ALLOY_BINARY, train_args(checkpoint), kTestGlobalBatch,
                       kTestSeqLen, extra);
  }
  static std::string four_ranks(const std::vector<TestStage>& stages, int micro_batches, const std::string& name,
                                const std::string& checkpoint) {
    const ModelSpec gpt = model_load(gpt_path_);
    const ClusterSpec cluster = cluster_load(cluster_path_, catalog_builtin());
    const std::string plan = dir_->path() + "/" + name + ".json";
    plan_save(test_plan(gpt, cluster, stages, Schedule::Schedule_1f1b, micro_batches), plan);
    return fmt::format("mpirun -np 4 --oversubscribe --bind-to none {} {} --plan {} --cluster {}", ALLOY_BINARY,
                       train_args(checkpoint), plan, cluster_path_);
  }
  static int count(const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
    return n;
  }
  // The checkpoint committed in `root` is from `step`, and every weight and moment of `rank`'s
  // files in it is finite.
  static void expect_finite_checkpoint(const std::string& root, int64_t step, int rank = 0) {
    ASSERT_EQ(checkpoint_manifest_read(root).step, step) << root;
    const std::string dir = checkpoint_rank_dir(root, step, rank);
    EXPECT_EQ(checkpoint_read_state(dir).step, step) << dir;
    for (const char* file : {kCheckpointModelFile, kCheckpointOptimizerFile}) {
      const SafetensorsFile tensors = safetensors_open(dir + "/" + file);
      for (const SafetensorsEntry& e : tensors.entries()) {
        std::vector<float> values((e.end_bytes - e.begin_bytes) / sizeof(float));
        tensors.entry_copy(e, values.data());
        for (float v : values) ASSERT_TRUE(std::isfinite(v)) << dir << "/" << file << ": " << e.name;
      }
    }
  }
};

TEST_F(NonFiniteRunTest, OneRankStopsAtTheStepNamingTheTensorAndTheLastCheckpoint) {
  const std::string ckpt = dir_->path() + "/one-rank";
  const CommandResult r = run_command("env ALLOY_FAULT=nan:0:5 " + one_rank(ckpt), 120);
  EXPECT_EQ(r.exit_code, kExitNonFinite) << r.output;
  EXPECT_NE(r.output.find("step 5: embed.token's gradient is not finite"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(fmt::format("the last good checkpoint is {} (step 4)", ckpt)), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the weights are those after step 4"), std::string::npos) << r.output;
  expect_finite_checkpoint(ckpt, 4);
  // What the message advises: continue from that checkpoint.
  const CommandResult resumed = run_command(one_rank(ckpt, "--resume"), 120);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("for steps 5..{}", kGuardSteps)), std::string::npos) << resumed.output;
  expect_finite_checkpoint(ckpt, kGuardSteps);
}

TEST_F(NonFiniteRunTest, FewerBadStepsThanTheLimitAreSkippedWithAWarning) {
  const std::string ckpt = dir_->path() + "/tolerated";
  const CommandResult r = run_command("env ALLOY_FAULT=nan:0:3 " + one_rank(ckpt, "--max-bad-steps 2"), 120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: step 3: embed.token's gradient is not finite"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 of --max-bad-steps 2 in a row"), std::string::npos) << r.output;
  expect_finite_checkpoint(ckpt, kGuardSteps);
}

TEST_F(NonFiniteRunTest, NonFiniteSettingsAreRefusedBeforeTraining) {
  const std::string ckpt = dir_->path() + "/refused";
  CommandResult r = run_command(one_rank(ckpt, "--lr inf"), 60);
  EXPECT_EQ(r.exit_code, kExitBadInput) << r.output;
  EXPECT_NE(r.output.find("--lr: 'inf' is not a finite number"), std::string::npos) << r.output;
  r = run_command(one_rank(ckpt, "--max-bad-steps 0"), 60);
  EXPECT_EQ(r.exit_code, kExitBadInput) << r.output;
  EXPECT_NE(r.output.find("--max-bad-steps"), std::string::npos) << r.output;
}

TEST_F(NonFiniteRunTest, PipelineOfFourStopsOnEveryRankAtTheStep) {
  const std::string ckpt = dir_->path() + "/pp4";
  const std::string command =
      four_ranks({{1, 1, 0, {2}}, {1, 1, 0, {2}}, {1, 1, 0, {1}}, {1, 1, 0, {1}}}, 4, "pp4", ckpt);
  const CommandResult r = run_command("env ALLOY_FAULT=nan:2:3 " + command, 120);
  EXPECT_EQ(r.exit_code, kExitNonFinite) << r.output;
  EXPECT_EQ(count(r.output, "step 3: layers.4.attn_norm.weight's gradient on rank 2 is not finite"), 1) << r.output;
  EXPECT_NE(r.output.find(fmt::format("the last good checkpoint is {} (step 2)", ckpt)), std::string::npos) << r.output;
  for (int rank = 0; rank < 4; ++rank) expect_finite_checkpoint(ckpt, 2, rank);
}

TEST_F(NonFiniteRunTest, TensorParallelPipelineNamesTheSliceOnTheSecondTensorRank) {
  // Tensor rank 1 leaves the replicated norms to tensor rank 0: its first counted gradient is a slice.
  const std::string ckpt = dir_->path() + "/tp2pp2";
  const std::string command = four_ranks({{2, 1, 0, {3}}, {2, 1, 0, {3}}}, 2, "tp2pp2", ckpt);
  const CommandResult r = run_command("env ALLOY_FAULT=nan:3:3 " + command, 120);
  EXPECT_EQ(r.exit_code, kExitNonFinite) << r.output;
  EXPECT_EQ(count(r.output, "step 3: layers.3.attn.qkv.weight's gradient on rank 3 is not finite"), 1) << r.output;
  for (int rank = 0; rank < 4; ++rank) expect_finite_checkpoint(ckpt, 2, rank);
}

TEST_F(NonFiniteRunTest, DataParallelOfFourUnderZeroOneStopsOnEveryRankAtTheStep) {
  const std::string ckpt = dir_->path() + "/dp4";
  const std::string command = four_ranks({{1, 4, 1, {6}}}, 1, "dp4", ckpt);
  const CommandResult r = run_command("env ALLOY_FAULT=nan:1:3 " + command, 120);
  EXPECT_EQ(r.exit_code, kExitNonFinite) << r.output;
  EXPECT_EQ(count(r.output, "on rank 1 is not finite"), 1) << r.output;
  EXPECT_NE(r.output.find("step 3: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(fmt::format("the last good checkpoint is {} (step 2)", ckpt)), std::string::npos) << r.output;
  for (int rank = 0; rank < 4; ++rank) expect_finite_checkpoint(ckpt, 2, rank);
}

}  // namespace
}  // namespace alloy::testing
