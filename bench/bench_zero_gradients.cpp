// Sharded against accumulated gradients under ZeRO 2 and 3: 4 CPU ranks train an 8-block
// GPT-2-family model as 4 data-parallel replicas with 4 micro-batches per step. Strategy (a),
// shard_gradients, reduce-scatters every micro-batch's gradients part by part (at most 1 MiB
// each) into a 1/dp shard; strategy (b)
// accumulates the full gradients and reduce-scatters once per step. Runs of (a) and (b)
// alternate within one run (the machine's speed drifts); prints per ZeRO stage the median step
// time, the largest arena peak and the gradient memory at the peak (shard and parts, or the
// full buffer) per rank, side by side, and the ratios (a)/(b).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "mpi_bench_util.hpp"

namespace {

using alloy::bench::median;
using alloy::bench::run;
using nlohmann::json;

constexpr int kRanks = 4;

// About 0.8 M parameters (3 MiB) per block: gradients (25 MiB for the stage) outweigh
// activations. Untied, so no part is held across the backward (a head tied to the embedding on
// the same stage keeps the table's parts from the head's backward on).
constexpr const char* kModelYaml = R"(name: zero-gpt
family: gpt2
layers: 8
hidden_size: 256
heads: 8
ffn_hidden_size: 1024
vocab_size: 256
max_seq_len: 64
tied_embeddings: false
norm_eps: 1.0e-5
)";

constexpr const char* kTrainYaml = R"(seq_len: 64
global_batch: 16
precision: fp32
optimizer: adamw
steps: 100
learning_rate: 1.0e-3
min_learning_rate: 1.0e-4
warmup_steps: 2
weight_decay: 0.1
grad_clip: 1.0
gradient_bucket_mib: 1
seed: 7
)";

constexpr const char* kClusterYaml = R"(name: zero-cpu-4
device_types:
  cpu-zero: {base: cpu, memory: 4GiB}
nodes:
  - {name: host, count: 1, device: cpu-zero, devices_per_node: 4, host_memory: 16GiB}
)";

struct Measured {
  std::vector<double> step_seconds;    // every round's median over the steps after the first
  double peak_arena_bytes = 0;         // largest rank, last step
  double gradient_bytes = 0;           // largest rank: gradient buffers at its arena peak
  bool ok = true;
};

// The planner's dp 4 layout with `zero`, 4 micro-batches, then shard_gradients set as asked.
std::string plan_for(const std::string& alloy, const std::string& dir, int zero, bool shard) {
  const std::string base = fmt::format("{}/zero{}-base.json", dir, zero);
  const std::string plan = fmt::format("{}/zero{}-{}.json", dir, zero, shard ? "a" : "b");
  if (!std::filesystem::exists(base) &&
      run(fmt::format("{} plan --model {}/model.yaml --cluster {}/cluster.yaml --train {}/train.yaml --pp 1 --tp 1 "
                      "--dp {} --zero {} --num-micro-batches 4 --recompute none --no-offload -o {} > {}/plan.out 2>&1",
                      alloy, dir, dir, dir, kRanks, zero, base, dir)) != 0) {
    std::fprintf(stderr, "alloy plan failed:\n%s", alloy::bench::errors_in(dir + "/plan.out").c_str());
    return "";
  }
  json j = json::parse(std::ifstream(base));
  for (json& st : j.at("stages")) st["shard_gradients"] = shard;
  std::ofstream(plan) << j.dump(1);
  return plan;
}

// Bytes of the gradient buffers in a rank's "rank R arena peak X MiB: name M; ..." line: the full
// buffer, or the shard and the parts ("gradient bucket" buffers).
double gradient_bytes_in(const std::string& line) {
  double bytes = 0;
  std::istringstream items(line.substr(line.find(':') + 1));
  for (std::string item; std::getline(items, item, ';');) {
    const size_t first = item.find_first_not_of(' '), space = item.find_last_of(' ');
    if (first == std::string::npos || space == std::string::npos || space <= first) continue;
    const std::string name = item.substr(first, space - first);
    if (name == "gradients" || name == "sharded gradients" || name == "gradient bucket")
      bytes += std::atof(item.c_str() + space + 1) * 1048576.0;
  }
  return bytes;
}

