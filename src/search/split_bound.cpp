#include "search/split_bound.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace alloy {

namespace {

constexpr double kSlack = 1e-12;

// Units the stages take under `cap`, each at least one (cap is at least every stage's one unit).
int64_t units_under(const std::vector<StageRate>& stages, double cap) {
  int64_t total = 0;
  for (const StageRate& s : stages)
    total += s.count * static_cast<int64_t>((cap - s.fixed_seconds) / s.unit_seconds);
  return total;
}

}  // namespace

double split_bottleneck_bound(const std::vector<StageRate>& stages, int units) {
  // Every stage takes one unit at least.
  double lo = 0;
  for (const StageRate& s : stages) lo = std::max(lo, s.fixed_seconds + s.unit_seconds);
  if (stages.empty() || units_under(stages, lo * (1 + kSlack)) >= units) return lo;
  // Without the floors the stages take sum count (cap - fixed) / unit, which is at least `units`
  // at the minimum and, less one unit per stage, at most `units` just below it: the minimum lies
  // in [first, last] and is a step point fixed + j unit of some stage.
  double rate = 0;
  double offset = 0;
  double stage_count = 0;
  for (const StageRate& s : stages) {
    rate += s.count / s.unit_seconds;
    offset += s.count * s.fixed_seconds / s.unit_seconds;
    stage_count += s.count;
  }
  const double first = std::max(lo, (units + offset) / rate);
  const double last = (units + stage_count + offset) / rate;
  std::vector<double> steps;
  for (const StageRate& s : stages) {
    const double j_first = std::ceil((first - s.fixed_seconds) / s.unit_seconds * (1 - kSlack));
    for (double j = std::max(1.0, j_first); s.fixed_seconds + j * s.unit_seconds <= last * (1 + kSlack); ++j)
      steps.push_back(s.fixed_seconds + j * s.unit_seconds);
  }
  std::sort(steps.begin(), steps.end());
  for (double cap : steps)
    if (units_under(stages, cap * (1 + kSlack)) >= units) return std::max(first, cap * (1 - kSlack));
  return first;
}

double split_step_bottleneck_bound(const std::vector<StageRate>& stages, const std::vector<OverheadRate>& overheads,
                                   double a, int units) {
  // Three bounds, the largest wins: the micro-batches alone; every stage's one unit and overhead
  // floor; and micro-batches and overhead together, when each stage's sum grows with its units.
  double bound = stages.empty() ? 0 : a * split_bottleneck_bound(stages, units);
  std::vector<StageRate> combined;
  combined.reserve(stages.size());
  bool growing = true;
  for (size_t i = 0; i < stages.size(); ++i) {
    const StageRate& s = stages[i];
    const OverheadRate& o = overheads[i];
    bound = std::max(bound, (a * (s.fixed_seconds + s.unit_seconds) + o.floor_seconds) * (1 - kSlack));
    combined.push_back({s.count, a * s.fixed_seconds + o.fixed_seconds, a * s.unit_seconds + o.unit_seconds});
    growing = growing && combined.back().unit_seconds > 0;
  }
  if (growing && !combined.empty()) bound = std::max(bound, split_bottleneck_bound(combined, units) * (1 - kSlack));
  return bound;
}

}  // namespace alloy
