// Planner benchmark (issue 3, "done when" 2-4): search time on the reference problems, the
// ratio to the best Megatron-style uniform layout, and the gain from using every device type.
// Models and clusters are the shipped examples (examples/), plus a few built from the catalog.
// Usage: bench_planner [--runs N] [--speed] [--only TEXT]; --speed prints only the search
// times, --only TEXT only the speed problems whose name contains TEXT.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../tests/support/specs.hpp"
#include "hw/catalog.hpp"
#include "search/baselines.hpp"
#include "search/explain.hpp"
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

// A shipped example cluster, with the catalog's device types.
ClusterSpec shipped(const std::string& name) { return cluster_load(name, catalog_builtin()); }

DeviceType catalog_type(const std::string& name) {
  const DeviceType* t = catalog_builtin().find(name);
  if (!t) throw Error("device type '" + name + "' is not in the catalog");
  return *t;
}

// The four-type case's 4096 GPUs and 400 Gb/s NIC per node, wired as two sites would be: each
// type's 128 nodes behind one spine (a pod; a "rack" in the cluster file), the H100 pod
// non-blocking and the older A100, MI250X and V100 pods 2:1, 4:1 and 8:1 oversubscribed, as
// leaf-spine fabrics grown on a budget are; H100 and A100 at one site, MI250X and V100 at
// another, joined by a 100 Gb/s WAN with 10 ms latency (two regions about 1000 km apart).
constexpr const char* kTieredCluster = R"(
name: four-type-4096-two-sites
network: {kind: infiniband, bandwidth: 400Gb/s, latency: 5us}
sites:
  - {name: east}
  - {name: west}
wan: {kind: ethernet, bandwidth: 100Gb/s, latency: 10ms}
racks:
  - {name: h100-pod, site: east, latency: 1us}
  - {name: a100-pod, site: east, oversubscription: 2, latency: 1us}
  - {name: mi250x-pod, site: west, oversubscription: 4, latency: 1us}
  - {name: v100-pod, site: west, oversubscription: 8, latency: 1us}
nodes:
  - {name: h100-nodes, count: 128, device: h100-sxm, devices_per_node: 8, host_memory: 1TiB, rack: h100-pod}
  - {name: a100-nodes, count: 128, device: a100-80gb-sxm, devices_per_node: 8, host_memory: 1TiB, rack: a100-pod}
  - {name: mi250x-nodes, count: 128, device: mi250x, devices_per_node: 8, host_memory: 1TiB, rack: mi250x-pod}
  - {name: v100-nodes, count: 128, device: v100-32gb, devices_per_node: 8, host_memory: 1TiB, rack: v100-pod}
)";

