// bfloat16 as 16 bits: the upper half of an IEEE float, rounded to nearest even. Used where
// fp32 values cross a link in bf16 (gradient reductions with gradient_communication: bf16); and
// IEEE half precision read from files.
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

// IEEE half precision (F16) to float: normals, subnormals, infinities and NaN.
inline float float_from_f16(uint16_t value) {
  const uint32_t sign = static_cast<uint32_t>(value & 0x8000u) << 16;
  const uint32_t exponent = (value >> 10) & 0x1fu;
  uint32_t mantissa = value & 0x3ffu;
  uint32_t bits = 0;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa != 0) {  // subnormal: normalise
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | ((mantissa & 0x3ffu) << 13);
  } else {
    bits = sign;
  }
  float out = 0;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

}  // namespace alloy
