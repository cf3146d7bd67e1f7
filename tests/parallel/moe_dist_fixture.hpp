// The MoE suites' fixture: tiny-moe plans on the eight-device CPU cluster, runs of them under
// mpirun, their losses and exported weights against one rank's, and the cost model's arena
// memory against a run's measured peak.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"
#include "dist_plans.hpp"
#include "hw/catalog.hpp"
#include "runtime/memory_terms.hpp"
#include "search/planner.hpp"
#include "runtime/io/safetensors.hpp"

namespace alloy::testing {

constexpr int kMoeSteps = 12;
constexpr Schedule kMoe1f1b = Schedule::Schedule_1f1b;

class MoeDistFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    cluster_path_ = dir_->write("local-cpu-8.yaml", kCpu8Yaml);
    data_ = dist_test_setup(*dir_);
    ASSERT_FALSE(data_.empty()) << "alloy tokenize failed";
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string tiny_moe_path() { return std::string(ALLOY_SOURCE_DIR) + "/examples/models/tiny-moe.yaml"; }
  static ModelSpec moe() { return model_load(model_path_); }
  static ClusterSpec cluster() { return cluster_load(cluster_path_, catalog_builtin()); }

  // `stages` with every stage's routed experts split over `ep` members (experts_per_member when given).
  static Plan moe_plan(const std::vector<TestStage>& stages, int micro_batches, int ep,
                       const std::vector<int>& experts_per_member = {}, Schedule schedule = kMoe1f1b) {
    Plan plan = test_plan(moe(), cluster(), stages, schedule, micro_batches);
    for (PlanStage& st : plan.stages) {
      st.ep = ep;
      st.experts_per_member = experts_per_member;
    }
    return plan;
  }

  static std::string train_command(const Plan& plan, const std::string& name, int steps, const std::string& extra) {
    const std::string plan_path = dir_->path() + "/" + name + ".json";
    plan_save(plan, plan_path);
    const std::string launch = plan.num_used_devices() > 1
                                   ? fmt::format("mpirun -np {} --oversubscribe --bind-to none ", plan.num_used_devices())
                                   : "";
    return fmt::format("{}{} train --model {} --data {} --train {}/dist-train.yaml --steps {} --no-progress --plan {} "
                       "--cluster {} {}",
                       launch, ALLOY_BINARY, model_path_, data_, dir_->path(), steps, plan_path, cluster_path_, extra);
  }

