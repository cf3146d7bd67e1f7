// Mixture-of-Experts training on several CPU ranks against one rank: expert parallelism (each
// member holding some experts, tokens exchanged by all-to-all), data parallelism with the
// load-balancing loss over every replica's tokens, pipeline stages, tensor and sequence
// parallelism, uneven expert counts, ZeRO 1 and recomputation; losses and final weights must match the one-rank run of the same
// micro-batches. Also resume, and what is refused.
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
#include "runtime/io/checkpoint_commit.hpp"
#include "runtime/io/safetensors.hpp"

namespace alloy::testing {
namespace {

constexpr int kMoeSteps = 12;
constexpr Schedule kMoe1f1b = Schedule::Schedule_1f1b;

class MoeDistTest : public ::testing::Test {
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
    static std::map<std::pair<std::string, int>, std::pair<RunLosses, std::string>> cache;
    const std::pair<std::string, int> key{model_path_, micro_batches};
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

TEST_F(MoeDistTest, ExpertParallelOnTwoRanksMatchesOneRank) {
  expect_matches_one_rank(moe_plan({{1, 2, 0, {3}}}, 2, 2), "ep2");
}

TEST_F(MoeDistTest, DataParallelWithoutExpertParallelismMatchesOneRank) {
  expect_matches_one_rank(moe_plan({{1, 2, 0, {3}}}, 2, 1), "dp2");
}

TEST_F(MoeDistTest, FourReplicasInTwoExpertGroupsMatchOneRank) {
  expect_matches_one_rank(moe_plan({{1, 4, 0, {3}}}, 2, 2), "dp4-ep2");
}

TEST_F(MoeDistTest, PipelineStagesWithExpertParallelismMatchOneRank) {
  // Stage 0: the dense block and an MoE block; stage 1: an MoE block and the head.
  expect_matches_one_rank(moe_plan({{1, 2, 0, {2}}, {1, 2, 0, {1}}}, 4, 2), "pp2-dp2-ep2");
}

TEST_F(MoeDistTest, PerBlockBalanceOverPipelineStagesMatchesOneRank) {
  // DeepSeek's form: each MoE block's own f and P (over the stage's replicas), the blocks' terms
  // added over the stages; the pooled tiny-moe's tests above pool them over the stages instead.
  std::string yaml = read_text(tiny_moe_path());
  yaml.replace(yaml.find("name: tiny-moe"), 14, "name: moe-per-block");
  yaml.replace(yaml.find("balance_loss: pooled"), 20, "balance_loss: per_block");
  model_path_ = dir_->write("moe-per-block.yaml", yaml);
  expect_matches_one_rank(moe_plan({{1, 2, 0, {2}}, {1, 2, 0, {1}}}, 4, 2), "per-block-pp2-dp2-ep2");
  model_path_ = tiny_moe_path();
}

TEST_F(MoeDistTest, InterleavedChunksWithExpertParallelismMatchOneRank) {
  // tiny-moe with four blocks: two stages of two chunks of one block each.
  std::string yaml = read_text(tiny_moe_path());
  yaml.replace(yaml.find("name: tiny-moe"), 14, "name: moe-4");
  yaml.replace(yaml.find("layers: 3"), 9, "layers: 4");
  model_path_ = dir_->write("moe-4.yaml", yaml);
  const Plan plan = moe_plan({{1, 2, 0, {1, 1}}, {1, 2, 0, {1, 1}}}, 2, 2, {}, Schedule::Schedule_interleaved);
  expect_matches_one_rank(plan, "interleaved-dp2-ep2");
  model_path_ = tiny_moe_path();
}

TEST_F(MoeDistTest, UnevenExpertsPerMemberMatchOneRank) {
  const Plan plan = moe_plan({{1, 2, 0, {3}}}, 2, 2, {3, 1});
  expect_matches_one_rank(plan, "dp2-ep2-experts-3-1");
  // Unequal shares of each micro-batch (3 and 1 of its 4 sequences): f_e and P_e still count every token once.
  expect_matches_one_rank(with_uneven_replicas(plan, 0, {3, 1}), "dp2-ep2-shares-3-1");
  // Each member holds and saves only its experts: 0-2 on rank 0, 3 on rank 1 (of both MoE blocks).
  const std::string ck = dir_->path() + "/experts-3-1-ck";
  ASSERT_EQ(run_command(train_command(plan, "experts-3-1-ck", 1, "--checkpoint " + ck), 120).exit_code, 0);
  for (int rank = 0; rank < 2; ++rank) {
    SafetensorsFile f = safetensors_open(checkpoint_rank_dir(ck, 1, rank) + "/model.safetensors");
    for (int layer = 1; layer < 3; ++layer)
      for (int e = 0; e < 4; ++e) {
        const bool held = rank == 0 ? e < 3 : e == 3;
        const std::string name = fmt::format("layers.{}.mlp.experts.{}.down.weight", layer, e);
        EXPECT_EQ(f.entry_find(name) != nullptr, held) << "rank " << rank << ": " << name;
      }
    EXPECT_NE(f.entry_find("layers.1.mlp.router.weight"), nullptr) << "rank " << rank;
  }
}

TEST_F(MoeDistTest, ZeroAndRecomputationWithExpertParallelismMatchOneRank) {
  expect_matches_one_rank(moe_plan({{1, 4, 1, {3}}}, 2, 2), "dp4-ep2-zero1");
  expect_matches_one_rank(moe_plan({{1, 4, 2, {3}}}, 2, 2), "dp4-ep2-zero2");
  Plan sharded = moe_plan({{1, 2, 2, {3}}}, 2, 1);
  sharded.stages[0].shard_gradients = true;
  expect_matches_one_rank(sharded, "dp2-zero2-sharded-gradients");
  TestStage recomputed{1, 2, 0, {3}};
  recomputed.recompute = {Recompute::Recompute_full, Recompute::Recompute_full, Recompute::Recompute_selective};
  expect_matches_one_rank(moe_plan({recomputed}, 2, 2), "dp2-ep2-recompute");
}

TEST_F(MoeDistTest, TensorParallelismWithExpertsReplicatedOverItMatchesOneRank) {
  expect_matches_one_rank(moe_plan({{2, 1, 0, {3}}}, 2, 1), "tp2");
  TestStage sequence_parallel{2, 2, 0, {3}};
  sequence_parallel.sequence_parallel = true;
  expect_matches_one_rank(moe_plan({sequence_parallel}, 2, 2), "tp2-sp-dp2-ep2");

}

TEST_F(MoeDistTest, ExpertParallelRunResumesExactly) {
  // Each rank's experts with their moments per tensor, and under ZeRO 2 packed with its pieces.
  const std::vector<std::pair<Plan, std::string>> plans = {{moe_plan({{1, 2, 0, {3}}}, 2, 2), "ep"},
                                                           {moe_plan({{1, 2, 2, {3}}}, 2, 2), "ep-zero2"}};
  for (const auto& [plan, name] : plans) {
    const std::string ck = dir_->path() + "/" + name + "-ck";
    const std::string full_log = dir_->path() + "/" + name + "-full.jsonl";
    const std::string part_log = dir_->path() + "/" + name + "-part.jsonl";
    ASSERT_EQ(run_command(train_command(plan, name + "-full", 6, "--log " + full_log), 120).exit_code, 0);
    ASSERT_EQ(run_command(train_command(plan, name + "-part", 3, fmt::format("--checkpoint {} --log {}", ck, part_log)), 120)
                  .exit_code,
              0);
    CommandResult resumed =
        run_command(train_command(plan, name + "-part", 6, fmt::format("--checkpoint {} --resume --log {}", ck, part_log)), 120);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    for (const char* key : {"loss", "aux_loss"}) {
      const std::vector<double> full = losses(full_log, key), part = losses(part_log, key);
      ASSERT_EQ(full.size(), 6u);
      ASSERT_EQ(part.size(), 6u);
      for (size_t i = 0; i < full.size(); ++i) EXPECT_DOUBLE_EQ(full[i], part[i]) << name << " " << key << " step " << i + 1;
    }
  }
}

TEST_F(MoeDistTest, CheckpointOfOneExpertSplitResumesUnderAnother) {
  // ep 2 for three steps, then every expert on each replica (ep 1), then experts split 3 + 1: each
  // resume reshards the experts' parameters and moments by name, and the run goes on as one would.
  const Plan ep2 = moe_plan({{1, 2, 0, {3}}}, 2, 2);
  const Plan ep1 = moe_plan({{1, 2, 0, {3}}}, 2, 1);
  const Plan ep2_uneven = moe_plan({{1, 2, 0, {3}}}, 2, 2, {3, 1});
  const std::string ck = dir_->path() + "/split-ck";
  const std::string full_log = dir_->path() + "/split-full.jsonl", part_log = dir_->path() + "/split-part.jsonl";
  ASSERT_EQ(run_command(train_command(ep2, "split-full", 9, "--log " + full_log), 120).exit_code, 0);
  ASSERT_EQ(run_command(train_command(ep2, "split-part", 3, fmt::format("--checkpoint {} --log {}", ck, part_log)), 120).exit_code, 0);
  const std::string resume = fmt::format("--checkpoint {} --resume --log {}", ck, part_log);
  CommandResult r = run_command(train_command(ep1, "split-ep1", 6, resume), 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command(train_command(ep2_uneven, "split-3-1", 9, resume), 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> full = losses(full_log), part = losses(part_log);
  ASSERT_EQ(full.size(), 9u);
  ASSERT_EQ(part.size(), 9u);
  for (size_t i = 0; i < full.size(); ++i) EXPECT_NEAR(full[i], part[i], 1e-6 * std::abs(full[i])) << "step " << i + 1;
}

// The cost model prices what an expert-parallel member's arena holds at its peak, in the last MoE
// block's backward: the routing and expert activations (the arrived rows' buffers rounded up as
// the runtime rounds them) and the backward's buffers (the gradients of the experts' outputs and
// gathered inputs, the arrived gradients, their reordered copy and the experts' input
// gradients). The plan's arena memory per device is within 3% of the fullest member's peak.
TEST_F(MoeDistTest, PredictedMemoryOfAnExpertParallelRunMatchesItsArenaPeak) {
  EXPECT_NEAR(predicted_over_measured_peak(moe_plan({{1, 2, 0, {3}}}, 1, 2), "ep2-memory"), 1.0, 0.03);
}

// Under tensor parallelism every tp rank holds the router and the experts (routed and shared)
// whole and runs them on all of its replica's rows: the cost model prices them so, and the
// plan's arena memory per device is within 3% of the ranks' measured peak (+0.4%; pricing them
// split over tp, as the dense part is, put it 30.9% below).
TEST_F(MoeDistTest, PredictedMemoryOfATensorParallelRunCountsTheReplicatedExperts) {
  EXPECT_NEAR(predicted_over_measured_peak(moe_plan({{2, 1, 0, {3}}}, 1, 1), "tp2-memory"), 1.0, 0.03);
}

TEST_F(MoeDistTest, UnsupportedCombinationsAreRefusedBeforeTheFirstStepNamingTheField) {
  const std::vector<std::pair<Plan, std::string>> cases = {
      {moe_plan({{1, 2, 3, {3}}}, 2, 2), "stages[0].zero"},
      {moe_plan({{1, 2, 0, {3}}}, 2, 2, {2, 1}), "experts_per_member"},  // 3 of 4 experts
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    CommandResult r = run_command(train_command(cases[i].first, fmt::format("refused-{}", i), 2, ""), 120);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(cases[i].second), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("step 1"), std::string::npos) << r.output;
  }
  // ep 4 does not divide six experts.
  std::string yaml = read_text(tiny_moe_path());
  yaml.replace(yaml.find("experts: 4"), 10, "experts: 6");
  model_path_ = dir_->write("moe-6.yaml", yaml);
  CommandResult r = run_command(train_command(moe_plan({{1, 4, 0, {3}}}, 2, 4), "refused-ep", 2, ""), 120);
  model_path_ = tiny_moe_path();
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("stages[0].ep"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace alloy::testing
