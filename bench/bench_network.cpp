// Planning around a slow link, measured: 4 CPU ranks stand for 4 one-device nodes in two racks,
// 1 GB/s between the nodes of a rack and 100 MB/s between the racks (the racks' uplinks), the
// links emulated by the MPI communicator (alloy train --emulate-network). Alloy plans the model
// twice, told the real topology and told the network is uniform (1 GB/s everywhere), and both
// plans run on the emulated racks; then four pinned layouts (a data-parallel reduction across the
// slow link, a pipeline boundary across it, a four-stage pipeline, and the uniform plan's choice)
// are predicted on the real topology and measured. Layer times come from `alloy profile` on this
// machine, calibrated as a user would (alloy train --calibrated-profile) by a four-stage pipeline
// run on the uniform network, emulated: that run teaches the profile what this machine's shared
// cores add to compute and to every message, and nothing about the racks, so the calibrated
// predictions differ from the runs by what the network model gets wrong. Prints the speed-up of
// the topology-aware plan and the prediction error per layout, with and without the calibration.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "mpi_bench_util.hpp"

namespace {

using alloy::bench::median;
using alloy::bench::run;

constexpr int kRanks = 4;

// About 0.8 M parameters a block: a data-parallel reduction of the whole model (13 MB of fp32
// gradients) costs seconds on the slow link, a micro-batch's activations (0.5 MB) a twentieth.
constexpr const char* kModelYaml = R"(name: racks-gpt
family: gpt2
layers: 4
hidden_size: 256
heads: 8
ffn_hidden_size: 1024
vocab_size: 256
max_seq_len: 64
)";

constexpr const char* kTrainYaml = R"(seq_len: 64
global_batch: 16
precision: fp32
optimizer: adamw
steps: 100
learning_rate: 1.0e-3
warmup_steps: 2
seed: 7
)";

constexpr const char* kRacksYaml = R"(name: racks-cpu
network: {kind: ethernet, bandwidth: 1GB/s, latency: 100us}
racks:
  - {name: r1, uplink: 100MB/s}
  - {name: r2, uplink: 100MB/s}
nodes:
  - {name: left, count: 2, device: cpu, devices_per_node: 1, host_memory: 8GiB, rack: r1}
  - {name: right, count: 2, device: cpu, devices_per_node: 1, host_memory: 8GiB, rack: r2}
)";

constexpr const char* kUniformYaml = R"(name: racks-cpu-told-uniform
network: {kind: ethernet, bandwidth: 1GB/s, latency: 100us}
nodes:
  - {name: left, count: 2, device: cpu, devices_per_node: 1, host_memory: 8GiB}
  - {name: right, count: 2, device: cpu, devices_per_node: 1, host_memory: 8GiB}
)";

struct Layout {
  std::string name;
  std::string pins;     // alloy plan flags; empty: the planner's own choice
  std::string cluster;  // the cluster file it is planned on
  std::string plan;     // path, once planned (with the calibrated profile)
  std::string shape;    // the plan's layout in words
  double predicted_seconds = 0;           // with the calibrated profile
  double predicted_uncalibrated_seconds = 0;  // the same layout with the profile as measured
  std::vector<double> measured_seconds;
};

Layout layout_of(const std::string& name, const std::string& pins, const std::string& cluster = "racks.yaml") {
  Layout l;
  l.name = name;
  l.pins = pins;
  l.cluster = cluster;
  return l;
}

// "pp 2: cpu dp2 | cpu dp2; 1f1b, m 4": the stages of a plan file, for the table.
std::string plan_shape(const nlohmann::json& plan) {
  std::string stages;
  for (const nlohmann::json& st : plan.at("stages")) {
    if (!stages.empty()) stages += " | ";
    stages += fmt::format("dp{} [{}]", st.at("dp").get<int>(), fmt::join(st.at("device_ids").get<std::vector<int>>(), ","));
  }
  return fmt::format("pp {}: {}; {}, m {}", plan.at("stages").size(), stages, plan.at("schedule").get<std::string>(),
                     plan.at("num_micro_batches").get<int>());
}

// The alloy plan flags that pin a plan file's layout: stages, data parallelism, micro-batches and
// blocks per stage.
std::string pins_of(const nlohmann::json& plan) {
  std::vector<int> blocks;
  for (const nlohmann::json& st : plan.at("stages")) {
    int n = 0;
    for (const nlohmann::json& chunk : st.at("chunks")) n += chunk.at(1).get<int>() - chunk.at(0).get<int>();
    blocks.push_back(n);
  }
  return fmt::format("--pp {} --dp {} --tp 1 --num-micro-batches {} --layer-split {}", blocks.size(),
                     plan.at("stages").at(0).at("dp").get<int>(), plan.at("num_micro_batches").get<int>(),
                     fmt::join(blocks, ","));
}

