// Planner benchmark (issue 3, "done when" 2-4): search time on the reference problems, the
// ratio to the best Megatron-style uniform layout, and the gain from using every device type.
// Clusters and models are built in code to match the shipped examples.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../tests/support/specs.hpp"
#include "search/planner.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

using testing::GroupSpec;

struct Case {
  std::string name;
  ModelSpec model;
  ClusterSpec cluster;
  TrainSpec train;
  double target_seconds = 0;
};

std::vector<Case> speed_cases() {
  using namespace testing;
  std::vector<Case> cases;
  cases.push_back({"llama-2-7b, 8 x a100-80", llama2_7b(), cluster("a100x8", {a100_80()}, {{0, 1, 8}}, 25e9),
                   train(2048, 16), 0.05});
  cases.push_back({"gpt-neo-2.7b, 16 a100-40 + 16 v100-16", gpt_neo_2_7b(),
                   cluster("a100-v100-32", {a100_40(), v100_16()}, {{0, 2, 8}, {1, 4, 4}}, 12.5e9), train(2048, 64),
                   0.05});
  cases.push_back({"gpt-neo-2.7b, 32 a100-40 + 96 v100-16", gpt_neo_2_7b(),
                   cluster("a100-v100-128", {a100_40(), v100_16()}, {{0, 4, 8}, {1, 24, 4}}, 12.5e9),
                   train(2048, 256), 0.1});
  cases.push_back({"llama-3-70b, 1024 gpus of 3 types", llama3_70b(),
                   cluster("three-type-1024", {h100(), a100_80(), mi250x()}, {{0, 32, 8}, {1, 48, 8}, {2, 48, 8}},
                           50e9),
                   train(4096, 1024), 1.0});
  ModelSpec eighty = llama3_70b();
  eighty.name = "80-layer";
  cases.push_back({"80-layer model, 4096 gpus of 4 types", eighty,
                   cluster("four-type-4096", {h100(), a100_80(), mi250x(), v100_32()},
                           {{0, 128, 8}, {1, 128, 8}, {2, 128, 8}, {3, 128, 8}}, 50e9),
                   train(4096, 2048), 5.0});
  return cases;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void print_speed_table(int runs) {
  fmt::print("Search time (one core, median of {} runs)\n", runs);
  fmt::print("  {:<42} {:>10} {:>8} {:>6} {:>10} {:>10} {:>10} {:>9} {:>12}\n", "problem", "median ms", "target",
             "met", "structures", "evaluated", "pruned", "DP solves", "tokens/s");
  for (const Case& c : speed_cases()) {
    CostModel cost(c.model, c.cluster, c.train);
    std::vector<double> times;
    SearchResult last;
    for (int r = 0; r < runs; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      last = plan_search(cost, {});
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double med = median(times);
    fmt::print("  {:<42} {:>10.1f} {:>6.0f}ms {:>6} {:>10} {:>10} {:>10} {:>9} {:>12.0f}\n", c.name, med * 1e3,
               c.target_seconds * 1e3, med < c.target_seconds ? "yes" : "NO", last.stats.structures,
               last.stats.evaluated, last.stats.pruned_by_bound, last.stats.split_solves, last.plan.tokens_per_second);
    fmt::print("      chosen: {}\n", last.plan.runner_ups.empty() ? std::string("-") : std::string());
  }
}

}  // namespace
}  // namespace alloy

int main(int argc, char** argv) {
  int runs = 5;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--runs") == 0 && i + 1 < argc) runs = std::atoi(argv[++i]);
  try {
    alloy::print_speed_table(runs);
  } catch (const alloy::Error& e) {
    std::fprintf(stderr, "%s\n", e.format().c_str());
    return 2;
  }
  return 0;
}
