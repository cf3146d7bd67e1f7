// The slowest stage of the best integer layer split, when a stage's time is a fixed part plus a
// time per unit of layers (and its per-step overhead at least so): lower bounds the planner
// orders and prunes layouts by.
#pragma once

#include <vector>

namespace alloy {

// `count` stages, each taking `fixed_seconds + n * unit_seconds` for n units (n >= 1).
struct StageRate {
  int count = 1;
  double fixed_seconds = 0;
  double unit_seconds = 0;  // > 0
};

// The smallest cap with sum over stages of floor((cap - fixed) / unit) >= units, every stage at
// least one unit: no split of `units` units has a faster slowest stage. Returns a value no
// larger than that minimum (by a relative 1e-12 at most), so it stays a bound under rounding.
double split_bottleneck_bound(const std::vector<StageRate>& stages, int units);

// What a stage pays once per step beside its micro-batches (its exposed gradient sync), for n
// units: at least max(floor_seconds, fixed_seconds + n unit_seconds).
struct OverheadRate {
  double floor_seconds = 0;
  double fixed_seconds = 0;  // may be negative
  double unit_seconds = 0;   // >= 0
};

// A lower bound on the pipeline's slowest stage per step, max over stages of
// (a x time per micro-batch + overhead), over every integer split of `units` units, each stage
// taking at least one: `stages` and `overheads` describe the same stages entry by entry, and `a`
// (>= 0) is the schedule's steady-state micro-batch factor (m - 1/v).
double split_step_bottleneck_bound(const std::vector<StageRate>& stages, const std::vector<OverheadRate>& overheads,
                                   double a, int units);

}  // namespace alloy
