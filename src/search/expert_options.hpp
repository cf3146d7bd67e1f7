// Expert parallelism as a per-stage search dimension of Mixture-of-Experts models: the degrees a
// stage may take and the Pareto set of stage options over them.
#pragma once

#include <vector>

#include "search/stage_options.hpp"

namespace alloy {

// Expert-parallel degrees a stage of `dp` replicas may take for `num_experts` experts: the
// divisors of dp that divide the experts (uneven splits are placed by expert_placement.hpp);
// `pinned` > 0 keeps only that one. {1} for a dense model.
std::vector<int> stage_ep_degrees(int dp, int num_experts, int pinned);

// A stage slot's shape and per-layer costs at one expert-parallel degree.
struct SlotAtEp {
  int ep = 1;
  StageShape shape;
  const StageUnitCosts* unit[2] = {nullptr, nullptr};  // by sequence parallelism, as StageSlot's
};

// Options of `slot` at each degree of `at_ep`, merged into one Pareto set (t ascending, u
// strictly descending) with each option's ep; empty without degrees (a pinned ep the stage's dp
// does not allow).
void stage_options_over_ep(const CostModel& cost, const StageSlot& slot, const std::vector<SlotAtEp>& at_ep, int blocks,
                           const OptionPins& pins, std::vector<StageOption>* out);

}  // namespace alloy
