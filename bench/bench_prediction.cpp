// Prediction benchmark (issue 7, "prediction error"): profiles this machine under mpirun and
// calibrates the profile with the median of a few runs of the planner's plan, plans small-gpt
// for the local CPU clusters with the calibrated profile (pinned to cover pipeline, tensor and
// data parallelism and recomputation), runs each plan with mpirun and prints predicted against
// measured step time and peak arena memory per rank, then the median and worst errors.
// This machine's cores have slow spells (other tenants; one core at 60-75% of its usual rate,
// from under a second to tens of seconds): every plan runs in --rounds interleaved rounds and
// their median counts; the spread column shows how far the rounds were apart.
//   bench_prediction [--steps N] [--rounds R] [--keep]
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "mpi_bench_util.hpp"
#include "plan/plan.hpp"
#include "runtime/dist/dist_trainer.hpp"

namespace {

struct Case {
  std::string name;
  std::string cluster;
  int ranks = 0;
  std::string pins;  // extra `alloy plan` options
};

using alloy::bench::errors_in;
using alloy::bench::median;
using alloy::bench::mpirun;
using alloy::bench::run;
using alloy::bench::RunResult;
using alloy::bench::run_result_read;

}  // namespace

int main(int argc, char** argv) {
  int steps = 8, rounds = 5;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--steps") steps = std::max(3, std::atoi(argv[i + 1]));
    if (std::string(argv[i]) == "--rounds") rounds = std::max(1, std::atoi(argv[i + 1]));
  }
  bool keep = false;  // --keep: leave the plans, profiles, logs and outputs for a look
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--keep") keep = true;
  alloy::bench::mpi_environment_set();
  const std::string alloy = alloy::bench::alloy_next_to_self();
  const std::string source = ALLOY_SOURCE_DIR;
  const std::string dir = std::filesystem::temp_directory_path() / fmt::format("alloy-prediction-{}", getpid());
  std::filesystem::create_directories(dir);
  const std::string train = source + "/examples/train/tiny-cpu.yaml";
  const std::string model = "small-gpt";
  if (run(fmt::format("{} tokenize {}/examples/data/fsf_licenses.txt -o {}/data.bin > /dev/null", alloy, source, dir)) != 0) return 1;

  const std::vector<Case> cases = {
      {"2 ranks, dp 2", "local-cpu-2", 2, "--pp 1 --dp 2 --zero 0"},
      {"2 ranks, pp 2", "local-cpu-2", 2, "--pp 2 --dp 1 --tp 1 --schedule 1f1b"},
      {"2 ranks, tp 2", "local-cpu-2", 2, "--pp 1 --tp 2 --dp 1 --sequence-parallel 0"},
      {"2 ranks, pp 2, full recompute", "local-cpu-2", 2, "--pp 2 --dp 1 --tp 1 --recompute full --schedule 1f1b"},
      {"3 ranks, planner's choice", "local-cpu-3", 3, ""},
      {"4 ranks, planner's choice", "local-cpu-4", 4, ""},
      {"4 ranks, pp 2 x dp 2", "local-cpu-4", 4, "--pp 2 --dp 2 --tp 1 --schedule 1f1b"},
      {"4 ranks, pp 2 x tp 2", "local-cpu-4", 4, "--pp 2 --tp 2 --dp 1 --sequence-parallel 0 --schedule 1f1b"},
  };

  // As a user would: profile each cluster, run the planner's plan to calibrate the profile (the
  // median of `rounds` runs), then plan every case with the calibrated profile.
  std::fprintf(stderr, "profiling and calibrating %s on 2, 3 and 4 ranks ...\n", model.c_str());
  for (int ranks : {2, 3, 4}) {
    const std::string cluster = fmt::format("local-cpu-{}", ranks);
    const std::string measured = fmt::format("{}/measured-{}.json", dir, ranks);
    const std::string first_plan = fmt::format("{}/calibration-plan-{}.json", dir, ranks);
    bool ok = run(fmt::format("{} {} profile --model {} --cluster {} --train {} -o {} > /dev/null 2>&1", mpirun(ranks),
                              alloy, model, cluster, train, measured)) == 0 &&
              run(fmt::format("{} plan --model {} --cluster {} --train {} --no-offload --profile {} -o {} > /dev/null 2>&1",
                              alloy, model, cluster, train, measured, first_plan)) == 0;
    const int used = ok ? alloy::plan_load(first_plan).num_used_devices() : 0;
    std::string calibration_report;
    ok = ok && alloy::bench::calibrate_from_median_run(
                   [&](const std::string& log, const std::string& calibrated) {
                     return fmt::format("{} {} train --plan {} --model {} --data {}/data.bin --train {} --steps {} "
                                        "--no-progress --log {} --profile {} --calibrated-profile {}",
                                        mpirun(used), alloy, first_plan, model, dir, train, steps, log, measured,
                                        calibrated);
                   },
                   rounds, fmt::format("{}/calibration-{}", dir, ranks), fmt::format("{}/profile-{}.json", dir, ranks),
                   &calibration_report);
    std::printf("calibrated on %d ranks with the planner's plan (%d of %d devices):\n%s", ranks, used, ranks,
                calibration_report.c_str());
    if (!ok) {
      std::fprintf(stderr, "profiling or calibrating on %d ranks failed\n", ranks);
      return 1;
    }
  }

  std::vector<std::string> plan_paths(cases.size());
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    plan_paths[k] = fmt::format("{}/plan-{}.json", dir, k);
    const std::string output = fmt::format("{}/plan-{}.txt", dir, k);
    if (run(fmt::format("{} plan --model {} --cluster {} --train {} --no-offload --profile {}/profile-{}.json {} -o {} > {} 2>&1",
                        alloy, model, c.cluster, train, dir, c.ranks, c.pins, plan_paths[k], output)) != 0) {
      std::printf("%-32s planning failed:\n%s", c.name.c_str(), errors_in(output).c_str());
      plan_paths[k].clear();
    }
  }
  // results[k]: case k's result in each round that ran; rounds alternate the cases so that every
  // case sees the machine's slow and fast spells alike.
  std::vector<std::vector<RunResult>> results(cases.size());
  for (int round = 0; round < rounds; ++round) {
    std::fprintf(stderr, "round %d of %d ...\n", round + 1, rounds);
    for (size_t k = 0; k < cases.size(); ++k) {
      if (plan_paths[k].empty()) continue;
      const std::string log = fmt::format("{}/log-{}-{}.jsonl", dir, k, round);
      const std::string output = fmt::format("{}/output-{}-{}.txt", dir, k, round);
      const alloy::Plan plan = alloy::plan_load(plan_paths[k]);
      if (run(fmt::format("{} {} train --plan {} --model {} --data {}/data.bin --train {} --steps {} --no-progress --log {} > {} 2>&1",
                          mpirun(plan.num_used_devices()), alloy, plan_paths[k], model, dir, train, steps, log, output)) != 0) {
        std::printf("%-32s failed:\n%s", cases[k].name.c_str(), errors_in(output).c_str());
        continue;
      }
      results[k].push_back(run_result_read(log));
    }
  }

  std::printf("%-32s %12s %12s %8s %8s %14s\n", "plan", "predicted", "measured", "spread", "error", "memory error");
  std::vector<double> time_errors, memory_errors;
  for (size_t k = 0; k < cases.size(); ++k) {
    if (results[k].empty()) continue;
    const alloy::Plan plan = alloy::plan_load(plan_paths[k]);
    const std::vector<alloy::RankInfo> ranks = alloy::plan_rank_map(plan);
    std::vector<double> steps_of_rounds;
    std::vector<double> peak(ranks.size(), 0.0);
    for (const RunResult& r : results[k]) {
      steps_of_rounds.push_back(r.step_seconds);
      for (size_t q = 0; q < ranks.size(); ++q) peak[q] = std::max(peak[q], r.peak_arena_bytes[q]);
    }
    const double measured = median(steps_of_rounds);
    const double spread = *std::max_element(steps_of_rounds.begin(), steps_of_rounds.end()) /
                          *std::min_element(steps_of_rounds.begin(), steps_of_rounds.end());
    const double error = (plan.step_seconds - measured) / measured;
    double worst_memory = 0;
    for (size_t q = 0; q < ranks.size(); ++q) {
      const double predicted = alloy::dist_predicted_arena_bytes(plan.stages[ranks[q].stage]);
      const double e = (predicted - peak[q]) / peak[q];
      if (std::abs(e) > std::abs(worst_memory)) worst_memory = e;
    }
    time_errors.push_back(std::abs(error));
    memory_errors.push_back(std::abs(worst_memory));
    std::printf("%-32s %10.1f ms %10.1f ms %7.2fx %+7.1f%% %+13.1f%%\n", cases[k].name.c_str(), plan.step_seconds * 1e3,
                measured * 1e3, spread, 100 * error, 100 * worst_memory);
  }
  std::printf("measured: the median of %d rounds, each the median step after the first of %d; spread: slowest round / "
              "fastest\n", rounds, steps);
  if (!time_errors.empty()) {
    std::printf("step time error: median %.1f%%, worst %.1f%% (targets 10%% and 20%%)\n", 100 * median(time_errors),
                100 * *std::max_element(time_errors.begin(), time_errors.end()));
    std::printf("peak arena memory error per rank: worst %.1f%% (target 5%%)\n",
                100 * *std::max_element(memory_errors.begin(), memory_errors.end()));
  }
  if (keep)
    std::printf("plans, profiles, logs and outputs kept in %s\n", dir.c_str());
  else
    std::filesystem::remove_all(dir);
  return 0;
}