std::vector<Case> speed_cases() {
  using testing::train;
  std::vector<Case> cases;
  cases.push_back({"llama-2-7b, a100-8", model_load("llama-2-7b"), shipped("a100-8"), train(2048, 16), 0.05});
  cases.push_back({"gpt-neo-2.7b-like, a100-40-v100-16-32", model_load("gpt-neo-2.7b-like"),
                   shipped("a100-40-v100-16-32"), train(2048, 64), 0.05});
  cases.push_back({"gpt-neo-2.7b-like, a100-40-v100-16-128", model_load("gpt-neo-2.7b-like"),
                   shipped("a100-40-v100-16-128"), train(2048, 256), 0.1});
  cases.push_back({"llama-3-70b, hetero-1024", model_load("llama-3-70b"), shipped("hetero-1024"), train(4096, 1024),
                   1.0});
  cases.push_back({"mixtral-8x7b, h100-a100", model_load("mixtral-8x7b"), shipped("h100-a100"), train(4096, 64), 1.0});
  ModelSpec eighty = model_load("llama-3-70b");
  eighty.name = "80-layer";
  // Not shipped: 4096 GPUs of four types, 128 nodes of 8 each, built here from the catalog.
  cases.push_back({"80-layer model, 4096 gpus of 4 types", eighty,
                   testing::cluster("four-type-4096",
                                    {catalog_type("h100-sxm"), catalog_type("a100-80gb-sxm"), catalog_type("mi250x"),
                                     catalog_type("v100-32gb")},
                                    {{0, 128, 8}, {1, 128, 8}, {2, 128, 8}, {3, 128, 8}}, 50e9),
                   train(4096, 2048), 5.0});
  cases.push_back({"80-layer model, 4096 gpus, racks+2 sites", eighty,
                   cluster_load_text(kTieredCluster, "four-type-4096-two-sites.yaml", "", catalog_builtin()),
                   train(4096, 2048), 5.0});
  return cases;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `only`: run the problems whose name contains it (all when empty).
void print_speed_table(int runs, const std::string& only) {
  const std::vector<Case> cases = speed_cases();
  if (std::none_of(cases.begin(), cases.end(), [&](const Case& c) { return c.name.find(only) != std::string::npos; }))
    throw Error(fmt::format("--only '{}' matches no speed problem", only), {"", "--only"},
                "give part of a problem's name, e.g. 'llama-3-70b' or 'v100-16-32'");
  fmt::print("Search time (one core, median of {} runs)\n", runs);
  fmt::print("  {:<40} {:>9} {:>7} {:>4} {:>10} {:>8} {:>8} {:>9} {:>9} {:>10}\n", "problem", "median ms", "target",
             "met", "structures", "bound", "refined", "evaluated", "DP runs", "tokens/s");
  for (const Case& c : cases) {
    if (c.name.find(only) == std::string::npos) continue;
    CostModel cost(c.model, c.cluster, c.train);
    std::vector<double> times;
    SearchResult last;
    try {
      for (int r = 0; r < runs; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        last = plan_search(cost, {});
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    } catch (const Error& e) {
      fmt::print("  {:<40} not met: {}\n", c.name, e.message());
      continue;
    }
    const double med = median(times);
    fmt::print("  {:<40} {:>9.1f} {:>5.0f}ms {:>4} {:>10} {:>8} {:>8} {:>9} {:>9} {:>10.0f}\n", c.name, med * 1e3,
               c.target_seconds * 1e3, med < c.target_seconds ? "yes" : "NO", last.stats.structures,
               last.stats.pruned_by_bound, last.stats.pruned_by_refined_bound, last.stats.evaluated,
               last.stats.split_solves, last.plan.tokens_per_second);
    fmt::print("      chosen: {}\n", plan_shape_summary(last.plan));
    std::fflush(stdout);
  }
}

struct Example {
  std::string name;
  ModelSpec model;
  ClusterSpec cluster;
  TrainSpec train;
};

std::vector<Example> homogeneous_examples() {
  using namespace testing;
  return {
      {"llama-2-7b on a100-8 (shipped)", model_load("llama-2-7b"), shipped("a100-8"), train(4096, 64)},
      {"llama-2-7b on 16 a100-40", model_load("llama-2-7b"),
       cluster("a100-40x16", {catalog_type("a100-40gb-sxm")}, {{0, 2, 8}}, 25e9), train(4096, 128)},
      {"gpt-neo-2.7b-like on 32 v100-16", model_load("gpt-neo-2.7b-like"),
       cluster("v100x32", {catalog_type("v100-16gb")}, {{0, 8, 4}}, 12.5e9), train(2048, 256)},
      {"llama-3-70b on 64 h100", model_load("llama-3-70b"), cluster("h100x64", {catalog_type("h100-sxm")}, {{0, 8, 8}}, 50e9),
       train(4096, 256)},
  };
}

std::vector<Example> heterogeneous_examples() {
  using testing::train;
  return {
      {"a100-v100: llama-2-7b", model_load("llama-2-7b"), shipped("a100-v100"), train(4096, 256)},
      {"h100-a100-l4: llama-2-7b", model_load("llama-2-7b"), shipped("h100-a100-l4"), train(4096, 256)},
      {"mi250x-a100: llama-2-7b", model_load("llama-2-7b"), shipped("mi250x-a100"), train(4096, 256)},
      {"hetero-1024: llama-3-70b", model_load("llama-3-70b"), shipped("hetero-1024"), train(4096, 1024)},
  };
}

void print_uniform_table() {
  fmt::print("\nNever worse than hand layouts: best plan vs best Megatron-style uniform layout\n");
  fmt::print("  {:<30} {:>10} {:>12} {:>12} {:>9}\n", "example", "uniforms", "plan s/step", "uniform s", "speedup");
  for (const Example& e : homogeneous_examples()) {
    CostModel cost(e.model, e.cluster, e.train);
    int scored = 0;
    const std::optional<Plan> uniform = best_uniform_plan(cost, 0, &scored);
    const SearchResult r = plan_search(cost, {});
    if (!uniform) {
      fmt::print("  {:<30} {:>10} {:>12.3f} {:>12} {:>9}\n", e.name, scored, r.plan.step_seconds, "none fits", "-");
      continue;
    }
    fmt::print("  {:<30} {:>10} {:>12.3f} {:>12.3f} {:>8.3f}x\n", e.name, scored, r.plan.step_seconds,
               uniform->step_seconds, uniform->step_seconds / r.plan.step_seconds);
    std::fflush(stdout);
  }
}

// The cluster with every device replaced by `type` (same nodes and links).
ClusterSpec as_type(const ClusterSpec& c, const DeviceType& type) {
  ClusterSpec out = c;
  out.device_types = {type};
  for (NodeGroup& g : out.node_groups) g.device_type_index = 0;
  for (Device& d : out.devices) d.device_type_index = 0;
  return out;
}

void print_heterogeneity_table() {
  fmt::print("\nHeterogeneity pays: throughput (tokens/s) of the plan vs baselines\n");
  fmt::print("  {:<44} {:>11} {:>11} {:>8} {:>11} {:>8} {:>11} {:>8}\n", "cluster", "plan", "all-slowest", "gain",
             "fastest", "gain", "sum alone", "of bound");
  for (const Example& e : heterogeneous_examples()) {
    CostModel cost(e.model, e.cluster, e.train);
    const SearchResult r = plan_search(cost, {});
    const Precision p = e.train.precision;
    int slowest = 0;
    int fastest = 0;
    for (size_t t = 0; t < e.cluster.device_types.size(); ++t) {
      if (e.cluster.device_types[t].peak_flops(p) < e.cluster.device_types[slowest].peak_flops(p)) slowest = static_cast<int>(t);
      if (e.cluster.device_types[t].peak_flops(p) > e.cluster.device_types[fastest].peak_flops(p)) fastest = static_cast<int>(t);
    }
    const ClusterSpec slow_cluster = as_type(e.cluster, e.cluster.device_types[slowest]);
    CostModel slow_cost(e.model, slow_cluster, e.train);
    const std::optional<Plan> slow_uniform = best_uniform_plan(slow_cost, 0);
    const double slow_tps = slow_uniform ? slow_uniform->tokens_per_second : 0;
    double fastest_tps = 0;
    double bound = 0;
    for (size_t t = 0; t < e.cluster.device_types.size(); ++t) {
      SearchOptions alone;
      alone.device_order = {e.cluster.device_types[t].name};
      double tps = 0;
      try {
        tps = plan_search(cost, alone).plan.tokens_per_second;
      } catch (const Error&) {
        tps = 0;  // this type alone cannot hold the model
      }
      bound += tps;
      if (static_cast<int>(t) == fastest) fastest_tps = tps;
    }
    // "n/a": no uniform layout of the slowest type fits (or divides the batch).
    const auto ratio = [&](double base) {
      return base > 0 ? fmt::format("{:.2f}x", r.plan.tokens_per_second / base) : std::string("n/a");
    };
    fmt::print("  {:<44} {:>11.0f} {:>11.0f} {:>8} {:>11.0f} {:>8} {:>11.0f} {:>7.1f}%\n", e.name,
               r.plan.tokens_per_second, slow_tps, ratio(slow_tps), fastest_tps, ratio(fastest_tps), bound,
               100.0 * r.plan.tokens_per_second / bound);
    fmt::print("      chosen: {}\n", plan_shape_summary(r.plan));
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace alloy

int main(int argc, char** argv) {
  int runs = 5;
  bool only_speed = false;
  std::string only;  // --only TEXT: speed problems whose name contains TEXT
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--runs") == 0 && i + 1 < argc) runs = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--speed") == 0) only_speed = true;
    if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
      only_speed = true;
    }
  }
  try {
    if (!only_speed) {
      alloy::print_uniform_table();
      alloy::print_heterogeneity_table();
    }
    alloy::print_speed_table(runs, only);
  } catch (const alloy::Error& e) {
    std::fprintf(stderr, "%s\n", e.format().c_str());
    return 2;
  }
  return 0;
}
