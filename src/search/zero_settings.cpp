#include "search/zero_settings.hpp"
#include "plan/runnable.hpp"

#include <algorithm>

namespace alloy {

double gradient_sync_seconds(const CostModel& cost, const StageSlot& slot, const StageUnitCosts& unit, int blocks,
                             const ZeroSetting& zero) {
  StageOption o;
  o.zero = zero.zero;
  o.shard_gradients = zero.shard;
  return cost.stage_gradient_sync_seconds(slot.shape, unit, stage_choice_of(slot, o, blocks));
}

std::vector<int> zero_levels(const StageSlot& slot, const OptionPins& pins) {
  // With one replica every ZeRO stage is the same layout: keep 0 (plan_search notes a pinned
  // stage it could not apply).
  if (slot.shape.dp == 1) return {0};
  if (pins.zero >= 0) return {pins.zero};
  // ZeRO 1 keeps what ZeRO 2 keeps with accumulated gradients and all-reduces where ZeRO 2
  // reduce-scatters: it never wins (the exhaustive test tries it).
  return {0, 2, 3};
}

bool zero_setting_offloads(const StageSlot& slot, const ZeroSetting& zero) {
  StageLayout layout;
  layout.tp = slot.shape.tp;
  layout.dp = slot.shape.dp;
  layout.offload = true;
  layout.shard_gradients = zero.shard && zero.zero >= 2 && slot.shape.dp > 1;
  return stage_features_runnable(layout).ok;
}

// The ZeRO stages with their gradient strategies: under ZeRO 2-3 with dp > 1, sharded and
// accumulated in full.
std::vector<ZeroSetting> zero_settings(const StageSlot& slot, const OptionPins& pins) {
  std::vector<ZeroSetting> out;
  for (int zero : zero_levels(slot, pins)) {
    if (zero < 2 || slot.shape.dp == 1) {
      out.push_back({zero, false});
      continue;
    }
    if (pins.shard_gradients != 0) out.push_back({zero, true});
    if (pins.shard_gradients != 1) out.push_back({zero, false});
  }
  return out;
}

// The settings with their exposed sync, the two strategies of a ZeRO stage ordered by sync and
// then memory. The front keeps the first of equal options, so a tie goes to the smaller memory;
// and when the cheaper sync fits without recomputation, the other is dominated at once.
std::vector<PricedSetting> priced_zero_settings(const CostModel& cost, const StageSlot& slot, const StageUnitCosts& unit,
                                                int blocks, const OptionPins& pins) {
  std::vector<PricedSetting> out;
  double compute_seconds = 0;  // the stage's plain forward and backward per step
  for (const ZeroSetting& zero : zero_settings(slot, pins)) {
    StageOption o;
    o.zero = zero.zero;
    o.shard_gradients = zero.shard;
    const StageChoice choice = stage_choice_of(slot, o, blocks);
    compute_seconds = choice.micro_batches * stage_blocks_sum(choice, unit.block.forward_seconds + unit.block.backward_seconds,
                                                              unit.dense_block.times.forward_seconds +
                                                                  unit.dense_block.times.backward_seconds);
    const double memory = cost.stage_memory(slot.shape, unit, choice, slot.in_flight, slot.has_next).total_bytes();
    out.push_back({zero, gradient_sync_seconds(cost, slot, unit, blocks, zero), memory});
  }
  // A strategy with no less sync and no less memory than the other of its ZeRO stage is
  // dominated at every recomputation and offload count (offloading widens sharding's excess:
  // the live parts stay while the full buffer shrinks): drop it. So is accumulating in full
  // when it saves no more than kShardingTimeTolerance of the compute and sharding holds less.
  // Only where both offload does that hold with offload: a strategy that offloads when the other
  // cannot (accumulating in full: plan/runnable.hpp) stays for its offloading options alone.
  const double tolerance = kShardingTimeTolerance * compute_seconds;
  const bool may_offload = pins.allow_offload && blocks > 0;
  const auto dominated_by = [&](const PricedSetting& a, const PricedSetting& b) {
    if (a.zero.zero != b.zero.zero) return false;
    if (!a.zero.shard && b.zero.shard && b.sync_seconds - a.sync_seconds <= tolerance && b.memory_bytes < a.memory_bytes)
      return true;
    return a.sync_seconds >= b.sync_seconds && a.memory_bytes >= b.memory_bytes &&
           (a.sync_seconds > b.sync_seconds || a.memory_bytes > b.memory_bytes);
  };
  std::vector<PricedSetting> kept;
  for (PricedSetting a : out) {
    bool dropped = false;
    for (const PricedSetting& b : out) {
      if (!dominated_by(a, b)) continue;
      if (may_offload && zero_setting_offloads(slot, a.zero) && !zero_setting_offloads(slot, b.zero)) {
        a.offload_only = true;
      } else {
        dropped = true;
      }
    }
    if (!dropped) kept.push_back(a);
  }
  out = std::move(kept);
  // zero_settings lists the ZeRO stages in ascending order: keep it.
  std::stable_sort(out.begin(), out.end(), [](const PricedSetting& a, const PricedSetting& b) {
    if (a.zero.zero != b.zero.zero) return a.zero.zero < b.zero.zero;
    return a.sync_seconds != b.sync_seconds ? a.sync_seconds < b.sync_seconds : a.memory_bytes < b.memory_bytes;
  });
  return out;
}

}  // namespace alloy
