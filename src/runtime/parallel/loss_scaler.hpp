// Dynamic loss scaling (TrainSpec::loss_scaling): the scale the backward multiplies the loss by,
// halved when a step's gradients overflow (the step is skipped) and doubled after a run of good
// steps. Every rank applies the same decisions to the same agreed finiteness, so all hold the
// same scale.
#pragma once

#include <algorithm>
#include <cstdint>

#include "spec/train.hpp"

namespace alloy {

// 2^64: past it a scaled fp32 gradient would overflow before an fp16 one.
inline constexpr double kLossScaleMost = 0x1p64;

struct LossScaler {
  bool dynamic = false;
  double scale = 1;            // 1 when not dynamic
  int64_t good_steps = 0;      // updates since the scale last changed
  int64_t growth_interval = 2000;

  // `fp16_compute`: whether the rank computes in fp16 (what `auto` turns scaling on for).
  static LossScaler from(const TrainSpec& train, bool fp16_compute) {
    LossScaler s;
    s.dynamic = train.loss_scaling == LossScaling::LossScaling_dynamic ||
                (train.loss_scaling == LossScaling::LossScaling_auto && fp16_compute);
    s.scale = s.dynamic ? train.initial_loss_scale : 1;
    s.growth_interval = train.loss_scale_growth_interval;
    return s;
  }

  // A step whose loss was finite but whose gradients were not: true when that is an overflow
  // the scale absorbs (halved; the step is skipped as usual), false when scaling is off or the
  // scale is already 1, so the gradients are non-finite in their own right.
  bool absorb_overflow() {
    if (!dynamic || scale <= 1) return false;
    scale = std::max(1.0, scale / 2);
    good_steps = 0;
    return true;
  }

  // An update that went through.
  void step_done() {
    if (!dynamic || ++good_steps < growth_interval) return;
    scale = std::min(kLossScaleMost, scale * 2);
    good_steps = 0;
  }
};

}  // namespace alloy
