// Dynamic loss scaling (TrainSpec::loss_scaling), run for real on CPU ranks: scaling by powers of
// two changes no loss, on one rank and on four (a pipeline of data-parallel ZeRO 2 stages); the
// scale grows after its interval; an overflow (a NaN injected with ALLOY_FAULT=nan:R:S) is
// absorbed by halving the scale, not counted as a bad step; a resumed run goes on with the scale
// it had reached.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"
#include "dist_plans.hpp"
#include "hw/catalog.hpp"
#include "runtime/trainer_setup.hpp"

namespace alloy::testing {
namespace {

constexpr int kScalingSteps = 6;
// The suite's training setup with `scaling` lines appended.
std::string scaling_train_yaml(const std::string& scaling) {
  return "seq_len: 32\nglobal_batch: 8\nprecision: fp32\noptimizer: adamw\nsteps: 200\nlearning_rate: 1.0e-3\n"
         "min_learning_rate: 1.0e-4\nwarmup_steps: 10\nweight_decay: 0.1\ngrad_clip: 1.0\nseed: 1234\n" + scaling;
}

// One logged step: its loss and the loss scale its backward ran with (1 when not logged).
struct LoggedStep {
  double loss = 0;
  double scale = 1;
  bool overflow = false;
};

std::vector<LoggedStep> log_read(const std::string& path) {
  std::vector<LoggedStep> steps;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    steps.push_back({j.at("loss").get<double>(), j.value("loss_scale", 1.0), j.value("loss_scale_overflow", false)});
  }
  return steps;
}

class LossScalingTest : public DistGptSuite<LossScalingTest> {
 protected:
  // Trains `steps` steps on one rank (or under `plan` on four) with the scaling lines, logging
  // to `name`.jsonl; returns the command's result.
  static CommandResult train(const std::string& name, const std::string& scaling, const std::string& extra = "",
                             const std::string& plan = "", int steps = kScalingSteps) {
    const std::string yaml = dir_->write(name + "-train.yaml", scaling_train_yaml(scaling));
    const std::string args = fmt::format("train --model {} --data {} --train {} --steps {} --no-progress --log {}/{}.jsonl {}",
                                         gpt_path_, data_, yaml, steps, dir_->path(), name, extra);
    if (plan.empty())
      return run_command(fmt::format("{} {} --batch {} --seq-len {}", ALLOY_BINARY, args, kTestGlobalBatch, kTestSeqLen), 120);
    return run_command(fmt::format("mpirun -np 4 --oversubscribe --bind-to none {} {} --plan {} --cluster {}", ALLOY_BINARY,
                                   args, plan, cluster_path_),
                       180);
  }
  static std::vector<LoggedStep> logged(const std::string& name) { return log_read(dir_->path() + "/" + name + ".jsonl"); }
};

// Scaling by 2^16 (and doubling it every two steps) is exact in fp32: every loss equals the
// unscaled run's, bit for bit, while the log shows the scale growing.
TEST_F(LossScalingTest, PowerOfTwoScalingChangesNoLossAndGrowsOnSchedule) {
  ASSERT_EQ(train("plain", "").exit_code, 0);
  const CommandResult r = train("scaled", "loss_scaling: dynamic\ninitial_loss_scale: 65536\nloss_scale_growth_interval: 2\n");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<LoggedStep> plain = logged("plain"), scaled = logged("scaled");
  ASSERT_EQ(plain.size(), static_cast<size_t>(kScalingSteps));
  ASSERT_EQ(scaled.size(), plain.size());
  const std::vector<double> scales = {65536, 65536, 131072, 131072, 262144, 262144};
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(scaled[i].loss, plain[i].loss) << "step " << i + 1;
    EXPECT_EQ(scaled[i].scale, scales[i]) << "step " << i + 1;
    EXPECT_EQ(plain[i].scale, 1) << "a CPU rank computes in fp32: auto scales nothing";
  }
}

// The same across a pipeline of two data-parallel stages whose ZeRO 2 reduce-scatters carry the
// scaled gradients.
TEST_F(LossScalingTest, ScaledDistributedRunMatchesTheUnscaledOne) {
  const ModelSpec gpt = model_load(gpt_path_);
  const ClusterSpec cluster = cluster_load(cluster_path_, catalog_builtin());
  const std::string plan = dir_->path() + "/pp2-dp2-zero2.json";
  plan_save(test_plan(gpt, cluster, {{1, 2, 2, {3}}, {1, 2, 2, {3}}}, Schedule::Schedule_1f1b, 2), plan);
  ASSERT_EQ(train("dist-plain", "", "", plan, 4).exit_code, 0);
  const CommandResult r = train("dist-scaled", "loss_scaling: dynamic\nloss_scale_growth_interval: 2\n", "", plan, 4);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<LoggedStep> plain = logged("dist-plain"), scaled = logged("dist-scaled");
  ASSERT_EQ(scaled.size(), 4u);
  for (size_t i = 0; i < scaled.size(); ++i) EXPECT_EQ(scaled[i].loss, plain[i].loss) << "step " << i + 1;
  EXPECT_EQ(scaled[3].scale, 2 * 65536.0);
}