void measure(const std::string& alloy, const std::string& dir, const std::string& plan, const std::string& tag,
             int steps, Measured& m) {
  const std::string log = fmt::format("{}/{}.jsonl", dir, tag), out = fmt::format("{}/{}.out", dir, tag);
  std::filesystem::remove(log);
  const int rc = run(fmt::format("{} -x ALLOY_ARENA_REPORT=1 -x ALLOY_THREADS=1 {} train --model {}/model.yaml --data "
                                 "{}/data.bin --steps {} --no-progress --plan {} --cluster {}/cluster.yaml --log {} > {} 2>&1",
                                 alloy::bench::mpirun(kRanks), alloy, dir, dir, steps, plan, dir, log, out));
  if (rc != 0) {
    std::fprintf(stderr, "%s failed (exit %d):\n%s", tag.c_str(), rc, alloy::bench::errors_in(out).c_str());
    m.ok = false;
    return;
  }
  const alloy::bench::RunResult r = alloy::bench::run_result_read(log);
  m.step_seconds.push_back(r.step_seconds);
  for (double peak : r.peak_arena_bytes) m.peak_arena_bytes = std::max(m.peak_arena_bytes, peak);
  std::ifstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("rank ", 0) == 0 && line.find("arena peak") != std::string::npos)
      m.gradient_bytes = std::max(m.gradient_bytes, gradient_bytes_in(line));
}

std::string mib(double bytes) { return fmt::format("{:.2f}", bytes / 1048576.0); }

}  // namespace

int main(int argc, char** argv) {
  const auto [steps, rounds] = alloy::bench::steps_and_rounds(argc, argv, 6, 3);
  alloy::bench::mpi_environment_set();
  const std::string alloy = alloy::bench::alloy_next_to_self();
  const std::string dir = alloy::bench::bench_folder("alloy-zero-gradients");
  alloy::bench::write_file(dir + "/model.yaml", kModelYaml);
  alloy::bench::write_file(dir + "/train.yaml", kTrainYaml);
  alloy::bench::write_file(dir + "/cluster.yaml", kClusterYaml);
  if (run(fmt::format("{} tokenize {}/examples/data/fsf_licenses.txt -o {}/data.bin > /dev/null", alloy, ALLOY_SOURCE_DIR, dir)) != 0)
    return 1;

  std::printf("zero-gpt (8 blocks of width 256) on %d CPU ranks, dp %d, 4 micro-batches, a 1 MiB bucket; "
              "%d rounds of %d steps, (a) and (b) alternating\n\n",
              kRanks, kRanks, rounds, steps);
  std::printf("%-6s %-22s %12s %12s %16s\n", "ZeRO", "strategy", "step s", "peak MiB", "gradients MiB");
  bool ok = true;
  for (int zero : {2, 3}) {
    const std::string plans[2] = {plan_for(alloy, dir, zero, true), plan_for(alloy, dir, zero, false)};
    if (plans[0].empty() || plans[1].empty()) return 1;
    Measured m[2];
    for (int round = 0; round < rounds; ++round)
      for (int k = 0; k < 2; ++k) measure(alloy, dir, plans[k], fmt::format("zero{}-{}-{}", zero, "ab"[k], round), steps, m[k]);
    if (!m[0].ok || !m[1].ok) {
      ok = false;
      continue;
    }
    const char* names[2] = {"(a) sharded", "(b) accumulated"};
    for (int k = 0; k < 2; ++k)
      std::printf("%-6d %-22s %12.4f %12s %16s\n", zero, names[k], median(m[k].step_seconds), mib(m[k].peak_arena_bytes).c_str(),
                  mib(m[k].gradient_bytes).c_str());
    std::printf("%-6d %-22s %12.3f %12.3f %16.3f\n\n", zero, "(a)/(b)", median(m[0].step_seconds) / median(m[1].step_seconds),
                m[0].peak_arena_bytes / m[1].peak_arena_bytes, m[0].gradient_bytes / m[1].gradient_bytes);
  }
  if (std::getenv("ALLOY_BENCH_KEEP") == nullptr) std::filesystem::remove_all(dir);
  return ok ? 0 : 1;
}
