// Expert parallelism in the planner: Mixtral-8x7B on a node of H100s and a node of A100s needs
// its experts split to fit well, and the plan says where they go.
#include <gtest/gtest.h>

#include <chrono>

#include "hw/catalog.hpp"
#include "search/planner.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

bool notes_contain(const Plan& plan, const std::string& text) {
  for (const std::string& note : plan.notes)
    if (note.find(text) != std::string::npos) return true;
  return false;
}

TEST(MoeSearch, MixtralSplitsItsExpertsAndNamesThePlacement) {
  const CostModel cost(model_load("mixtral-8x7b"), cluster_load("h100-a100", catalog_builtin()), TrainSpec{});
  const auto started = std::chrono::steady_clock::now();
  const SearchResult r = plan_search(cost, SearchOptions{});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), 1.0);
  for (const PlanStage& st : r.plan.stages) {
    EXPECT_GT(st.ep, 1) << "every stage splits its experts";
    EXPECT_EQ(st.dp % st.ep, 0);
  }
  EXPECT_LE(plan_memory_ratio(r.plan), 1.0);
  EXPECT_TRUE(notes_contain(r.plan, "stage 0 expert placement: ep ")) << r.plan.notes.size();
}

// The planner offers MoE models what the runtime trains: ZeRO 0-3, sharded gradients and weight
// offload at any ep, never sharded gradients beside offload; a pinned ZeRO 3 is planned.
TEST(MoeSearch, PlansStayInsideWhatTheRuntimeTrains) {
  TrainSpec train;
  train.global_batch_sequences = 64;
  const std::pair<const char*, const char*> problems[] = {{"mixtral-8x7b", "h100-a100"}, {"qwen1.5-moe-a2.7b", "a100-8"}};
  for (const auto& [model, cluster] : problems) {
    const CostModel cost(model_load(model), cluster_load(cluster, catalog_builtin()), train);
    for (int ep : {0, 1}) {
      SearchOptions options;
      options.ep = ep;
      const SearchResult r = plan_search(cost, options);
      for (const PlanStage& st : r.plan.stages) EXPECT_FALSE(st.shard_gradients && flags_any(st.offload)) << cluster;
    }
    SearchOptions zero3;
    zero3.zero = 3;
    const SearchResult r = plan_search(cost, zero3);
    for (const PlanStage& st : r.plan.stages) EXPECT_TRUE(st.dp == 1 || st.zero == 3) << cluster;
    EXPECT_LE(plan_memory_ratio(r.plan), 1.0) << cluster;
  }
}

// Mixtral-8x7B's weights and AdamW state (about 750 GB) exceed one node of 8 A100-80GB under any
// sharding: the plan fits by offloading blocks, each member taking its share of the experts along
// (ep > 1). Pinned to ep 1, offload still fits it, but every member then streams all eight
// experts of each offloaded block over its host link and updates them on the host: slower.
TEST(MoeSearch, MixtralOnOneNodeFitsWithOffloadAndSplitExperts) {
  const CostModel cost(model_load("mixtral-8x7b"), cluster_load("a100-8", catalog_builtin()), TrainSpec{});
  const SearchResult r = plan_search(cost, SearchOptions{});
  EXPECT_LE(plan_memory_ratio(r.plan), 1.0);
  bool offloads_split_experts = false;
  for (const PlanStage& st : r.plan.stages) offloads_split_experts = offloads_split_experts || (flags_any(st.offload) && st.ep > 1);
  EXPECT_TRUE(offloads_split_experts);
  SearchOptions one;
  one.ep = 1;
  const SearchResult pinned = plan_search(cost, one);
  EXPECT_LE(plan_memory_ratio(pinned.plan), 1.0);
  bool pinned_offloads = false;
  for (const PlanStage& st : pinned.plan.stages) pinned_offloads = pinned_offloads || flags_any(st.offload);
  EXPECT_TRUE(pinned_offloads);
  EXPECT_LT(r.plan.step_seconds, pinned.plan.step_seconds);
}

TEST(MoeSearch, PinnedEpOneIsSlowerForMixtral) {
  const CostModel cost(model_load("mixtral-8x7b"), cluster_load("h100-a100", catalog_builtin()), TrainSpec{});
  SearchOptions one;
  one.ep = 1;
  const SearchResult pinned = plan_search(cost, one);
  const SearchResult free = plan_search(cost, SearchOptions{});
  EXPECT_LT(free.plan.step_seconds, pinned.plan.step_seconds);
  for (const PlanStage& st : pinned.plan.stages) EXPECT_EQ(st.ep, 1);
}

// With a measured, skewed routing the plan places the experts by load where that shortens the
// step, and says by how much against an even placement priced beside it.
TEST(MoeSearch, MeasuredRoutingPlacesExpertsByLoad) {
  TrainSpec train;
  train.expert_tokens = {1800, 1500, 1200, 1000, 900, 800, 700, 600};
  const CostModel cost(model_load("mixtral-8x7b"), cluster_load("h100-a100", catalog_builtin()), train);
  SearchOptions options;
  options.ep = 4;
  const SearchResult r = plan_search(cost, options);
  EXPECT_TRUE(notes_contain(r.plan, "expert load: measured routing, the most popular expert takes 21.2%"));
  bool placed = false;
  for (const PlanStage& st : r.plan.stages) {
    if (st.experts_per_member.empty()) continue;
    placed = true;
    ASSERT_EQ(st.experts_per_member.size(), size_t{4});
    EXPECT_GT(st.experts_per_member.back(), st.experts_per_member.front());  // fewer of the popular ones
  }
  EXPECT_TRUE(placed);
  EXPECT_TRUE(notes_contain(r.plan, "by speed and measured routing load: step "));
  EXPECT_TRUE(notes_contain(r.plan, "with an even placement ("));
}

// Under uneven data parallelism an expert-parallel group of H200s and A100s mixes speeds: the
// plan names what each type holds and what a placement by speed would do.
TEST(MoeSearch, MixedGroupNamesThePlacementBySpeed) {
  const std::string yaml =
      "name: h200-a100-quad\nnetwork: {kind: roce, bandwidth: 400Gb/s, latency: 8us}\nnodes:\n"
      "  - {name: h200-node, count: 1, device: h200-sxm, devices_per_node: 2, host_memory: 512GiB, host_link: 50GB/s}\n"
      "  - {name: a100-node, count: 1, device: a100-80gb-sxm, devices_per_node: 2, host_memory: 512GiB, host_link: 25GB/s}\n";
  const CostModel cost(model_load("qwen1.5-moe-a2.7b"), cluster_load_text(yaml, "quad.yaml", "quad", catalog_builtin()),
                       TrainSpec{});
  SearchOptions options;
  options.ep = 4;
  const SearchResult r = plan_search(cost, options);
  ASSERT_EQ(r.plan.stages.size(), size_t{1});
  EXPECT_EQ(r.plan.stages[0].ep, 4);
  EXPECT_FALSE(r.plan.stages[0].replicas.empty());
  EXPECT_TRUE(notes_contain(r.plan, "stage 0 expert placement: ep 4 (60 experts per MoE block), a100-80gb-sxm "));
  EXPECT_TRUE(notes_contain(r.plan, "(by speed, 23/23/7/7 experts per member") ||
              notes_contain(r.plan, "by speed: step "));
}

}  // namespace
}  // namespace alloy
