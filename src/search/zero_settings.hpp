// The planner's ZeRO dimension per stage: the ZeRO stages a stage may take and, under ZeRO 2-3,
// its gradient strategy (sharded: reduce-scattered after every micro-batch, 1/dp kept; or
// accumulated in full), each priced for its exposed gradient sync.
#pragma once

#include <vector>

#include "search/stage_options.hpp"

namespace alloy {

// Accumulating gradients in full is kept beside sharding only when it saves more than this share
// of the stage's compute per step: below it the difference lies inside the cost model's error,
// while the memory sharding frees (all the stage's gradients but a shard and a part) is certain
// and leaves headroom against fragmentation and for larger micro-batches.
inline constexpr double kShardingTimeTolerance = 0.01;

// A setting with its exposed gradient sync per step and its memory without recomputation or
// offload.
struct PricedSetting {
  ZeroSetting zero;
  double sync_seconds = 0;
  double memory_bytes = 0;
  bool offload_only = false;  // worth considering only with blocks offloaded (the other strategy cannot)
};

// The exposed gradient sync of a stage's layers at a ZeRO setting, priced once per (sp, setting).
double gradient_sync_seconds(const CostModel& cost, const StageSlot& slot, const StageUnitCosts& unit, int blocks,
                             const ZeroSetting& zero);

// Whether the runtime offloads blocks' weights at this setting (plan/runnable.hpp).
bool zero_setting_offloads(const StageSlot& slot, const ZeroSetting& zero);

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
