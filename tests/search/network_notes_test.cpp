// The plan's network note names the slowest link the layout crosses and what goes across it.
#include <gtest/gtest.h>

#include "../support/specs.hpp"
#include "search/network_notes.hpp"

namespace alloy {
namespace {

// Four one-device nodes, two per rack; NICs 10 GB/s, rack uplinks 1 GB/s.
ClusterSpec notes_two_racks() {
  ClusterSpec c = testing::cluster("two-racks", {testing::a100_80()}, {{0, 2, 1}, {0, 2, 1}}, 10e9);
  c.racks = {Rack{"r1", -1, 1e9, 1, 0}, Rack{"r2", -1, 1e9, 1, 0}};
  c.node_groups[0].rack = 0;
  c.node_groups[1].rack = 1;
  return c;
}

Plan notes_plan(const std::vector<std::vector<int>>& stages, int dp) {
  Plan plan;
  for (const std::vector<int>& ids : stages) {
    PlanStage st;
    st.device_ids = ids;
    st.dp = dp;
    plan.stages.push_back(st);
  }
  return plan;
}

TEST(NetworkNotes, PipelineBoundaryOnTheUplinkReductionsInsideRacks) {
  const std::vector<std::string> notes = network_notes(notes_plan({{0, 1}, {2, 3}}, 2), notes_two_racks());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("rack r1 uplink (500 MB/s per transfer)"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("across it: the pipeline boundary stage 0 -> 1; no data-parallel reduction crosses it"),
            std::string::npos)
      << notes[0];
}

TEST(NetworkNotes, ReductionAcrossRacksIsNamed) {
  const std::vector<std::string> notes = network_notes(notes_plan({{0, 1, 2, 3}}, 4), notes_two_racks());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("stage 0's data-parallel reduction (dp 4); no pipeline boundary crosses it"), std::string::npos)
      << notes[0];
}

TEST(NetworkNotes, FlatClusterHasNone) {
  EXPECT_TRUE(network_notes(notes_plan({{0, 1, 2, 3}}, 4), testing::cluster("flat", {testing::a100_80()}, {{0, 4, 1}})).empty());
}

}  // namespace
}  // namespace alloy
