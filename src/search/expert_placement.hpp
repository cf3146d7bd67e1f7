// Heterogeneity-aware expert placement: under uneven data parallelism the members of an
// expert-parallel group may be devices of unequal speed; each then holds routed experts in
// proportion to its speed, so that every member's expert time is about the same.
#pragma once

#include <string>
#include <vector>

#include "cost/cost_model.hpp"
#include "plan/plan.hpp"
#include "search/planner.hpp"

namespace alloy {

// Integer expert counts in proportion to `speeds` (largest remainders), each at least 1, summing
// to `num_experts` (which must be at least the number of members).
std::vector<int> expert_counts_by_speed(const std::vector<double>& speeds, int num_experts);

// Contiguous expert counts (expert ids follow member order) whose measured routing loads
// (`shares`, one per expert) are as near as the whole experts allow to in proportion to
// `speeds`, each at least 1.
std::vector<int> expert_counts_by_load(const std::vector<double>& speeds, const std::vector<double>& shares);

// Speed of each position of an expert-parallel group of stage `st` (peak FLOPs at the plan's
// precision of the device type at that dp rank, the mean over the stage's groups).
std::vector<double> expert_member_speeds(const CostModel& cost, const PlanStage& st, Precision precision);

// Of a one-stage plan under uneven data parallelism (evaluated), the best expert-parallel degree
// and placement (by speed where a group mixes device types), evaluated; unchanged for dense models.
// Candidates over memory lose to those that fit.
void expert_placement_choose(const CostModel& cost, const SearchOptions& options, Plan* plan);

// Of a planned (evaluated) plan, each stage with ep > 1 whose members differ in speed or whose
// experts' measured loads differ gets the placement by speed and load where it is faster and
// fits; the plan is evaluated again.
void expert_placement_refine(const CostModel& cost, Plan* plan);

// What the placement of a plan's MoE stages is and what it gains over an even one (plan notes):
// empty for dense models.
std::vector<std::string> expert_placement_notes(const CostModel& cost, const Plan& plan);

}  // namespace alloy
