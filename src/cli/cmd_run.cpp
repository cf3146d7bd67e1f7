// `alloy run`: an elastic supervisor. It launches a plan's training job, and when the launcher
// reports a rank lost, drops that rank's device from the cluster, re-plans the checkpoint's model
// and setup for the devices left, and resumes from the last committed checkpoint, up to
// --max-restarts times, printing each event (lost, re-planned, resumed, steps lost). A stop
// signal (SIGINT, SIGTERM) is passed on to the job, which saves and stops; so does the supervisor.
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/option_checks.hpp"
#include "hw/catalog.hpp"
#include "plan/plan_inputs.hpp"
#include "runtime/elastic.hpp"
#include "runtime/io/checkpoint_commit.hpp"
#include "search/planner.hpp"
#include "spec/error.hpp"
#include "spec/field_reader.hpp"
#include "spec/text_file.hpp"

namespace alloy::cli {

namespace {

namespace fs = std::filesystem;

struct RunCommand {
  std::string plan;
  std::string data;
  std::string checkpoint;
  std::string log;
  std::string launcher = "mpirun --bind-to none";
  std::string train_flags;
  std::string cluster;  // a cluster file the user may update between launches ("": the plan's)
  int64_t steps = 0;
  int64_t checkpoint_every = 10;
  int max_restarts = 3;
  bool all_devices = false;
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The last step the JSON-lines log records (0 when none).
int64_t log_last_step(const std::string& path) {
  std::ifstream in(path);
  int64_t last = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json step = nlohmann::json::parse(line, nullptr, false);
    if (step.is_object() && step.contains("step")) last = step["step"].get<int64_t>();
  }
  return last;
}

// The launcher's verdict comes at the end of its output: the tail kept of a long run's output.
constexpr size_t kOutputTailBytes = 64 * 1024;

uintmax_t size_or_zero(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  return ec ? 0 : size;
}

// One launch of the job: its exit status, the end of what it printed (all of it passed
// through) and when its log first grew (-1: never).
struct Launch {
  int status = 0;
  std::string output;
  double started = 0;
  double first_step = -1;
  double ended = 0;
};

// A stop signal the supervisor received (0: none): passed on to the job, which saves and stops.
volatile std::sig_atomic_t g_stop_signal = 0;

void stop_signal_note(int signal) { g_stop_signal = signal; }

Launch launch(const std::string& command, const std::string& log) {
  int out[2];
  if (pipe(out) != 0) throw Error("cannot create a pipe for the training job", {"", ""}, "check the process limits");
  Launch l;
  l.started = now_seconds();
  const uintmax_t log_size = size_or_zero(log);
  const pid_t child = fork();
  if (child < 0) throw Error("cannot start the training job (fork failed)", {"", ""}, "check the process limits");
  if (child == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    // exec: the launcher itself is the child, so a stop signal passed on reaches it.
    const std::string exec_command = "exec " + command;
    execl("/bin/sh", "sh", "-c", exec_command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  char buffer[4096];
  const auto pass_through = [&] {  // false once the job's output has ended
    ssize_t n = 0;
    while ((n = read(out[0], buffer, sizeof(buffer))) > 0) {
      l.output.append(buffer, static_cast<size_t>(n));
      if (l.output.size() > 2 * kOutputTailBytes) l.output.erase(0, l.output.size() - kOutputTailBytes);
      fwrite(buffer, 1, static_cast<size_t>(n), stdout);
      fflush(stdout);
    }
    return n < 0;  // 0: end of output; < 0: nothing more for now
  };
  int status = 0;
  bool passed_on = false;
  for (bool output_open = true;;) {
    if (g_stop_signal != 0 && !passed_on) {
      kill(child, static_cast<int>(g_stop_signal));
      passed_on = true;
    }
    if (output_open) {
      pollfd p{out[0], POLLIN, 0};
      poll(&p, 1, 50);
      output_open = pass_through();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // output closed: wait for the exit
    }
    if (l.first_step < 0 && size_or_zero(log) > log_size) l.first_step = now_seconds();
    if (waitpid(child, &status, WNOHANG) == child) break;
  }
  pass_through();
  l.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  close(out[0]);
  l.ended = now_seconds();
  return l;
}

std::string self_executable() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "alloy" : self.string();
}

// Returns the exit status: 0, or 128 + a stop signal passed on to the job.
int run_elastic(const RunCommand& c) {
  struct sigaction on_stop = {};
  on_stop.sa_handler = stop_signal_note;
  sigaction(SIGINT, &on_stop, nullptr);
  sigaction(SIGTERM, &on_stop, nullptr);
  Plan plan = plan_load(c.plan);
  const ModelSpec model = plan_model(plan, "", c.plan);
  const TrainSpec train = plan_train(plan, "", c.plan);
  ClusterSpec cluster = plan_cluster(plan, c.cluster, catalog_builtin(), c.plan);
  const auto cluster_text = [&] { return c.cluster.empty() ? std::string() : spec_file_text(c.cluster); };
  std::string launched_with = cluster_text();
  const std::string log = c.log.empty() ? c.checkpoint + "/elastic.jsonl" : c.log;
  fs::create_directories(c.checkpoint);
  std::string plan_path = c.plan;
  for (int restart = 0;; ++restart) {
    const bool resume = fs::exists(fs::path(c.checkpoint) / kCheckpointLatest);
    const std::string command =
        fmt::format("{} -np {} {} train --plan {} --data {} --steps {} --checkpoint {} --checkpoint-every {} --log {}{} {}",
                    c.launcher, plan.num_used_devices(), self_executable(), plan_path, c.data, c.steps, c.checkpoint,
                    c.checkpoint_every, log, resume ? " --resume" : "", c.train_flags);
    fmt::print(stderr, "alloy run: launch {} on {} device(s): {}\n", restart == 0 ? "1" : fmt::format("{} (restart)", restart + 1),
               plan.num_used_devices(), command);
    const Launch l = launch(command, log);
    if (restart > 0 && l.first_step >= 0)
      fmt::print(stderr, "alloy run: resumed: first step {:.1f} s after the relaunch\n", l.first_step - l.started);
    if (l.status == 0) {
      fmt::print(stderr, "alloy run: finished step {} after {} restart(s)\n", log_last_step(log), restart);
      return 0;
    }
    if (g_stop_signal != 0) {
      const int saved = fs::exists(fs::path(c.checkpoint) / kCheckpointLatest) ? static_cast<int>(checkpoint_manifest_read(c.checkpoint).step) : 0;
      fmt::print(stderr, "alloy run: received {}: passed it on, and the job stopped after step {}; its last checkpoint is "
                         "step {}; run the same command again to resume\n",
                 strsignal(static_cast<int>(g_stop_signal)), log_last_step(log), saved);
      return 128 + static_cast<int>(g_stop_signal);
    }
    const int lost = elastic_lost_rank(l.output);
    if (lost < 0 || lost >= plan.num_used_devices())
      throw Error(fmt::format("the training job ended with status {} and the launcher names no lost rank, so it is not "
                              "restarted",
                              l.status),
                  {"", "--plan"}, "read its output above, fix the cause and run again: it resumes from the last checkpoint");
    if (restart >= c.max_restarts)
      throw Error(fmt::format("rank {} was lost, and the run has been restarted {} time(s) already", lost, restart),
                  {"", "--max-restarts"}, "raise --max-restarts, or fix the devices and run again (it resumes)");
    const int64_t saved_or_none = fs::exists(fs::path(c.checkpoint) / kCheckpointLatest) ? checkpoint_manifest_read(c.checkpoint).step : 0;
    const int64_t reached = std::max(log_last_step(log), saved_or_none);
    const int64_t saved = saved_or_none;
    const RankInfo who = plan_rank_map(plan).at(static_cast<size_t>(lost));
    const DeviceType& type = cluster.device_types[static_cast<size_t>(cluster.devices[static_cast<size_t>(who.device_id)].device_type_index)];
    fmt::print(stderr, "alloy run: lost rank {} (device {}, {}) after step {}; the job ended {:.1f} s after its launch; "
                       "the last checkpoint is step {}: {} step(s) lost\n",
               lost, who.device_id, type.name, reached, l.ended - l.started, saved, reached - saved);
    const double replan_start = now_seconds();
    // A cluster file the user changed since the launch says what is left; otherwise the lost
    // rank's device is dropped from the one the run had.
    const std::string updated = cluster_text();
    if (!c.cluster.empty() && updated != launched_with) {
      cluster = cluster_load(c.cluster, catalog_builtin());
      launched_with = updated;
      fmt::print(stderr, "alloy run: {} changed: re-planning for the {} device(s) it lists\n", c.cluster, cluster.devices.size());
    } else {
      const std::string cluster_path = fmt::format("{}/elastic-cluster-{}.yaml", c.checkpoint, restart + 1);
      text_file_write(cluster_path, elastic_cluster_without(cluster, who.device_id), "cluster file", "--checkpoint");
      cluster = cluster_load(cluster_path, catalog_builtin());
    }
    const CostModel cost(model, cluster, train);
    SearchOptions options;
    options.every_device = c.all_devices;
    SearchResult result = plan_search(cost, options);
    plan = result.plan;
    plan_set_inputs(&plan, model, cluster, train);
    plan_path = fmt::format("{}/elastic-plan-{}.json", c.checkpoint, restart + 1);
    plan_save(plan, plan_path);
    fmt::print(stderr, "alloy run: re-planned for the {} device(s) left in {:.2f} s: {} stage(s), {} device(s) used, "
                       "step {:.3f} s predicted ({})\n",
               cluster.devices.size(), now_seconds() - replan_start, plan.stages.size(), plan.num_used_devices(),
               plan.step_seconds, plan_path);
  }
}

}  // namespace

void add_run(CLI::App& app, int* exit_code) {
  auto c = std::make_shared<RunCommand>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Train a plan elastically: when a rank is lost, re-plan for the devices left and resume from the last checkpoint");
  cmd->add_option("--plan,-p", c->plan, "The plan to start with (it carries its model, cluster and training setup)")->required();
  cmd->add_option("--data,-d", c->data, "Training token file")->required();
  cmd->add_option("--steps", c->steps, "Optimizer steps in all")->required()->check(option_whole_in(1, kOptionMostSteps));
  cmd->add_option("--checkpoint", c->checkpoint, "Checkpoint folder (the run resumes from its last committed step)")->required();
  cmd->add_option("--checkpoint-every", c->checkpoint_every, "Checkpoint every N steps: at most N - 1 steps are lost")
      ->capture_default_str()
      ->check(option_whole_in(1, kOptionMostSteps));
  cmd->add_option("--max-restarts", c->max_restarts, "Restarts after lost ranks before giving up")
      ->capture_default_str()
      ->check(option_whole_in(0, 1000));
  cmd->add_option("--cluster,-c", c->cluster,
                  "Cluster file read again before each re-plan: update it when devices change (default: the plan's "
                  "cluster, less each lost rank's device)");
  cmd->add_flag("--all-devices", c->all_devices, "Re-plan with every device left (default: the planner's choice)");
  cmd->add_option("--log", c->log, "JSON-lines log of every step (default: <checkpoint>/elastic.jsonl)");
  cmd->add_option("--launcher", c->launcher, "Launcher command, given -np and the job")->capture_default_str();
  cmd->add_option("--train-flags", c->train_flags, "More flags for every `alloy train` launch, e.g. \"--no-progress\"");
  cmd->callback([c, exit_code]() { *exit_code = run_elastic(*c); });
}

}  // namespace alloy::cli
