// The integer split bound the planner orders layouts by: never above the true smallest slowest
// stage (found here by trying every step point), and within a hair of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <utility>

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

// The smallest slowest stage, (a x time per micro-batch + overhead), over every split of `units`
// units into the stages (counts expanded), each taking one or more.
double brute_force_step_bottleneck(const std::vector<StageRate>& stages, const std::vector<OverheadRate>& overheads,
                                   double a, int units) {
  std::vector<std::pair<StageRate, OverheadRate>> each;
  for (size_t i = 0; i < stages.size(); ++i)
    for (int c = 0; c < stages[i].count; ++c) each.emplace_back(stages[i], overheads[i]);
  double best = std::numeric_limits<double>::infinity();
  std::function<void(size_t, int, double)> split = [&](size_t stage, int left, double worst) {
    if (worst >= best) return;
    if (stage + 1 == each.size()) {
      const auto& [rate, overhead] = each[stage];
      const double time = a * (rate.fixed_seconds + left * rate.unit_seconds) +
                          std::max(overhead.floor_seconds, overhead.fixed_seconds + left * overhead.unit_seconds);
      best = std::min(best, std::max(worst, time));
      return;
    }
    for (int n = 1; n <= left - static_cast<int>(each.size() - stage - 1); ++n) {
      const auto& [rate, overhead] = each[stage];
      const double time = a * (rate.fixed_seconds + n * rate.unit_seconds) +
                          std::max(overhead.floor_seconds, overhead.fixed_seconds + n * overhead.unit_seconds);
      split(stage + 1, left - n, std::max(worst, time));
    }
  };
  split(0, units, 0);
  return best;
}

// With per-step overheads (negative fixed parts included, as a sync bound less the backward
// that hides it has), the bound never exceeds the best split's slowest stage, and it is never
// below the bound from the micro-batches alone.
TEST(SplitBound, StepBottleneckNeverAboveTheBestSplit) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> unit(0.5, 4.0);
  std::uniform_real_distribution<double> fixed(0.0, 3.0);
  std::uniform_real_distribution<double> overhead(-6.0, 6.0);
  int raised = 0;
  for (int trial = 0; trial < 1000; ++trial) {
    const int groups = 1 + static_cast<int>(rng() % 3);
    std::vector<StageRate> stages;
    std::vector<OverheadRate> overheads;
    int stage_count = 0;
    for (int g = 0; g < groups; ++g) {
      stages.push_back({1 + static_cast<int>(rng() % 2), fixed(rng), unit(rng)});
      overheads.push_back({std::max(0.0, overhead(rng)), overhead(rng), std::max(0.0, overhead(rng) / 2)});
      stage_count += stages.back().count;
    }
    const int units = stage_count + static_cast<int>(rng() % 10);
    const double a = trial % 5 == 0 ? 0.0 : 0.5 + (rng() % 16);
    const double exact = brute_force_step_bottleneck(stages, overheads, a, units);
    const double bound = split_step_bottleneck_bound(stages, overheads, a, units);
    ASSERT_LE(bound, exact * (1 + 1e-12)) << "trial " << trial;
    const double compute_only = a * split_bottleneck_bound(stages, units);
    ASSERT_GE(bound, compute_only) << "trial " << trial;
    raised += bound > compute_only * (1 + 1e-9);
  }
  // The overheads raise the bound in most trials, not just a corner.
  EXPECT_GT(raised, 500);
}

}  // namespace
}  // namespace alloy
