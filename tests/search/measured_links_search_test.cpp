// The planner on links measured between node groups: a cluster file that states one fast network
// for two groups, and a profile that measured the link between them 10x slower. The planner
// prices the layouts on the measured link, moves the data-parallel reduction off it and says so.
#include <gtest/gtest.h>

#include <string>

#include "cost/cost_model.hpp"
#include "cost/profile.hpp"
#include "hw/catalog.hpp"
#include "search/planner.hpp"
#include "spec/cluster.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy {
namespace {

// Two groups of two one-device CPU nodes, every node on 1 GB/s, 100 us as the file says
// (fast enough that a reduction over all four, on CPU ranks that share two cores, wins there).
constexpr const char* kStatedYaml = R"(name: two-groups
network: {kind: ethernet, bandwidth: 1GB/s, latency: 100us}
nodes:
  - {name: east, count: 2, device: cpu, devices_per_node: 1, host_memory: 8GiB}
  - {name: west, count: 2, device: cpu, devices_per_node: 1, host_memory: 8GiB}
)";

// Measured: inside each group as stated, between them 100 MB/s and 1 ms.
constexpr const char* kMeasuredJson = R"({"version": 1, "links": [
  {"from": "east", "to": "east", "bandwidth_bytes_per_second": 1e9, "latency_seconds": 1e-4},
  {"from": "west", "to": "west", "bandwidth_bytes_per_second": 1e9, "latency_seconds": 1e-4},
  {"from": "east", "to": "west", "bandwidth_bytes_per_second": 1e8, "latency_seconds": 1e-3}]})";

struct LinksCase {
  ModelSpec model = model_load("small-gpt");
  ClusterSpec cluster = cluster_load_text(kStatedYaml, "two-groups.yaml", "", catalog_builtin());
  TrainSpec train = train_load(std::string(ALLOY_SOURCE_DIR) + "/examples/train/tiny-cpu.yaml");
  Profile measured = profile_parse(kMeasuredJson, "links.json");
};

// Whether a stage replicates over devices of both groups: its data-parallel reduction crosses
// the link between them.
bool reduction_crosses_groups(const Plan& plan, const ClusterSpec& cluster) {
  for (const PlanStage& st : plan.stages) {
    if (st.dp < 2) continue;
    bool east = false, west = false;
    for (int id : st.device_ids) (cluster.devices[id].node_group == 0 ? east : west) = true;
    if (east && west) return true;
  }
  return false;
}

TEST(MeasuredLinksSearch, SlowMeasuredLinkMovesTheReductionOffIt) {
  const LinksCase c;
  const CostModel file(c.model, c.cluster, c.train);
  const CostModel measured(c.model, c.cluster, c.train, &c.measured);
  const SearchResult on_file = plan_search(file, {});
  const SearchResult on_measured = plan_search(measured, {});
  // On the file's one fast network a reduction over all four devices is cheap and chosen.
  EXPECT_TRUE(reduction_crosses_groups(on_file.plan, c.cluster));
  EXPECT_FALSE(reduction_crosses_groups(on_measured.plan, c.cluster));
  EXPECT_GT(on_measured.plan.step_seconds, on_file.plan.step_seconds);

  // The file's layout priced on the measured links: slower than what the planner chose there.
  SearchOptions pinned;
  pinned.tp = on_file.plan.stages.front().tp;
  pinned.pp = static_cast<int>(on_file.plan.stages.size());
  pinned.dp = on_file.plan.stages.front().dp;
  const SearchResult file_layout_measured = plan_search(measured, pinned);
  EXPECT_GT(file_layout_measured.plan.step_seconds, 1.3 * on_measured.plan.step_seconds)
      << file_layout_measured.plan.step_seconds << " s against " << on_measured.plan.step_seconds << " s";

  // The notes name the measured link and where its figures came from.
  bool named = false, sourced = false;
  for (const std::string& note : on_measured.plan.notes) {
    named = named || note.find("slowest link this layout crosses is the measured link east - west (100 MB/s") != std::string::npos;
    sourced = sourced || note.find("links measured between node groups (links.json) replace the cluster file's") != std::string::npos;
  }
  EXPECT_TRUE(named && sourced) << [&] {
    std::string all;
    for (const std::string& note : on_measured.plan.notes) all += note + "\n";
    return all;
  }();
}

}  // namespace
}  // namespace alloy
