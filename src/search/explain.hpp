// Turning planner solutions into plans and explaining them: a plan from a structure and its
// split, a one-line shape, why a runner-up lost to the chosen plan, and why each ZeRO 2-3 stage
// shards its gradients or accumulates them in full.
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

// One line per stage under ZeRO 2-3 with dp > 1: its gradient strategy against the other one,
// priced by evaluating the plan with that stage switched ("stage 0 shards gradients: 15.9 GiB
// less per device for +3.1 ms per step"). The plan must be evaluated.
std::vector<std::string> gradient_strategy_notes(const Plan& plan, const CostModel& cost);

}  // namespace alloy
