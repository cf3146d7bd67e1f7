// One candidate structure solved exactly for the planner's search: its stages placed on devices,
// a lower bound from the placed stages, and the best layer split with each stage's choices
// (dynamic programming on the bottleneck). One solver per search thread: it caches what
// structures share (per-layer costs, option sets, boundary links).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cost/cost_model.hpp"
#include "search/expert_options.hpp"
#include "search/layouts.hpp"
#include "search/option_cache.hpp"
#include "search/planner.hpp"
#include "search/search_checks.hpp"
#include "search/split_bound.hpp"
#include "search/stage_options.hpp"

namespace alloy {

// A stage with its key parts, inside one structure.
struct SlotInfo {
  StageSlot slot;
  UnitKey unit_key;  // sp = 0
  std::span<const int> device_ids;  // into the type's pool
  int64_t placement = 0;            // first device, tp and dp: identifies the stage's placement
  std::vector<SlotAtEp> at_ep;  // MoE models: the slot at each ep it may take (empty for dense models)
  GradientReduceBound reduce;   // the least its gradient reduction takes
};

std::vector<int> slot_device_ids(const SlotInfo& info);

// The best layer split of a structure and each stage's choices.
struct Solution {
  int structure = -1;
  double step_seconds = std::numeric_limits<double>::infinity();
  double score = std::numeric_limits<double>::infinity();
  std::vector<int> blocks;  // per stage
  std::vector<StageOption> options;
};

class StructureSolver {
 public:
  StructureSolver(const CostModel& cost, const SearchOptions& options);

  // The structure's stages in pipeline order, placed on consecutive devices of each type's pool.
  std::vector<SlotInfo> slots(const Structure& s, const std::vector<TypePool>& pools);

  // A lower bound on the step time from the placed stages: each stage's time per micro-batch
  // is at least its blocks' time plus its fixed part (boundary sends, embedding, head), its
  // per-step overhead at least the gradient sync its placement must pay. Returns the bound and
  // sets its part for the slowest stage ((m - 1/v) x time per micro-batch + overhead).
  double refined_lower_bound(const Structure& s, const std::vector<SlotInfo>& slot_infos, double* bottleneck);

  // Exact best split for a structure: walk the bottleneck cap down from infinity, each time
  // solving the min-sum split under the cap; stop when no smaller cap can win.
  // `bound` and `bottleneck_bound`: refined_lower_bound's answers for this structure, the last
  // structure it was given. `*limited`: no split was found below the threshold, though some
  // might fit.
  std::optional<Solution> solve(const Structure& s, std::vector<SlotInfo>& slot_infos, double threshold_seconds,
                                double bound, double bottleneck_bound, bool* limited);

  // Memory the most frugal even split of a structure needs, as a multiple of capacity; and,
  // when every stage would fit device memory by offloading more than host memory holds, the
  // host memory per device the most demanding stage needs, as a multiple of its share.
  double frugal_memory_ratio(const Structure& s, std::vector<SlotInfo>& slot_infos, double* bytes, int* type,
                             HostShortfall* host);

  SearchStats stats;

 private:
  const StageUnitCosts* unit(const StageShape& shape, UnitKey key);
  // A slot's option sets when an MoE model's `leading` dense blocks lie from its first block on
  // (StageSlot::leading_dense_blocks; 0 for dense models and stages past them).
  SlotOptionSets& option_sets(const SlotInfo& info, int leading);
  const std::vector<StageOption>& options(const SlotInfo& info, int leading, SlotOptionSets& sets, int blocks);
  // The leading dense blocks from the first block of a stage whose chunk starts `offset` blocks in.
  int leading_dense_from(int offset) const { return std::max(0, dense_layers_ - offset); }
  // The range of leading_dense_from over the offsets stage `st` of a split may start at.
  std::pair<int, int> stage_leading_range(int st, int p, int units, int unit, int fewest) const;
  // The slot at each expert-parallel degree its dp allows (ep 1 is the slot itself).
  void add_expert_degrees(SlotInfo* info, int dp, bool plain_allowed, bool sp_allowed);
  // The path between two adjacent stages, by their placements.
  const BoundaryLink& boundary(const SlotInfo& from, const SlotInfo& to);
  // Summing a table tied between the first and last stage, by their placements (0 when untied).
  double tied_table(const SlotInfo& first, const SlotInfo& last);
  // Minimum total per-micro-batch time over layer splits whose every stage keeps
  // (m - 1/v) t + u <= cap. Fills blocks and options; false when nothing fits.
  // `k_limit`: per stage, the most units it may take (more would make the step no faster than
  // the threshold).
  bool split_min_sum(const Structure& s, std::vector<SlotInfo>& slot_infos, double cap, const std::vector<int>& k_limit,
                     std::vector<int>* blocks, std::vector<StageOption>* chosen, double* sum);
  // Smallest possible max over stages of (m - 1/v) t + u, over every split, from the option
  // sets the last split_min_sum visited (min-max dynamic program).
  double min_bottleneck(const Structure& s, const std::vector<SlotInfo>& slot_infos);

  const CostModel& cost_;
  const SearchOptions& options_;
  OptionPins pins_;
  int dense_layers_ = 0;  // an MoE model's leading dense blocks (0 for dense models)
  GroupLinksIds link_ids_;
  std::unordered_map<UnitKey, StageUnitCosts, KeyHash> units_;
  // By placement of (first device, tp, dp): the stage's shape and the least its gradient
  // reduction takes.
  struct PlacedShape {
    StageShape shape;
    GradientReduceBound reduce;
    int links = 0;  // link_ids_ of its dp group
  };
  std::unordered_map<int64_t, PlacedShape> shapes_;
  std::map<std::pair<int64_t, int64_t>, BoundaryLink> boundaries_;  // by the two stages' placements
  std::map<std::pair<int64_t, int64_t>, double> tied_tables_;       // by the first and last placements
  std::unordered_map<SlotKey, SlotOptionSets, KeyHash> option_sets_;
  // (stage, leading dense blocks, units) of the structure in solve(), at option_cell().
  std::vector<const std::vector<StageOption>*> option_table_;
  size_t option_cell(int st, int leading, int units, size_t width) const {
    return (static_cast<size_t>(st) * (dense_layers_ + 1) + leading) * width + units;
  }
  // Tables of split_min_sum, kept between calls to save allocations.
  struct Scratch {
    std::vector<double> best;
    std::vector<int> take;
    std::vector<const StageOption*> pick;
    std::vector<const StageOption*> under_cap;
    std::vector<double> fastest;
    std::vector<int> k_end;       // per (stage, leading dense blocks)
    std::vector<int> k_max;       // the same
    std::vector<double> worst;
    std::vector<StageRate> stage_rates;  // of the structure last given to refined_lower_bound
    std::vector<OverheadRate> overheads;  // of the same stages
    std::vector<int> k_limit;
  } scratch_;
};

}  // namespace alloy
