// The distributed runtime against the single-rank one: plans covering each parallel dimension
// alone and combined run for 20 steps under mpirun; losses and final weights must match the
// single-rank run. Also resume, killed and failing ranks, and bad input on every rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"
#include "dist_plans.hpp"
#include "hw/catalog.hpp"
#include "runtime/io/safetensors.hpp"
#include "runtime/shard.hpp"

namespace alloy::testing {
namespace {

constexpr int kSteps = 20;

std::string mpirun(int ranks) {
  return fmt::format("mpirun -np {} --oversubscribe --bind-to none", ranks);
}

class DistTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
    setenv("ALLOY_THREADS", "1", 0);
    dir_ = new TempDir();
    gpt_path_ = dir_->write("gpt-6.yaml", kGpt6Yaml);
    llama_path_ = dir_->write("llama-4.yaml", kLlama4Yaml);
    cluster_path_ = dir_->write("local-cpu-8.yaml", kCpu8Yaml);
    data_ = dir_->path() + "/data.bin";
    CommandResult r = run_command(fmt::format("{} tokenize {}/examples/data/fsf_licenses.txt -o {}", ALLOY_BINARY,
                                              ALLOY_SOURCE_DIR, data_));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }

  static ModelSpec gpt() { return model_load(gpt_path_); }
  static ModelSpec llama() { return model_load(llama_path_); }
  static ClusterSpec cluster() { return cluster_load(cluster_path_, catalog_builtin()); }

  static std::string common_args(const std::string& model_path) {
    return fmt::format("--model {} --data {} --train {}/examples/train/tiny-cpu.yaml --steps {} --no-progress",
                       model_path, data_, ALLOY_SOURCE_DIR, kSteps);
  }

  // Single-rank run of the same batches: losses per step and the final weights' file.
  static const std::pair<std::vector<double>, std::string>& reference(const std::string& model_path) {
    static std::map<std::string, std::pair<std::vector<double>, std::string>> cache;
    auto it = cache.find(model_path);
    if (it != cache.end()) return it->second;
    const std::string out = dir_->path() + "/ref-" + std::to_string(cache.size());
    CommandResult r = run_command(fmt::format("{} train {} --batch {} --seq-len {} --log {}.jsonl --checkpoint {}",
                                              ALLOY_BINARY, common_args(model_path), kTestGlobalBatch, kTestSeqLen,
                                              out, out), 120);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return cache[model_path] = {losses(out + ".jsonl"), out + "/model.safetensors"};
  }

  static std::vector<double> losses(const std::string& log) {
    std::vector<double> out;
    std::istringstream in(read_text(log));
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
    return out;
  }

  // Runs `plan` under mpirun and compares losses and weights with the single-rank run.
  void expect_matches_single_rank(const Plan& plan, const std::string& model_path, const std::string& name) {
    const std::string plan_path = dir_->path() + "/" + name + ".json";
    plan_save(plan, plan_path);
    const std::string out = dir_->path() + "/" + name;
    CommandResult r = run_command(fmt::format("{} {} train {} --plan {} --cluster {} --log {}.jsonl --export {}.safetensors",
                                              mpirun(plan.num_used_devices()), ALLOY_BINARY, common_args(model_path),
                                              plan_path, cluster_path_, out, out), 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("predicted"), std::string::npos) << r.output;
    const auto& [ref_losses, ref_weights] = reference(model_path);
    const std::vector<double> got = losses(out + ".jsonl");
    ASSERT_EQ(got.size(), ref_losses.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], ref_losses[i], 1e-5 * std::abs(ref_losses[i])) << name << " step " << i + 1;
    SafetensorsFile a = safetensors_open(ref_weights);
    SafetensorsFile b = safetensors_open(out + ".safetensors");
    ASSERT_EQ(a.entries().size(), b.entries().size());
    double worst = 0;
    for (const SafetensorsEntry& ea : a.entries()) {
      const SafetensorsEntry* eb = b.entry_find(ea.name);
      ASSERT_NE(eb, nullptr) << ea.name;
      ASSERT_EQ(ea.shape, eb->shape) << ea.name;
      std::vector<float> x((ea.end_bytes - ea.begin_bytes) / 4), y(x.size());
      a.entry_copy(ea, x.data());
      b.entry_copy(*eb, y.data());
      for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(x[i] - y[i])));
    }
    EXPECT_LT(worst, 1e-4) << name << ": largest weight difference";
  }

  static TempDir* dir_;
  static std::string gpt_path_, llama_path_, cluster_path_, data_;
};

