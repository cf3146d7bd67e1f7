#include "search/expert_options.hpp"

#include <algorithm>

namespace alloy {

std::vector<int> stage_ep_degrees(int dp, int num_experts, int pinned) {
  if (num_experts <= 0) return {1};
  std::vector<int> out;
  for (int ep = 1; ep <= dp; ++ep)
    if (dp % ep == 0 && num_experts % ep == 0 && (pinned <= 0 || ep == pinned)) out.push_back(ep);
  return out;
}

void stage_options_over_ep(const CostModel& cost, const StageSlot& slot, const std::vector<SlotAtEp>& at_ep, int blocks,
                           const OptionPins& pins, std::vector<StageOption>* out) {
  out->clear();
  std::vector<StageOption> at;
  for (const SlotAtEp& a : at_ep) {
    StageSlot with = slot;
    with.shape = a.shape;
    with.unit[0] = a.unit[0];
    with.unit[1] = a.unit[1];
    // Offloading is searched at every ep: an offloaded block takes this member's experts along.
    stage_options(cost, with, blocks, pins, &at);
    for (StageOption o : at) {
      o.ep = a.ep;
      out->push_back(o);
    }
  }
  std::sort(out->begin(), out->end(), [](const StageOption& a, const StageOption& b) {
    return a.t != b.t ? a.t < b.t : a.u < b.u;
  });
  std::vector<StageOption> kept;
  for (const StageOption& o : *out)
    if (kept.empty() || o.u < kept.back().u) kept.push_back(o);
  *out = std::move(kept);
}

}  // namespace alloy
