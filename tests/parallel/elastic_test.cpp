// The elastic supervisor for real: `alloy run` trains a 4-rank plan, one rank is killed with
// SIGKILL mid-training, and the run goes on: the lost rank is named, the model is re-planned for
// the 3 devices left, the job resumes from the last checkpoint within 60 s of the kill, loses at
// most the steps since that checkpoint, and its losses are those of an uninterrupted run.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"
#include "dist_plans.hpp"
#include "hw/catalog.hpp"
#include "plan/plan_inputs.hpp"

namespace alloy::testing {
namespace {

constexpr int kElasticSteps = 40;
constexpr int kElasticEvery = 5;

class ElasticTest : public DistGptSuite<ElasticTest> {
 protected:
  // Step -> loss, the last line of each step winning (a resumed run logs its steps again).
  static std::map<int, double> step_losses(const std::string& path) {
    std::map<int, double> out;
    std::istringstream in(read_text(path));
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      out[j.at("step").get<int>()] = j.at("loss").get<double>();
    }
    return out;
  }
  static std::string command_output(const std::string& command) {
    std::string out;
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return out;
    char buffer[256];
    while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
    pclose(pipe);
    return out;
  }
  static uintmax_t size_of(const std::string& path) {
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(path, ec);
    return ec ? 0 : size;
  }
};

TEST_F(ElasticTest, AKilledRankIsReplacedByAPlanForTheDevicesLeft) {
  const std::string four = dir_->write("local-cpu-4-even.yaml", R"(name: local-cpu-4-even
device_types:
  cpu-fast: {base: cpu, memory: 2GiB}
nodes:
  - {name: host, count: 1, device: cpu-fast, devices_per_node: 4, host_memory: 16GiB}
)");
  const ModelSpec gpt = model_load(gpt_path_);
  const ClusterSpec cluster = cluster_load(four, catalog_builtin());
  Plan plan = test_plan(gpt, cluster, {{1, 4, 1, {6}}}, Schedule::Schedule_1f1b, 2);
  plan_set_inputs(&plan, gpt, cluster, train_load(dir_->path() + "/dist-train.yaml"));
  const std::string plan_path = dir_->path() + "/elastic-plan.json";
  plan_save(plan, plan_path);

  const std::string reference = dir_->path() + "/elastic-reference.jsonl";
  ASSERT_EQ(run_command(fmt::format("mpirun -np 4 --oversubscribe --bind-to none {} train --plan {} --data {} --steps {} "
                                    "--no-progress --log {}",
                                    ALLOY_BINARY, plan_path, data_, kElasticSteps, reference),
                        300)
                .exit_code,
            0);

  const std::string ck = dir_->path() + "/elastic-ck", log = dir_->path() + "/elastic.jsonl";
  const std::string out = dir_->path() + "/elastic.out", status = dir_->path() + "/elastic.status";
  std::system(fmt::format("({} run --plan {} --data {} --steps {} --checkpoint {} --checkpoint-every {} --log {} "
                          "--all-devices --launcher 'mpirun --oversubscribe --bind-to none' --train-flags --no-progress "
                          "> {} 2>&1; echo $? > {}) &",
                          ALLOY_BINARY, plan_path, data_, kElasticSteps, ck, kElasticEvery, log, out, status)
                  .c_str());
  // Wait for step 8 (a checkpoint is committed at 5), then kill one rank of the job.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (step_losses(log).size() < 8 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string pids = command_output(fmt::format("pgrep -f '^{} train --plan {}'", ALLOY_BINARY, plan_path));
  ASSERT_FALSE(pids.empty()) << "no rank to kill (the run ended before step 8?)\n" << read_text(out);
  const int victim = std::atoi(pids.substr(pids.rfind('\n', pids.size() - 2) + 1).c_str());
  const uintmax_t before = size_of(log);
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_EQ(std::system(fmt::format("kill -9 {}", victim).c_str()), 0);
  double resumed_after = -1;
  while (!std::filesystem::exists(status) && std::chrono::steady_clock::now() < deadline) {
    if (resumed_after < 0 && size_of(log) > before)
      resumed_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string output = read_text(out);
  ASSERT_TRUE(std::filesystem::exists(status)) << output;
  EXPECT_EQ(std::atoi(read_text(status).c_str()), 0) << output;
  std::printf("kill to the first resumed step: %.1f s\n", resumed_after);
  EXPECT_GE(resumed_after, 0.0) << output;
  EXPECT_LT(resumed_after, 60.0) << output;
  EXPECT_NE(output.find("alloy run: lost rank"), std::string::npos) << output;
  EXPECT_NE(output.find("re-planned for the 3 device(s) left"), std::string::npos) << output;
  EXPECT_NE(output.find("on 3 device(s)"), std::string::npos) << output;
  EXPECT_NE(output.find("resharded checkpoint step"), std::string::npos) << output;
  EXPECT_NE(output.find("finished step 40 after 1 restart(s)"), std::string::npos) << output;
  const size_t lost_at = output.find("step(s) lost");
  ASSERT_NE(lost_at, std::string::npos) << output;
  // At most the steps since the last committed checkpoint: kElasticEvery when the kill hits the
  // save of the next one.
  const int lost = std::atoi(output.c_str() + output.rfind(": ", lost_at) + 2);
  EXPECT_GE(lost, 0) << output;
  EXPECT_LE(lost, kElasticEvery) << output;
  // Every step's loss, the resumed ones on 3 ranks included, is the uninterrupted run's.
  const std::map<int, double> want = step_losses(reference), got = step_losses(log);
  ASSERT_EQ(got.size(), static_cast<size_t>(kElasticSteps)) << output;
  for (const auto& [step, loss] : want) EXPECT_NEAR(got.at(step), loss, 1e-5 * loss) << "step " << step;
}

}  // namespace
}  // namespace alloy::testing
