// The planner's best candidates re-ranked by the simulator: on LLaMA-2-7B over one 8 x A100
// node the formula's favourite simulates slower than a runner-up, and re-ranking picks the
// runner-up; where they agree the choice stays.
#include <gtest/gtest.h>

#include "hw/catalog.hpp"
#include "sim/rerank.hpp"
#include "sim/simulate.hpp"

namespace alloy {
namespace {

// LLaMA-pretrain-sized steps: 2048 sequences of 2048 tokens.
CostModel cost_for(const std::string& model_name, const std::string& cluster_name) {
  TrainSpec train;
  train.seq_len = 2048;
  train.global_batch_sequences = 2048;
  return CostModel(model_load(model_name), cluster_load(cluster_name, catalog_builtin()), train);
}

TEST(Rerank, SimulatorOverrulesTheFormulaWhenItFindsAFasterPlan) {
  // The first of these cases where the simulator disagrees with the formula (the cost model's
  // memory terms decide which layouts compete, so the case that shows it may move).
  const std::pair<const char*, const char*> cases[] = {{"llama-2-7b", "a100-8"},       {"llama-2-13b", "a100-8"},
                                                       {"llama-2-7b", "a100-v100"},    {"llama-3-8b", "a100-8"},
                                                       {"llama-2-7b", "h100-a100-l4"}, {"llama-2-13b", "a100-v100"},
                                                       {"llama-3-8b", "a100-v100"},    {"llama-2-13b", "h100-a100-l4"},
                                                       {"llama-2-70b", "a100-8"}};
  for (const auto& [model, cluster] : cases) {
    const CostModel cost = cost_for(model, cluster);
    SearchResult result = plan_search(cost, SearchOptions{});
    if (result.candidates.size() < 2) continue;
    const Plan formula_choice = result.candidates.front();
    RerankReport report = plan_rerank_by_simulation(&result, cost, Objective::Objective_throughput);
    if (!report.changed) continue;
    std::printf("%s on %s: ", model, cluster);
    const double before = report.simulated_step_seconds.front();
    const double after = report.simulated_step_seconds[static_cast<size_t>(report.chosen)];
    std::printf("formula's choice simulates at %.2f s; re-ranked choice at %.2f s\n", before, after);
    EXPECT_LT(after, before);
    // The new plan is one of the candidates, with the others (the old favourite included) as runner-ups.
    EXPECT_EQ(result.plan.runner_ups.size(), result.candidates.size() - 1);
    EXPECT_DOUBLE_EQ(simulate(result.plan, cost.model(), cost.cluster()).step_seconds, after);
    EXPECT_NE(result.plan.notes.back().find("re-ranked by simulation"), std::string::npos);
    EXPECT_NE(formula_choice.step_seconds, 0);
    return;
  }
  FAIL() << "the formula's choice is also the simulator's in every case; add a case";
}

TEST(Rerank, AgreementKeepsTheChoice) {
  const CostModel cost = cost_for("gpt2-xl", "a100-8");
  SearchResult result = plan_search(cost, SearchOptions{});
  const double predicted = result.plan.step_seconds;
  RerankReport report = plan_rerank_by_simulation(&result, cost, Objective::Objective_throughput);
  EXPECT_FALSE(report.changed);
  EXPECT_DOUBLE_EQ(result.plan.step_seconds, predicted);
  EXPECT_NE(result.plan.notes.back().find("confirmed by simulation"), std::string::npos);
}

}  // namespace
}  // namespace alloy
