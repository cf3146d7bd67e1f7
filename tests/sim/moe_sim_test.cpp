// The simulator replays a Mixture-of-Experts plan within 5% of the cost model's step.
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
  const SimResult sim = simulate(plan, model, cluster, SimOptions{});
  EXPECT_LT(std::abs(sim.step_seconds / plan.step_seconds - 1.0), 0.05)
      << "simulated " << sim.step_seconds << " s, predicted " << plan.step_seconds << " s";
}

}  // namespace
}  // namespace alloy
