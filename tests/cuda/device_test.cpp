// Which GPUs the CUDA backend runs on, answered from the compute capability alone so that the
// refusal a V100 or T4 would get is checked on any machine.
#include <gtest/gtest.h>

#include <string>

#include "runtime/cuda/device.hpp"

namespace alloy {
namespace {

TEST(CudaCapability, GpusWithoutBf16TensorCoresAreRefusedNamingWhatTheyLack) {
  for (const auto& [major, minor] : {std::pair{8, 0}, std::pair{8, 6}, std::pair{8, 9}, std::pair{9, 0}, std::pair{10, 0}})
    EXPECT_EQ(cuda_capability_refusal(major, minor), "") << major << "." << minor;
  for (const auto& [major, minor] : {std::pair{7, 0}, std::pair{7, 5}, std::pair{6, 1}}) {
    const std::string refusal = cuda_capability_refusal(major, minor);
    EXPECT_NE(refusal.find(std::to_string(major) + "." + std::to_string(minor)), std::string::npos) << refusal;
    EXPECT_NE(refusal.find("no bf16 tensor cores"), std::string::npos) << refusal;
    EXPECT_NE(refusal.find("8.0 or newer"), std::string::npos) << refusal;
  }
}

}  // namespace
}  // namespace alloy
