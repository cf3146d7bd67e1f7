// Self-contained plans: a plan made from a model, cluster and training file of the user's own
// runs under mpirun, simulates and explains after those files are gone, with no flag but the
// plan; a model, cluster or training file given anyway must agree with the plan or exit 2.
#include <gtest/gtest.h>

#include <filesystem>

#include <fmt/format.h>

#include "../common/test_util.hpp"

namespace alloy {
namespace {

using testing::alloy;
using testing::CommandResult;
using testing::TempDir;

constexpr const char* kOwnModel = R"(name: own-gpt
family: gpt2
layers: 2
hidden_size: 64
heads: 4
vocab_size: 256
max_seq_len: 64
norm_eps: 1.0e-6
)";

constexpr const char* kOwnCluster = R"(name: own-cpus
nodes:
  - {name: box, count: 1, device: cpu, devices_per_node: 2, host_memory: 8GiB}
)";

constexpr const char* kOwnTrain = R"(seq_len: 32
global_batch: 4
precision: fp32
steps: 7
learning_rate: 2.0e-3
min_learning_rate: 2.0e-4
warmup_steps: 1
)";

class PlanInputsCli : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::mpi_test_environment_set();
    const std::string model = dir_.write("own-gpt.yaml", kOwnModel);
    const std::string cluster = dir_.write("own-cpus.yaml", kOwnCluster);
    const std::string train = dir_.write("own-train.yaml", kOwnTrain);
    plan_ = dir_.path() + "/plan.json";
    const CommandResult made = alloy(fmt::format("plan --model {} --cluster {} --train {} --dp 2 --no-simulate -o {}",
                                                 model, cluster, train, plan_));
    ASSERT_EQ(made.exit_code, 0) << made.output;
    for (const std::string& file : {model, cluster, train}) std::filesystem::remove(file);
    data_ = dir_.path() + "/data.bin";
    ASSERT_EQ(alloy(fmt::format("tokenize {}/examples/data/fsf_licenses.txt -o {}", ALLOY_SOURCE_DIR, data_)).exit_code, 0);
  }
  std::string train_with(const std::string& flags) const {
    return fmt::format("mpirun -np 2 --oversubscribe --bind-to none {} train --plan {} --data {} --no-progress {}",
                       ALLOY_BINARY, plan_, data_, flags);
  }

  TempDir dir_;
  std::string plan_, data_;
};

TEST_F(PlanInputsCli, ThePlanAloneRunsSimulatesAndExplains) {
  const CommandResult trained = testing::run_command(train_with(""), 120);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  // The plan's own model and its training setup: 7 steps, as the deleted file said.
  EXPECT_NE(trained.output.find("trained own-gpt on 2 CPU rank(s) for steps 1..7"), std::string::npos) << trained.output;
  const CommandResult simulated = alloy("simulate --plan " + plan_);
  EXPECT_EQ(simulated.exit_code, 0) << simulated.output;
  const CommandResult explained = alloy("explain " + plan_);
  EXPECT_EQ(explained.exit_code, 0) << explained.output;
  EXPECT_NE(explained.output.find("Plan for own-gpt on own-cpus"), std::string::npos) << explained.output;
}

TEST_F(PlanInputsCli, InputsGivenAnywayMustAgree) {
  const std::string other_train = dir_.write("other.yaml", "seq_len: 16\nglobal_batch: 4\nprecision: fp32\n");
  const std::string tokens_train = dir_.write("tokens.yaml", "seq_len: 32\nglobal_batch_tokens: 64\n");
  const struct {
    std::string flags;
    const char* expect;
  } cases[] = {
      {"--model small-gpt", "--model small-gpt is not the model the plan was made for ('own-gpt': the architectures "
                            "differ)"},
      // tiny-gpt has own-gpt's architecture, but not its norm epsilon.
      {"--model tiny-gpt", "--model tiny-gpt is not the model the plan was made for ('own-gpt': norm_eps 1e-05 "
                           "against 1e-06)"},
      {"--cluster local-cpu-4", "--cluster local-cpu-4 is not the cluster the plan was made for ('own-cpus': devices "
                                "or links differ)"},
      {"--train " + other_train, "seq_len is 16 here but 32 in the plan"},
      {"--train " + tokens_train, "global_batch_tokens is 64 here but 128 in the plan"},
  };
  for (const auto& c : cases) {
    const CommandResult r = testing::run_command(train_with(c.flags), 120);
    EXPECT_EQ(r.exit_code, 2) << c.flags << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.flags << "\n" << r.output;
    EXPECT_NE(r.output.find("fix:"), std::string::npos) << c.flags << "\n" << r.output;
  }
  // A training file that leaves the sequence length and batch to the plan sets the rest.
  const std::string schedule_only = dir_.write("schedule.yaml", "steps: 3\nlearning_rate: 1.0e-3\nwarmup_steps: 1\n");
  const CommandResult scheduled = testing::run_command(train_with("--train " + schedule_only), 120);
  EXPECT_EQ(scheduled.exit_code, 0) << scheduled.output;
  EXPECT_NE(scheduled.output.find("for steps 1..3"), std::string::npos) << scheduled.output;
  // The same model from another file, and the same devices under another name (local-cpu-2,
  // with more host memory, which the plan does not need): accepted.
  const std::string same = dir_.write("same.yaml", kOwnModel);
  const CommandResult simulated = alloy(fmt::format("simulate --plan {} --model {} --cluster local-cpu-2", plan_, same));
  EXPECT_EQ(simulated.exit_code, 0) << simulated.output;
}

}  // namespace
}  // namespace alloy
