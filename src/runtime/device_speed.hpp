// Emulated device speed of this rank: how much slower than this CPU its compute runs. The
// cluster file's `speed` for the rank's device type, unless ALLOY_DEVICE_SPEED overrides it for
// this process (to emulate a device that is slower than its catalog entry says).
#pragma once

#include "spec/device_type.hpp"

namespace alloy {

// In (0, 1] for emulated slower devices, 1 for full speed. Throws alloy::Error for a malformed
// ALLOY_DEVICE_SPEED.
double device_speed(const DeviceType& type);

}  // namespace alloy
