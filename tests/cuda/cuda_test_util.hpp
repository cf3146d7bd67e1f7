// Shared by the GPU tests: skip where no GPU is present, copies between host and device, and the
// bf16 rounding the GPU kernels apply, so CPU references can be compared at the right tolerance.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/cuda/cuda_check.hpp"
#include "runtime/cuda/device.hpp"
#include "spec/error.hpp"

namespace alloy::testing {

// Skips the calling test (with the driver's reason) when this machine has no GPU the backend
// runs on.
#define ALLOY_REQUIRE_GPU()                                                   \
  do {                                                                        \
    std::string alloy_gpu_reason;                                             \
    if (::alloy::cuda_device_count(&alloy_gpu_reason) == 0) {                 \
      GTEST_SKIP() << "no GPU here: " << alloy_gpu_reason;                    \
    }                                                                         \
    try {                                                                     \
      ::alloy::cuda_device_open(0);                                           \
    } catch (const ::alloy::Error& alloy_gpu_error) {                         \
      GTEST_SKIP() << alloy_gpu_error.message();                              \
    }                                                                         \
  } while (0)

// A device buffer of n elements of T, freed at scope end.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t n) : n_(n) {
    cuda_check(cudaMalloc(&data_, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T)), "test cudaMalloc");
  }
  DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(static_cast<int64_t>(host.size())) { upload(host); }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return data_; }
  int64_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    cuda_check(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "test upload");
  }
  std::vector<T> download() const {
    std::vector<T> host(static_cast<size_t>(n_));
    cuda_check(cudaDeviceSynchronize(), "test kernels");
    cuda_check(cudaMemcpy(host.data(), data_, host.size() * sizeof(T), cudaMemcpyDeviceToHost), "test download");
    return host;
  }

 private:
  T* data_ = nullptr;
  int64_t n_ = 0;
};

inline std::vector<float> random_floats(int64_t n, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& x : out) x = normal(rng);
  return out;
}

inline std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = __float2bfloat16(x[i]);
  return out;
}

inline std::vector<float> to_float(const std::vector<bf16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = __bfloat162float(x[i]);
  return out;
}

// x rounded to bf16 and back: the CPU reference then sees exactly the GPU's inputs.
inline std::vector<float> round_bf16(const std::vector<float>& x) { return to_float(to_bf16(x)); }

// Largest |a - b| / (atol + rtol |b|) over the elements; <= 1 means within tolerance.
inline double tolerance_ratio(const std::vector<float>& a, const std::vector<float>& b, double atol, double rtol) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double ratio = std::fabs(double{a[i]} - double{b[i]}) / (atol + rtol * std::fabs(double{b[i]}));
    if (!(ratio <= worst)) worst = std::isnan(ratio) ? INFINITY : ratio;
  }
  return worst;
}

// The value of `key` in every line of a training log (alloy train --log: one JSON object per step).
inline std::vector<double> logged(const std::string& log, const char* key) {
  std::vector<double> out;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at(key).get<double>());
  return out;
}

}  // namespace alloy::testing
