// Offload benchmark (issue 8): trains an 8-block GPT-2-family model on one rank with every block
// offloaded to host memory, at prefetch depths 1, 2 and 4 and at host-link bandwidths where
// copying one block's weights takes about as long as its forward (measured here first), half
// and double that; prints peak device arena memory and step time against the same plan without
// offload, measured side by side in one run, and the cost model's and the event simulator's
// predictions for the same plans; then one or two offloaded blocks (the window holding fewer
// than depth + 1) at the slow link; last, the blocks' saved activations offloaded as well.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cost/cost_model.hpp"
#include "hw/catalog.hpp"
#include "mpi_bench_util.hpp"
#include "plan/plan.hpp"
#include "runtime/parallel/dist_report.hpp"
#include "runtime/shard.hpp"
#include "search/planner.hpp"
#include "sim/simulate.hpp"
#include "spec/cluster.hpp"
#include "spec/model.hpp"

namespace {

using alloy::bench::median;
using alloy::bench::run;
using nlohmann::json;

// Params (~3.2M per block) dominate activations at 4 x 64 tokens: where offload matters.
constexpr const char* kModelYaml = R"(name: offload-gpt
family: gpt2
layers: 8
hidden_size: 512
heads: 8
ffn_hidden_size: 2048
vocab_size: 256
max_seq_len: 64
tied_embeddings: true
norm_eps: 1.0e-5
)";

constexpr const char* kTrainYaml = R"(seq_len: 64
global_batch: 4
precision: fp32
optimizer: adamw
steps: 100
learning_rate: 1.0e-3
min_learning_rate: 1.0e-4
warmup_steps: 2
weight_decay: 0.1
grad_clip: 1.0
seed: 7
)";

struct Measured {
  double step_seconds = 0;      // median over the steps after the first
  double peak_arena_bytes = 0;  // largest of the steps
  double forward_seconds = 0;   // median forward op of the last step's trace
  double load = 0;              // the machine's load average when the run ended
  bool ok = false;
};

struct Row {
  std::string name;
  int depth = 0;
  double link_bytes_per_second = 0;
  Measured m;
  double predicted_step_seconds = 0;
  double predicted_peak_bytes = 0;
  double simulated_step_seconds = 0;
};

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// The machine's 1-minute load average (timings on a shared machine are read beside it).
double load_average() {
  double load[1] = {0};
  return getloadavg(load, 1) == 1 ? load[0] : -1;
}

std::string cluster_yaml(double link_bytes_per_second) {
  return fmt::format(R"(name: offload-cpu-1
device_types:
  cpu-one: {{base: cpu, memory: 4GiB}}
nodes:
  - {{name: host, count: 1, device: cpu-one, devices_per_node: 1, host_memory: 16GiB, host_link: {:.0f}B/s}}
)",
                     link_bytes_per_second);
}

// Floats of one block's parameters.
double block_floats(const alloy::ModelSpec& model) {
  double floats = 0;
  for (const alloy::ShardedTensor& t : alloy::shard_tensors(model, alloy::shard_full(model))) {
    if (t.name.rfind("layers.0.", 0) != 0) continue;
    double n = 1;
    for (int64_t e : t.full_shape) n *= static_cast<double>(e);
    floats += n;
  }
  return floats;
}

Measured measure(const std::string& alloy, const std::string& dir, const std::string& tag, const std::string& plan,
                 const std::string& cluster, int steps) {
  Measured m;
  const std::string log = fmt::format("{}/{}.jsonl", dir, tag), trace = fmt::format("{}/{}-trace.json", dir, tag);
  std::filesystem::remove(log);
  const int rc = run(fmt::format("{} train --model {}/model.yaml --data {}/data.bin --steps {} --threads 1 --no-progress "
                                 "--plan {} --cluster {} --log {} --trace {} > {}/{}.out 2>&1",
                                 alloy, dir, dir, steps, plan, cluster, log, trace, dir, tag));
  if (rc != 0) {
    std::fprintf(stderr, "%s failed (exit %d): see %s/%s.out\n%s", tag.c_str(), rc, dir.c_str(), tag.c_str(),
                 alloy::bench::errors_in(fmt::format("{}/{}.out", dir, tag)).c_str());
    return m;
  }
  std::ifstream in(log);
  std::vector<double> steps_seconds;
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    steps_seconds.push_back(j.at("step_seconds").get<double>());
    m.peak_arena_bytes = std::max(m.peak_arena_bytes, j.at("peak_arena_bytes").get<double>());
  }
  if (steps_seconds.size() > 1) steps_seconds.erase(steps_seconds.begin());
  m.step_seconds = median(steps_seconds);
  std::vector<double> forwards;
  const json doc = json::parse(std::ifstream(trace));
  for (const json& e : doc.at("traceEvents"))
    if (e.at("ph") == "X" && e.at("cat") == "forward") forwards.push_back(e.at("dur").get<double>() * 1e-6);
  m.forward_seconds = median(forwards);
  m.load = load_average();
  m.ok = m.step_seconds > 0;
  return m;
}

