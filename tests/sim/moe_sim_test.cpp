// The simulator replays a Mixture-of-Experts plan within 5% of the cost model's step and shows
// its all-to-alls.
#include <gtest/gtest.h>

#include <cmath>

#include "cost/moe_cost.hpp"
#include "hw/catalog.hpp"
#include "search/planner.hpp"
#include "sim/simulate.hpp"

namespace alloy {
namespace {

TEST(MoeSim, MixtralPlanAgreesWithThePrediction) {
  const ModelSpec model = model_load("mixtral-8x7b");
  const ClusterSpec cluster = cluster_load("h100-a100", catalog_builtin());
  const CostModel cost(model, cluster, TrainSpec{});
  SearchOptions options;
  options.runner_ups = 0;
  // ZeRO 2 with gradients in full: the simulator gathers a ZeRO-3 stage's weights a chunk at a
  // time where the cost model prefetches a block at a time (with one micro-batch the first
  // chunk's gather is exposed: +12%), and reduces every op's gradients over dp where the experts'
  // go over expert-dp (sharded gradients: +5.3%).
  options.zero = 2;
  options.shard_gradients = false;
  const Plan plan = plan_search(cost, options).plan;
  SimOptions sim_options;
  sim_options.record_intervals = true;
  const SimResult sim = simulate(plan, model, cluster, sim_options);
  EXPECT_LT(std::abs(sim.step_seconds / plan.step_seconds - 1.0), 0.05)
      << "simulated " << sim.step_seconds << " s, predicted " << plan.step_seconds << " s";
  // Every forward and backward pass of a stage with ep > 1 shows its dispatch and combine.
  int passes = 0, exchanges = 0;
  for (const SimInterval& iv : sim.intervals) {
    if (iv.stream == SimStream::SimStream_compute && iv.kind != OpKind::OpKind_optimizer) ++passes;
    if (iv.stream == SimStream::SimStream_all_to_all) {
      ++exchanges;
      EXPECT_GT(iv.end_seconds, iv.start_seconds);
    }
  }
  EXPECT_GT(plan.stages[0].ep, 1);
  EXPECT_EQ(exchanges, passes);
}

// DeepSeek-MoE-16B with its leading dense block alone on the first stage: that stage holds the
// embedding and a dense block's parameters, exactly, and runs no all-to-all; the other holds 27
// MoE blocks with the experts of its members. The simulator agrees with the prediction.
TEST(MoeSim, DeepSeekLeadingDenseBlockIsPricedAndSimulatedAsDense) {
  const ModelSpec model = model_load("deepseek-moe-16b");
  const ClusterSpec cluster = cluster_load("h100-a100", catalog_builtin());
  const CostModel cost(model, cluster, TrainSpec{});
  SearchOptions options;
  options.runner_ups = 0;
  options.pp = 2;
  options.schedule = Schedule::Schedule_1f1b;
  options.layer_split = {1, 27};
  options.zero = 2;  // parameters whole on each member (and as MixtralPlanAgreesWithThePrediction)
  const Plan plan = plan_search(cost, options).plan;
  ASSERT_EQ(plan.stages.size(), size_t{2});
  const ModelParameterCounts counts = model_parameter_counts(model);
  const double e = precision_bytes(plan.precision);
  const auto parameters = [&](const PlanStage& st) {
    for (const MemoryTerm& t : st.memory)
      if (t.name == "parameters") return t.bytes / e;
    return 0.0;
  };
  const PlanStage& first = plan.stages[0];
  EXPECT_NEAR(parameters(first), static_cast<double>(embedding_parameters(model) + counts.per_block) / first.tp,
              1e-9 * parameters(first));
  const PlanStage& rest = plan.stages[1];
  const double experts_not_held = (64.0 - 64.0 / rest.ep) * static_cast<double>(moe_expert_parameters(model));
  EXPECT_NEAR(parameters(rest),
              (27 * (static_cast<double>(counts.per_moe_block) - experts_not_held) +
               static_cast<double>(head_parameters(model, true))) / rest.tp,
              1e-9 * parameters(rest));
  const SimResult sim = simulate(plan, model, cluster, SimOptions{});
  EXPECT_LT(std::abs(sim.step_seconds / plan.step_seconds - 1.0), 0.05)
      << "simulated " << sim.step_seconds << " s, predicted " << plan.step_seconds << " s";
  SimOptions traced;
  traced.record_intervals = true;
  int exchanges = 0;
  for (const SimInterval& iv : simulate(plan, model, cluster, traced).intervals) {
    if (iv.stream != SimStream::SimStream_all_to_all) continue;
    EXPECT_EQ(iv.lane, 1) << "the dense stage exchanges nothing";
    ++exchanges;
  }
  EXPECT_EQ(exchanges > 0, rest.ep > 1);
}

}  // namespace
}  // namespace alloy
