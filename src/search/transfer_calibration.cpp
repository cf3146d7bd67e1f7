#include "search/transfer_calibration.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "search/planner.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {

// A probe of the model's step against the per-transfer time: large enough to move a step of
// tens of milliseconds measurably, small against one.
constexpr double kProbeSeconds = 1e-3;
// Secant steps at most, and how close to the missing time they stop.
constexpr int kSecantSteps = 4;
constexpr double kSecantTolerance = 0.005;

// The plan's step as the calibrated profile predicts it with `extra` seconds per transfer.
double predicted_step(const Plan& plan, const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                      const Profile& calibrated, const std::vector<std::string>& types, double extra) {
  Profile profile = calibrated;
  for (const std::string& type : types) profile.device_types.at(type).boundary_transfer_seconds = extra;
  const CostModel cost(model, cluster, plan_train_spec(train, plan), &profile);
  Plan evaluated = plan;
  plan_evaluate(&evaluated, cost);
  return evaluated.step_seconds;
}

}  // namespace

std::optional<TransferCalibration> transfer_calibration_fit(const Plan& plan, const ModelSpec& model,
                                                            const ClusterSpec& cluster, const TrainSpec& train,
                                                            const Profile& calibrated, double measured_step_seconds) {
  if (plan.stages.size() < 2 || measured_step_seconds <= 0) return std::nullopt;
  TransferCalibration c;
  for (const PlanStage& st : plan.stages)
    for (int id : st.device_ids) {
      const std::string& type = cluster.device_type(cluster.devices.at(static_cast<size_t>(id))).name;
      if (calibrated.device_types.count(type) > 0 &&
          std::find(c.device_types.begin(), c.device_types.end(), type) == c.device_types.end())
        c.device_types.push_back(type);
    }
  if (c.device_types.empty()) return std::nullopt;
  const auto step = [&](double extra) {
    return predicted_step(plan, model, cluster, train, calibrated, c.device_types, extra);
  };
  c.model_step_seconds = step(0);
  c.measured_step_seconds = measured_step_seconds;
  const double missing = measured_step_seconds - c.model_step_seconds;
  if (missing <= 0) return c;  // the link model is a floor: never below it
  // The step grows piecewise linearly with the time per transfer (the slowest stage can change):
  // secants through the origin, from a probe, until the step is within tolerance.
  double tried = kProbeSeconds;
  double reached = step(tried) - c.model_step_seconds;
  for (int i = 0; i < kSecantSteps && reached > 0; ++i) {
    tried *= missing / reached;
    reached = step(tried) - c.model_step_seconds;
    c.extra_seconds = tried;
    if (std::abs(reached - missing) <= kSecantTolerance * missing) break;
  }
  return c;
}

void transfer_calibration_apply(Profile* profile, const TransferCalibration& c) {
  for (const std::string& type : c.device_types) profile->device_types.at(type).boundary_transfer_seconds = c.extra_seconds;
}

std::string transfer_calibration_describe(const TransferCalibration& c) {
  const double ratio = c.model_step_seconds > 0 ? c.measured_step_seconds / c.model_step_seconds : 0;
  std::string text = fmt::format(
      "measured / predicted on stage-boundary transfers: the step {:.2f}x ({} measured, {} with the corrections above)",
      ratio, units_format_seconds(c.measured_step_seconds), units_format_seconds(c.model_step_seconds));
  if (c.extra_seconds > 0)
    return text + fmt::format(", so each transfer from {} takes {} more than the link model",
                              fmt::join(c.device_types, ", "), units_format_seconds(c.extra_seconds));
  return text + fmt::format(", so transfers from {} keep the link model", fmt::join(c.device_types, ", "));
}

}  // namespace alloy
