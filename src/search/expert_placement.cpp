#include "search/expert_placement.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include <fmt/format.h>

#include "cost/moe_cost.hpp"
#include "search/expert_options.hpp"

namespace alloy {

namespace {

double placement_score(const Plan& plan, const SearchOptions& options) {
  const double over = plan_memory_ratio(plan) > 1 ? 1e6 * plan_memory_ratio(plan) : 0;
  return over + (options.objective == Objective::Objective_cost ? plan.price_per_million_tokens
                                                                : 1.0 / plan.tokens_per_second);
}

// Whether the members of one expert-parallel group of `st` are of more than one speed.
bool placement_group_mixed(const std::vector<double>& speeds) {
  return std::any_of(speeds.begin(), speeds.end(), [&](double v) { return v != speeds.front(); });
}

// The placement of a stage by its members' speeds and its experts' measured loads; empty (even)
// where neither differs.
std::vector<int> expert_placement_counts(const CostModel& cost, const PlanStage& st, Precision precision) {
  const std::vector<double> speeds = expert_member_speeds(cost, st, precision);
  const std::vector<double>& shares = cost.expert_token_shares();
  if (st.ep <= 1) return {};
  std::vector<int> counts;
  if (!shares.empty()) counts = expert_counts_by_load(speeds, shares);
  else if (placement_group_mixed(speeds)) counts = expert_counts_by_speed(speeds, static_cast<int>(cost.model().moe.num_experts));
  // The same count everywhere is the even placement.
  if (std::all_of(counts.begin(), counts.end(), [&](int c) { return c == counts.front(); })) counts.clear();
  return counts;
}

// Why a stage of members of unequal speed kept an even placement: what the placement by speed
// would take.
std::string placement_by_speed_outcome(const CostModel& cost, const Plan& plan, size_t s) {
  Plan placed = plan;
  placed.runner_ups.clear();
  placed.stages[s].experts_per_member = expert_placement_counts(cost, placed.stages[s], plan.precision);
  if (placed.stages[s].experts_per_member.empty()) return "";
  plan_evaluate(&placed, cost);
  if (plan_memory_ratio(placed) > 1)
    return fmt::format(" (by speed, {} experts per member, would need {:.0f}% of a device's memory)",
                       fmt::join(placed.stages[s].experts_per_member, "/"), 100.0 * plan_memory_ratio(placed));
  return fmt::format(" (by speed, {} experts per member, would take {:.3f} s)",
                     fmt::join(placed.stages[s].experts_per_member, "/"), placed.step_seconds);
}

}  // namespace

std::vector<int> expert_counts_by_speed(const std::vector<double>& speeds, int num_experts) {
  const int n = static_cast<int>(speeds.size());
  std::vector<int> counts(static_cast<size_t>(n), 1);
  const double total = std::accumulate(speeds.begin(), speeds.end(), 0.0);
  if (n == 0 || total <= 0) return counts;
  // One each first, then the rest by each member's ideal count beyond what it has.
  std::vector<double> ideal(static_cast<size_t>(n));
  int given = n;
  for (int m = 0; m < n; ++m) {
    ideal[static_cast<size_t>(m)] = num_experts * speeds[static_cast<size_t>(m)] / total;
    const int floor_count = std::max(1, static_cast<int>(std::floor(ideal[static_cast<size_t>(m)])));
    given += floor_count - 1;
    counts[static_cast<size_t>(m)] = floor_count;
  }
  while (given > num_experts) {  // floors of 1 pushed the sum over: take from the largest
    const auto most = std::max_element(counts.begin(), counts.end());
    --*most;
    --given;
  }
  while (given < num_experts) {
    int best = 0;
    double best_gap = -1e300;
    for (int m = 0; m < n; ++m) {
      const double gap = ideal[static_cast<size_t>(m)] - counts[static_cast<size_t>(m)];
      if (gap > best_gap) {
        best_gap = gap;
        best = m;
      }
    }
    ++counts[static_cast<size_t>(best)];
    ++given;
  }
  return counts;
}

std::vector<int> expert_counts_by_load(const std::vector<double>& speeds, const std::vector<double>& shares) {
  const int n = static_cast<int>(speeds.size());
  const int experts = static_cast<int>(shares.size());
  const double total_speed = std::accumulate(speeds.begin(), speeds.end(), 0.0);
  const double total_load = std::accumulate(shares.begin(), shares.end(), 0.0);
  std::vector<int> counts;
  int begin = 0;
  double target = 0, load = 0;
  for (int m = 0; m < n - 1; ++m) {
    target += speeds[static_cast<size_t>(m)] / total_speed * total_load;
    // The end that brings the cumulative load nearest the target, leaving one expert per later member.
    int best_end = begin + 1;
    double cumulative = load + shares[static_cast<size_t>(begin)];
    double best_gap = std::abs(cumulative - target), best_load = cumulative;
    for (int end = begin + 2; end <= experts - (n - 1 - m); ++end) {
      cumulative += shares[static_cast<size_t>(end - 1)];
      if (std::abs(cumulative - target) < best_gap) {
        best_gap = std::abs(cumulative - target);
        best_end = end;
        best_load = cumulative;
      }
    }
    counts.push_back(best_end - begin);
    begin = best_end;
    load = best_load;
  }
  counts.push_back(experts - begin);
  return counts;
}

std::vector<double> expert_member_speeds(const CostModel& cost, const PlanStage& st, Precision precision) {
  const int ep = std::max(1, st.ep);
  std::vector<double> speeds(static_cast<size_t>(ep), 0.0);
  const ClusterSpec& cluster = cost.cluster();
  for (int d = 0; d < st.dp; ++d) {
    const DeviceType& type = cluster.device_types[cluster.devices[st.device_ids[static_cast<size_t>(d) * st.tp]].device_type_index];
    speeds[static_cast<size_t>(d % ep)] += type.peak_flops(precision_run_on(type, precision)) * ep / st.dp;
  }
  return speeds;
}

void expert_placement_choose(const CostModel& cost, const SearchOptions& options, Plan* plan) {
  if (!model_is_moe(cost.model()) || plan->stages.size() != 1) return;
  const int experts = static_cast<int>(cost.model().moe.num_experts);
  Plan best = *plan;
  // A pinned ep replaces the plan's (ep 1) whatever it scores.
  double best_score = options.ep > 1 ? std::numeric_limits<double>::infinity() : placement_score(best, options);
  // Each degree evenly and by speed and load: more experts on a fast device may not fit its memory.
  for (int ep : stage_ep_degrees(plan->stages[0].dp, experts, options.ep)) {
    Plan candidate = *plan;
    candidate.stages[0].ep = ep;
    candidate.stages[0].experts_per_member.clear();
    const std::vector<int> placed = expert_placement_counts(cost, candidate.stages[0], candidate.precision);
    std::vector<std::vector<int>> placements = {{}};
    if (!placed.empty()) placements.push_back(placed);
    for (const std::vector<int>& counts : placements) {
      candidate.stages[0].experts_per_member = counts;
      plan_evaluate(&candidate, cost);
      const double score = placement_score(candidate, options);
      if (score < best_score) {
        best_score = score;
        best = candidate;
      }
    }
  }
  *plan = std::move(best);
}

void expert_placement_refine(const CostModel& cost, Plan* plan) {
  if (!model_is_moe(cost.model())) return;
  for (size_t s = 0; s < plan->stages.size(); ++s) {
    const std::vector<int> counts = expert_placement_counts(cost, plan->stages[s], plan->precision);
    if (counts.empty() || counts == plan->stages[s].experts_per_member) continue;
    Plan placed = *plan;
    placed.stages[s].experts_per_member = counts;
    plan_evaluate(&placed, cost);
    if (placed.step_seconds < plan->step_seconds && plan_memory_ratio(placed) <= 1) *plan = std::move(placed);
  }
}

std::vector<std::string> expert_placement_notes(const CostModel& cost, const Plan& plan) {
  std::vector<std::string> notes;
  if (!model_is_moe(cost.model())) return notes;
  const ClusterSpec& cluster = cost.cluster();
  const int experts = static_cast<int>(cost.model().moe.num_experts);
  notes.push_back(cost.expert_token_shares().empty()
                      ? std::string("expert load: uniform routing assumed (a training file's expert_tokens, e.g. from "
                                    "alloy train's step log, prices a measured one)")
                      : fmt::format("expert load: measured routing, the most popular expert takes {:.1f}% of the picks "
                                    "(even: {:.1f}%)",
                                    100.0 * *std::max_element(cost.expert_token_shares().begin(),
                                                              cost.expert_token_shares().end()),
                                    100.0 / static_cast<double>(experts)));
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& st = plan.stages[s];
    // Experts held per device type (the counts of each member, by its type).
    std::map<std::string, std::vector<int>> by_type;
    for (int d = 0; d < st.dp; ++d) {
      const std::pair<int, int> range = plan_expert_range(st, experts, d % std::max(1, st.ep));
      const std::string& type = cluster.device_type(cluster.devices[st.device_ids[static_cast<size_t>(d) * st.tp]]).name;
      std::vector<int>& counts = by_type[type];
      if (std::find(counts.begin(), counts.end(), range.second - range.first) == counts.end())
        counts.push_back(range.second - range.first);
    }
    std::string held;
    for (const auto& [type, counts] : by_type)
      held += fmt::format("{}{} {} expert{}", held.empty() ? "" : ", ", type, fmt::join(counts, "/"),
                          counts.size() == 1 && counts.front() == 1 ? "" : "s");
    std::string line = fmt::format("stage {} expert placement: ep {} ({} experts per MoE block), {} per member", s,
                                   st.ep, experts, held);
    if (st.experts_per_member.empty()) {
      const std::vector<double> speeds = expert_member_speeds(cost, st, plan.precision);
      if (!cost.expert_token_shares().empty() && st.ep > 1)
        line += "; even (a placement by measured routing load would not shorten the step)";
      else if (placement_group_mixed(speeds))
        line += "; even split over members of unequal speed" + placement_by_speed_outcome(cost, plan, s);
      else if (st.ep > 1)
        line += "; even (each expert-parallel group is of one speed, so even is proportional)";
      else
        line += "; every member holds every expert";
      notes.push_back(line);
      continue;
    }
    Plan even = plan;
    even.runner_ups.clear();
    even.stages[s].experts_per_member.clear();
    const bool divides = experts % std::max(1, st.ep) == 0;
    if (divides) plan_evaluate(&even, cost);
    const char* by = cost.expert_token_shares().empty() ? "by speed" : "by speed and measured routing load";
    line += divides ? fmt::format("; {}: step {:.3f} s against {:.3f} s with an even placement ({:.1f}% shorter)", by,
                                  plan.step_seconds, even.step_seconds,
                                  100.0 * (1.0 - plan.step_seconds / even.step_seconds))
                    : fmt::format("; {} (the experts do not divide evenly over the members)", by);
    notes.push_back(line);
  }
  return notes;
}

}  // namespace alloy