// A non-finite gradient under dynamic scaling is an overflow: the step is skipped, the scale
// halved and training goes on (no bad-step warning, exit 0); without scaling the same fault is a
// bad step that stops the run.
TEST_F(LossScalingTest, AnOverflowHalvesTheScaleAndTrainingGoesOn) {
  const std::string yaml = dir_->write("overflow-train.yaml", scaling_train_yaml("loss_scaling: dynamic\n"));
  const CommandResult scaled = run_command(
      fmt::format("env ALLOY_FAULT=nan:0:3 {} train --model {} --data {} --train {} --steps {} --no-progress --log "
                  "{}/overflow.jsonl --batch {} --seq-len {}",
                  ALLOY_BINARY, gpt_path_, data_, yaml, kScalingSteps, dir_->path(), kTestGlobalBatch, kTestSeqLen),
      120);
  ASSERT_EQ(scaled.exit_code, 0) << scaled.output;
  EXPECT_NE(scaled.output.find("step 3: the gradients overflowed at loss scale 65536; the update was skipped and the "
                               "scale halved to 32768"),
            std::string::npos)
      << scaled.output;
  EXPECT_EQ(scaled.output.find("warning"), std::string::npos) << scaled.output;
  const std::vector<LoggedStep> steps = logged("overflow");
  ASSERT_EQ(steps.size(), static_cast<size_t>(kScalingSteps));
  EXPECT_TRUE(steps[2].overflow);
  EXPECT_EQ(steps[2].scale, 65536);
  EXPECT_EQ(steps[3].scale, 32768);
  EXPECT_FALSE(steps[3].overflow);
}

// A run stopped at step 4 and resumed goes on with the scale it had reached: the scales and
// losses of steps 5 and 6 are those of the uninterrupted run.
TEST_F(LossScalingTest, AResumedRunKeepsItsScale) {
  const std::string scaling = "loss_scaling: dynamic\nloss_scale_growth_interval: 3\n";
  ASSERT_EQ(train("whole", scaling).exit_code, 0);
  const std::string ckpt = dir_->path() + "/scaled-ckpt";
  ASSERT_EQ(train("first", scaling, "--checkpoint " + ckpt, "", 4).exit_code, 0);
  const CommandResult resumed = train("rest", scaling, "--checkpoint " + ckpt + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::vector<LoggedStep> whole = logged("whole"), rest = logged("rest");
  ASSERT_EQ(rest.size(), 2u);
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].scale, whole[4 + i].scale) << "step " << 5 + i;
    EXPECT_EQ(rest[i].loss, whole[4 + i].loss) << "step " << 5 + i;
  }
  EXPECT_EQ(whole[3].scale, 2 * 65536.0) << "doubled after three good steps";
}

TEST_F(LossScalingTest, BadSettingsAreRefusedByField) {
  for (const auto& [lines, field] : {std::pair{"loss_scaling: sometimes\n", "loss_scaling"},
                                     std::pair{"initial_loss_scale: 0\n", "initial_loss_scale"},
                                     std::pair{"loss_scale_growth_interval: 0\n", "loss_scale_growth_interval"}}) {
    const CommandResult r = train("refused", lines);
    EXPECT_EQ(r.exit_code, kExitBadInput) << r.output;
    EXPECT_NE(r.output.find(field), std::string::npos) << r.output;
  }
}

// What cuts a ZeRO stage's pieces is part of the layout a checkpoint is checked against: the
// bucket size and the bytes of a gradient element it counts (a checkpoint whose buckets were cut
// at 2 bytes an element is resharded, not loaded into shifted places).
TEST(LayoutFingerprint, FollowsTheBytesThatCutTheBuckets) {
  const ModelSpec gpt = model_load_text(kGpt6Yaml, "gpt-6.yaml");
  const ClusterSpec cluster = cluster_load_text(kCpu8Yaml, "local-cpu-8.yaml", "local-cpu-8", catalog_builtin());
  const Plan plan = test_plan(gpt, cluster, {{1, 2, 1, {6}}}, Schedule::Schedule_1f1b, 2);
  Plan half = plan;
  half.gradient_bytes = 2;
  EXPECT_NE(plan_layout_fingerprint(half), plan_layout_fingerprint(plan));
  Plan wider = plan;
  wider.gradient_bucket_bytes *= 2;
  EXPECT_NE(plan_layout_fingerprint(wider), plan_layout_fingerprint(plan));
}

}  // namespace
}  // namespace alloy::testing
