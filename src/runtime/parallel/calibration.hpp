// Calibration: a run of a plan made with a measured profile corrects that profile, per device
// type and per layer kind (embedding, blocks, head), and for the optimizer step.
//
// Each rank's forward and backward time of a step is split over the layer kinds it ran in
// proportion to the thread CPU time each kind took, and compared with the plan's prediction
// split in proportion to the profile's times for the same layers. One factor per device type
// scaled every layer alike before; but a profile that is off for one kind only (the head's
// large vocabulary product, say) then moved the whole type, and carried over badly to plans
// that give that type another mix of layers (docs/runtime-distributed.md).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "cost/profile.hpp"
#include "plan/plan.hpp"
#include "runtime/trainer.hpp"
#include "spec/model.hpp"

namespace alloy {

inline constexpr double kCalibrationMinimumShare = 0.1;

// A run's collectives of one kind and group size against the profile's times for their sizes.
struct CollectiveCalibration {
  CollectiveOp op = CollectiveOp::CollectiveOp_all_reduce;
  int group_size = 0;
  int count = 0;
  double measured_seconds = 0, predicted_seconds = 0;  // summed over the run's collectives
  double ratio() const { return measured_seconds / predicted_seconds; }
};

struct DeviceTypeCalibration {
  std::string device_type;
  double pass_ratio = 1;  // forward and backward of a step, every layer kind together
  // Per LayerKind, measured where the kind took at least kCalibrationMinimumShare of the type's
  // pass time; 0 elsewhere (pass_ratio applies to it). A kind that ran briefly (the embedding
  // often takes 1-3%) gives a ratio that the machine's noise sets more than the profile's error.
  std::array<double, kLayerKinds> layer_ratio = {0, 0, 0};
  std::array<double, kLayerKinds> layer_share = {0, 0, 0};  // of the type's measured pass time
  double optimizer_ratio = 1;
  // The ratios above are the slowest rank's among ranks doing the same work (one stage and share
  // of each micro-batch): a synchronous step waits for it. How much slower it ran than their
  // average, in the passes (1: one rank per work, or all alike).
  double slowest_alike_lift = 1;
  // The collectives the type's ranks took part in (each timed once every member had joined),
  // by kind and group size; and all of them together (0: none ran, or the profile has none).
  std::vector<CollectiveCalibration> collectives;
  double collective_ratio = 0;
};

// Measured over predicted per device type of the plan's stages. `profile` is the one the plan
// was made with (its layer times give the predicted split over layer kinds; a kind it lacks the
// shape of takes no share of the prediction).
std::vector<DeviceTypeCalibration> dist_calibration(const TrainerResult& result, const Plan& plan,
                                                    const Profile& profile, const ModelSpec& model);

// `profile` with each calibrated type's layer times scaled by their kind's ratio, its optimizer
// rate by the optimizer's, and its collectives (both placements) by their kind and group size's
// ratio; where the run had none of that size, by that kind's ratio over the sizes it had, and
// where it had none of that kind, by all its collectives' ratio: what slows a collective inside
// training and not in `alloy profile` (cold caches, the peers' compute on the same cores) slows
// the others there too.
Profile profile_calibrated(const Profile& profile, const std::vector<DeviceTypeCalibration>& ratios);

// "blocks 1.37x, head 0.80x, forward and backward 1.21x, optimizer 0.98x, collectives 1.90x
// (all_reduce over 4 2.10x, all_gather over 4 1.40x)" (kinds without a ratio of their own left
// out).
std::string calibration_describe(const DeviceTypeCalibration& c);

}  // namespace alloy
