// Test helpers for the runtime kernels: seeded random tensors and a central finite-difference
// check of a backward kernel against its forward.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace alloy::testing {

inline std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (float& value : values) value = normal(rng);
  return values;
}

// sum(out * weights) in double: the scalar whose gradient the backward kernels compute when
// given dout = weights.
inline double weighted_sum(const std::vector<float>& out, const std::vector<float>& weights) {
  double sum = 0.0;
  for (size_t i = 0; i < out.size(); i++) sum += static_cast<double>(out[i]) * weights[i];
  return sum;
}

// For up to `probes` indices of x: (loss(x + h e_i) - loss(x - h e_i)) / 2h must match
// analytic[i] within tolerance * max(1, max |analytic|). loss() re-runs the forward kernel.
inline void expect_gradient_matches(const std::string& name, std::vector<float>& x,
                                    const std::vector<float>& analytic,
                                    const std::function<double()>& loss, double h = 1e-2,
                                    double tolerance = 2e-3, size_t probes = 48) {
  ASSERT_EQ(x.size(), analytic.size()) << name;
  double scale = 1.0;
  for (float g : analytic) scale = std::max(scale, static_cast<double>(std::fabs(g)));
  const size_t stride = std::max<size_t>(1, x.size() / probes);
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); i += stride) {
    const float saved = x[i];
    x[i] = saved + static_cast<float>(h);
    const double plus = loss();
    x[i] = saved - static_cast<float>(h);
    const double minus = loss();
    x[i] = saved;
    const double numeric = (plus - minus) / (2.0 * h);
    const double error = std::fabs(numeric - analytic[i]) / scale;
    worst = std::max(worst, error);
    EXPECT_LT(error, tolerance) << name << " index " << i << ": finite difference " << numeric
                                << " vs backward " << analytic[i];
  }
  std::printf("  %-28s max relative gradient error %.2e over %zu probes\n", name.c_str(), worst,
              (x.size() + stride - 1) / stride);
}

// Largest |a - b| relative to max(1e-30, max |b|): how the golden and forward tests compare.
inline double max_relative_difference(const float* a, const double* b, size_t n) {
  double max_ref = 1e-30;
  double max_diff = 0.0;
  for (size_t i = 0; i < n; i++) {
    max_ref = std::max(max_ref, std::fabs(b[i]));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return max_diff / max_ref;
}

}  // namespace alloy::testing
