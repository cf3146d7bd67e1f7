// The elastic supervisor for real: `alloy run` trains a 4-rank plan, one rank is killed with
// SIGKILL mid-training, and the run goes on: the lost rank is named, the model is re-planned for
// the 3 devices left, the job resumes from the last checkpoint within 60 s of the kill, loses at
// most the steps since that checkpoint, and its losses are those of an uninterrupted run; a
// cluster file the user updated before the failure decides the devices instead.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
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

  // A 4-device cluster file, a dp-4 ZeRO 1 plan over it carrying its inputs, and the plan's
  // uninterrupted run (its log's losses).
  struct Setup {
    std::string cluster_path, plan_path, reference;
  };
  static Setup setup(const std::string& name) {
    Setup s;
    s.cluster_path = dir_->write(name + "-cluster.yaml", kFourDevices);
    const ModelSpec gpt = model_load(gpt_path_);
    const ClusterSpec cluster = cluster_load(s.cluster_path, catalog_builtin());
    Plan plan = test_plan(gpt, cluster, {{1, 4, 1, {6}}}, Schedule::Schedule_1f1b, 2);
    plan_set_inputs(&plan, gpt, cluster, train_load(dir_->path() + "/dist-train.yaml"));
    s.plan_path = dir_->path() + "/" + name + "-plan.json";
    plan_save(plan, s.plan_path);
    s.reference = dir_->path() + "/" + name + "-reference.jsonl";
    const CommandResult r = run_command(fmt::format("mpirun -np 4 --oversubscribe --bind-to none {} train --plan {} --data {} "
                                                    "--steps {} --no-progress --log {}",
                                                    ALLOY_BINARY, s.plan_path, data_, kElasticSteps, s.reference),
                                        300);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return s;
  }

  struct Supervised {
    std::string output;
    int status = -1;
    double resumed_after = -1;  // seconds from the kill to the first resumed step
    std::string log;
  };
  // Starts `alloy run` on the plan, and at step 8 (a checkpoint is committed at 5) calls
  // `before_kill` and kills one rank of the job with SIGKILL; waits for the supervisor to end.
  static Supervised supervise(const Setup& s, const std::string& name, const std::string& extra,
                              const std::function<void()>& before_kill) {
    Supervised run;
    const std::string ck = dir_->path() + "/" + name + "-ck", out = dir_->path() + "/" + name + ".out";
    const std::string status = dir_->path() + "/" + name + ".status";
    run.log = dir_->path() + "/" + name + ".jsonl";
    std::system(fmt::format("({} run --plan {} --data {} --steps {} --checkpoint {} --checkpoint-every {} --log {} {} "
                            "--launcher 'mpirun --oversubscribe --bind-to none' --train-flags --no-progress "
                            "> {} 2>&1; echo $? > {}) &",
                            ALLOY_BINARY, s.plan_path, data_, kElasticSteps, ck, kElasticEvery, run.log, extra, out, status)
                    .c_str());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (step_losses(run.log).size() < 8 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    before_kill();
    const std::string pids = command_output(fmt::format("pgrep -f '^{} train --plan {}'", ALLOY_BINARY, s.plan_path));
    EXPECT_FALSE(pids.empty()) << "no rank to kill (the run ended before step 8?)";
    if (pids.empty()) return run;
    const int victim = std::atoi(pids.substr(pids.rfind('\n', pids.size() - 2) + 1).c_str());
    const uintmax_t before = size_of(run.log);
    const auto killed = std::chrono::steady_clock::now();
    EXPECT_EQ(std::system(fmt::format("kill -9 {}", victim).c_str()), 0);
    while (!std::filesystem::exists(status) && std::chrono::steady_clock::now() < deadline) {
      if (run.resumed_after < 0 && size_of(run.log) > before)
        run.resumed_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    run.output = read_text(out);
    if (std::filesystem::exists(status)) run.status = std::atoi(read_text(status).c_str());
    return run;
  }

  // The supervised run finished, lost at most the steps since its last checkpoint, and every
  // step's loss is the uninterrupted run's.
  static void expect_continued(const Supervised& run, const Setup& s) {
    EXPECT_EQ(run.status, 0) << run.output;
    EXPECT_NE(run.output.find("alloy run: lost rank"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("resharded checkpoint step"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("finished step 40 after 1 restart(s)"), std::string::npos) << run.output;
    std::printf("kill to the first resumed step: %.1f s\n", run.resumed_after);
    EXPECT_GE(run.resumed_after, 0.0) << run.output;
    EXPECT_LT(run.resumed_after, 60.0) << run.output;
    // At most the steps since the last committed checkpoint: kElasticEvery when the kill hits
    // the save of the next one.
    const size_t lost_at = run.output.find("step(s) lost");
    ASSERT_NE(lost_at, std::string::npos) << run.output;
    const int lost = std::atoi(run.output.c_str() + run.output.rfind(": ", lost_at) + 2);
    EXPECT_GE(lost, 0) << run.output;
    EXPECT_LE(lost, kElasticEvery) << run.output;
    const std::map<int, double> want = step_losses(s.reference), got = step_losses(run.log);
    ASSERT_EQ(got.size(), static_cast<size_t>(kElasticSteps)) << run.output;
    for (const auto& [step, loss] : want) EXPECT_NEAR(got.at(step), loss, 1e-5 * loss) << "step " << step;
  }

  static constexpr const char* kFourDevices = R"(name: local-cpu-4-even
device_types:
  cpu-fast: {base: cpu, memory: 2GiB}
nodes:
  - {name: host, count: 1, device: cpu-fast, devices_per_node: 4, host_memory: 16GiB}
)";
};

TEST_F(ElasticTest, AKilledRankIsReplacedByAPlanForTheDevicesLeft) {
  const Setup s = setup("dropped");
  const Supervised run = supervise(s, "dropped", "--all-devices", [] {});
  EXPECT_NE(run.output.find("re-planned for the 3 device(s) left"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("on 3 device(s)"), std::string::npos) << run.output;
  expect_continued(run, s);
}

TEST_F(ElasticTest, AJobThatFailsWithoutALostRankIsNotRestarted) {
  // Bad input to the job (a data file that does not exist) is no lost device: the supervisor
  // stops with the job's status and says so, instead of re-planning.
  const Setup s = setup("failing");
  const CommandResult r = run_command(
      fmt::format("{} run --plan {} --data {}/missing.bin --steps 4 --checkpoint {}/failing-ck "
                  "--launcher 'mpirun --oversubscribe --bind-to none' --train-flags --no-progress",
                  ALLOY_BINARY, s.plan_path, dir_->path(), dir_->path()),
      120);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("names no lost rank, so it is not restarted"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("re-planned"), std::string::npos) << r.output;
}

TEST_F(ElasticTest, AStopSignalToTheSupervisorStopsTheJobWithACheckpoint) {
  // SIGTERM to `alloy run` alone (as a batch system sends it): the job gets it, saves its step and
  // stops; no rank is left running; the supervisor exits with 128 + 15 and says how to resume.
  const Setup s = setup("stopped");
  const std::string ck = dir_->path() + "/stopped-ck", log = dir_->path() + "/stopped.jsonl";
  const std::string out = dir_->path() + "/stopped.out", status = dir_->path() + "/stopped.status";
  std::system(fmt::format("({} run --plan {} --data {} --steps 400 --checkpoint {} --checkpoint-every 50 --log {} "
                          "--launcher 'mpirun --oversubscribe --bind-to none' --train-flags --no-progress "
                          "> {} 2>&1; echo $? > {}) &",
                          ALLOY_BINARY, s.plan_path, data_, ck, log, out, status)
                  .c_str());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (step_losses(log).size() < 8 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string supervisor = command_output(fmt::format("pgrep -f '^{} run --plan {}'", ALLOY_BINARY, s.plan_path));
  ASSERT_FALSE(supervisor.empty()) << read_text(out);
  ASSERT_EQ(std::system(fmt::format("kill -TERM {}", std::atoi(supervisor.c_str())).c_str()), 0);
  while (!std::filesystem::exists(status) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string output = read_text(out);
  EXPECT_EQ(std::atoi(read_text(status).c_str()), 128 + 15) << output;
  EXPECT_NE(output.find("alloy run: received Terminated: passed it on"), std::string::npos) << output;
  EXPECT_TRUE(command_output(fmt::format("pgrep -f '^{} train --plan {}'", ALLOY_BINARY, s.plan_path)).empty()) << output;
  // The step it stopped at is committed, and logged.
  const size_t at = output.find("its last checkpoint is step ");
  ASSERT_NE(at, std::string::npos) << output;
  const int saved = std::atoi(output.c_str() + at + 28);
  EXPECT_GE(saved, 8) << output;
  EXPECT_EQ(static_cast<int>(step_losses(log).size()), saved) << output;
}

TEST_F(ElasticTest, AClusterFileTheUserUpdatedSaysWhatIsLeft) {
  // Before the failure the user writes that two devices remain: the supervisor plans for those.
  const Setup s = setup("updated");
  const Supervised run = supervise(s, "updated", "--all-devices --cluster " + s.cluster_path, [&] {
    std::string two = kFourDevices;
    two.replace(two.find("devices_per_node: 4"), 19, "devices_per_node: 2");
    dir_->write("updated-cluster.yaml", two);
  });
  EXPECT_NE(run.output.find("changed: re-planning for the 2 device(s) it lists"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("on 2 device(s)"), std::string::npos) << run.output;
  expect_continued(run, s);
}

}  // namespace
}  // namespace alloy::testing
