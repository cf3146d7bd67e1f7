// Rack uplinks and WAN ports shared between stages in the simulator: two stages' all-reduces
// over one oversubscribed uplink slow each other by what their overlap costs, a link used by
// one transfer at a time keeps the cost model's step, and the trace, report and text show
// which transfers crossed which link.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "cost/cost_model.hpp"
#include "plan/trace.hpp"
#include "plans.hpp"
#include "search/planner.hpp"
#include "sim/report.hpp"
#include "sim/simulate.hpp"

namespace alloy {
namespace {

using testing::hand_plan;
using testing::model_with_layers;
using testing::StageSpec;

constexpr double kNicBytesPerSecond = 1e9;
constexpr double kLatencySeconds = 5e-6;  // NICs and the nodes' fabric alike (testing::cluster)
constexpr double kUplinkBytesPerSecond = kNicBytesPerSecond / 20;

// Racks r1 and r2 of one node each (two A100s a node, 1 GB/s NICs), each uplink 20:1
// oversubscribed: 50 MB/s out of and into the rack.
ClusterSpec two_racks() {
  ClusterSpec c = testing::cluster("two-racks", {testing::a100_80()}, {{0, 1, 2}, {0, 1, 2}}, kNicBytesPerSecond,
                                   kLatencySeconds);
  c.racks = {Rack{"r1", -1, 0, 20, 0}, Rack{"r2", -1, 0, 20, 0}};
  c.node_groups[0].rack = 0;
  c.node_groups[1].rack = 1;
  return c;
}

// Two stages of dp 2, each with one replica in each rack (stage 0: devices 0 and 2, stage 1:
// devices 1 and 3), so a boundary stays on its node and each stage's all-reduce crosses both
// uplinks. One bucket: each stage reduces once, after its last backward.
Plan two_stages_across_racks(const ModelSpec& model, double forward_seconds, double backward_seconds) {
  Plan plan = hand_plan(model, 4, {StageSpec{1, 2, 0, 1, forward_seconds, backward_seconds}, StageSpec{1, 2, 0, 1, forward_seconds, backward_seconds}},
                        4, 2, Schedule::Schedule_1f1b);
  plan.stages[0].device_ids = {0, 2};
  plan.stages[1].device_ids = {1, 3};
  plan.gradient_bucket_bytes = 1e18;
  return plan;
}

const SimInterval& only_all_reduce(const SimResult& r, int lane) {
  const SimInterval* found = nullptr;
  for (const SimInterval& iv : r.intervals)
    if (iv.lane == lane && iv.kind == OpKind::OpKind_all_reduce) {
      EXPECT_EQ(found, nullptr) << "one bucket: one all-reduce on lane " << lane;
      found = &iv;
    }
  EXPECT_NE(found, nullptr);
  return *found;
}

int link_id(const SimResult& r, const std::string& name) {
  for (size_t l = 0; l < r.shared_links.size(); ++l)
    if (r.shared_links[l].name == name) return static_cast<int>(l);
  ADD_FAILURE() << "no shared link " << name;
  return 0;
}

// Worked by hand. Each stage's all-reduce is a ring of two over the uplinks; alone it takes
//   T_s = 2 (latency + B_s / 2 / 50 MB/s),
// with B_s its gradient in fp32: stage 0 one block and the embedding (1,182,976 parameters,
// 4,731,904 bytes, T_0 = 94.65 ms), stage 1 one block, the final norm and its copy of the tied
// table (1,052,416 parameters, 4,209,664 bytes, T_1 = 84.20 ms). Stage 1 finishes its last
// backward first and starts reducing at s1; stage 0 starts at s0 = s1 + d, d = the last
// gradient's hop on the node (5 us + 32 KiB at 300 GB/s) plus stage 0's last backward (4 ms).
// Both take the whole of each uplink, so while they overlap each runs at half speed:
//   stage 1 has T_1 - d left at s0 and needs 2 (T_1 - d) more: it ends at s0 + 2 (T_1 - d);
//   stage 0 gets T_1 - d done meanwhile, then runs alone: it ends at s0 + T_0 + (T_1 - d).
// So the step (stage 0's reduction, then the tied table's sum in its optimizer step) grows by
// T_1 - d = 80.2 ms over the s0 + T_0 + optimizer it would take with an uplink of its own, and
// each uplink is oversubscribed for the 2 (T_1 - d) of the overlap.
TEST(LinkSharing, TwoStagesReducingOverOneUplinkSlowEachOtherByTheirOverlap) {
  const ClusterSpec cluster = two_racks();
  const ModelSpec model = model_with_layers(2);
  const double forward_seconds = 0.002, backward_seconds = 0.004;
  const Plan plan = two_stages_across_racks(model, forward_seconds, backward_seconds);
  const SimResult r = simulate(plan, model, cluster);

  const double b0 = static_cast<double>(schedule_gradient_bytes(plan, model, 0, 0, 1, plan.gradient_bytes));
  const double b1 = static_cast<double>(schedule_gradient_bytes(plan, model, 1, 1, 2, plan.gradient_bytes));
  ASSERT_EQ(b0, 4731904.0);
  ASSERT_EQ(b1, 4209664.0);
  const double t0 = 2 * (kLatencySeconds + b0 / 2 / kUplinkBytesPerSecond);
  const double t1 = 2 * (kLatencySeconds + b1 / 2 / kUplinkBytesPerSecond);
  const double hop = kLatencySeconds + static_cast<double>(plan.seq_len * model.hidden_size * precision_bytes(plan.precision)) /
                                           cluster.node_groups[0].intra_node.bandwidth_bytes_per_second;
  const double d = hop + backward_seconds;

  const SimInterval& first = only_all_reduce(r, 1);
  const SimInterval& second = only_all_reduce(r, 0);
  const double s1 = first.start_seconds, s0 = second.start_seconds;
  EXPECT_NEAR(s0 - s1, d, 1e-9) << "stage 0 starts reducing one gradient hop and one backward later";
  EXPECT_NEAR(first.end_seconds, s0 + 2 * (t1 - d), 1e-9);
  EXPECT_NEAR(second.end_seconds, s0 + t0 + (t1 - d), 1e-9);

  double optimizer_seconds = 0;
  for (const SimInterval& iv : r.intervals)
    if (iv.lane == 0 && iv.kind == OpKind::OpKind_optimizer) optimizer_seconds = iv.end_seconds - iv.start_seconds;
  const double own_uplink_step = s0 + t0 + optimizer_seconds;
  std::printf("two reductions over one uplink: step %.6f s, %.6f s with an uplink each, +%.6f s (by hand T_1 - d = %.6f s)\n",
              r.step_seconds, own_uplink_step, r.step_seconds - own_uplink_step, t1 - d);
  EXPECT_NEAR(r.step_seconds - own_uplink_step, t1 - d, 1e-9);
  EXPECT_GT(t1 - d, 0.5 * t1) << "the reductions must overlap for most of their time";

  // Both reductions cross each uplink in each direction, taking all of it.
  ASSERT_EQ(r.shared_links.size(), 4u);
  for (const SimInterval* iv : {&first, &second}) {
    ASSERT_EQ(iv->num_link_uses, 4);
    for (int u = iv->first_link_use; u < iv->first_link_use + iv->num_link_uses; ++u)
      EXPECT_DOUBLE_EQ(r.link_uses[static_cast<size_t>(u)].share, 1.0);
  }
  for (const SimSharedLink& link : r.shared_links) {
    EXPECT_DOUBLE_EQ(link.bytes_per_second, kUplinkBytesPerSecond) << link.name;
    EXPECT_NEAR(link.busy_seconds, t0 + t1, 1e-9) << link.name << " carries both reductions' work back to back";
    EXPECT_NEAR(link.contended_seconds, 2 * (t1 - d), 1e-9) << link.name;
  }
}

// Once stage 1 has finished reducing before stage 0 starts (a slow last backward on stage 0),
// nothing overlaps: each reduction takes what it takes alone.
TEST(LinkSharing, ReductionsThatDoNotOverlapRunAsAlone) {
  const ClusterSpec cluster = two_racks();
  const ModelSpec model = model_with_layers(2);
  const Plan plan = two_stages_across_racks(model, 0.1, 0.2);
  const SimResult r = simulate(plan, model, cluster);
  const double b1 = static_cast<double>(schedule_gradient_bytes(plan, model, 1, 1, 2, plan.gradient_bytes));
  const SimInterval& first = only_all_reduce(r, 1);
  EXPECT_NEAR(first.end_seconds - first.start_seconds, 2 * (kLatencySeconds + b1 / 2 / kUplinkBytesPerSecond), 1e-9);
  for (const SimSharedLink& link : r.shared_links) EXPECT_EQ(link.contended_seconds, 0.0) << link.name;
}

// A planner plan on racks whose boundary crosses the uplinks one transfer at a time agrees with
// the cost model as on a flat cluster (tests/sim/planner_agreement_test.cpp).
TEST(LinkSharing, APipelineAcrossRacksKeepsTheCostModelsStep) {
  const ModelSpec model = testing::gpt2("tied-gpt", 4, 512, 8, 2048, 1024);
  ClusterSpec cluster = testing::cluster("rack-pair", {testing::a100_80()}, {{0, 1, 1}, {0, 1, 1}}, 1e9, 1e-3);
  cluster.racks = {Rack{"r1", -1, 100e6, 1, 0}, Rack{"r2", -1, 100e6, 1, 0}};
  cluster.node_groups[0].rack = 0;
  cluster.node_groups[1].rack = 1;
  CostModel cost(model, cluster, testing::train(512, 8));
  SearchOptions options;
  options.pp = 2;
  options.num_micro_batches = 4;
  const Plan plan = plan_search(cost, options).plan;
  ASSERT_EQ(plan.stages.size(), 2u);
  const SimResult r = simulate(plan, model, cluster);
  std::printf("pipeline across racks: simulated %.5f s, cost model %.5f s, difference %+.2f%%\n", r.step_seconds,
              plan.step_seconds, 100.0 * (r.step_seconds / plan.step_seconds - 1));
  EXPECT_NEAR(r.step_seconds / plan.step_seconds, 1.0, 0.05);
  double busy = 0;
  for (const SimSharedLink& link : r.shared_links) busy += link.busy_seconds;
  EXPECT_GT(busy, 0.0) << "the boundary sends cross the uplinks";
}

TEST(LinkSharing, TraceHasATrackPerLinkWithOverlappingTransfersOnRowsOfTheirOwn) {
  const ClusterSpec cluster = two_racks();
  const ModelSpec model = model_with_layers(2);
  const Plan plan = two_stages_across_racks(model, 0.002, 0.004);
  const SimResult r = simulate(plan, model, cluster);
  const nlohmann::json doc = nlohmann::json::parse(trace_json(r, plan));
  int links_pid = -1;
  for (const nlohmann::json& e : doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "process_name" && e["args"]["name"] == "shared links (rack uplinks, WAN ports)")
      links_pid = e["pid"];
  ASSERT_EQ(links_pid, 4) << "after the four ranks' processes";
  std::map<int, std::string> threads;
  std::map<std::string, std::vector<std::string>> events_by_thread;
  double peak_load = 0;
  for (const nlohmann::json& e : doc["traceEvents"]) {
    if (e["pid"] != links_pid) continue;
    if (e["ph"] == "M" && e["name"] == "thread_name") threads[e["tid"]] = e["args"]["name"];
    if (e["ph"] == "C" && e["name"] == "rack r1 uplink out load")
      peak_load = std::max(peak_load, e["args"]["share of capacity"].get<double>());
  }
  for (const nlohmann::json& e : doc["traceEvents"])
    if (e["pid"] == links_pid && e["ph"] == "X") events_by_thread[threads[e["tid"]]].push_back(e["name"]);
  // The two reductions overlap: each uplink direction shows them on two rows.
  for (const char* link : {"rack r1 uplink out", "rack r1 uplink in", "rack r2 uplink out", "rack r2 uplink in"}) {
    EXPECT_EQ(events_by_thread[link], (std::vector<std::string>{"stage 1: all_reduce c0"})) << link;
    EXPECT_EQ(events_by_thread[std::string(link) + " (2)"], (std::vector<std::string>{"stage 0: all_reduce c0"})) << link;
  }
  EXPECT_DOUBLE_EQ(peak_load, 2.0);
}

TEST(LinkSharing, ReportAndTextNameEachLink) {
  const ClusterSpec cluster = two_racks();
  const ModelSpec model = model_with_layers(2);
  const Plan plan = two_stages_across_racks(model, 0.002, 0.004);
  const SimResult r = simulate(plan, model, cluster);
  const std::string html = report_html(plan, r);
  EXPECT_NE(html.find(">rack r2 uplink in</text>"), std::string::npos);
  EXPECT_NE(html.find("asked for 2.00x what rack r1 uplink out carries"), std::string::npos) << "the overlap is marked";
  const std::string text = sim_render_text(r, plan);
  const int link = link_id(r, "rack r1 uplink out");
  char busy[32];
  std::snprintf(busy, sizeof busy, "%.4f", r.shared_links[static_cast<size_t>(link)].busy_seconds);
  const size_t row = text.find("rack r1 uplink out");
  ASSERT_NE(row, std::string::npos) << text;
  EXPECT_NE(text.find(busy, row), std::string::npos) << text;

  // Without racks nothing is listed.
  const ClusterSpec flat = testing::cluster("flat", {testing::a100_80()}, {{0, 1, 2}, {0, 1, 2}}, kNicBytesPerSecond);
  const SimResult plain = simulate(plan, model, flat);
  EXPECT_TRUE(plain.shared_links.empty());
  EXPECT_EQ(sim_render_text(plain, plan).find("shared link"), std::string::npos);
  EXPECT_EQ(report_html(plan, plain).find(report_contended_color().hex), std::string::npos);
}

}  // namespace
}  // namespace alloy