// The plan for `cluster` without offload (the planner's, pinned to one micro-batch), then with
// the first `offloaded` blocks (every block: -1) offloaded at `depth`; returns the path of the
// plan to run.
std::string plan_for(const std::string& alloy, const std::string& dir, const std::string& cluster, const std::string& tag,
                     int depth, bool activations = false, int offloaded = -1) {
  const std::string base = fmt::format("{}/{}-base.json", dir, tag), plan = fmt::format("{}/{}.json", dir, tag);
  if (run(fmt::format("{} plan --model {}/model.yaml --cluster {} --train {}/train.yaml --pp 1 --tp 1 --dp 1 "
                      "--num-micro-batches 1 --recompute none --no-offload -o {} > /dev/null 2>&1",
                      alloy, dir, cluster, dir, base)) != 0)
    return "";
  json j = json::parse(std::ifstream(base));
  for (json& st : j.at("stages")) {
    int block = 0;
    for (auto& flag : st.at("offload")) flag = depth > 0 && (offloaded < 0 || block++ < offloaded);
    if (activations) st["offload_activations"] = st.at("offload");
    st["offload_prefetch_depth"] = std::max(1, depth);
  }
  std::ofstream(plan) << j.dump(1);
  return plan;
}

// The cost model's step time and device memory (the terms the arena holds) for a saved plan, and
// the event simulator's step time for it, with the device's compute `speed` times the cluster
// file's (calibrated to the measured step without offload: the host link is paced to the clock,
// the compute runs at whatever this machine's load leaves it).
void predict(const std::string& dir, const std::string& plan_path, const std::string& cluster_path, double speed,
             Row& row) {
  alloy::Plan plan = alloy::plan_load(plan_path);
  const alloy::ModelSpec model = alloy::model_load(dir + "/model.yaml");
  alloy::ClusterSpec cluster = alloy::cluster_load(cluster_path, alloy::catalog_builtin());
  for (alloy::DeviceType& type : cluster.device_types) type.speed *= speed;
  plan.cluster_fingerprint = alloy::cluster_fingerprint(cluster);  // the same cluster, its compute calibrated
  alloy::TrainSpec train;
  train.seq_len = plan.seq_len;
  train.global_batch_sequences = plan.global_batch_sequences;
  train.precision = plan.precision;
  alloy::plan_evaluate(&plan, alloy::CostModel(model, cluster, train));
  row.predicted_step_seconds = plan.step_seconds;
  row.predicted_peak_bytes = alloy::dist_predicted_arena_bytes(plan.stages.front().memory);
  row.simulated_step_seconds = alloy::simulate(plan, model, cluster).step_seconds;
}


std::string mib(double bytes) { return fmt::format("{:.1f}", bytes / (1024.0 * 1024.0)); }

}  // namespace

