// Uneven data parallelism: one stage over devices of several types, each replica holding the
// whole model and taking a share of every micro-batch that its speed earns (balancing by batch,
// where the layer-split search balances by layers). Whole blocks cap a pipeline of unequal
// devices (12 blocks over speeds 1, 0.5 and 0.25 leave the best split at 86% of their summed
// speed); sequences of a micro-batch divide finer.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "cost/cost_model.hpp"
#include "plan/plan.hpp"
#include "search/planner.hpp"

namespace alloy {

// Sequences of one micro-batch of `micro_batch` per replica, in the order of `seconds`: each
// sequence goes to the replica that would finish it soonest. seconds[r](b): replica r's time
// for b sequences (increasing in b). Needs micro_batch >= replicas (each takes at least one).
std::vector<int64_t> uneven_shares(int64_t micro_batch, const std::vector<std::function<double(int64_t)>>& seconds);

// The best plan of this kind that fits (every device of the cluster, tp 1, one stage), or none
// when the options rule it out (pinned pp > 1, tp > 1, a layer split or a device order; one
// device type; --even-dp) or nothing fits.
std::optional<Plan> uneven_dp_best(const CostModel& cost, const SearchOptions& options);

}  // namespace alloy
