// Checkpoints across layouts: a run checkpointed under one plan resumes under another (other rank
// count, pipeline split, tensor parallelism, ZeRO stage, uneven replicas, offload), each rank
// reading the slices of the full tensors it holds from the writers' files. The losses after the
// resume match the uninterrupted run of the first plan (fp32: the plans differ only in the order
// of their sums); a checkpoint of another model is refused naming the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"
#include "dist_plans.hpp"
#include "hw/catalog.hpp"

namespace alloy::testing {
namespace {

constexpr int kReshardSteps = 6;
constexpr int kReshardSavedStep = 3;
// The issue's bound for a resumed curve against an uninterrupted one (fp32); the test prints the
// largest difference it measured. The plans' own equivalence tests hold them to 1e-6.
constexpr double kReshardLossTolerance = 1e-5;

class ReshardTest : public DistGptSuite<ReshardTest> {
 protected:
  static ClusterSpec cluster() { return cluster_load(cluster_path_, catalog_builtin()); }

  struct Layout {
    std::string name;
    Plan plan;
  };

  // The six layouts of the matrix; R for recomputation.
  static std::vector<Layout> layouts() {
    using R = Recompute;
    const ModelSpec gpt = model_load(gpt_path_);
    Plan uneven = with_uneven_replicas(test_plan(gpt, cluster(), {{1, 2, 1, {6}}}, Schedule::Schedule_1f1b, 2), 0, {3, 1});
    uneven.stages[0].offload = {false, true, true, false, false, true};
    return {
        {"one-rank", test_plan(gpt, cluster(), {{1, 1, 0, {6}}}, Schedule::Schedule_1f1b, 2)},
        {"pp2", test_plan(gpt, cluster(), {{1, 1, 0, {2}}, {1, 1, 0, {4}}}, Schedule::Schedule_1f1b, 4)},
        {"tp2", test_plan(gpt, cluster(), {{2, 1, 0, {6}, {R::Recompute_full}}}, Schedule::Schedule_1f1b, 2)},
        {"dp4-zero3", test_plan(gpt, cluster(), {{1, 4, 3, {6}}}, Schedule::Schedule_1f1b, 2)},
        {"pp2-tp2", test_plan(gpt, cluster(), {{2, 1, 0, {3}}, {2, 1, 0, {3}, {}, true}}, Schedule::Schedule_1f1b, 4)},
        {"uneven-dp-offload", uneven},
    };
  }

  static CommandResult train(const Plan& plan, const std::string& name, int steps, const std::string& extra) {
    const std::string plan_path = dir_->path() + "/" + name + ".json";
    plan_save(plan, plan_path);
    return run_command(fmt::format("mpirun -np {} --oversubscribe --bind-to none {} train --model {} --data {} --train "
                                   "{}/dist-train.yaml --steps {} --no-progress --plan {} --cluster {} --log {}/{}.jsonl {}",
                                   plan.num_used_devices(), ALLOY_BINARY, gpt_path_, data_, dir_->path(), steps, plan_path,
                                   cluster_path_, dir_->path(), name, extra),
                       300);
  }

