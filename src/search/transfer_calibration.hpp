// Calibration of stage-boundary transfers: the per-transfer time, beyond the link model, that
// makes a calibrated profile predict the step its own run measured.
//
// The layer, optimizer and collective corrections (runtime/parallel/calibration.hpp) leave one part
// of a pipeline's step unmeasured: its waits for neighbouring stages. On this machine's shared
// cores each of them costs a wake-up and a scheduling delay, not the link's 5 us, and a 2-stage
// interleaved plan (64 transfers per step) ran 1.07-1.14x of its calibrated prediction while
// its compute matched (docs/profile-format.md).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cost/profile.hpp"
#include "plan/plan.hpp"
#include "spec/cluster.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy {

struct TransferCalibration {
  std::vector<std::string> device_types;  // the plan's types found in the profile: they take it
  double extra_seconds = 0;               // per transfer; 0 when the model already predicts enough
  double model_step_seconds = 0;          // the calibrated profile's step without it
  double measured_step_seconds = 0;
};

// `train`: the run's spec (optimizer and master weights); the plan's sequence length, batch and
// precision replace its own. None when the plan has one stage (no boundaries) or none of its
// device types is in the profile.
std::optional<TransferCalibration> transfer_calibration_fit(const Plan& plan, const ModelSpec& model,
                                                            const ClusterSpec& cluster, const TrainSpec& train,
                                                            const Profile& calibrated, double measured_step_seconds);

// Sets the fitted time on the calibration's device types.
void transfer_calibration_apply(Profile* profile, const TransferCalibration& c);

// One line, e.g. "measured / predicted on stage-boundary transfers: the step 1.05x (447 ms
// measured, 426 ms with the corrections above), so each transfer from cpu-fast takes 432 us
// more than the link model".
std::string transfer_calibration_describe(const TransferCalibration& c);

}  // namespace alloy
