// On clusters with one network (no racks, no sites) nothing but the per-stage links is shared:
// plans on shipped clusters simulate to the very step they did before rack uplinks and WAN
// ports became resources of their own. The expected steps were recorded, to the last bit, by
// the simulator before that change; a difference here means flat clusters simulate differently.
// The ZeRO-3 case was recorded again when the simulator came to gather a pass's weights block by
// block, as the runtime does, instead of a chunk at a time.
#include <gtest/gtest.h>

#include <cstdio>

#include "hw/catalog.hpp"
#include "plans.hpp"
#include "sim/simulate.hpp"
#include "spec/topology.hpp"

namespace alloy {
namespace {

using testing::hand_plan;
using testing::StageSpec;

ClusterSpec shipped_cluster(const std::string& name) {
  return cluster_load(std::string(ALLOY_SOURCE_DIR) + "/examples/clusters/" + name + ".yaml", catalog_builtin());
}

ModelSpec shipped_model(const std::string& name) {
  return model_load(std::string(ALLOY_SOURCE_DIR) + "/examples/models/" + name + ".json");
}

// Stage `s` runs on the cluster's device type of its first device.
Plan on_cluster(Plan plan, const ClusterSpec& cluster) {
  for (PlanStage& st : plan.stages) st.device_type = cluster.device_type(cluster.devices[st.device_ids.front()]).name;
  return plan;
}

struct FlatCase {
  const char* what;
  double recorded_step_seconds;
};

// GPT-2 medium (24 blocks) on a100-v100 (2 A100 nodes, 2 V100 nodes, 800 Gb/s InfiniBand).
std::vector<std::pair<FlatCase, Plan>> flat_cases(const ModelSpec& model, const ClusterSpec& cluster) {
  std::vector<std::pair<FlatCase, Plan>> out;
  // dp 16 over two nodes per stage: all-reduces and boundary sends on the network.
  out.push_back({{"pp 2 dp 16 1f1b", 0x1.98f80f99b6f77p-2},
                 on_cluster(hand_plan(model, 32, {StageSpec{1, 16, 0, 12, 0.010, 0.020}, StageSpec{1, 16, 0, 12, 0.015, 0.030}},
                                      8, 16, Schedule::Schedule_1f1b),
                            cluster)});
  // ZeRO-3 gathers and bucketed reduce-scatters, interleaved with two chunks.
  Plan zero3 = hand_plan(model, 32, {StageSpec{1, 16, 3, 6, 0.010, 0.020}, StageSpec{1, 16, 3, 6, 0.015, 0.030}}, 8, 16,
                         Schedule::Schedule_interleaved, 2);
  zero3.gradient_bucket_bytes = 8 << 20;
  out.push_back({{"pp 2 dp 16 zero-3 interleaved", 0x1.9c7a664115ef8p-2}, on_cluster(zero3, cluster)});
  // tp 8 per node, four stages, offloaded blocks on the first: host copies and one node per stage
  // (fetched block by block, each into a slot of the offload window).
  out.push_back({{"pp 4 tp 8 gpipe offload", 0x1.34b9c258508b3p-1},
                 on_cluster(hand_plan(model, 32,
                                      {StageSpec{8, 1, 0, 6, 0.01, 0.02, 2}, StageSpec{8, 1, 0, 6, 0.01, 0.02},
                                       StageSpec{8, 1, 0, 6, 0.02, 0.04}, StageSpec{8, 1, 0, 6, 0.02, 0.04}},
                                      8, 4, Schedule::Schedule_gpipe),
                            cluster)});
  return out;
}

TEST(FlatCluster, StepIsUnchangedToTheBit) {
  const ClusterSpec cluster = shipped_cluster("a100-v100");
  ASSERT_TRUE(topology_is_flat(cluster));
  const ModelSpec model = shipped_model("gpt2-medium");
  for (const auto& [c, plan] : flat_cases(model, cluster)) {
    const SimResult r = simulate(plan, model, cluster);
    std::printf("%-32s simulated %a (%.9f s)\n", c.what, r.step_seconds, r.step_seconds);
    EXPECT_EQ(r.step_seconds, c.recorded_step_seconds) << c.what;
    EXPECT_TRUE(r.shared_links.empty()) << c.what;
  }
}

}  // namespace
}  // namespace alloy
