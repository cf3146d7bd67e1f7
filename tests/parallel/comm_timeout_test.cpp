// Communicator timeouts: a rank that never joins is named, with the operation, its group's ranks
// and where that rank is, by the ranks that waited for it (comm-check and a training run);
// ALLOY_COMM_TIMEOUT is validated (finite, positive, at most 10^6 s; "off" waits without a limit).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "../common/test_util.hpp"
#include "dist_plans.hpp"
#include "hw/catalog.hpp"
#include "runtime/parallel/communicator.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

using testing::CommandResult;
using testing::run_command;

CommandResult comm_check(int ranks, const std::string& environment, const std::string& extra, int limit_seconds = 60) {
  testing::mpi_test_environment_set();
  return run_command("env " + environment + " mpirun -np " + std::to_string(ranks) + " " + ALLOY_BINARY +
                         " comm-check --bytes 64KiB " + extra,
                     limit_seconds);
}

// The timeout ALLOY_COMM_TIMEOUT=`value` resolves to, or the error's message.
std::string timeout_from_environment(const char* value, double* seconds) {
  setenv("ALLOY_COMM_TIMEOUT", value, 1);
  std::string message;
  try {
    *seconds = communicator_timeout_resolve(0);
  } catch (const Error& e) {
    EXPECT_EQ(e.where().field, "ALLOY_COMM_TIMEOUT") << value;
    EXPECT_FALSE(e.hint().empty()) << value;
    message = e.what();
  }
  unsetenv("ALLOY_COMM_TIMEOUT");
  return message;
}

TEST(CommTimeout, EnvironmentValueIsValidated) {
  double seconds = 0;
  EXPECT_EQ(timeout_from_environment("600", &seconds), "");
  EXPECT_DOUBLE_EQ(seconds, 600);
  EXPECT_EQ(timeout_from_environment("2.5", &seconds), "");
  EXPECT_DOUBLE_EQ(seconds, 2.5);
  for (const char* off : {"off", "OFF", "inf", "0"}) {
    seconds = 0;
    EXPECT_EQ(timeout_from_environment(off, &seconds), "") << off;
    EXPECT_TRUE(std::isinf(seconds)) << off;
  }
  EXPECT_NE(timeout_from_environment("1e10", &seconds).find("longer than the longest timeout"), std::string::npos);
  for (const char* bad : {"nan", "-1", "abc", "12abc", "1e400", "-inf"})
    EXPECT_NE(timeout_from_environment(bad, &seconds).find("is not a positive number of seconds"), std::string::npos)
        << bad;
  EXPECT_THROW(communicator_timeout_resolve(-1), Error);
  EXPECT_THROW(communicator_timeout_resolve(std::nan("")), Error);
  EXPECT_THROW(communicator_timeout_resolve(1e10), Error);
  EXPECT_DOUBLE_EQ(communicator_timeout_resolve(7), 7);
}

TEST(CommTimeout, HugeEnvironmentValueEndsTheJobWithAMessageNotATimeout) {
  for (const char* value : {"1e10", "nan", "-1", "abc"}) {
    const CommandResult r = comm_check(2, std::string("ALLOY_COMM_TIMEOUT=") + value, "");
    EXPECT_EQ(r.exit_code, 2) << value << "\n" << r.output;
    EXPECT_NE(r.output.find("ALLOY_COMM_TIMEOUT"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("timed out"), std::string::npos) << r.output;
  }
  const CommandResult off = comm_check(2, "ALLOY_COMM_TIMEOUT=off", "");
  EXPECT_EQ(off.exit_code, 0) << off.output;
}

TEST(CommTimeout, RanksThatWaitedNameTheRankThatNeverJoined) {
  // Rank 2 of 3 sleeps before its first collective; ranks 0 and 1 time out in it.
  const CommandResult r = comm_check(3, "", "--fault-rank 2 --fault stall --timeout 3", 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.signal, 0) << "killed by the test's time limit instead of the communicator timeout\n" << r.output;
  const size_t at = r.output.find("timed out after ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
  // The operation and its group's ranks, the rank that waited, the one that never joined and
  // where it is: not waiting on any communication (it sleeps in its caller).
  EXPECT_NE(line.find("over ranks [0, 1, 2] on rank "), std::string::npos) << line;
  EXPECT_NE(line.find("rank 2 has not joined (it has posted 0 of this group's collectives; this one is number 1)"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("waits for no communication (it computes, or is stuck outside it; it has posted none yet)"),
            std::string::npos)
      << line;
  EXPECT_EQ(line.find("rank 0 has not joined"), std::string::npos) << line;
  EXPECT_EQ(line.find("rank 1 has not joined"), std::string::npos) << line;
}

// A training run whose data-parallel group is part of the world: stage 0 on rank 0, stage 1 on
// ranks 1 and 2. Rank 2 stalls at step 2; whoever waits for it names it and the operation.
TEST(CommTimeout, TrainingRankThatStallsIsNamedByThoseWaitingForIt) {
  const testing::TempDir dir;
  const std::string data = testing::dist_test_setup(dir);
  ASSERT_FALSE(data.empty()) << "alloy tokenize failed";
  const std::string model_path = dir.write("gpt-6.yaml", testing::kGpt6Yaml);
  const std::string cluster_path = dir.write("local-cpu-8.yaml", testing::kCpu8Yaml);
  const ClusterSpec cluster = cluster_load(cluster_path, catalog_builtin());
  const std::string plan_path = dir.path() + "/plan.json";
  plan_save(testing::test_plan(model_load(model_path), cluster, {{1, 1, 0, {3}}, {1, 2, 0, {3}}},
                               Schedule::Schedule_1f1b, 2),
            plan_path);
  const CommandResult r = run_command(
      "env ALLOY_FAULT=stall:2:2 ALLOY_COMM_TIMEOUT=3 mpirun -np 3 --oversubscribe --bind-to none " +
          std::string(ALLOY_BINARY) + " train --model " + model_path + " --data " + data + " --train " +
          dir.path() + "/dist-train.yaml --steps 6 --no-progress --plan " + plan_path +
          " --cluster " + cluster_path,
      90);
  EXPECT_EQ(r.exit_code, kExitCommTimeout) << r.output;
  EXPECT_NE(r.output.find("rank 2 stalls at step 2"), std::string::npos) << r.output;
  const size_t at = r.output.find("timed out after ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
  // Rank 0 waits for rank 2's gradients, or rank 1 in the data-parallel all-reduce over [1, 2].
  const bool receive = line.find("from rank 2") != std::string::npos && line.find("on rank 0:") != std::string::npos;
  const bool all_reduce =
      line.find("over ranks [1, 2] on rank 1: rank 2 has not joined") != std::string::npos;
  EXPECT_TRUE(receive || all_reduce) << line;
  EXPECT_NE(line.find("waits for no communication"), std::string::npos) << line;
  EXPECT_NE(line.find("the last it posted: "), std::string::npos) << line;  // in step 1
  EXPECT_EQ(line.find("rank 0 has not joined"), std::string::npos) << line;
  EXPECT_EQ(line.find("rank 1 has not joined"), std::string::npos) << line;
}

}  // namespace
}  // namespace alloy
