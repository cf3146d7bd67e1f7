// The event simulator: agreement with the analytic pipeline formula on balanced plans,
// bubbles, overlap of gradient reduction, shared links, memory over time and the critical path.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "cost/cost_model.hpp"
#include "plans.hpp"
#include "sim/simulate.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

using testing::hand_plan;
using testing::model_with_layers;
using testing::StageSpec;

ClusterSpec nodes_of_a100(int nodes, double network_bw = 25e9) {
  return testing::cluster("a100-nodes", {testing::a100_80()}, {{0, nodes, 8}}, network_bw);
}

TEST(Simulate, BalancedPipelinesAgreeWithTheAnalyticFormula) {
  const ClusterSpec cluster = nodes_of_a100(1);
  const double f = 0.010, b = 0.020;
  for (Schedule kind : {Schedule::Schedule_gpipe, Schedule::Schedule_1f1b})
    for (int p : {2, 4, 8})
      for (int m : {1, 4, 8, 32}) {
        const ModelSpec model = model_with_layers(p);
        const Plan plan = hand_plan(model, 8, std::vector<StageSpec>(p, StageSpec{1, 1, 0, 1, f, b}), m, 1, kind);
        const SimResult r = simulate(plan, model, cluster);
        const double formula = (m + p - 1) * (f + b);
        EXPECT_NEAR(r.step_seconds / formula, 1.0, 0.02) << schedule_name(kind) << " p " << p << " m " << m;
        // Every stage idles for the same fill and drain: (p - 1)(f + b) of the step.
        for (const SimLane& lane : r.lanes)
          EXPECT_NEAR(lane.bubble_fraction, (p - 1.0) / (m + p - 1.0), 0.02) << "stage " << lane.stage;
      }
}

TEST(Simulate, InterleavingShrinksTheBubbleByTheChunkCount) {
  const ClusterSpec cluster = nodes_of_a100(1);
  const int p = 4, v = 2, m = 8;
  const double f = 0.010, b = 0.020;  // per micro-batch, both chunks together
  const ModelSpec model = model_with_layers(p * v);
  const Plan plan = hand_plan(model, 8, std::vector<StageSpec>(p, StageSpec{1, 1, 0, 1, f, b}), m, 1,
                              Schedule::Schedule_interleaved, v);
  const SimResult r = simulate(plan, model, cluster);
  const double formula = (m + (p - 1.0) / v) * (f + b);
  EXPECT_NEAR(r.step_seconds / formula, 1.0, 0.02);
  const Plan plain = hand_plan(model, 8, std::vector<StageSpec>(p, StageSpec{1, 1, 0, 2, f, b}), m, 1,
                               Schedule::Schedule_1f1b);
  EXPECT_LT(r.step_seconds, simulate(plain, model, cluster).step_seconds);
}

TEST(Simulate, HeterogeneousPlansAreReportedAgainstTheCostModelFormula) {
  const ClusterSpec cluster = nodes_of_a100(1);
  const std::vector<std::vector<double>> stage_times = {{0.010, 0.030, 0.020}, {0.030, 0.010, 0.010, 0.020}, {0.02, 0.01}};
  for (const std::vector<double>& times : stage_times) {
    const int p = static_cast<int>(times.size());
    std::vector<StageSpec> specs;
    std::vector<double> per_mb, overhead;
    double sum = 0, slowest = 0;
    for (double t : times) {
      specs.push_back(StageSpec{1, 1, 0, 1, t, 2 * t});
      per_mb.push_back(3 * t);
      overhead.push_back(0);
      sum += 3 * t;
      slowest = std::max(slowest, 3 * t);
    }
    const int m = 8;
    const ModelSpec model = model_with_layers(p);
    const SimResult r = simulate(hand_plan(model, 8, specs, m, 1, Schedule::Schedule_1f1b), model, cluster);
    const double analytic = pipeline_step_seconds(per_mb, overhead, m, 1);
    std::printf("heterogeneous stages p=%d m=%d: simulated %.4f s, analytic %.4f s, difference %+.2f%%\n", p, m,
                r.step_seconds, analytic, 100.0 * (r.step_seconds / analytic - 1));
    // Bounds any schedule obeys: the slowest stage works m times; one micro-batch crosses all.
    EXPECT_GE(r.step_seconds, m * slowest * 0.999);
    EXPECT_GE(r.step_seconds, sum * 0.999);
    EXPECT_LE(r.step_seconds, (m + p - 1) * slowest * 1.001);
  }
}