  // The `key` of every step of a run's log: "loss" (the cross-entropy) or "aux_loss".
  static std::vector<double> losses(const std::string& log, const std::string& key = "loss") {
    std::vector<double> out;
    std::istringstream in(read_text(log));
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at(key).get<double>());
    return out;
  }

  // Largest relative difference between two runs' values, expected within 1e-6.
  static double expect_close(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
    EXPECT_EQ(got.size(), want.size()) << what;
    if (got.size() != want.size() || got.empty()) return 0;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
    EXPECT_LT(worst, 1e-6) << what << ": largest relative difference";
    return worst;
  }

  // The first step's tokens per expert (num_layers x experts) of a run's step log.
  static std::vector<int64_t> first_expert_tokens(const std::string& log) {
    std::istringstream in(read_text(log));
    std::string line;
    std::getline(in, line);
    return nlohmann::json::parse(line).at("expert_tokens").get<std::vector<int64_t>>();
  }

  // A run's step log: the cross-entropy and the load-balancing loss of every step.
  struct RunLosses {
    std::vector<double> loss, aux;
  };

  // Runs `plan`; returns its losses, and the weights it exported in `weights`.
  static RunLosses run(const Plan& plan, const std::string& name, std::string* weights) {
    const std::string out = dir_->path() + "/" + name;
    CommandResult r = run_command(train_command(plan, name, kMoeSteps, fmt::format("--log {0}.jsonl --export {0}.safetensors", out)), 300);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (r.exit_code != 0) return {};
    *weights = out + ".safetensors";
    return {losses(out + ".jsonl"), losses(out + ".jsonl", "aux_loss")};
  }

  // One rank running the same model and micro-batches.
  static const std::pair<RunLosses, std::string>& reference(int micro_batches) {
    // By the suite's folder too: suites sharing this fixture each run their own reference.
    static std::map<std::pair<std::string, int>, std::pair<RunLosses, std::string>> cache;
    const std::pair<std::string, int> key{dir_->path() + " " + model_path_, micro_batches};
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    std::string weights;
    const int layers = static_cast<int>(moe().num_layers);
    const RunLosses l = run(moe_plan({{1, 1, 0, {layers}}}, micro_batches, 1),
                            fmt::format("ref-{}-{}", moe().name, micro_batches), &weights);
    return cache[key] = {l, weights};
  }

  // Largest relative loss difference of `plan` against one rank; expects it, and that of the
  // load-balancing loss, within 1e-6 and the final weights within 1e-5 of each other.
  static double expect_matches_one_rank(const Plan& plan, const std::string& name) {
    const auto& [ref, ref_weights] = reference(plan.num_micro_batches);
    std::string weights;
    const RunLosses got = run(plan, name, &weights);
    if (got.loss.size() != ref.loss.size() || got.loss.empty()) {
      ADD_FAILURE() << name << ": " << got.loss.size() << " steps logged, the reference " << ref.loss.size();
      return 0;
    }
    const double worst = expect_close(got.loss, ref.loss, name + " loss");
    const double worst_aux = expect_close(got.aux, ref.aux, name + " aux_loss");
    // From the same weights every token picks the same experts, whichever rank routes it.
    EXPECT_EQ(first_expert_tokens(dir_->path() + "/" + name + ".jsonl"),
              first_expert_tokens(ref_weights.substr(0, ref_weights.size() - std::string(".safetensors").size()) + ".jsonl"))
        << name;
    SafetensorsFile a = safetensors_open(ref_weights);
    SafetensorsFile b = safetensors_open(weights);
    EXPECT_EQ(a.entries().size(), b.entries().size()) << name;
    double weight_worst = 0;
    for (const SafetensorsEntry& ea : a.entries()) {
      const SafetensorsEntry* eb = b.entry_find(ea.name);
      EXPECT_NE(eb, nullptr) << name << ": " << ea.name;
      if (eb == nullptr || ea.shape != eb->shape) return worst;
      std::vector<float> x((ea.end_bytes - ea.begin_bytes) / 4), y(x.size());
      a.entry_copy(ea, x.data());
      b.entry_copy(*eb, y.data());
      for (size_t i = 0; i < x.size(); ++i) weight_worst = std::max(weight_worst, static_cast<double>(std::abs(x[i] - y[i])));
    }
    EXPECT_LT(weight_worst, 1e-5) << name << ": largest weight difference";
    std::printf("%-28s largest relative difference: loss %.3g, aux loss %.3g; largest weight difference %.3g\n",
                name.c_str(), worst, worst_aux, weight_worst);
    return worst;
  }

  // Trains `plan` one step and returns its arena memory per device as the cost model predicts it,
  // priced with the routing the step measured (the training file's expert_tokens), over the
  // fullest rank's measured arena peak; 0 when the run failed.
  static double predicted_over_measured_peak(Plan plan, const std::string& name) {
    const std::string log = dir_->path() + "/" + name + ".jsonl";
    const CommandResult r = run_command(train_command(plan, name, 1, "--log " + log), 120);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (r.exit_code != 0) return 0;
    const nlohmann::json step = nlohmann::json::parse(read_text(log));
    double fullest = 0;
    for (const nlohmann::json& rank : step.at("ranks")) fullest = std::max(fullest, rank.at("peak_arena_bytes").get<double>());
    TrainSpec train = train_load(dir_->path() + "/dist-train.yaml");
    train.expert_tokens = step.at("expert_tokens").get<std::vector<double>>();
    plan_evaluate(&plan, CostModel(moe(), cluster(), train));
    double predicted = 0;
    for (double bytes : memory_terms_predicted(plan.stages[0].memory, false)) predicted += bytes;
    std::printf("%s arena peak: predicted %.0f bytes, measured %.0f (fullest rank), %+.1f%%\n", name.c_str(), predicted,
                fullest, 100.0 * (predicted / fullest - 1.0));
    return predicted / fullest;
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string cluster_path_, data_;
  static inline std::string model_path_ = tiny_moe_path();  // the model the plans and runs use
};

}  // namespace alloy::testing
