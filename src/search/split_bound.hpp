// The slowest stage of the best integer layer split, when a stage's time is a fixed part plus a
// time per unit of layers: a lower bound the planner orders and prunes layouts by.
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

}  // namespace alloy