TempDir* DistTest::dir_ = nullptr;
std::string DistTest::gpt_path_, DistTest::llama_path_, DistTest::cluster_path_, DistTest::data_;

using R = Recompute;
constexpr Schedule k1f1b = Schedule::Schedule_1f1b;

TEST_F(DistTest, UnevenPipeline) {
  expect_matches_single_rank(test_plan(gpt(), cluster(), {{1, 1, 0, {4}}, {1, 1, 0, {2}}}, k1f1b, 4), gpt_path_, "pp-uneven");
}

TEST_F(DistTest, TensorParallel) {
  expect_matches_single_rank(test_plan(llama(), cluster(), {{2, 1, 0, {4}}}, k1f1b, 2), llama_path_, "tp2");
}

TEST_F(DistTest, TensorParallelTiedVocabulary) {
  expect_matches_single_rank(test_plan(gpt(), cluster(), {{2, 1, 0, {6}}}, k1f1b, 1), gpt_path_, "tp2-tied");
}

TEST_F(DistTest, DataParallel) {
  expect_matches_single_rank(test_plan(gpt(), cluster(), {{1, 2, 0, {6}}}, k1f1b, 2), gpt_path_, "dp2");
}

TEST_F(DistTest, Zero1) {
  expect_matches_single_rank(test_plan(llama(), cluster(), {{1, 2, 1, {4}}}, k1f1b, 2), llama_path_, "zero1");
}

TEST_F(DistTest, Zero2) {
  expect_matches_single_rank(test_plan(gpt(), cluster(), {{1, 2, 2, {6}}}, k1f1b, 4), gpt_path_, "zero2");
}

TEST_F(DistTest, Zero3) {
  expect_matches_single_rank(test_plan(llama(), cluster(), {{1, 2, 3, {4}}}, k1f1b, 2), llama_path_, "zero3");
}

TEST_F(DistTest, PipelineTensorDataParallel) {
  expect_matches_single_rank(test_plan(llama(), cluster(), {{2, 2, 1, {2}}, {2, 2, 0, {2}}}, k1f1b, 2), llama_path_,
                             "pp2-tp2-dp2");
}

TEST_F(DistTest, StagesWithDifferentDataParallelism) {
  expect_matches_single_rank(test_plan(gpt(), cluster(), {{1, 1, 0, {3}}, {1, 2, 2, {3}}}, k1f1b, 2), gpt_path_,
                             "dp-1-then-2");
}

TEST_F(DistTest, GPipeThreeStages) {
  expect_matches_single_rank(test_plan(gpt(), cluster(), {{1, 1, 0, {1}}, {1, 1, 0, {3}}, {1, 1, 0, {2}}},
                                       Schedule::Schedule_gpipe, 4),
                             gpt_path_, "gpipe-pp3");
}

TEST_F(DistTest, InterleavedOneFOneB) {
  expect_matches_single_rank(test_plan(llama(), cluster(), {{1, 1, 0, {1, 1}}, {1, 1, 0, {1, 1}}},
                                       Schedule::Schedule_interleaved, 4),
                             llama_path_, "interleaved");
}

TEST_F(DistTest, Recomputation) {
  expect_matches_single_rank(
      test_plan(gpt(), cluster(),
                {{1, 1, 0, {3}, {R::Recompute_full, R::Recompute_selective, R::Recompute_none}},
                 {1, 1, 0, {3}, {R::Recompute_selective, R::Recompute_full, R::Recompute_full}}},
                k1f1b, 4),
      gpt_path_, "recompute");
}

TEST_F(DistTest, TiedEmbeddingAcrossTensorParallelPipeline) {
  expect_matches_single_rank(test_plan(gpt(), cluster(), {{2, 1, 0, {2}}, {1, 2, 3, {2}}, {2, 1, 0, {2}}}, k1f1b, 2),
                             gpt_path_, "pp3-tp-tied");
}

}  // namespace
}  // namespace alloy::testing
