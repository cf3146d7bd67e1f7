// exp and tanh for the elementwise kernels, written so that `omp simd` loops vectorise them (the
// libm calls do not): exp by range reduction to |r| <= ln2/2 and a degree-7 Taylor polynomial,
// relative error about 2e-7, i.e. within a few float ulps.
#pragma once

#include <bit>
#include <cstdint>

// Hot elementwise loops get an AVX2+FMA clone next to the baseline one, picked at load time from
// the CPU (GCC function multiversioning); the baseline build stays portable.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define ALLOY_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define ALLOY_VECTOR_CLONES
#endif

namespace alloy {

// Elements per parallel task in chunked elementwise loops.
inline constexpr int64_t kElementwiseChunk = 4096;

[[gnu::always_inline]] inline float exp_fast(float x) {
  x = x < 88.0f ? x : 88.0f;  // keeps 2^n a normal float (and maps to minps / maxps)
  x = x > -87.0f ? x : -87.0f;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2High = 0.693145751953125f;      // ln 2 split so n * kLn2High is exact
  constexpr float kLn2Low = 1.42860682030941723212e-6f;
  constexpr float kRound = 12582912.0f;                // 1.5 * 2^23: adding it rounds to integer
  const float shifted = x * kLog2e + kRound;
  const float n = shifted - kRound;
  const int32_t exponent = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  const float r = (x - n * kLn2High) - n * kLn2Low;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * std::bit_cast<float>((exponent + 127) << 23);
}

[[gnu::always_inline]] inline float tanh_fast(float x) {
  return 1.0f - 2.0f / (exp_fast(2.0f * x) + 1.0f);
}

}  // namespace alloy
