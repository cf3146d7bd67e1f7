// Heterogeneity benchmark (issue 7, "heterogeneity gain"), measured with mpirun on emulated
// unequal CPU devices: Alloy's plan (after `alloy profile` and calibrating runs, as a user
// would) against the best plan for the same devices treated as equal (planned on a uniform view
// of the cluster with the smallest memory, then run on the real one), and against the upper
// bound: the sum of what each device group achieves alone (each planned with the same profile).
// The groups' own jobs run at the same time, each on its own devices: the emulated devices share
// this machine's cores, and a group run while the others' cores sit idle would get more of them
// than it has in the whole cluster (that bound would be higher than any plan of the cluster could
// reach here, since the cluster's ranks take all the cores).
// Every plan runs in --rounds interleaved rounds. The rates printed are medians over rounds; the
// gain and the share of the bound are medians of each round's own ratios (this machine's cores
// have slow spells, and its overall speed drifts over minutes).
//   bench_heterogeneity [--steps N] [--rounds R] [--keep] [--fast-memory M] [--slow-memory M] [--model M] [--train T]
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "hw/catalog.hpp"
#include "mpi_bench_util.hpp"
#include "plan/plan.hpp"
#include "spec/cluster.hpp"

namespace {

struct Group {
  std::string type;   // device type name
  double speed = 1;
  std::string memory;  // e.g. "96MiB"
  int devices = 1;     // on one node of its own
};

struct Case {
  std::string name;
  std::vector<Group> groups;
};

std::string root;  // this run's folder: the token file, and one folder per case
std::string dir;   // the current case's folder
std::string alloy_binary;
std::string train;
// Twelve blocks: enough to split unevenly over 2-3 stages of unequal speed (a 4-block model
// cannot give a stage 1/3 or 2/3 of the work). --model and --train replace them.
std::string kModel = "deep-gpt";
int steps = 8;
int rounds = 3;

using alloy::bench::errors_in;
using alloy::bench::median;
using alloy::bench::mpirun;
using alloy::bench::run;

std::string cluster_yaml(const std::string& name, const std::vector<Group>& groups, bool uniform) {
  std::string types, nodes;
  std::string smallest = groups.front().memory;
  for (const Group& g : groups)
    if (std::stod(g.memory) < std::stod(smallest)) smallest = g.memory;
  for (size_t i = 0; i < groups.size(); ++i) {
    const Group& g = groups[i];
    const std::string type = uniform ? "cpu-uniform" : g.type;
    if (!uniform || i == 0)
      types += uniform ? fmt::format("  {}: {{base: cpu, memory: {}}}\n", type, smallest)
                       : fmt::format("  {}: {{base: cpu, speed: {}, memory: {}}}\n", type, g.speed, g.memory);
    nodes += fmt::format("  - {{name: n{}, count: 1, device: {}, devices_per_node: {}, host_memory: 8GiB}}\n", i, type,
                         g.devices);
  }
  const std::string path = fmt::format("{}/{}.yaml", dir, name);
  std::ofstream(path) << fmt::format("name: {}\ndevice_types:\n{}nodes:\n{}", name, types, nodes);
  return path;
}

std::string train_command(const std::string& plan_path, const std::string& cluster_path, const std::string& log,
                          const std::string& extra, int run_steps = steps) {
  const alloy::Plan plan = alloy::plan_load(plan_path);
  return fmt::format("{} {} train --plan {} --cluster {} --model {} --data {}/data.bin --train {} --steps {} "
                     "--no-progress --log {} {}",
                     mpirun(plan.num_used_devices()), alloy_binary, plan_path, cluster_path, kModel, root, train,
                     run_steps, log, extra);
}

struct Job {
  std::string plan, cluster;  // an empty plan is not run and measures 0
};

// Tokens per second of each job (median of its steps after the first; 0 when it failed or has
// no plan), all run with mpirun at the same time. Each runs about as long as the slowest by its
// plan's prediction, so that its steps meet the others' load throughout.
std::vector<double> measure_together(const std::vector<Job>& jobs, int round) {
  double longest = 0;
  for (const Job& j : jobs)
    if (!j.plan.empty()) longest = std::max(longest, alloy::plan_load(j.plan).step_seconds);
  std::string command;
  for (const Job& j : jobs) {
    if (j.plan.empty()) continue;
    const int job_steps =
        std::max(steps, static_cast<int>(std::lround(steps * longest / alloy::plan_load(j.plan).step_seconds)));
    const std::string prefix = fmt::format("{}.{}", j.plan, round);
    command += fmt::format("({} > {}.out 2>&1; echo $? > {}.rc) & ",
                           train_command(j.plan, j.cluster, prefix + ".jsonl", "", job_steps), prefix, prefix);
  }
  run(command + "wait");
  std::vector<double> rates;
  for (const Job& j : jobs) {
    const std::string prefix = fmt::format("{}.{}", j.plan, round);
    int code = -1;
    if (!j.plan.empty()) std::ifstream(prefix + ".rc") >> code;
    if (code != 0 && !j.plan.empty()) std::printf("%s", errors_in(prefix + ".out").c_str());
    rates.push_back(code == 0 ? alloy::bench::run_result_read(prefix + ".jsonl").tokens_per_second : 0.0);
  }
  return rates;
}

// Each job's rate in each of `rounds` rounds ([entry][job][round]). A round runs every entry of
// `batches` in turn (the jobs of one entry together), so that all of them meet the machine alike.
using RoundRates = std::vector<std::vector<std::vector<double>>>;
RoundRates measure_interleaved(const std::vector<std::vector<Job>>& batches) {
  RoundRates rates(batches.size());
  for (size_t b = 0; b < batches.size(); ++b) rates[b].resize(batches[b].size());
  for (int round = 0; round < rounds; ++round)
    for (size_t b = 0; b < batches.size(); ++b) {
      const std::vector<double> measured = measure_together(batches[b], round);
      for (size_t k = 0; k < measured.size(); ++k) rates[b][k].push_back(measured[k]);
    }
  return rates;
}

// The median over rounds of numerator / denominator, both measured in the same round (the
// machine's speed drifts between rounds, and a ratio of two medians from different rounds
// carries that drift). 0 when no round measured both.
double median_paired_ratio(const std::vector<double>& numerator, const std::vector<double>& denominator) {
  std::vector<double> ratios;
  for (size_t r = 0; r < numerator.size() && r < denominator.size(); ++r)
    if (numerator[r] > 0 && denominator[r] > 0) ratios.push_back(numerator[r] / denominator[r]);
  return ratios.empty() ? 0 : median(ratios);
}

std::string plan_for(const std::string& cluster_path, const std::string& name, const std::string& pins = "") {
  const std::string path = fmt::format("{}/{}.json", dir, name);
  if (run(fmt::format("{} plan --model {} --cluster {} --train {} --no-offload {} -o {} > {}.txt 2>&1", alloy_binary,
                      kModel, cluster_path, train, pins, path, path)) != 0)
    return "";
  return path;
}

// The uniform view's plan moved onto the real devices: same layout, the real device types.
std::string move_to_real_cluster(const std::string& uniform_plan, const std::string& real_cluster_path) {
  alloy::Plan plan = alloy::plan_load(uniform_plan);
  const alloy::ClusterSpec real = alloy::cluster_load(real_cluster_path, alloy::catalog_builtin());
  plan.cluster_name = real.name;
  plan.cluster_fingerprint = alloy::cluster_fingerprint(real);
  for (alloy::PlanStage& st : plan.stages) {
    const alloy::DeviceType& type = real.device_type(real.devices[static_cast<size_t>(st.device_ids.front())]);
    st.device_type = type.name;
    st.memory_capacity_bytes = type.memory_bytes;
  }
  const std::string path = uniform_plan + ".real.json";
  alloy::plan_save(plan, path);
  return path;
}

void run_case(const Case& c, const std::string& folder) {
  dir = root + "/" + folder;
  std::filesystem::create_directories(dir);
  // Every run of the case, the groups alone included, is slowed by the dilation the whole
  // cluster needs on this machine's cores, so their rates compare.
  int ranks = 0;
  for (const Group& g : c.groups) ranks += g.devices;
  const double dilation = std::max(1.0, static_cast<double>(ranks) / std::thread::hardware_concurrency());
  setenv("ALLOY_TIME_DILATION", fmt::format("{}", dilation).c_str(), 1);
  // Likewise each device keeps the threads it has in the whole cluster when its group runs alone.
  const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks);
  setenv("ALLOY_THREADS", std::to_string(threads).c_str(), 1);
  std::printf("\n%s (time dilation %.2f on %u cores, %d thread%s per rank)\n", c.name.c_str(), dilation,
              std::thread::hardware_concurrency(), threads, threads == 1 ? "" : "s");
  const std::string real = cluster_yaml("real", c.groups, false);
  const std::string uniform = cluster_yaml("uniform", c.groups, true);
  // Alloy as a user runs it: profile the cluster, calibrate the profile from a run of the best
  // plan on every device (as `alloy train` advises: a type no rank ran keeps its profile), and
  // plan with the calibrated profile. The planner's free first plan had left the quarter-speed
  // device out in one run: its profile stayed as measured (it then predicted 675 tokens/s for
  // that device alone, which ran at 527), the plan gave it 2 of 12 blocks and reached 67% of the
  // bound. (Calibrating on every device had also gone wrong once, with one factor per device
  // type: 75% of the bound, the half-speed device's ratio at 0.77x.)
  const std::string measured = dir + "/measured.json";
  const std::string profile = dir + "/profile.json";
  if (run(fmt::format("{} {} profile --model {} --cluster {} --train {} -o {} > {}.txt 2>&1", mpirun(ranks),
                      alloy_binary, kModel, real, train, measured, measured)) != 0) {
    std::printf("  profiling failed (see %s.txt)\n", measured.c_str());
    return;
  }
  const std::string calibration_plan = plan_for(real, "calibration-plan", "--all-devices --profile " + measured);
  std::string calibration_report;
  const bool calibrated =
      !calibration_plan.empty() &&
      alloy::bench::calibrate_from_median_run(
          [&](const std::string& log, const std::string& out) {
            return train_command(calibration_plan, real, log, fmt::format("--profile {} --calibrated-profile {}", measured, out));
          },
          rounds, dir + "/calibration", profile, &calibration_report);
  if (!calibrated) {
    std::printf("  calibrating failed (see %s)\n", dir.c_str());
    return;
  }
  std::printf("  calibrated with the planner's best plan on all %d devices:\n%s", ranks, calibration_report.c_str());
  const std::string alloy_plan = plan_for(real, "alloy", "--profile " + profile);
  // Treated as equal, the devices still form one stage per group (a stage has one device type):
  // data parallelism no wider than the smallest group.
  int narrowest = c.groups.front().devices;
  for (const Group& g : c.groups) narrowest = std::min(narrowest, g.devices);
  const std::string uniform_plan = plan_for(uniform, "uniform", fmt::format("--dp {} --pp {}", narrowest, c.groups.size()));
  if (alloy_plan.empty() || uniform_plan.empty()) {
    std::printf("  planning failed (see %s)\n", dir.c_str());
    return;
  }
  std::vector<Job> groups_alone;
  for (size_t i = 0; i < c.groups.size(); ++i) {
    const std::string alone = cluster_yaml(fmt::format("alone-{}", i), {c.groups[i]}, false);
    groups_alone.push_back({plan_for(alone, fmt::format("alone-{}", i), "--profile " + profile), alone});
  }
  const RoundRates rates = measure_interleaved(
      {{{alloy_plan, real}}, {{move_to_real_cluster(uniform_plan, real), real}}, groups_alone});
  const std::vector<double>& alloy_rates = rates[0][0];
  const std::vector<double>& uniform_rates = rates[1][0];
  std::vector<double> bound_rates(static_cast<size_t>(rounds), 0.0);  // per round: the groups' sum
  for (size_t i = 0; i < c.groups.size(); ++i) {
    const std::string label = fmt::format("{} alone", c.groups[i].type);
    if (groups_alone[i].plan.empty())  // nothing fits these devices alone: they add nothing to the bound
      std::printf("  %-28s %10s tokens/s (no plan without offload fits its memory)\n", label.c_str(), "0");
    else
      std::printf("  %-28s %10.0f tokens/s (predicted %.0f; the groups' jobs at the same time)\n", label.c_str(),
                  median(rates[2][i]), alloy::plan_load(groups_alone[i].plan).tokens_per_second);
    for (size_t r = 0; r < bound_rates.size(); ++r) bound_rates[r] += rates[2][i][r];
  }
  std::printf("  %-28s %10.0f tokens/s\n", "uniform plan (devices equal)", median(uniform_rates));
  std::printf("  %-28s %10.0f tokens/s (predicted %.0f)\n", "Alloy's plan", median(alloy_rates),
              alloy::plan_load(alloy_plan).tokens_per_second);
  std::printf("  %-28s %10.0f tokens/s (the groups alone, summed per round)\n", "bound", median(bound_rates));
  const double gain = median_paired_ratio(alloy_rates, uniform_rates);
  const double share = median_paired_ratio(alloy_rates, bound_rates);
  if (gain > 0 && share > 0)
    std::printf("  gain over uniform %.2fx (target 1.3x); %.0f%% of the bound (target 85%%); medians of the rounds' "
                "ratios\n", gain, 100 * share);
}

}  // namespace

