// The GPU communicators (NCCL and host-staged), checked by running comm_check_gpu under mpirun:
// with one rank (both communicators) and with two ranks (host-staged; NCCL too where the host has
// a GPU per rank, else the checker must say it skipped it).
#include <gtest/gtest.h>

#include <string>

#include <fmt/core.h>

#include "../common/test_util.hpp"
#include "cuda_test_util.hpp"

namespace alloy::testing {
namespace {

// The checker's path, or "" where it was not built (benchmarks off).
std::string comm_checker_path() {
#ifdef ALLOY_COMM_CHECK_GPU
  return ALLOY_COMM_CHECK_GPU;
#else
  return "";
#endif
}

CommandResult comm_check_run(int ranks) {
  mpi_test_environment_set();
  return run_command(fmt::format("mpirun -np {} --oversubscribe --bind-to none {} all", ranks, comm_checker_path()),
                     120);
}

TEST(GpuComm, OneRankNcclAndHostStagedAreExact) {
  ALLOY_REQUIRE_GPU();
  if (comm_checker_path().empty()) GTEST_SKIP() << "comm_check_gpu is built only with -DALLOY_BENCH=ON";
  const CommandResult result = comm_check_run(1);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("nccl: 1 rank(s)"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("host-staged: 1 rank(s)"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("all_to_all"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("all results exact"), std::string::npos) << result.output;
}

TEST(GpuComm, TwoRanksHostStagedAreExact) {
  ALLOY_REQUIRE_GPU();
  if (comm_checker_path().empty()) GTEST_SKIP() << "comm_check_gpu is built only with -DALLOY_BENCH=ON";
  const CommandResult result = comm_check_run(2);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("host-staged: 2 rank(s)"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("all_to_all"), std::string::npos) << result.output;
  // One GPU: NCCL must be skipped with a message, not fail; two or more: it must have run.
  const bool nccl_ran = result.output.find("nccl: 2 rank(s)") != std::string::npos;
  const bool nccl_skipped = result.output.find("nccl: skipped") != std::string::npos;
  EXPECT_EQ(nccl_skipped, cuda_device_count() < 2) << result.output;
  EXPECT_NE(nccl_ran, nccl_skipped) << result.output;
  EXPECT_NE(result.output.find("all results exact"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace alloy::testing
