// The MPI communicator end to end: `alloy comm-check` under mpirun on 1 to 4 ranks verifies every
// collective, and its fault hooks show that a wrong result and a rank that never joins both end
// the job with a message instead of a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "../common/test_util.hpp"
#include "runtime/parallel/communicator.hpp"

namespace {

using alloy::testing::CommandResult;
using alloy::testing::run_command;

CommandResult comm_check_run(int ranks, const std::string& extra = "", int timeout_seconds = 60) {
  alloy::testing::mpi_test_environment_set();
  std::string command = std::string("mpirun -np ") + std::to_string(ranks) + " " + ALLOY_BINARY +
                        " comm-check --bytes 1MiB " + extra;
  return run_command(command, timeout_seconds);
}

// Number of table lines naming `group` whose result is "pass".
int pass_lines(const std::string& output, const std::string& group) {
  int count = 0;
  size_t start = 0;
  while (start < output.size()) {
    size_t end = output.find('\n', start);
    if (end == std::string::npos) end = output.size();
    std::string line = output.substr(start, end - start);
    if (line.find(" " + group + " ") != std::string::npos && line.find(" pass") != std::string::npos) ++count;
    start = end + 1;
  }
  return count;
}

void expect_all_pass(const CommandResult& r, int ranks) {
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("world size " + std::to_string(ranks)), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("FAIL"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checks passed"), std::string::npos) << r.output;
  // Twelve collective checks per group; the world also has the invalid-call, timing and overlap checks.
  EXPECT_EQ(pass_lines(r.output, "world"), 15) << r.output;
  EXPECT_NE(r.output.find("collective timing            world      pass"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("reduce_scatter bf16 wire"), std::string::npos) << r.output;
  EXPECT_EQ(pass_lines(r.output, "even/odd"), 12) << r.output;
  EXPECT_EQ(pass_lines(r.output, "first n-1"), ranks >= 2 ? 12 : 0) << r.output;
  EXPECT_NE(r.output.find("overlap all_reduce+compute   world      pass"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bus bandwidth"), std::string::npos) << r.output;
}

// Sets `name` to `value` (nullptr: unsets it) and restores the old value when it goes.
class EnvironmentOverride {
 public:
  EnvironmentOverride(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    had_ = old != nullptr;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~EnvironmentOverride() {
    if (had_) {
      setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::string old_;
  bool had_ = false;
};

TEST(CommLaunch, MoreThanOneRankFromAnyLauncherMeansLaunchedByMpi) {
  EnvironmentOverride ompi("OMPI_COMM_WORLD_SIZE", nullptr);
  EnvironmentOverride pmi("PMI_SIZE", nullptr);
  EnvironmentOverride slurm("SLURM_NTASKS", nullptr);
  EXPECT_FALSE(alloy::communicator_launched_by_mpi());
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    {
      EnvironmentOverride one(name, "1");
      EXPECT_FALSE(alloy::communicator_launched_by_mpi()) << name << "=1";
    }
    EnvironmentOverride four(name, "4");
    EXPECT_TRUE(alloy::communicator_launched_by_mpi()) << name << "=4";
  }
}

TEST(CommCheck, SingleProcessWithoutMpirun) {
  alloy::testing::mpi_test_environment_set();
  CommandResult r = run_command(std::string(ALLOY_BINARY) + " comm-check --bytes 1MiB", 60);
  expect_all_pass(r, 1);
  EXPECT_NE(r.output.find("n/a (one rank)"), std::string::npos) << r.output;
}

TEST(CommCheck, OneRank) { expect_all_pass(comm_check_run(1), 1); }
TEST(CommCheck, TwoRanks) {
  CommandResult r = comm_check_run(2);
  expect_all_pass(r, 2);
  EXPECT_EQ(r.output.find("n/a (one rank)"), std::string::npos) << r.output;
}
TEST(CommCheck, ThreeRanks) { expect_all_pass(comm_check_run(3), 3); }
TEST(CommCheck, FourRanks) { expect_all_pass(comm_check_run(4), 4); }

TEST(CommCheck, WrongInputOnOneRankFailsTheCheckOnEveryRank) {
  CommandResult r = comm_check_run(2, "--fault-rank 1 --fault corrupt");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("all_reduce sum float on world is wrong on rank 0: element 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("FAIL on rank 0,1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checks FAILED"), std::string::npos) << r.output;
}

TEST(CommCheck, RankThatNeverJoinsEndsTheJobAfterTheTimeout) {
  auto start = std::chrono::steady_clock::now();
  CommandResult r = comm_check_run(2, "--fault-rank 1 --fault stall --timeout 3", 30);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.signal, 0) << "killed by the test's time limit instead of the communicator timeout\n" << r.output;
  EXPECT_LT(seconds, 10.0) << r.output;
  EXPECT_NE(r.output.find("alloy: error on rank 0"), std::string::npos) << r.output;
  // The first collective is the host-name exchange; a loaded machine may overshoot the 3 s a little.
  size_t at = r.output.find("timed out after ");
  ASSERT_NE(at, std::string::npos) << r.output;
  double waited_seconds = std::stod(r.output.substr(at + 16, 8));
  EXPECT_GE(waited_seconds, 3.0) << r.output;
  EXPECT_LT(waited_seconds, 5.0) << r.output;
  EXPECT_NE(r.output.find(" s waiting for all_gather_bytes", at), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("over ranks [0, 1]"), std::string::npos) << r.output;
}

}  // namespace

// ctest -j starts several mpirun jobs at once; each test process keeps their session folders
// apart so that Open MPI's racy creation of the shared one cannot fail a job.
TEST(CommLaunch, TestJobsKeepTheirSessionFoldersApart) {
  alloy::testing::mpi_test_environment_set();
  const char* base = std::getenv("OMPI_MCA_orte_tmpdir_base");
  ASSERT_NE(base, nullptr);
  const CommandResult r = run_command(std::string("mpirun -np 1 ls ") + base);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ompi."), std::string::npos) << "no session folder under " << base << ":\n" << r.output;
}
