// Baseline layouts the planner is measured against: Megatron-style uniform layouts (one tp,
// pp, dp for every stage, even layer split, 1F1B), built and scored directly, not searched.
#pragma once

#include <optional>

#include "plan/plan.hpp"
#include "search/planner.hpp"

namespace alloy {

struct UniformLayout {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int num_micro_batches = 1;
  int zero = 0;
  Recompute recompute = Recompute::Recompute_none;
  bool sequence_parallel = false;
};

// The uniform layout on the first tp x pp x dp devices of `device_type`, scored by the cost
// model. Throws alloy::Error when the layout is not valid for the cluster or batch.
Plan plan_uniform(const CostModel& cost, int device_type, const UniformLayout& layout);

// The fastest uniform layout on all devices of `device_type` that fits in memory: every tp
// (power of two dividing the node), pp dividing the layers, dp, micro-batch count, ZeRO 0/1,
// uniform recomputation and sequence parallelism. Empty when none fits.
std::optional<Plan> best_uniform_plan(const CostModel& cost, int device_type, int* layouts_scored = nullptr);

}  // namespace alloy