TEST(Simulate, GradientBucketsOverlapTheLastBackward) {
  // Two replicas on different nodes of a slow network: reduction time is visible.
  const ClusterSpec cluster = nodes_of_a100(2, 2e9);
  const ModelSpec model = model_with_layers(8);
  StageSpec spec{1, 2, 0, 8, 0.010, 0.020};
  spec.first_device = 0;
  Plan plan = hand_plan(model, 16, {spec}, 4, 2, Schedule::Schedule_1f1b);
  plan.stages[0].device_ids = {0, 8};
  Plan one_bucket = plan;
  one_bucket.gradient_bucket_bytes = 1e18;
  Plan per_block = plan;
  per_block.gradient_bucket_bytes = 1;
  const double serial = simulate(one_bucket, model, cluster).step_seconds;
  const double overlapped = simulate(per_block, model, cluster).step_seconds;
  const double compute = 4 * 0.030;
  EXPECT_GT(serial, compute * 1.01) << "the reduction must cost something on this network";
  EXPECT_LT(overlapped, serial * 0.97) << "buckets should hide part of the reduction behind backward";
  EXPECT_GT(overlapped, compute);
}

// The simulator prices collectives from the profile the plan was made with, as the cost model
// does: a measured all-reduce ten times slower than the NVLink model shows in the step.
TEST(Simulate, MeasuredCollectivesReplaceTheModel) {
  const ClusterSpec cluster = nodes_of_a100(1);
  const ModelSpec model = model_with_layers(8);
  StageSpec spec{1, 2, 0, 8, 0.010, 0.020};
  Plan plan = hand_plan(model, 8, {spec}, 4, 2, Schedule::Schedule_1f1b);
  plan.gradient_bucket_bytes = 1e18;  // the whole reduction after the last backward
  SimOptions one_bucket;
  const double modelled = simulate(plan, model, cluster, one_bucket).step_seconds;

  const double gradient_bytes =
      static_cast<double>(schedule_gradient_bytes(plan, model, 0, 0, 8, plan.gradient_bytes));
  Profile profile;
  profile.model_name = model.name;
  const ProfiledCollective slow{CollectiveOp::CollectiveOp_all_reduce, 2, false, 1e9, 1e-3, {}};
  profile.device_types[plan.stages[0].device_type].collectives.push_back(slow);
  SimOptions measured = one_bucket;
  measured.profile = &profile;
  EXPECT_NEAR(simulate(plan, model, cluster, measured).step_seconds - modelled,
              slow.seconds(gradient_bytes) - (modelled - 4 * 0.030), 0.05 * slow.seconds(gradient_bytes));
  // A group the profile did not measure keeps the model.
  profile.device_types[plan.stages[0].device_type].collectives[0].group_size = 4;
  EXPECT_DOUBLE_EQ(simulate(plan, model, cluster, measured).step_seconds, modelled);
}

TEST(Simulate, TransfersThatShareALinkShareItsBandwidth) {
  // Stage 0 (one device) feeds two replicas of stage 1 on another node: both pieces leave
  // over stage 0's network link at the same time, so each takes about as long as both.
  const double bw = 1e9;
  const ClusterSpec cluster = nodes_of_a100(2, bw);
  const ModelSpec model = model_with_layers(2);
  StageSpec second{1, 2, 0, 1};
  second.first_device = 8;
  const Plan plan = hand_plan(model, 16, {StageSpec{}, second}, 2, 2, Schedule::Schedule_1f1b);
  const SimResult r = simulate(plan, model, cluster);
  const double piece_bytes = static_cast<double>(plan.seq_len * model.hidden_size * 2);
  int sends = 0;
  for (const SimInterval& iv : r.intervals)
    if (iv.lane == 0 && iv.kind == OpKind::OpKind_send_activation && iv.micro_batch == 0) {
      ++sends;
      const double alone = piece_bytes / bw + cluster.network.latency_seconds;
      EXPECT_NEAR(iv.end_seconds - iv.start_seconds, 2 * alone, 0.01 * alone);
    }
  EXPECT_EQ(sends, 2);
}

