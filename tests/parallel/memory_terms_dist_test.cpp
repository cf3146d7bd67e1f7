// Measured memory by term under mpirun: each rank's terms in the step log sum to its arena peak,
// they hold what ZeRO says they hold (ZeRO 0: the stage's whole gradient buffer; ZeRO 3: less than
// the whole parameters), and the end-of-run report shows them beside the prediction.
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"
#include "dist_plans.hpp"
#include "hw/catalog.hpp"
#include "runtime/memory_terms.hpp"
#include "runtime/parallel/executor.hpp"
#include "runtime/shard.hpp"
#include "search/planner.hpp"
#include "spec/train.hpp"

namespace alloy::testing {

using K = MemoryTermKind;

class MemoryTermsDistTest : public DistGptSuite<MemoryTermsDistTest> {
 protected:
  // gpt-6 on one stage, dp 2 at ZeRO `zero`, 2 micro-batches, predictions from the cost model.
  static Plan data_parallel(int zero) {
    const ModelSpec model = model_load(gpt_path_);
    const ClusterSpec cluster = cluster_load(cluster_path_, catalog_builtin());
    Plan plan = test_plan(model, cluster, {{1, 2, zero, {6}}}, Schedule::Schedule_1f1b, 2);
    TrainSpec train = train_load(std::string(ALLOY_SOURCE_DIR) + "/examples/train/tiny-cpu.yaml");
    train.seq_len = kTestSeqLen;
    train.global_batch_sequences = kTestGlobalBatch;
    plan_evaluate(&plan, CostModel(model, cluster, train));
    return plan;
  }

  // Parameters of the stage (one tp rank): the floats of its whole parameter or gradient buffer.
  static int64_t stage_parameters(const Plan& plan) {
    int64_t count = 0;
    for (const ShardedTensor& t : shard_tensors(model_load(gpt_path_), rank_shard(plan, 0, 0))) {
      int64_t numel = 1;
      for (int64_t e : t.local_shape) numel *= e;
      count += numel;
    }
    return count;
  }

  struct Run {
    CommandResult result;
    std::vector<nlohmann::json> ranks;  // every step's per-rank entries, in order
  };

  static Run train(const Plan& plan, const std::string& name) {
    const std::string plan_path = dir_->path() + "/" + name + ".json";
    const std::string log = dir_->path() + "/" + name + ".jsonl";
    plan_save(plan, plan_path);
    Run run;
    run.result = run_command(fmt::format("mpirun -np {} --oversubscribe --bind-to none {} train --model {} --data {} "
                                         "--train {}/dist-train.yaml --steps 3 --no-progress --plan {} "
                                         "--cluster {} --log {}",
                                         plan.num_used_devices(), ALLOY_BINARY, gpt_path_, data_, dir_->path(),
                                         plan_path, cluster_path_, log),
                             180);
    std::istringstream in(read_text(log));
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json step = nlohmann::json::parse(line);
      for (const nlohmann::json& rank : step.at("ranks")) run.ranks.push_back(rank);
    }
    return run;
  }

  static int64_t term(const nlohmann::json& rank, MemoryTermKind kind) {
    return rank.at("peak_by_term").at(memory_term_key(kind)).get<int64_t>();
  }

  // Every rank's terms sum to its peak, and every term is in the log.
  static void expect_terms_sum_to_peak(const Run& run) {
    ASSERT_EQ(run.ranks.size(), 6u) << "3 steps x 2 ranks";
    for (const nlohmann::json& rank : run.ranks) {
      int64_t total = 0;
      for (int k = 0; k < kMemoryTermKinds; ++k) total += term(rank, static_cast<MemoryTermKind>(k));
      EXPECT_EQ(total, rank.at("peak_arena_bytes").get<int64_t>()) << rank.dump();
      EXPECT_EQ(term(rank, K::MemoryTermKind_other), 0) << "a buffer without a term: " << rank.dump();
    }
  }

  // The report's by-term table: a measured and a predicted row per rank, under every term.
  static void expect_table(const std::string& output) {
    const size_t table = output.find("arena memory at each rank's peak by term");
    ASSERT_NE(table, std::string::npos) << output;
    std::printf("%s", output.substr(table, output.find("measured /", table) - table).c_str());
    for (int k = 0; k < kMemoryTermKinds; ++k)
      EXPECT_NE(output.find(memory_term_name(static_cast<MemoryTermKind>(k))), std::string::npos) << output;
    size_t measured = 0, predicted = 0;  // rows "<rank> <stage> measured ..." and "predicted ... <error>%"
    std::istringstream in(output);
    for (std::string line; std::getline(in, line);) {
      std::istringstream words(line);
      std::string first, second, third;
      words >> first >> second >> third;
      measured += third == "measured";
      predicted += first == "predicted" && line.back() == '%';
    }
    EXPECT_EQ(measured, 2u) << output;
    EXPECT_EQ(predicted, 2u) << output;
  }
};

TEST_F(MemoryTermsDistTest, ZeroZeroHoldsTheWholeGradientBuffer) {
  const Plan plan = data_parallel(0);
  const Run run = train(plan, "terms-zero0");
  ASSERT_EQ(run.result.exit_code, 0) << run.result.output;
  expect_terms_sum_to_peak(run);
  const int64_t gradient_bytes = stage_parameters(plan) * static_cast<int64_t>(sizeof(float));
  const auto predicted = memory_terms_predicted(plan.stages[0].memory, false);
  for (const nlohmann::json& rank : run.ranks) {
    EXPECT_EQ(term(rank, K::MemoryTermKind_gradients), arena_rounded_bytes(gradient_bytes)) << rank.dump();
    EXPECT_EQ(term(rank, K::MemoryTermKind_parameters), arena_rounded_bytes(gradient_bytes)) << rank.dump();
    EXPECT_GT(term(rank, K::MemoryTermKind_optimizer_state), 0) << rank.dump();
    EXPECT_GT(term(rank, K::MemoryTermKind_activations), 0) << rank.dump();
    // The prediction counts the same buffer under the same term (up to the arena's rounding).
    EXPECT_NEAR(predicted[static_cast<size_t>(K::MemoryTermKind_gradients)],
                static_cast<double>(term(rank, K::MemoryTermKind_gradients)), kArenaAlignmentBytes);
  }
  expect_table(run.result.output);
}

TEST_F(MemoryTermsDistTest, ZeroThreeHoldsLessThanTheWholeParameters) {
  const Plan plan = data_parallel(3);
  const Run run = train(plan, "terms-zero3");
  ASSERT_EQ(run.result.exit_code, 0) << run.result.output;
  expect_terms_sum_to_peak(run);
  const int64_t parameter_bytes = stage_parameters(plan) * static_cast<int64_t>(sizeof(float));
  for (const nlohmann::json& rank : run.ranks) {
    EXPECT_GT(term(rank, K::MemoryTermKind_parameters), 0) << rank.dump();
    EXPECT_LT(term(rank, K::MemoryTermKind_parameters), parameter_bytes) << rank.dump();
  }
  expect_table(run.result.output);
}

}  // namespace alloy::testing
