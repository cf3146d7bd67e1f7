// bfloat16 as 16 bits: the upper half of an IEEE float, rounded to nearest even. Used where
// fp32 values cross a link in bf16 (gradient reductions with gradient_communication: bf16).
#pragma once

#include <cstdint>
#include <cstring>

namespace alloy {

inline uint16_t bf16_from_float(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0)
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN stays NaN (quiet)
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float bf16_to_float(uint16_t value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float out = 0;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

}  // namespace alloy