TEST(Simulate, ActivationMemoryFollowsTheMicroBatchesInFlight) {
  const ClusterSpec cluster = nodes_of_a100(1);
  const int p = 4, m = 8;
  const double states = 10e9, act = 1e9;
  for (Schedule kind : {Schedule::Schedule_1f1b, Schedule::Schedule_gpipe}) {
    const ModelSpec model = model_with_layers(p);
    Plan plan = hand_plan(model, 8, std::vector<StageSpec>(p, StageSpec{}), m, 1, kind);
    for (int s = 0; s < p; ++s) {
      PlanStage& st = plan.stages[s];
      st.micro_batches_in_flight = kind == Schedule::Schedule_gpipe ? m : p - s;
      st.memory = {{"parameters", states}, {"activations", act * st.micro_batches_in_flight}};
    }
    const SimResult r = simulate(plan, model, cluster);
    for (const SimLane& lane : r.lanes) {
      const int held = kind == Schedule::Schedule_gpipe ? m : std::min(m, p - lane.stage);
      EXPECT_NEAR(lane.peak_memory_bytes, states + held * act, 1.0) << schedule_name(kind) << " stage " << lane.stage;
      EXPECT_GT(lane.peak_memory_seconds, 0);
      EXPECT_LT(lane.peak_memory_seconds, r.step_seconds);
      EXPECT_NEAR(lane.memory.back().bytes, states, 1.0) << "activations are all freed by the end";
    }
  }
}

TEST(Simulate, CriticalPathRunsFromStartToEndWithoutGaps) {
  const ClusterSpec cluster = nodes_of_a100(1);
  const ModelSpec model = model_with_layers(3);
  const Plan plan = hand_plan(model, 8, {StageSpec{1, 1, 0, 1, 0.01, 0.02}, StageSpec{1, 1, 0, 1, 0.03, 0.06},
                                         StageSpec{1, 1, 0, 1, 0.01, 0.02}},
                              6, 1, Schedule::Schedule_1f1b);
  const SimResult r = simulate(plan, model, cluster);
  ASSERT_FALSE(r.critical_path.empty());
  EXPECT_NEAR(r.critical_path.front().start_seconds, 0, 1e-9);
  EXPECT_NEAR(r.critical_path.back().end_seconds, r.step_seconds, 1e-9);
  double compute_on_slow_stage = 0;
  for (size_t i = 1; i < r.critical_path.size(); ++i)
    EXPECT_GE(r.critical_path[i].start_seconds, r.critical_path[i - 1].end_seconds - 1e-9);
  for (const CriticalStep& c : r.critical_path)
    if (c.lane == 1 && (c.kind == OpKind::OpKind_forward || c.kind == OpKind::OpKind_backward))
      compute_on_slow_stage += c.end_seconds - c.start_seconds;
  EXPECT_GT(compute_on_slow_stage, 0.5 * r.step_seconds) << "the slow middle stage should dominate";
}

TEST(Simulate, RefusesAPlanForAnotherCluster) {
  const ModelSpec model = model_with_layers(2);
  const Plan plan = hand_plan(model, 16, {StageSpec{}, StageSpec{}}, 2, 1, Schedule::Schedule_1f1b);
  try {
    simulate(plan, model, nodes_of_a100(1));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.where().field, "num_devices");
    EXPECT_NE(std::string(e.what()).find("16 devices"), std::string::npos) << e.what();
  }
}

TEST(Simulate, ThousandDevicesInUnderASecond) {
  const ClusterSpec cluster = nodes_of_a100(128, 50e9);
  const ModelSpec model = model_with_layers(80);
  // 16 stages of tp 8 x dp 8, 5 blocks each, 64 micro-batches.
  std::vector<StageSpec> specs(16, StageSpec{8, 8, 1, 5, 0.02, 0.04});
  const Plan plan = hand_plan(model, 1024, specs, 64, 64, Schedule::Schedule_1f1b);
  const auto t0 = std::chrono::steady_clock::now();
  const SimResult r = simulate(plan, model, cluster);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.lanes.size(), 16u);
  EXPECT_GT(r.step_seconds, (64 + 15) * 0.06);
  std::printf("1024 devices: simulated in %.3f s, step %.3f s\n", seconds, r.step_seconds);
  EXPECT_LT(seconds, 5.0);  // 1 s in a release build (bench_sim); slack for sanitizer builds
}

}  // namespace
}  // namespace alloy