int main(int argc, char** argv) {
  // Caps that bind: deep-gpt takes 263 MiB on one device at its fastest micro-batch, so each
  // device's memory shapes its plan (issue 7 asks for caps that bind).
  std::string fast_memory = "128MiB", slow_memory = "64MiB";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--steps") steps = std::max(3, std::atoi(argv[i + 1]));
    if (std::string(argv[i]) == "--rounds") rounds = std::max(1, std::atoi(argv[i + 1]));
    if (std::string(argv[i]) == "--fast-memory") fast_memory = argv[i + 1];
    if (std::string(argv[i]) == "--slow-memory") slow_memory = argv[i + 1];
    if (std::string(argv[i]) == "--model") kModel = argv[i + 1];
    if (std::string(argv[i]) == "--train") train = argv[i + 1];
  }
  bool keep = false;  // --keep: leave the plans, profiles, logs and outputs for a look
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--keep") keep = true;
  alloy::bench::mpi_environment_set();
  alloy_binary = alloy::bench::alloy_next_to_self();
  if (train.empty()) train = std::string(ALLOY_SOURCE_DIR) + "/examples/train/pipeline-cpu.yaml";
  root = std::filesystem::temp_directory_path() / fmt::format("alloy-heterogeneity-{}", getpid());
  std::filesystem::create_directories(root);
  if (run(fmt::format("{} tokenize {}/examples/data/fsf_licenses.txt -o {}/data.bin > /dev/null", alloy_binary, ALLOY_SOURCE_DIR,
                      root)) != 0)
    return 1;
  std::printf("%s, %d steps per run, median of %d rounds, memory: fast %s, slower %s\n", kModel.c_str(), steps, rounds,
              fast_memory.c_str(), slow_memory.c_str());
  run_case({"4 ranks: speeds 1, 1, 0.5, 0.5",
            {{"cpu-fast", 1.0, fast_memory, 2}, {"cpu-half", 0.5, slow_memory, 2}}},
           "four-ranks");
  run_case({"3 ranks: speeds 1, 0.5, 0.25",
            {{"cpu-full", 1.0, fast_memory, 1}, {"cpu-half", 0.5, slow_memory, 1}, {"cpu-quarter", 0.25, slow_memory, 1}}},
           "three-ranks");
  if (keep)
    std::printf("plans, profiles, logs and outputs kept in %s\n", root.c_str());
  else
    std::filesystem::remove_all(root);
  return 0;
}
