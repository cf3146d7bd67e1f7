// Every command-line value and environment variable checked before it is used: a value out of
// range, not finite or past 64 bits, or an option that does not apply, exits 2 naming the flag;
// a failed write of any output file exits 2 naming the file and the system's reason.
#include <gtest/gtest.h>

#include "../common/test_util.hpp"

namespace alloy {
namespace {

using testing::alloy;
using testing::CommandResult;
using testing::run_command;
using testing::TempDir;

struct BadOption {
  const char* args;
  const char* names;  // the flag or variable the message must name
  const char* range;  // and the accepted range (or what it needs)
};

void expect_refused(const BadOption& bad, const std::string& prefix = "") {
  CommandResult r = run_command(prefix + ALLOY_BINARY + std::string(" ") + bad.args);
  EXPECT_EQ(r.exit_code, 2) << bad.args << "\n" << r.output;
  EXPECT_EQ(r.signal, 0) << bad.args;
  EXPECT_NE(r.output.find(bad.names), std::string::npos) << bad.args << "\n" << r.output;
  EXPECT_NE(r.output.find(bad.range), std::string::npos) << bad.args << "\n" << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << bad.args << "\n" << r.output;
}

const char* const kTrain = "train --model tiny-gpt --data /no/such.bin ";

TEST(CliValidation, TrainValuesOutOfRangeNameTheFlagAndRange) {
  const BadOption cases[] = {
      {"--steps 0", "--steps", "[1, 1000000000]"},
      {"--steps -1", "--steps", "[1, 1000000000]"},
      {"--steps 18446744073709551616", "--steps", "[1, 1000000000]"},
      {"--steps 3x", "--steps", "[1, 1000000000]"},
      {"--lr nan", "--lr", "(0, 10]"},
      {"--lr -1", "--lr", "(0, 10]"},
      {"--lr inf", "--lr", "(0, 10]"},
      {"--batch 0", "--batch", "[1, 10000000]"},
      {"--seq-len 0", "--seq-len", "[1, 10000000]"},
      {"--threads 100000", "--threads", "[1, "},
      {"--threads 20000", "--threads", "[1, "},
      {"--threads 0", "--threads", "[1, "},
      {"--val-batches 0", "--val-batches", "[1, "},
  };
  for (const BadOption& bad : cases) expect_refused({(std::string(kTrain) + bad.args).c_str(), bad.names, bad.range});
}

TEST(CliValidation, OptionsThatDoNotApplyAreRefused) {
  const BadOption cases[] = {
      {"--val-every 5", "--val-every", "--val-data"},
      {"--checkpoint-every 5", "--checkpoint-every", "--checkpoint"},
      {"--cluster local-cpu-1", "--cluster", "--plan"},
      {"--calibrated-profile p.json", "--calibrated-profile", "--plan"},
      {"--gpu 0", "--gpu", "--device cuda"},
      {"--gpu-comm host", "--gpu-comm", "--device cuda"},
  };
  for (const BadOption& bad : cases) expect_refused({(std::string(kTrain) + bad.args).c_str(), bad.names, bad.range});
  expect_refused({"plan --model tiny-gpt --cluster local-cpu-1 --schedule 1f1b --chunks 2", "--chunks", "interleaved"});
  expect_refused({"plan --model tiny-gpt --cluster local-cpu-1 --no-offload --prefetch-depth 2", "--prefetch-depth",
                  "--no-offload"});
}

TEST(CliValidation, PlanPinsOutOfRange) {
  const std::string plan = "plan --model tiny-gpt --cluster local-cpu-1 ";
  const BadOption cases[] = {
      {"--zero 4", "--zero", "[0, 3]"},
      {"--tp 0", "--tp", "[1, "},
      {"--pp -2", "--pp", "[1, "},
      {"--sequence-parallel 2", "--sequence-parallel", "[0, 1]"},
      {"--global-batch 0", "--global-batch", "[1, "},
      {"--threads 3", "--threads", "[1, 2]"},
      {"--micro-batch 99999999999999999999", "--micro-batch", "[1, "},
  };
  for (const BadOption& bad : cases) expect_refused({(plan + bad.args).c_str(), bad.names, bad.range});
  expect_refused({"comm-check --timeout nan", "--timeout", "[0, "});
  expect_refused({"profile --model tiny-gpt --cluster local-cpu-1 --repeats 0", "--repeats", "[1, 1000]"});
}

TEST(CliValidation, EnvironmentVariablesOutOfRange) {
  TempDir dir;
  const std::string data = dir.path() + "/fsf.bin";
  ASSERT_EQ(alloy("tokenize " + std::string(ALLOY_SOURCE_DIR) + "/examples/data/fsf_licenses.txt -o " + data).exit_code, 0);
  const std::string train = std::string("train --model tiny-gpt --steps 1 --no-progress --data ") + data;
  expect_refused({train.c_str(), "ALLOY_THREADS", "[1, "}, "env ALLOY_THREADS=100000 ");
  expect_refused({train.c_str(), "ALLOY_THREADS", "[1, "}, "env ALLOY_THREADS=99999999999999999999 ");
  expect_refused({train.c_str(), "ALLOY_THREADS", "[1, "}, "env ALLOY_THREADS=-3 ");
  expect_refused({train.c_str(), "ALLOY_DEVICE_SPEED", "[0.001, 1]"}, "env ALLOY_DEVICE_SPEED=nan ");
  expect_refused({train.c_str(), "ALLOY_TIME_DILATION", "[1, 1000]"}, "env ALLOY_TIME_DILATION=0 ");
}

// A full disk, as /dev/full gives it: every output file's write fails with ENOSPC.
TEST(CliValidation, WriteFailuresNameTheFileAndTheCause) {
  TempDir dir;
  const std::string plan = dir.path() + "/plan.json";
  ASSERT_EQ(alloy("plan --model tiny-gpt --cluster local-cpu-1 -o " + plan).exit_code, 0);
  const std::string data = dir.path() + "/fsf.bin";
  ASSERT_EQ(alloy("tokenize " + std::string(ALLOY_SOURCE_DIR) + "/examples/data/fsf_licenses.txt -o " + data).exit_code, 0);
  const std::string train = "train --model tiny-gpt --steps 2 --batch 2 --seq-len 16 --no-progress --data " + data;
  const char* const commands[] = {"plan --model tiny-gpt --cluster local-cpu-1 -o /dev/full",
                                  "plan --model tiny-gpt --cluster local-cpu-1 --report /dev/full",
                                  "simulate --plan PLAN --trace /dev/full",
                                  "report PLAN -o /dev/full",
                                  "TRAIN --log /dev/full",
                                  "TRAIN --trace /dev/full"};
  for (std::string command : commands) {
    if (size_t at = command.find("PLAN"); at != std::string::npos) command.replace(at, 4, plan);
    if (size_t at = command.find("TRAIN"); at != std::string::npos) command.replace(at, 5, train);
    CommandResult r = alloy(command);
    EXPECT_EQ(r.exit_code, 2) << command << "\n" << r.output;
    EXPECT_NE(r.output.find("/dev/full"), std::string::npos) << command << "\n" << r.output;
    EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << command << "\n" << r.output;
  }
}

}  // namespace
}  // namespace alloy
