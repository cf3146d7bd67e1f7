// The enumeration's lower bounds of structures (StructureBounds) against what the solver finds:
// they count every stage's boundary sends, and stay below every split the solver prices, for
// ordered structures and for families over every one of their orders.
#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <vector>

#include "../support/specs.hpp"
#include "search/layouts.hpp"
#include "search/structure_solver.hpp"

namespace alloy {
namespace {

constexpr double kRelativeSlack = 1e-9;

// The solver's best step of an ordered structure, none when nothing fits.
std::optional<double> solved_step_seconds(StructureSolver& solver, const Structure& s, const std::vector<TypePool>& pools) {
  std::vector<SlotInfo> slots = solver.slots(s, pools);
  double bottleneck = 0;
  const double bound = solver.refined_lower_bound(s, slots, &bottleneck);
  bool limited = false;
  const std::optional<Solution> solution =
      solver.solve(s, slots, std::numeric_limits<double>::infinity(), bound, bottleneck, &limited);
  if (!solution) return std::nullopt;
  return solution->step_seconds;
}

// Every stage's sends per micro-batch, both ways, as the placed stages price them.
double placed_sends_seconds(StructureSolver& solver, const Structure& s, const std::vector<TypePool>& pools) {
  double sends = 0;
  for (const SlotInfo& info : solver.slots(s, pools)) sends += 2.0 * info.slot.chunks_sent * info.slot.boundary_seconds;
  return sends;
}

// The sends from each stage to the next of the same type (one type group per type), which every
// order of a family pays.
double placed_sends_within_types_seconds(StructureSolver& solver, const Structure& s, const std::vector<TypePool>& pools) {
  const std::vector<SlotInfo> slots = solver.slots(s, pools);
  double sends = 0;
  for (size_t i = 0; i + 1 < slots.size(); ++i)
    if (slots[i].slot.shape.device_type == slots[i + 1].slot.shape.device_type)
      sends += 2.0 * slots[i].slot.chunks_sent * slots[i].slot.boundary_seconds;
  return sends;
}

// An 8-block LLaMA-2-7B on `nodes` nodes of 8 devices of each type, joined by a 100 MB/s network,
// so that a stage boundary between nodes takes longer than the blocks.
CostModel slow_network_model(const std::vector<DeviceType>& types, int nodes) {
  ModelSpec model = model_load("llama-2-7b");
  model.num_layers = 8;
  std::vector<testing::GroupSpec> groups;
  for (size_t t = 0; t < types.size(); ++t) groups.push_back({static_cast<int>(t), nodes, 8});
  return CostModel(model, testing::cluster("slow-network", types, groups, 1e8), testing::train(2048, 16));
}

// One device type, a stage per node: the sends between stages of one type group are in the bound
// (at least their share per chunk), which stays below the best split.
TEST(StructureBounds, CountTheSendsBetweenStagesOfOneType) {
  const CostModel cost = slow_network_model({testing::a100_80()}, 4);
  SearchOptions options;
  options.pp = 4;
  options.tp = 8;
  const std::vector<TypePool> pools = type_pools(cost.cluster());
  StructureBounds bounds(cost, options, pools);
  StructureSolver solver(cost, options);
  int solved = 0;
  for (const Structure& s : structures_enumerate(cost, pools, options, bounds)) {
    ASSERT_FALSE(s.all_orders);
    const double sends = placed_sends_seconds(solver, s, pools);
    ASSERT_GT(sends, 0);
    EXPECT_GE(s.lower_bound_seconds, sends / s.virtual_chunks * (1 - kRelativeSlack))
        << s.micro_batches << " micro-batches, v" << s.virtual_chunks;
    const std::optional<double> step = solved_step_seconds(solver, s, pools);
    if (!step) continue;
    ++solved;
    EXPECT_LE(s.lower_bound_seconds, *step * (1 + kRelativeSlack));
  }
  EXPECT_GT(solved, 0);
}

// Two device types, their order open: each family's bound is below every order's, each of which
// is below its best split; the family's counts the sends within its type groups.
TEST(StructureBounds, FamiliesStayBelowEveryOrder) {
  const CostModel cost = slow_network_model({testing::a100_80(), testing::v100_32()}, 2);
  SearchOptions options;
  options.tp = 8;
  const std::vector<TypePool> pools = type_pools(cost.cluster());
  StructureBounds bounds(cost, options, pools);
  StructureSolver solver(cost, options);
  int families = 0, solved = 0;
  bool sends_within_types = false;
  for (const Structure& family : structures_enumerate(cost, pools, options, bounds)) {
    if (!family.all_orders) continue;
    ++families;
    for (const Structure& order : structure_orders(family, bounds)) {
      const double within = placed_sends_within_types_seconds(solver, order, pools);
      sends_within_types = sends_within_types || within > 0;
      EXPECT_GE(family.lower_bound_seconds, within / family.virtual_chunks * (1 - kRelativeSlack));
      EXPECT_LE(family.lower_bound_seconds, order.lower_bound_seconds * (1 + kRelativeSlack));
      const std::optional<double> step = solved_step_seconds(solver, order, pools);
      if (!step) continue;
      ++solved;
      EXPECT_LE(order.lower_bound_seconds, *step * (1 + kRelativeSlack));
    }
  }
  EXPECT_GT(families, 0);
  EXPECT_GT(solved, 0);
  EXPECT_TRUE(sends_within_types);
}

}  // namespace
}  // namespace alloy
