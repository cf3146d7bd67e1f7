// The planner's ZeRO dimension per stage: the ZeRO stages a stage may take and, under ZeRO 2-3,
// its gradient strategy (sharded: reduce-scattered after every micro-batch, 1/dp kept; or
// accumulated in full), each priced for its exposed gradient sync.
#pragma once

#include <vector>

#include "search/stage_options.hpp"

namespace alloy {

// ZeRO stage and gradient strategy of a stage.
struct ZeroSetting {
  int zero = 0;
  bool shard = false;
};

// A setting with its exposed gradient sync per step and its memory without recomputation or
// offload.
struct PricedSetting {
  ZeroSetting zero;
  double sync_seconds = 0;
  double memory_bytes = 0;
};

// The exposed gradient sync of a stage's layers at a ZeRO setting, priced once per (sp, setting).
double gradient_sync_seconds(const CostModel& cost, const StageSlot& slot, const StageUnitCosts& unit, int blocks,
                             const ZeroSetting& zero);

// The ZeRO stages a slot may take, ascending.
std::vector<int> zero_levels(const StageSlot& slot, const OptionPins& pins);
// The ZeRO stages with their gradient strategies: under ZeRO 2-3 with dp > 1, sharded and
// accumulated in full (as pinned).
std::vector<ZeroSetting> zero_settings(const StageSlot& slot, const OptionPins& pins);
// The settings priced, a dominated strategy dropped, the two strategies of a ZeRO stage
// ordered by sync and then memory (see the definition).
std::vector<PricedSetting> priced_zero_settings(const CostModel& cost, const StageSlot& slot, const StageUnitCosts& unit,
                                                int blocks, const OptionPins& pins);

}  // namespace alloy
