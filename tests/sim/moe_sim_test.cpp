// The simulator replays a Mixture-of-Experts plan within 5% of the cost model's step and shows
// its all-to-alls.
#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
}  // namespace alloy
