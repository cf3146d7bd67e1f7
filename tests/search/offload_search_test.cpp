// Offload in the planner: chosen under a tight device cap with a prefetch depth of 1, 2 or 4, a
// pinned depth honoured, plan evaluation reading the plan's depth, and host memory enforced.
#include <gtest/gtest.h>

#include <algorithm>

#include "../support/specs.hpp"
#include "search/planner.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy {
namespace {


// A 0.9B-parameter model on one device of 8 GiB: its weights, gradients and Adam states (about
// 16 GB) only fit with most blocks offloaded.
struct Tight {
  ModelSpec model = testing::llama("llama-0.9b", 16, 2048, 16, 16, 5632, 32000);
  TrainSpec train = testing::train(1024, 8);
  ClusterSpec cluster;

  explicit Tight(double host_memory_bytes = 256 * kGiB) {
    DeviceType small = testing::a100_80();
    small.memory_bytes = 8 * kGiB;
    cluster = testing::cluster("one-small-gpu", {small}, {{0, 1, 1}});
    cluster.node_groups[0].host_memory_bytes = host_memory_bytes;
  }
};

int offloaded_blocks(const Plan& plan) {
  int n = 0;
  for (const PlanStage& s : plan.stages) n += static_cast<int>(std::count(s.offload.begin(), s.offload.end(), true));
  return n;
}

TEST(OffloadSearch, TightDeviceMemoryIsMetByOffloadWithAChosenDepth) {
  Tight t;
  CostModel cost(t.model, t.cluster, t.train);
  SearchOptions no_offload;
  no_offload.allow_offload = false;
  EXPECT_THROW(plan_search(cost, no_offload), Error);
  const SearchResult r = plan_search(cost, {});
  EXPECT_GT(offloaded_blocks(r.plan), 0);
  EXPECT_LE(plan_memory_ratio(r.plan), 1.0);
  for (const PlanStage& s : r.plan.stages) {
    const int depth = s.offload_prefetch_depth;
    EXPECT_TRUE(depth == 1 || depth == 2 || depth == 4) << depth;
  }
  // The report's terms: the node's offloaded state within its host memory, the copies' share of
  // the step within the step.
  EXPECT_GT(r.plan.host_offload_bytes_per_node, 0);
  EXPECT_LE(r.plan.host_offload_bytes_per_node, r.plan.host_memory_bytes_per_node);
  EXPECT_DOUBLE_EQ(r.plan.host_memory_bytes_per_node, 256 * kGiB);
  EXPECT_GE(r.plan.offload_step_seconds, 0);
  EXPECT_LT(r.plan.offload_step_seconds, r.plan.step_seconds);
}

TEST(OffloadSearch, PinnedDepthIsHonouredAndNoFasterThanTheFreeChoice) {
  Tight t;
  CostModel cost(t.model, t.cluster, t.train);
  const SearchResult free_choice = plan_search(cost, {});
  for (int depth : {1, 2, 4}) {
    SearchOptions o;
    o.prefetch_depth = depth;
    const SearchResult r = plan_search(cost, o);
    EXPECT_GT(offloaded_blocks(r.plan), 0);
    for (const PlanStage& s : r.plan.stages) EXPECT_EQ(s.offload_prefetch_depth, depth);
    EXPECT_GE(r.plan.step_seconds, free_choice.plan.step_seconds * (1 - 1e-9));
  }
  SearchOptions bad;
  bad.prefetch_depth = kMaxOffloadPrefetchDepth + 1;
  EXPECT_THROW(plan_search(cost, bad), Error);
}

TEST(OffloadSearch, EvaluationReadsThePlansDepth) {
  Tight t;
  CostModel cost(t.model, t.cluster, t.train);
  Plan plan = plan_search(cost, {}).plan;
  ASSERT_EQ(plan.stages.size(), 1u);
  const int offloaded = offloaded_blocks(plan);
  ASSERT_GE(offloaded, 3);
  auto window = [](const Plan& p) {
    for (const MemoryTerm& m : p.stages[0].memory)
      if (m.name == "offload_window") return m.bytes;
    return -1.0;
  };
  plan.stages[0].offload_prefetch_depth = 1;
  plan_evaluate(&plan, cost);
  const double one = window(plan);
  const double fwd_one = plan.stages[0].forward_seconds + plan.stages[0].backward_seconds;
  plan.stages[0].offload_prefetch_depth = 2;
  plan_evaluate(&plan, cost);
  // One more slot of weights (bf16) and gradients (fp32) per block.
  EXPECT_DOUBLE_EQ(window(plan) - one, static_cast<double>(block_parameters(t.model)) * 6);
  EXPECT_LE(plan.stages[0].forward_seconds + plan.stages[0].backward_seconds, fwd_one);
}

TEST(OffloadSearch, HostMemoryTooSmallForTheNeededOffloadIsRefused) {
  Tight t(4 * kGiB);
  CostModel cost(t.model, t.cluster, t.train);
  try {
    plan_search(cost, {});
    FAIL() << "expected a host memory error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("host memory per node"), std::string::npos) << what;
    EXPECT_NE(what.find("has 4 GiB"), std::string::npos) << what;
    EXPECT_NE(e.hint().find("host memory"), std::string::npos) << e.hint();
    EXPECT_NE(e.hint().find("add devices"), std::string::npos) << e.hint();
  }
  // Enough host memory for some of the offload but not all: the planner stays within it.
  Tight some(10 * kGiB);
  CostModel partial(some.model, some.cluster, some.train);
  try {
    const SearchResult r = plan_search(partial, {});
    EXPECT_LE(r.plan.host_offload_bytes_per_node, 10 * kGiB);
    EXPECT_LE(plan_memory_ratio(r.plan), 1.0);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("host memory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace alloy