int main(int argc, char** argv) {
  int steps = 6;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--steps") steps = std::max(3, std::atoi(argv[i + 1]));
  alloy::bench::mpi_environment_set();
  const std::string alloy = alloy::bench::alloy_next_to_self();
  const std::string dir = std::filesystem::temp_directory_path() / fmt::format("alloy-offload-{}", getpid());
  std::filesystem::create_directories(dir);
  write(dir + "/model.yaml", kModelYaml);
  write(dir + "/train.yaml", kTrainYaml);
  if (run(fmt::format("{} tokenize {}/examples/data/fsf_licenses.txt -o {}/data.bin > /dev/null", alloy, ALLOY_SOURCE_DIR, dir)) != 0)
    return 1;
  const alloy::ModelSpec model = alloy::model_load(dir + "/model.yaml");
  const double block_bytes = block_floats(model) * sizeof(float);

  // 1. Without offload (the link does not matter): the baseline and the block's forward time.
  const std::string probe_cluster = dir + "/cluster-probe.yaml";
  write(probe_cluster, cluster_yaml(1e9));
  Row baseline{"no offload", 0, 0, {}, 0, 0, 0};
  const std::string base_plan = plan_for(alloy, dir, probe_cluster, "none", 0);
  if (base_plan.empty()) return 1;
  baseline.m = measure(alloy, dir, "none", base_plan, probe_cluster, steps);
  if (!baseline.m.ok) return 1;
  predict(dir, base_plan, probe_cluster, 1.0, baseline);
  const double speed = baseline.predicted_step_seconds / baseline.m.step_seconds;
  predict(dir, base_plan, probe_cluster, speed, baseline);
  const double block_forward = baseline.m.forward_seconds / static_cast<double>(model.num_layers);
  const double matched = block_bytes / block_forward;
  std::printf("offload-gpt: %lld blocks of %.1f MiB; one block's forward %.1f ms -> matched host link %.0f MB/s\n",
              static_cast<long long>(model.num_layers), block_bytes / 1048576.0, block_forward * 1e3, matched / 1e6);
  std::printf("predictions at %.2fx the catalog's CPU speed: the measured step without offload (load %.1f)\n\n", speed,
              baseline.m.load);

  // 2. Every block offloaded, per bandwidth and prefetch depth.
  std::vector<Row> rows;
  for (double scale : {1.0, 0.5, 2.0}) {
    const std::string cluster = fmt::format("{}/cluster-{}.yaml", dir, scale);
    write(cluster, cluster_yaml(matched * scale));
    for (int depth : {1, 2, 4}) {
      const std::string tag = fmt::format("offload-x{}-d{}", scale, depth);
      Row row{fmt::format("offload all, link x{}", scale), depth, matched * scale, {}, 0, 0, 0};
      const std::string plan = plan_for(alloy, dir, cluster, tag, depth);
      if (plan.empty()) return 1;
      row.m = measure(alloy, dir, tag, plan, cluster, steps);
      predict(dir, plan, cluster, speed, row);
      rows.push_back(row);
    }
  }

  // 3. One or two offloaded blocks (fewer than depth + 1: the window holds each of them), at the
  // slow link: their fetches may start in the passes before theirs.
  for (int offloaded : {1, 2}) {
    const std::string cluster = fmt::format("{}/cluster-{}.yaml", dir, 0.5);
    for (int depth : {1, 2}) {
      const std::string tag = fmt::format("offload-{}-x0.5-d{}", offloaded, depth);
      const std::string name = fmt::format("offload {} block{}, link x0.5", offloaded, offloaded > 1 ? "s" : "");
      Row row{name, depth, matched * 0.5, {}, 0, 0, 0};
      const std::string plan = plan_for(alloy, dir, cluster, tag, depth, false, offloaded);
      if (plan.empty()) return 1;
      row.m = measure(alloy, dir, tag, plan, cluster, steps);
      predict(dir, plan, cluster, speed, row);
      rows.push_back(row);
    }
  }

  {  // saved activations too, at the matched link
    const std::string cluster = fmt::format("{}/cluster-{}.yaml", dir, 1.0);
    Row row{"offload all + activations", 2, matched, {}, 0, 0, 0};
    const std::string plan = plan_for(alloy, dir, cluster, "offload-acts", 2, true);
    if (plan.empty()) return 1;
    row.m = measure(alloy, dir, "offload-acts", plan, cluster, steps);
    predict(dir, plan, cluster, speed, row);
    rows.push_back(row);
  }

  std::printf("%-26s %5s %10s %12s %8s %10s %8s %12s %7s %12s %7s %14s %6s\n", "plan", "depth", "link MB/s",
              "peak MiB", "vs none", "step s", "vs none", "cost model s", "error", "simulated s", "error",
              "pred. peak MiB", "load");
  const auto error = [](double predicted, double measured) {
    return fmt::format("{:+.0f}%", 100.0 * (predicted / measured - 1.0));
  };
  const auto print = [&](const Row& r) {
    std::printf("%-26s %5s %10s %12s %8.3f %10.3f %8.3f %12.3f %7s %12.3f %7s %14s %6.1f\n", r.name.c_str(),
                r.depth > 0 ? std::to_string(r.depth).c_str() : "-",
                r.link_bytes_per_second > 0 ? fmt::format("{:.0f}", r.link_bytes_per_second / 1e6).c_str() : "-",
                mib(r.m.peak_arena_bytes).c_str(), r.m.peak_arena_bytes / baseline.m.peak_arena_bytes, r.m.step_seconds,
                r.m.step_seconds / baseline.m.step_seconds, r.predicted_step_seconds,
                error(r.predicted_step_seconds, r.m.step_seconds).c_str(), r.simulated_step_seconds,
                error(r.simulated_step_seconds, r.m.step_seconds).c_str(), mib(r.predicted_peak_bytes).c_str(),
                r.m.load);
  };
  print(baseline);
  bool met = false;
  for (const Row& r : rows) {
    if (!r.m.ok) {
      std::printf("%-26s %5d  failed\n", r.name.c_str(), r.depth);
      continue;
    }
    print(r);
    const bool matched_link = r.link_bytes_per_second == matched && r.name.find("activations") == std::string::npos;
    if (matched_link && r.m.peak_arena_bytes <= 0.4 * baseline.m.peak_arena_bytes &&
        r.m.step_seconds <= 1.2 * baseline.m.step_seconds)
      met = true;
  }
  std::printf("\ntarget (matched link): peak arena memory at most 0.40 of no offload with step time at most 1.20: %s\n",
              met ? "met" : "NOT met");
  if (std::getenv("ALLOY_BENCH_KEEP") == nullptr) std::filesystem::remove_all(dir);
  return 0;
}