// alloy plan of the model on `cluster` with `profile`, layout pinned by `pins` (none: the
// planner's choice), written to `plan_path`. Returns the plan, or null when planning failed.
nlohmann::json plan_with(const std::string& alloy, const std::string& dir, const std::string& cluster,
                         const std::string& profile, const std::string& pins, const std::string& plan_path) {
  const std::string out = plan_path + ".out";
  if (run(fmt::format("{} plan --model {}/model.yaml --cluster {}/{} --train {}/train.yaml --profile {}/{} "
                      "--no-offload {} -o {} > {} 2>&1",
                      alloy, dir, dir, cluster, dir, dir, profile, pins, plan_path, out)) != 0) {
    std::fprintf(stderr, "planning %s failed:\n%s", plan_path.c_str(), alloy::bench::errors_in(out).c_str());
    return nullptr;
  }
  return nlohmann::json::parse(std::ifstream(plan_path));
}

double predicted_step(const nlohmann::json& plan) { return plan.at("predicted").at("step_seconds").get<double>(); }

// Plans `layout` on the cluster it names with the calibrated profile; a plan made on the uniform
// network is pinned on the real racks, as that is where it runs. Then predicts the same layout
// on the racks with the uncalibrated profile.
bool plan_layout(const std::string& alloy, const std::string& dir, Layout& layout, int index) {
  layout.plan = fmt::format("{}/plan-{}.json", dir, index);
  nlohmann::json plan = plan_with(alloy, dir, layout.cluster, "calibrated.json", layout.pins, layout.plan);
  if (plan.is_null()) return false;
  if (layout.cluster != "racks.yaml") {
    plan = plan_with(alloy, dir, "racks.yaml", "calibrated.json", pins_of(plan), layout.plan);
    if (plan.is_null()) return false;
  }
  layout.shape = plan_shape(plan);
  layout.predicted_seconds = predicted_step(plan);
  const nlohmann::json uncalibrated = plan_with(alloy, dir, "racks.yaml", "profile.json", pins_of(plan),
                                                fmt::format("{}/plan-{}-uncalibrated.json", dir, index));
  if (uncalibrated.is_null()) return false;
  layout.predicted_uncalibrated_seconds = predicted_step(uncalibrated);
  return true;
}

std::string train_command(const std::string& alloy, const std::string& dir, const std::string& plan,
                          const std::string& cluster, int steps, const std::string& log) {
  return fmt::format("{} {} train --plan {} --cluster {}/{} --data {}/data.bin --steps {} --no-progress "
                     "--emulate-network --log {}",
                     alloy::bench::mpirun(kRanks), alloy, plan, dir, cluster, dir, steps, log);
}

// The calibration: a four-stage pipeline planned and run on the uniform network (emulated), the
// profile corrected by the run of median step time.
bool calibrate(const std::string& alloy, const std::string& dir, int steps, int rounds, std::string* report) {
  const std::string plan = dir + "/calibration-plan.json";
  if (plan_with(alloy, dir, "uniform.yaml", "profile.json", "--pp 4 --dp 1 --tp 1", plan).is_null()) return false;
  const auto command = [&](const std::string& log, const std::string& calibrated) {
    return fmt::format("{} --profile {}/profile.json --calibrated-profile {}",
                       train_command(alloy, dir, plan, "uniform.yaml", steps, log), dir, calibrated);
  };
  if (alloy::bench::calibrate_from_median_run(command, rounds, dir + "/calibration", dir + "/calibrated.json", report))
    return true;
  std::fprintf(stderr, "the calibration run failed; its output is in %s/calibration-*.out\n", dir.c_str());
  return false;
}

bool measure(const std::string& alloy, const std::string& dir, Layout& layout, int steps, int index, int round) {
  const std::string log = fmt::format("{}/run-{}-{}.jsonl", dir, index, round);
  const std::string out = fmt::format("{}/run-{}-{}.out", dir, index, round);
  const int rc = run(fmt::format("{} > {} 2>&1", train_command(alloy, dir, layout.plan, "racks.yaml", steps, log), out));
  if (rc != 0) {
    std::fprintf(stderr, "%s failed (exit %d):\n%s", layout.name.c_str(), rc, alloy::bench::errors_in(out).c_str());
    return false;
  }
  layout.measured_seconds.push_back(alloy::bench::run_result_read(log).step_seconds);
  return true;
}

