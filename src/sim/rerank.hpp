// Re-ranking the planner's best candidates with the event simulator: the analytic pipeline
// formula orders layouts quickly, the simulator (links shared, overlap as scheduled) decides
// among the few best.
#pragma once

#include "search/planner.hpp"

namespace alloy {

struct RerankReport {
  bool changed = false;                      // the simulator preferred another candidate
  std::vector<double> simulated_step_seconds;  // per candidate, in the planner's order
  int chosen = 0;                            // index into the planner's candidates
};

// Simulates every candidate of `result`, makes the one with the shortest simulated step (or,
// for the cost objective, the lowest simulated price per token) the plan, rebuilds the
// runner-ups around it and notes the change in the plan. Candidates keep the planner's
// predictions; the note gives both figures.
RerankReport plan_rerank_by_simulation(SearchResult* result, const CostModel& cost, Objective objective);

}  // namespace alloy
