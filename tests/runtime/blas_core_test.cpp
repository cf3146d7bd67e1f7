// OpenBLAS kernel family: the upgrade rule on its own, then the family this process runs on.
#include <gtest/gtest.h>

#include <cstdlib>

#include "runtime/cpu/blas_core.hpp"
#include "runtime/threads.hpp"

namespace alloy {
namespace {

CpuVectorFeatures features(bool avx, bool avx2, bool avx512, bool bf16) {
  return CpuVectorFeatures{.avx = avx, .avx2_fma = avx2, .avx512 = avx512, .avx512_bf16 = bf16};
}

TEST(BlasCore, UpgradesAFallbackToTheWidestVectorsTheCpuHas) {
  EXPECT_EQ(blas_core_upgrade("Prescott", features(true, true, true, false)), "SkylakeX");
  EXPECT_EQ(blas_core_upgrade("Prescott", features(true, true, true, true)), "Cooperlake");
  EXPECT_EQ(blas_core_upgrade("Nehalem", features(true, true, false, false)), "Haswell");
  EXPECT_EQ(blas_core_upgrade("Core2", features(true, false, false, false)), "Sandybridge");
  EXPECT_EQ(blas_core_upgrade("Haswell", features(true, true, true, false)), "SkylakeX");
  EXPECT_EQ(blas_core_upgrade("PRESCOTT", features(true, true, false, false)), "Haswell");  // names in any case
}

TEST(BlasCore, KeepsAFamilyAsWideAsTheCpuAllowsOrOneItDoesNotKnow) {
  EXPECT_EQ(blas_core_upgrade("SkylakeX", features(true, true, true, true)), "");
  EXPECT_EQ(blas_core_upgrade("SapphireRapids", features(true, true, true, true)), "");
  EXPECT_EQ(blas_core_upgrade("Zen", features(true, true, false, false)), "");
  EXPECT_EQ(blas_core_upgrade("Prescott", features(false, false, false, false)), "");
  EXPECT_EQ(blas_core_upgrade("POWER9", features(true, true, true, true)), "");
  EXPECT_EQ(blas_core_upgrade("NewCore2030", features(true, true, true, true)), "");
}

TEST(BlasCore, ThisProcessRunsTheWidestFamilyTheCpuAllows) {
  runtime_set_threads(1);
  const BlasCore& core = blas_core();
  std::printf("%s\n", core.note.c_str());
  EXPECT_FALSE(core.name.empty());
  EXPECT_FALSE(core.note.empty());
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) GTEST_SKIP() << "OPENBLAS_CORETYPE chooses the family";
  EXPECT_EQ(blas_core_upgrade(core.name, cpu_vector_features()), "")
      << "OpenBLAS runs " << core.name << " (it chose " << core.detected << ")";
  EXPECT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr) << "the switch must not leak into child processes";
}

}  // namespace
}  // namespace alloy