// Median and worst of |predicted / measured - 1| over the layouts.
std::pair<double, double> error_median_worst(const std::vector<Layout>& layouts, double Layout::*predicted) {
  std::vector<double> errors;
  for (const Layout& l : layouts) errors.push_back(std::fabs(l.*predicted / median(l.measured_seconds) - 1));
  std::sort(errors.begin(), errors.end());
  return {errors[errors.size() / 2], errors.back()};
}

void print_results(const std::vector<Layout>& layouts) {
  std::printf("%-30s %-44s %10s %10s %10s %8s\n", "layout", "plan", "measured", "predicted", "error", "uncalibrated");
  for (const Layout& l : layouts) {
    const double measured = median(l.measured_seconds);
    std::printf("%-30s %-44s %9.3fs %9.3fs %+9.1f%% %+8.1f%%\n", l.name.c_str(), l.shape.c_str(), measured,
                l.predicted_seconds, 100 * (l.predicted_seconds / measured - 1),
                100 * (l.predicted_uncalibrated_seconds / measured - 1));
  }
  const double speedup = median(layouts[1].measured_seconds) / median(layouts[0].measured_seconds);
  std::printf("\ntopology-aware plan against the plan told uniform, both on the racks: %.2fx faster (target >= 1.3x)\n",
              speedup);
  const auto [median_error, worst_error] = error_median_worst(layouts, &Layout::predicted_seconds);
  const auto [raw_median, raw_worst] = error_median_worst(layouts, &Layout::predicted_uncalibrated_seconds);
  std::printf("prediction error over the %zu layouts on the racks: median %.1f%%, worst %.1f%% (targets 10%%, 20%%);\n"
              "with the profile uncalibrated: median %.1f%%, worst %.1f%%\n",
              layouts.size(), 100 * median_error, 100 * worst_error, 100 * raw_median, 100 * raw_worst);
}

}  // namespace

int main(int argc, char** argv) {
  const auto [steps, rounds] = alloy::bench::steps_and_rounds(argc, argv, 5, 2);
  alloy::bench::mpi_environment_set();
  const std::string alloy = alloy::bench::alloy_next_to_self();
  const std::string dir = alloy::bench::bench_folder("alloy-network");
  alloy::bench::write_file(dir + "/model.yaml", kModelYaml);
  alloy::bench::write_file(dir + "/train.yaml", kTrainYaml);
  alloy::bench::write_file(dir + "/racks.yaml", kRacksYaml);
  alloy::bench::write_file(dir + "/uniform.yaml", kUniformYaml);
  if (run(fmt::format("{} tokenize {}/examples/data/fsf_licenses.txt -o {}/data.bin > /dev/null", alloy, ALLOY_SOURCE_DIR,
                      dir)) != 0 ||
      run(fmt::format("{} profile --model {}/model.yaml --cluster {}/racks.yaml --train {}/train.yaml -o "
                      "{}/profile.json > {}/profile.out 2>&1",
                      alloy, dir, dir, dir, dir, dir)) != 0) {
    std::fprintf(stderr, "preparing failed:\n%s", alloy::bench::errors_in(dir + "/profile.out").c_str());
    return 1;
  }
  std::string calibration_report;
  if (!calibrate(alloy, dir, steps, std::max(3, rounds), &calibration_report)) return 1;
  std::vector<Layout> layouts = {
      layout_of("topology-aware plan", ""),
      layout_of("plan told uniform", "", "uniform.yaml"),
      layout_of("dp 4 (reduction across)", "--pp 1 --dp 4 --tp 1"),
      layout_of("pp 2 x dp 2 (boundary across)", "--pp 2 --dp 2 --tp 1"),
      layout_of("pp 4", "--pp 4 --dp 1 --tp 1"),
  };
  for (size_t k = 0; k < layouts.size(); ++k)
    if (!plan_layout(alloy, dir, layouts[k], static_cast<int>(k))) return 1;
  std::printf("racks-gpt (4 blocks of width 256, batch 16 x 64) on 4 CPU ranks: two racks of two one-device nodes,\n"
              "1 GB/s inside a rack, 100 MB/s between them (emulated); %d rounds of %d steps, layouts alternating.\n"
              "The profile calibrated by a four-stage pipeline on the uniform 1 GB/s network (emulated):\n%s\n",
              rounds, steps, calibration_report.c_str());
  for (int round = 0; round < rounds; ++round)
    for (size_t k = 0; k < layouts.size(); ++k)
      if (!measure(alloy, dir, layouts[k], steps, static_cast<int>(k), round)) return 1;
  print_results(layouts);
  if (std::getenv("ALLOY_BENCH_KEEP") == nullptr) std::filesystem::remove_all(dir);
  return 0;
}
