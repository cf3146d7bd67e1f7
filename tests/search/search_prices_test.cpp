// The search's own price of a structure (its stages' options from the solver's caches) against
// the exact evaluation of the plan it builds: they agree when every stage is priced by what it
// holds and where it sits, whatever the solver priced before.
#include <gtest/gtest.h>

#include <limits>

#include "hw/catalog.hpp"
#include "search/explain.hpp"
#include "search/layouts.hpp"
#include "search/structure_solver.hpp"

namespace alloy {
namespace {

struct Priced {
  double search_seconds = 0;
  double evaluated_seconds = 0;
  std::vector<int> blocks;
};

// Every structure the options allow, solved in order by one solver (its caches shared between
// them, as in the search), each next to its plan's evaluation.
std::vector<Priced> solve_every_structure(const CostModel& cost, const SearchOptions& options) {
  const std::vector<TypePool> pools = type_pools(cost.cluster());
  StructureBounds bounds(cost, options, pools);
  std::vector<Structure> structures = structures_enumerate(cost, pools, options, bounds);
  StructureSolver solver(cost, options);
  std::vector<Priced> out;
  for (const Structure& s : structures) {
    if (s.all_orders) continue;
    std::vector<SlotInfo> slots = solver.slots(s, pools);
    double bottleneck = 0;
    const double bound = solver.refined_lower_bound(s, slots, &bottleneck);
    bool limited = false;
    const std::optional<Solution> solution =
        solver.solve(s, slots, std::numeric_limits<double>::infinity(), bound, bottleneck, &limited);
    if (!solution) continue;
    std::vector<std::vector<int>> device_ids;
    for (const SlotInfo& info : slots) device_ids.push_back(slot_device_ids(info));
    const Plan plan = plan_build(cost, s, device_ids, solution->blocks, solution->options, options.objective);
    out.push_back({solution->step_seconds, plan.step_seconds, solution->blocks});
  }
  return out;
}

// A DeepSeek-like model (DeepSeek-MoE-16B's blocks, eight of them) with three leading dense
// blocks: a first stage of one or two blocks leaves the others to the next stage, which the search
// prices as the dense blocks they are.
TEST(SearchPrices, LeadingDenseBlocksPastTheFirstStageArePricedAsEvaluated) {
  ModelSpec model = model_load("deepseek-moe-16b");
  model.num_layers = 8;
  model.moe.first_dense_layers = 3;
  TrainSpec train;
  train.global_batch_sequences = 16;
  const CostModel cost(model, cluster_load("h100-a100", catalog_builtin()), train);
  for (int first : {1, 2}) {
    SearchOptions options;
    options.pp = 2;
    options.layer_split = {first, static_cast<int>(model.num_layers) - first};
    options.device_order = {"h100-sxm", "a100-80gb-sxm"};
    const std::vector<Priced> priced = solve_every_structure(cost, options);
    ASSERT_FALSE(priced.empty()) << first;
    for (const Priced& p : priced) {
      EXPECT_EQ(p.blocks.front(), first);
      EXPECT_NEAR(p.search_seconds, p.evaluated_seconds, 1e-9 * p.evaluated_seconds) << "first stage " << first;
    }
  }
  // With the split free, every split the search picks is priced as evaluated too.
  SearchOptions free;
  free.pp = 4;
  for (const Priced& p : solve_every_structure(cost, free))
    EXPECT_NEAR(p.search_seconds, p.evaluated_seconds, 1e-9 * p.evaluated_seconds);
}

// One device type behind two networks (a100-two-networks: InfiniBand and 10x slower Ethernet):
// two stages of the same shape, one on each, share no costs that depend on their links.
TEST(SearchPrices, EqualShapesBehindUnequalNetworksArePricedByTheirOwnLinks) {
  TrainSpec train;
  train.global_batch_sequences = 32;
  const CostModel cost(model_load("llama-2-7b"), cluster_load("a100-two-networks", catalog_builtin()), train);
  for (int zero : {1, 3}) {
    SearchOptions options;
    options.pp = 2;
    options.tp = 8;
    options.dp = 2;
    options.zero = zero;
    const std::vector<Priced> priced = solve_every_structure(cost, options);
    ASSERT_FALSE(priced.empty());
    for (const Priced& p : priced)
      EXPECT_NEAR(p.search_seconds, p.evaluated_seconds, 1e-9 * p.evaluated_seconds) << "zero " << zero;
  }
}

}  // namespace
}  // namespace alloy
