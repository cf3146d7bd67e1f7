// Chrome trace export: parses back as JSON with named processes and threads for every rank
// and one complete event per operation, in microseconds.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "plans.hpp"
#include "plan/trace.hpp"

namespace alloy {
namespace {

using testing::hand_plan;
using testing::model_with_layers;
using testing::StageSpec;

struct Traced {
  Plan plan;
  SimResult result;
};

Traced traced_plan() {
  const ClusterSpec cluster = testing::cluster("one-node", {testing::a100_80()}, {{0, 1, 8}});
  const ModelSpec model = model_with_layers(4);
  // Stage 0: tp 2 x dp 2 (ranks 0-3), stage 1: dp 2 (ranks 4-5), ZeRO-1 so there are gathers.
  Plan plan = hand_plan(model, 8, {StageSpec{2, 2, 1, 2, 0.01, 0.02}, StageSpec{1, 2, 1, 2, 0.01, 0.02}}, 4, 2,
                        Schedule::Schedule_1f1b);
  return {plan, simulate(plan, model, cluster)};
}

TEST(Trace, ParsesBackWithEveryRankAndStreamNamed) {
  const Traced t = traced_plan();
  const nlohmann::json doc = nlohmann::json::parse(trace_json(t.result, t.plan));
  ASSERT_TRUE(doc.contains("traceEvents"));
  const nlohmann::json& events = doc["traceEvents"];
  ASSERT_TRUE(events.is_array());
  std::map<int, std::string> process_names;
  std::map<std::pair<int, int>, std::string> thread_names;
  std::map<int, int> forwards_per_pid;
  double last_end_us = 0;
  for (const nlohmann::json& e : events) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("name")) << e.dump();
    const std::string ph = e["ph"];
    if (ph == "M" && e["name"] == "process_name") process_names[e["pid"]] = e["args"]["name"];
    if (ph == "M" && e["name"] == "thread_name") thread_names[{e["pid"], e["tid"]}] = e["args"]["name"];
    if (ph == "X") {
      ASSERT_TRUE(e["ts"].is_number() && e["dur"].is_number() && e.contains("tid")) << e.dump();
      EXPECT_GE(e["dur"].get<double>(), 0);
      last_end_us = std::max(last_end_us, e["ts"].get<double>() + e["dur"].get<double>());
      if (e["cat"] == "forward") ++forwards_per_pid[e["pid"]];
    }
  }
  ASSERT_EQ(process_names.size(), 6u);
  EXPECT_EQ(process_names[0], "rank 0: a100-80 stage 0");
  EXPECT_EQ(process_names[3], "rank 3: a100-80 stage 0");
  EXPECT_EQ(process_names[5], "rank 5: a100-80 stage 1");
  for (int pid = 0; pid < 6; ++pid) {
    EXPECT_EQ((thread_names[{pid, 0}]), "compute");
    EXPECT_EQ((thread_names[{pid, static_cast<int>(SimStream::SimStream_collective)}]), "collective");
    EXPECT_EQ(forwards_per_pid[pid], 4) << "one forward per micro-batch on rank " << pid;
  }
  EXPECT_NEAR(last_end_us, t.result.step_seconds * 1e6, 1e-3 * t.result.step_seconds * 1e6);
}

TEST(Trace, LargePlansShowOneProcessPerStage) {
  const Traced t = traced_plan();
  TraceOptions options;
  options.max_ranks = 4;
  const nlohmann::json doc = nlohmann::json::parse(trace_json(t.result, t.plan, options));
  std::set<std::string> names;
  for (const nlohmann::json& e : doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "process_name") names.insert(e["args"]["name"].get<std::string>());
  EXPECT_EQ(names, (std::set<std::string>{"rank 0: a100-80 stage 0 (for ranks 0-3)", "rank 4: a100-80 stage 1 (for ranks 4-5)"}));
}

}  // namespace
}  // namespace alloy
