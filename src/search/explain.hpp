// Turning planner solutions into plans and explaining them: a plan from a structure and its
// split, a one-line shape, and why a runner-up lost to the chosen plan.
#pragma once

#include <string>
#include <vector>

#include "plan/plan.hpp"
#include "search/layouts.hpp"
#include "search/stage_options.hpp"

namespace alloy {

// Builds and evaluates the plan of a solved structure. Recomputation and offload counts are
// laid out per block (full first, then selective; offload on the first blocks of the stage).
Plan plan_build(const CostModel& cost, const Structure& structure, const std::vector<std::vector<int>>& device_ids,
                const std::vector<int>& blocks, const std::vector<StageOption>& options, Objective objective);

// "2 stages: a100 tp2 dp2 [0,16) | v100 tp1 dp4 [16,32); 1f1b, 16 x 4 seq"
std::string plan_shape_summary(const Plan& plan);

// Why `other` lost to `best`: the largest of its step-time differences (bottleneck stage,
// pipeline fill and drain, exposed per-step overhead), with the total gap in percent.
RunnerUp runner_up_explain(const Plan& best, const Plan& other, bool by_cost);

}  // namespace alloy
