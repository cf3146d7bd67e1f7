#include "sim/rerank.hpp"

#include <fmt/format.h>

#include "search/explain.hpp"
#include "sim/simulate.hpp"
#include "spec/units.hpp"

namespace alloy {

RerankReport plan_rerank_by_simulation(SearchResult* result, const CostModel& cost, Objective objective) {
  RerankReport report;
  if (result->candidates.size() < 2) return report;
  for (const Plan& candidate : result->candidates) {
    SimOptions options;
    options.record_intervals = false;
    options.profile = cost.profile();
    report.simulated_step_seconds.push_back(simulate(candidate, cost.model(), cost.cluster(), options).step_seconds);
  }
  // Price per token scales with step time for a fixed device set, so both objectives compare
  // simulated step time weighted by the plan's price per second.
  auto score = [&](size_t i) {
    const Plan& p = result->candidates[i];
    const double price_weight = objective == Objective::Objective_cost && p.price_per_million_tokens > 0
                                    ? p.price_per_million_tokens / p.step_seconds
                                    : 1.0;
    return report.simulated_step_seconds[i] * price_weight;
  };
  size_t best = 0;
  for (size_t i = 1; i < result->candidates.size(); ++i) {
    if (score(i) < score(best)) best = i;
  }
  report.chosen = static_cast<int>(best);
  report.changed = best != 0;
  const bool by_cost = objective == Objective::Objective_cost;
  Plan chosen = result->candidates[best];
  chosen.runner_ups.clear();
  for (size_t i = 0; i < result->candidates.size(); ++i) {
    if (i == best) continue;
    const Plan& other = result->candidates[i];
    RunnerUp r = runner_up_explain(chosen, other, by_cost);
    const std::string simulated = fmt::format("{} vs {}", units_format_seconds(report.simulated_step_seconds[i]),
                                              units_format_seconds(report.simulated_step_seconds[best]));
    // A candidate the formula ranked above the chosen plan lost in the simulation alone.
    const double formula_gap = by_cost ? other.price_per_million_tokens / chosen.price_per_million_tokens - 1.0
                                       : chosen.tokens_per_second / other.tokens_per_second - 1.0;
    if (formula_gap < 0)
      r.reason = fmt::format("slower when simulated ({}), though {:.0f}% better by the formula", simulated,
                             -formula_gap * 100);
    else
      r.reason += "; simulated " + simulated;
    chosen.runner_ups.push_back(r);
  }
  if (report.changed) {
    chosen.notes.push_back(fmt::format(
        "re-ranked by simulation: the formula's first choice simulates at {}, this plan at {} ({:+.1f}%)",
        units_format_seconds(report.simulated_step_seconds[0]), units_format_seconds(report.simulated_step_seconds[best]),
        100.0 * (report.simulated_step_seconds[best] / report.simulated_step_seconds[0] - 1.0)));
  } else {
    chosen.notes.push_back(fmt::format("confirmed by simulation: {} simulated against {} predicted",
                                       units_format_seconds(report.simulated_step_seconds[0]),
                                       units_format_seconds(chosen.step_seconds)));
  }
  result->plan = std::move(chosen);
  return report;
}

}  // namespace alloy
