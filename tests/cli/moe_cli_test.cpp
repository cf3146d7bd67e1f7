// Mixture-of-Experts models at the command line: `alloy check` prints their exact totals, `alloy
// train` trains one on a CPU rank, `alloy plan` and `alloy simulate` price its experts, and every
// command that would profile or convert one (or train it elsewhere) refuses it by name.
#include <gtest/gtest.h>

#include <sstream>
#include <vector>

#include "../common/test_util.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

using testing::alloy;
using testing::CommandResult;
using testing::TempDir;

TEST(MoeCli, CheckPrintsTotalAndActiveCounts) {
  const CommandResult r = alloy("check --model mixtral-8x7b");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("46,702,792,704"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("12,879,925,248"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("8 routed experts of width 14336, 2 per token"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("active per token"), std::string::npos) << r.output;
  const CommandResult tiny = alloy("check --model tiny-moe");
  ASSERT_EQ(tiny.exit_code, 0) << tiny.output;
  EXPECT_NE(tiny.output.find("276,416"), std::string::npos) << tiny.output;
  EXPECT_NE(tiny.output.find("202,688"), std::string::npos) << tiny.output;
}

void expect_moe_refused(const std::string& args) {
  const CommandResult r = alloy(args);
  EXPECT_EQ(r.exit_code, kExitBadInput) << args << "\n" << r.output;
  EXPECT_NE(r.output.find("Mixture-of-Experts models (model tiny-moe: 4 experts, 2 per token) are not supported "
                          "here yet"),
            std::string::npos)
      << args << "\n" << r.output;
  EXPECT_NE(r.output.find("alloy plan --model tiny-moe"), std::string::npos) << args << "\n" << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << args << "\n" << r.output;
}

TEST(MoeCli, ProfileRefusesMoe) {
  TempDir dir;
  expect_moe_refused("profile --model tiny-moe --cluster local-cpu-1 -o " + dir.path() + "/profile.json");
}

TEST(MoeCli, PlanNamesTheExpertPlacement) {
  TempDir dir;
  const CommandResult r = alloy("plan --model tiny-moe --cluster local-cpu-2 -o " + dir.path() + "/plan.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("expert placement: ep "), std::string::npos) << r.output;
  // Its leading dense block is priced as the dense block it is, with no note of an approximation.
  EXPECT_EQ(r.output.find("as MoE blocks"), std::string::npos) << r.output;
  const CommandResult sim = alloy("simulate --plan " + dir.path() + "/plan.json");
  EXPECT_EQ(sim.exit_code, 0) << sim.output;
  // Stages that split their experts show the degree in the stage table.
  const CommandResult mixtral = alloy("plan --model mixtral-8x7b --cluster h100-a100 --no-simulate");
  ASSERT_EQ(mixtral.exit_code, 0) << mixtral.output;
  EXPECT_NE(mixtral.output.find(" tp dp ep "), std::string::npos) << mixtral.output;
  EXPECT_NE(mixtral.output.find("stage 1 expert placement: ep "), std::string::npos) << mixtral.output;
  EXPECT_EQ(mixtral.output.find("stage 1 expert placement: ep 1 "), std::string::npos) << mixtral.output;
}

// A pinned expert-parallel degree that cannot be: one line naming it, exit 2.
TEST(MoeCli, PinnedEpThatDoesNotDivideIsRefused) {
  const CommandResult experts = alloy("plan --model tiny-moe --cluster local-cpu-2 --ep 3");
  EXPECT_EQ(experts.exit_code, kExitBadInput) << experts.output;
  EXPECT_NE(experts.output.find("--ep 3 does not divide the 4 experts of tiny-moe"), std::string::npos) << experts.output;
  const CommandResult dp = alloy("plan --model tiny-moe --cluster local-cpu-2 --ep 2 --dp 1 --pp 2");
  EXPECT_EQ(dp.exit_code, kExitBadInput) << dp.output;
  EXPECT_NE(dp.output.find("--ep 2 does not divide --dp 1"), std::string::npos) << dp.output;
  const CommandResult dense = alloy("plan --model tiny-llama --cluster local-cpu-2 --ep 2");
  EXPECT_EQ(dense.exit_code, kExitBadInput) << dense.output;
}

// A key's numbers in each line of a JSON-lines log, as written.
std::vector<double> logged_numbers(const std::string& log, const std::string& key) {
  std::vector<double> values;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("\"" + key + "\":");
    if (at != std::string::npos) values.push_back(std::stod(line.substr(at + key.size() + 3)));
  }
  return values;
}

// tiny-moe (a dense block, then two MoE blocks of 4 experts, top-2, one shared expert) trains on
// one CPU rank: its loss falls, and the log reports the load-balancing loss and the top-k picks
// of each expert of each block.
TEST(MoeCli, TrainsTinyMoeOnOneCpuRank) {
  TempDir dir;
  const CommandResult tok = alloy("tokenize " + std::string(ALLOY_SOURCE_DIR) + "/examples/data/fsf_licenses.txt -o " +
                                  dir.path() + "/fsf.bin --val-fraction 0.1");
  ASSERT_EQ(tok.exit_code, 0) << tok.output;
  const CommandResult r = alloy("train --model tiny-moe --data " + dir.path() + "/fsf_train.bin --batch 4 --seq-len 32 "
                                "--threads 1 --steps 40 --recompute selective --log " + dir.path() + "/log.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("aux "), std::string::npos) << r.output;
  const std::string log = testing::read_text(dir.path() + "/log.jsonl");
  const std::vector<double> losses = logged_numbers(log, "loss"), aux = logged_numbers(log, "aux_loss");
  ASSERT_EQ(losses.size(), size_t{40}) << log;
  ASSERT_EQ(aux.size(), size_t{40}) << log;
  double first = 0, last = 0;
  for (size_t k = 0; k < 5; ++k) {
    first += losses[k] / 5;
    last += losses[losses.size() - 1 - k] / 5;
  }
  std::printf("  tiny-moe: mean loss of steps 1-5 %.4f, of steps 36-40 %.4f; load-balancing loss %.4f -> %.4f\n", first,
              last, aux.front(), aux.back());
  EXPECT_LT(last, first - 0.3) << log;
  for (double value : aux) {  // E sum_e f_e P_e with f_e <= 1 and sum_e P_e = 1: within (0, E]
    EXPECT_GT(value, 0.0);
    EXPECT_LE(value, 4.0);
  }
  // Each step routes 4 x 32 tokens x top-2 through each MoE block; the dense block 0 routes none.
  const size_t at = log.find("\"expert_tokens\":[");
  ASSERT_NE(at, std::string::npos) << log;
  std::istringstream counts(log.substr(at + 17, log.find(']', at) - at - 17));
  std::vector<int64_t> picks;
  for (std::string number; std::getline(counts, number, ',');) picks.push_back(std::stoll(number));
  ASSERT_EQ(picks.size(), size_t{12});
  int64_t block1 = 0, block2 = 0;
  for (size_t e = 0; e < 4; ++e) {
    EXPECT_EQ(picks[e], 0);
    block1 += picks[4 + e];
    block2 += picks[8 + e];
  }
  EXPECT_EQ(block1, 4 * 32 * 2);
  EXPECT_EQ(block2, 4 * 32 * 2);
}

// A checkpoint holds the experts like any other weights: resuming continues bit for bit.
TEST(MoeCli, ResumeContinuesExactly) {
  TempDir dir;
  const CommandResult tok = alloy("tokenize " + std::string(ALLOY_SOURCE_DIR) + "/examples/data/fsf_licenses.txt -o " +
                                  dir.path() + "/fsf.bin --val-fraction 0.1");
  ASSERT_EQ(tok.exit_code, 0) << tok.output;
  const std::string common = "train --model tiny-moe --data " + dir.path() + "/fsf_train.bin --batch 2 --seq-len 16 " +
                             "--threads 1 --no-progress ";
  ASSERT_EQ(alloy(common + "--steps 6 --log " + dir.path() + "/straight.jsonl").exit_code, 0);
  ASSERT_EQ(alloy(common + "--steps 3 --checkpoint " + dir.path() + "/ckpt").exit_code, 0);
  const CommandResult resumed =
      alloy(common + "--steps 6 --resume --checkpoint " + dir.path() + "/ckpt --log " + dir.path() + "/resumed.jsonl");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::vector<double> straight = logged_numbers(testing::read_text(dir.path() + "/straight.jsonl"), "loss");
  const std::vector<double> again = logged_numbers(testing::read_text(dir.path() + "/resumed.jsonl"), "loss");
  ASSERT_EQ(straight.size(), size_t{6});
  ASSERT_EQ(again.size(), size_t{3});
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(again[k], straight[3 + k]) << "step " << 4 + k;
}

// The cuda backend trains MoE blocks: --device cuda is not refused for the model's experts (here
// it stops at the missing data, or, in a build without CUDA, at the backend).
TEST(MoeCli, TrainingOnCudaIsNotRefusedForTheExperts) {
  const CommandResult r = alloy("train --model tiny-moe --device cuda --data /no/such.bin --steps 1");
  EXPECT_EQ(r.exit_code, kExitBadInput) << r.output;
  EXPECT_EQ(r.output.find("Mixture-of-Experts model"), std::string::npos) << r.output;
}

TEST(MoeCli, ImportHfRefusesMoe) {
  TempDir dir;
  const CommandResult r = alloy("import-hf " + dir.path() + "/model.safetensors " + std::string(ALLOY_SOURCE_DIR) +
                                "/examples/models/mixtral-8x7b.json -o " + dir.path() + "/imported");
  EXPECT_EQ(r.exit_code, kExitBadInput) << r.output;
  EXPECT_NE(r.output.find("Mixture-of-Experts models (model mixtral-8x7b: 8 experts, 2 per token)"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace alloy