  static std::vector<double> losses(const std::string& name) {
    std::vector<double> out;
    std::istringstream in(read_text(dir_->path() + "/" + name + ".jsonl"));
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
    return out;
  }
};

TEST_F(ReshardTest, EveryLayoutResumesUnderThreeOthers) {
  const std::vector<Layout> all = layouts();
  double worst = 0;
  for (size_t a = 0; a < all.size(); ++a) {
    const Layout& from = all[a];
    ASSERT_EQ(train(from.plan, from.name + "-full", kReshardSteps, "").exit_code, 0) << from.name;
    const std::string saved = dir_->path() + "/ck-" + from.name;
    const CommandResult part = train(from.plan, from.name + "-part", kReshardSavedStep, "--checkpoint " + saved);
    ASSERT_EQ(part.exit_code, 0) << from.name << "\n" << part.output;
    const std::vector<double> want = losses(from.name + "-full");
    ASSERT_EQ(want.size(), static_cast<size_t>(kReshardSteps)) << from.name;
    for (size_t k = 1; k <= 3; ++k) {
      const Layout& to = all[(a + k) % all.size()];
      const std::string name = from.name + "-to-" + to.name;
      const std::string copy = dir_->path() + "/ck-" + name;
      std::filesystem::copy(saved, copy, std::filesystem::copy_options::recursive);
      std::filesystem::remove(copy + "/.lock");
      const CommandResult r = train(to.plan, name, kReshardSteps, fmt::format("--checkpoint {} --resume", copy));
      ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
      EXPECT_NE(r.output.find("resharded checkpoint step 3"), std::string::npos) << name << "\n" << r.output;
      const std::vector<double> got = losses(name);
      ASSERT_EQ(got.size(), static_cast<size_t>(kReshardSteps - kReshardSavedStep)) << name;
      for (size_t i = 0; i < got.size(); ++i) {
        const double expected = want[static_cast<size_t>(kReshardSavedStep) + i];
        worst = std::max(worst, std::abs(got[i] - expected) / expected);
        EXPECT_NEAR(got[i], expected, kReshardLossTolerance * expected) << name << " step " << kReshardSavedStep + 1 + static_cast<int>(i);
      }
    }
  }
  std::printf("18 resumes under another layout: largest loss difference from the uninterrupted run %.2e (relative)\n", worst);
}

TEST_F(ReshardTest, AColumnSplitMatrixIsOneStridedRun) {
  // Under tp 2, attn.out.weight (C x C) keeps half of each row: C runs of C / 2, written as one.
  const Layout tp2 = layouts()[2];
  const std::string saved = dir_->path() + "/ck-strided";
  ASSERT_EQ(train(tp2.plan, "strided", 1, "--checkpoint " + saved).exit_code, 0);
  const nlohmann::json state =
      nlohmann::json::parse(read_text(saved + "/step-00000001/rank-00001/checkpoint.json"));
  const nlohmann::json& runs = state.at("global_layout").at("model").at("layers.0.attn.out.weight");
  ASSERT_EQ(runs.size(), 1u) << runs.dump();
  const int64_t C = model_load(gpt_path_).hidden_size;
  EXPECT_EQ(runs[0], nlohmann::json({"layers.0.attn.out.weight", C / 2, C / 2, 0, C, C})) << runs.dump();
}

TEST_F(ReshardTest, ReplanMovesTheRunToTheDevicesLeft) {
  // Four ranks checkpoint step 3; two devices remain: `alloy replan` plans the checkpoint's model
  // and setup for them, and the run resumes on the new plan, continuing the four-rank losses.
  const Layout from = layouts()[4];  // pp 2 x tp 2
  ASSERT_EQ(train(from.plan, "replan-full", kReshardSteps, "").exit_code, 0);
  const std::string saved = dir_->path() + "/ck-replan";
  ASSERT_EQ(train(from.plan, "replan-part", kReshardSavedStep, "--checkpoint " + saved).exit_code, 0);
  const std::string pair = dir_->write("local-cpu-2.yaml", R"(name: local-cpu-2
device_types:
  cpu-fast: {base: cpu, memory: 2GiB}
nodes:
  - {name: host, count: 1, device: cpu-fast, devices_per_node: 2, host_memory: 16GiB}
)");
  const std::string next = dir_->path() + "/replanned.json";
  const CommandResult planned =
      run_command(fmt::format("{} replan --checkpoint {} --cluster {} -o {} --no-simulate", ALLOY_BINARY, saved, pair, next));
  ASSERT_EQ(planned.exit_code, 0) << planned.output;
  EXPECT_NE(planned.output.find("Re-planning step 3 of gpt-6"), std::string::npos) << planned.output;
  EXPECT_NE(planned.output.find("--checkpoint " + saved + " --resume"), std::string::npos) << planned.output;
  const Plan plan = plan_load(next);
  ASSERT_LE(plan.num_used_devices(), 2);
  const CommandResult r = run_command(
      fmt::format("mpirun -np {} --oversubscribe --bind-to none {} train --plan {} --data {} --steps {} --no-progress "
                  "--checkpoint {} --resume --log {}/replan-resumed.jsonl",
                  plan.num_used_devices(), ALLOY_BINARY, next, data_, kReshardSteps, saved, dir_->path()),
      300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resharded checkpoint step 3"), std::string::npos) << r.output;
  const std::vector<double> want = losses("replan-full"), got = losses("replan-resumed");
  ASSERT_EQ(got.size(), static_cast<size_t>(kReshardSteps - kReshardSavedStep));
  for (size_t i = 0; i < got.size(); ++i) {
    const double expected = want[static_cast<size_t>(kReshardSavedStep) + i];
    EXPECT_NEAR(got[i], expected, kReshardLossTolerance * expected) << "step " << kReshardSavedStep + 1 + static_cast<int>(i);
  }
}

TEST_F(ReshardTest, ACheckpointOfAnotherModelIsRefusedNamingBothModels) {
  // A wider model: the run refuses before any step, naming the checkpoint's model and its own.
  const std::vector<Layout> all = layouts();
  const std::string saved = dir_->path() + "/ck-model";
  ASSERT_EQ(train(all[1].plan, "model-part", kReshardSavedStep, "--checkpoint " + saved).exit_code, 0);
  std::string wide = kGpt6Yaml;
  wide.replace(wide.find("ffn_hidden_size: 128"), 20, "ffn_hidden_size: 256");
  const std::string wide_path = dir_->write("gpt-6-wide.yaml", wide);
  Plan other = test_plan(model_load(wide_path), cluster(), {{1, 1, 0, {6}}}, Schedule::Schedule_1f1b, 2);
  const std::string plan_path = dir_->path() + "/wide.json";
  plan_save(other, plan_path);
  const CommandResult r = run_command(fmt::format("{} train --model {} --data {} --train {}/dist-train.yaml --steps 6 "
                                                  "--no-progress --plan {} --cluster {} --checkpoint {} --resume",
                                                  ALLOY_BINARY, wide_path, data_, dir_->path(), plan_path, cluster_path_, saved),
                                      120);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the checkpoint is of another model"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fingerprint"), std::string::npos) << r.output;
}

TEST_F(ReshardTest, ARankChecksOnlyTheWritersItReadsFrom) {
  // A pp 2 checkpoint resumed under the same split with other micro-batches (another layout): the
  // new first stage reads only writer 0, the second only writer 1. With writer 1's optimizer file
  // cut short, only the second stage's rank finds it, and the run stops before any step.
  const Plan written = layouts()[1].plan;
  Plan other = written;
  other.num_micro_batches = 2;
  other.micro_batch_sequences = written.global_batch_sequences / 2;
  const std::string saved = dir_->path() + "/ck-partial";
  ASSERT_EQ(train(written, "partial-part", kReshardSavedStep, "--checkpoint " + saved).exit_code, 0);
  const std::string victim = saved + "/step-00000003/rank-00001/optimizer.safetensors";
  std::filesystem::resize_file(victim, std::filesystem::file_size(victim) / 2);
  const CommandResult r = train(other, "partial-resume", kReshardSteps, fmt::format("--checkpoint {} --resume", saved));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("rank 1 of 2: " + victim + ": file differs from the one committed"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("rank 0 of 2"), std::string::npos) << "rank 0 read writer 1's files\n" << r.output;
}

TEST_F(ReshardTest, ADamagedWriterFileIsRefusedNamingIt) {
  // Resharding reads every writer's files: one cut short is named before any step runs.
  const std::vector<Layout> all = layouts();
  const std::string saved = dir_->path() + "/ck-damaged";
  ASSERT_EQ(train(all[3].plan, "damaged-part", kReshardSavedStep, "--checkpoint " + saved).exit_code, 0);
  const std::string victim = saved + "/step-00000003/rank-00002/optimizer.safetensors";
  ASSERT_TRUE(std::filesystem::exists(victim));
  std::filesystem::resize_file(victim, std::filesystem::file_size(victim) / 2);
  const CommandResult r = train(all[0].plan, "damaged-resume", kReshardSteps, fmt::format("--checkpoint {} --resume", saved));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("rank-00002/optimizer.safetensors"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 4"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace alloy::testing
