// The integer split bound the planner orders layouts by: never above the true smallest slowest
// stage (found here by trying every step point), and within a hair of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>

#include "search/split_bound.hpp"

namespace alloy {
namespace {

// Every cap where some stage gains a unit, smallest first, until the stages hold `units`.
double brute_force_bound(const std::vector<StageRate>& stages, int units) {
  std::vector<double> steps;
  for (const StageRate& s : stages)
    for (int j = 1; j <= units; ++j) steps.push_back(s.fixed_seconds + j * s.unit_seconds);
  std::sort(steps.begin(), steps.end());
  double lo = 0;
  for (const StageRate& s : stages) lo = std::max(lo, s.fixed_seconds + s.unit_seconds);
  for (double cap : steps) {
    if (cap < lo) continue;
    int64_t total = 0;
    for (const StageRate& s : stages)
      total += s.count * static_cast<int64_t>(std::floor((cap - s.fixed_seconds) / s.unit_seconds + 1e-9));
    if (total >= units) return cap;
  }
  return steps.back();
}

TEST(SplitBound, MatchesEveryStepPointSearch) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> unit(0.5, 4.0);
  std::uniform_real_distribution<double> fixed(0.0, 3.0);
  for (int trial = 0; trial < 2000; ++trial) {
    const int groups = 1 + static_cast<int>(rng() % 4);
    std::vector<StageRate> stages;
    int stage_count = 0;
    for (int g = 0; g < groups; ++g) {
      StageRate s;
      s.count = 1 + static_cast<int>(rng() % 4);
      s.fixed_seconds = trial % 2 == 0 ? 0.0 : fixed(rng);
      s.unit_seconds = unit(rng);
      stage_count += s.count;
      stages.push_back(s);
    }
    const int units = stage_count + static_cast<int>(rng() % 60);
    const double exact = brute_force_bound(stages, units);
    const double bound = split_bottleneck_bound(stages, units);
    ASSERT_LE(bound, exact * (1 + 1e-15)) << "trial " << trial;
    ASSERT_GE(bound, exact * (1 - 1e-9)) << "trial " << trial;
  }
}

TEST(SplitBound, OneUnitPerStageIsTheFloor) {
  // Three stages and three units: each takes one, the slowest one-unit stage sets the bound.
  const std::vector<StageRate> stages = {{1, 0.5, 1.0}, {2, 0.0, 2.0}};
  EXPECT_DOUBLE_EQ(split_bottleneck_bound(stages, 3), 2.0);
}

}  // namespace
}  // namespace alloy
