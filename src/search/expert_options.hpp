// Expert parallelism as a per-stage search dimension of Mixture-of-Experts models: the degrees a
// stage may take and the Pareto set of stage options over them.
#pragma once

#include <functional>
#include <vector>

#include "search/stage_options.hpp"

namespace alloy {

// Expert-parallel degrees a stage of `dp` replicas may take for `num_experts` experts: the
// divisors of dp that divide the experts (uneven splits are placed by expert_placement.hpp);
// `pinned` > 0 keeps only that one. {1} for a dense model.
std::vector<int> stage_ep_degrees(int dp, int num_experts, int pinned);

// Options of a slot at each degree, each set filled by `options_at(ep, out)`, merged into one
// Pareto set (t ascending, u strictly descending) with each option's ep.
void stage_options_over_ep(const std::vector<int>& degrees,
                           const std::function<void(int ep, std::vector<StageOption>* out)>& options_at,
                           std::vector<StageOption>* out);

}  // namespace alloy
