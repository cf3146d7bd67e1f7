// Emulated device speed from the cluster file or ALLOY_DEVICE_SPEED.
#include "runtime/device_speed.hpp"

#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "spec/error.hpp"

namespace alloy {

double device_speed(const DeviceType& type) {
  if (const char* text = std::getenv("ALLOY_DEVICE_SPEED"); text != nullptr && *text != '\0') {
    char* end = nullptr;
    const double speed = std::strtod(text, &end);
    if (*end != '\0' || !(speed > 0) || speed > 1)
      throw Error(fmt::format("ALLOY_DEVICE_SPEED='{}' is not a speed in (0, 1]", text), {"", "ALLOY_DEVICE_SPEED"},
                  "give e.g. 0.5 for half speed, or unset it");
    return speed;
  }
  return type.speed > 0 ? type.speed : 1.0;
}

}  // namespace alloy
