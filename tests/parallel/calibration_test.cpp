// Calibration from a run, per device type and layer kind: a profile that is off for one kind
// only is corrected for that kind only, a run whose time splits over the kinds as the profile
// says moves every kind by the same factor, and kinds that did not run or ran briefly keep the
// type's one factor.
#include <gtest/gtest.h>

#include "runtime/parallel/calibration.hpp"

namespace alloy {
namespace {

constexpr int kMicroBatches = 4;
constexpr size_t kEmbedding = static_cast<size_t>(LayerKind::LayerKind_embedding);
constexpr size_t kBlock = static_cast<size_t>(LayerKind::LayerKind_block);
constexpr size_t kHead = static_cast<size_t>(LayerKind::LayerKind_head);

// Per micro-batch, forward + backward: a block 3 ms, the embedding 0.3 ms, the head 3 ms.
Profile profile_for(const std::string& type) {
  Profile p;
  p.model_name = "tiny-gpt";
  DeviceProfile& d = p.device_types[type];
  d.layers.push_back({LayerKind::LayerKind_embedding, 2, 16, 1, false, 1e-4, 2e-4});
  d.layers.push_back({LayerKind::LayerKind_block, 2, 16, 1, false, 1e-3, 2e-3});
  d.layers.push_back({LayerKind::LayerKind_head, 2, 16, 1, false, 1e-3, 2e-3});
  d.optimizer_seconds_per_parameter = 1e-9;
  return p;
}

// Two stages of one type: the embedding and 2 blocks, then 2 blocks and the head, priced as
// the profile says (stage 0: 6.3 ms per micro-batch, stage 1: 9 ms).
Plan two_stage_plan(const std::string& type) {
  Plan plan;
  plan.model_name = "tiny-gpt";
  plan.seq_len = 16;
  plan.micro_batch_sequences = 2;
  plan.num_micro_batches = kMicroBatches;
  plan.global_batch_sequences = 2 * kMicroBatches;
  for (int s = 0; s < 2; ++s) {
    PlanStage st;
    st.device_type = type;
    st.device_ids = {s};
    st.chunks = {{2 * s, 2 * s + 2}};
    st.has_embedding = s == 0;
    st.has_head = s == 1;
    st.forward_seconds = s == 0 ? 2.1e-3 : 3e-3;
    st.backward_seconds = s == 0 ? 4.2e-3 : 6e-3;
    st.optimizer_seconds = 0.01;
    plan.stages.push_back(st);
  }
  return plan;
}

// A rank whose passes computed for `pass_seconds` and waited `waits` more inside them (ZeRO-3
// gathers, tensor-parallel sums).
RankSummary rank(int index, double pass_seconds, std::array<double, kLayerKinds> cpu, double waits = 0) {
  RankSummary r;
  r.rank = index;
  r.stage = index;
  r.pass_seconds = pass_seconds + waits;
  r.layer_cpu_seconds = cpu;
  r.optimizer_seconds = 0.01;
  r.compute_seconds = pass_seconds + r.optimizer_seconds;
  return r;
}

TEST(Calibration, AHeadSlowerThanProfiledMovesTheHeadOnly) {
  const ModelSpec model = model_load("tiny-gpt");
  const Plan plan = two_stage_plan("cpu");
  const Profile profile = profile_for("cpu");
  TrainerResult run;
  // Stage 0 ran as profiled; stage 1's head took 6 ms instead of 3, half of its 12 ms.
  run.ranks = {rank(0, kMicroBatches * 6.3e-3, {0.3, 6, 0}), rank(1, kMicroBatches * 12e-3, {0, 6, 6})};
  const std::vector<DeviceTypeCalibration> ratios = dist_calibration(run, plan, profile, model);
  ASSERT_EQ(ratios.size(), 1u);
  const DeviceTypeCalibration& c = ratios[0];
  EXPECT_NEAR(c.layer_ratio[kHead], 2.0, 1e-9);
  EXPECT_NEAR(c.layer_ratio[kBlock], 1.0, 1e-9);
  EXPECT_EQ(c.layer_ratio[kEmbedding], 0);  // 1.6% of the pass: the type's factor applies
  EXPECT_NEAR(c.pass_ratio, (6.3 + 12) / (6.3 + 9), 1e-9);  // what one factor per type would apply to all
  EXPECT_NEAR(c.optimizer_ratio, 1.0, 1e-9);

  const Profile calibrated = profile_calibrated(profile, ratios);
  const DeviceProfile& d = calibrated.device_types.at("cpu");
  EXPECT_NEAR(d.layers[kHead].forward_seconds, 2e-3, 1e-12);
  EXPECT_NEAR(d.layers[kHead].backward_seconds, 4e-3, 1e-12);
  EXPECT_NEAR(d.layers[kBlock].backward_seconds, 2e-3, 1e-12);
  EXPECT_NEAR(d.layers[kEmbedding].forward_seconds, 1e-4 * c.pass_ratio, 1e-12);
  EXPECT_NE(calibration_describe(c).find("head 2.00x"), std::string::npos) << calibration_describe(c);
}

// Stage 0 on one type, stage 1 on another: the head ran on "cpu-b" only, and "cpu-a" keeps
// one factor for it; the embedding, 7% of cpu-a's pass, is too brief to set its own.
TEST(Calibration, KindsATypeDidNotRunOrRanBrieflyKeepTheTypesFactor) {
  const ModelSpec model = model_load("tiny-gpt");
  Plan plan = two_stage_plan("cpu-a");
  plan.stages[1].device_type = "cpu-b";
  Profile profile = profile_for("cpu-a");
  profile.device_types["cpu-b"] = profile.device_types["cpu-a"];
  TrainerResult run;
  // cpu-a: blocks as profiled, the embedding (profiled at 5% of the pass) 1.5x slower: 7%.
  const double blocks = kMicroBatches * 6e-3, embedding = 1.5 * kMicroBatches * 0.3e-3;
  run.ranks = {rank(0, blocks + embedding, {1.5 * 0.3, 6, 0}), rank(1, kMicroBatches * 12e-3, {0, 6, 6})};
  const std::vector<DeviceTypeCalibration> ratios = dist_calibration(run, plan, profile, model);
  ASSERT_EQ(ratios.size(), 2u);
  const DeviceTypeCalibration& a = ratios[0].device_type == "cpu-a" ? ratios[0] : ratios[1];
  const DeviceTypeCalibration& b = ratios[0].device_type == "cpu-a" ? ratios[1] : ratios[0];
  EXPECT_NEAR(b.layer_ratio[kHead], 2.0, 1e-9);
  EXPECT_EQ(a.layer_ratio[kHead], 0);
  EXPECT_NEAR(a.layer_share[kEmbedding], embedding / (blocks + embedding), 1e-9);
  EXPECT_LT(a.layer_share[kEmbedding], kCalibrationMinimumShare);
  EXPECT_EQ(a.layer_ratio[kEmbedding], 0);
  const Profile calibrated = profile_calibrated(profile, ratios);
  const double pass_ratio = (blocks + embedding) / (kMicroBatches * 6.3e-3);
  EXPECT_NEAR(a.pass_ratio, pass_ratio, 1e-9);
  EXPECT_NEAR(calibrated.device_types.at("cpu-a").layers[kHead].forward_seconds, 1e-3 * pass_ratio, 1e-12);
  EXPECT_NEAR(calibrated.device_types.at("cpu-a").layers[kEmbedding].forward_seconds, 1e-4 * pass_ratio, 1e-12);
  EXPECT_EQ(calibration_describe(a).find("head"), std::string::npos) << calibration_describe(a);
  EXPECT_NE(calibration_describe(a).find("embedding 7% of the passes (too brief"), std::string::npos)
      << calibration_describe(a);
}

TEST(Calibration, ASplitAsProfiledMovesEveryKindAlike) {
  const ModelSpec model = model_load("tiny-gpt");
  const Plan plan = two_stage_plan("cpu");
  TrainerResult run;
  // 1.5x slower throughout, time split over the kinds as the profile says.
  run.ranks = {rank(0, 1.5 * kMicroBatches * 6.3e-3, {0.03, 0.6, 0}), rank(1, 1.5 * kMicroBatches * 9e-3, {0, 0.6, 0.3})};
  const DeviceTypeCalibration c = dist_calibration(run, plan, profile_for("cpu"), model).at(0);
  EXPECT_NEAR(c.layer_ratio[kBlock], 1.5, 1e-9);
  EXPECT_NEAR(c.layer_ratio[kHead], 1.5, 1e-9);
  EXPECT_NEAR(c.pass_ratio, 1.5, 1e-9);
}

// The profile holds compute alone: waits inside the passes do not move it.
TEST(Calibration, WaitsInsideThePassesAreLeftOut) {
  const ModelSpec model = model_load("tiny-gpt");
  const Plan plan = two_stage_plan("cpu");
  TrainerResult run;
  run.ranks = {rank(0, kMicroBatches * 6.3e-3, {0.3, 6, 0}, 0.02), rank(1, kMicroBatches * 9e-3, {0, 6, 3}, 0.03)};
  const DeviceTypeCalibration c = dist_calibration(run, plan, profile_for("cpu"), model).at(0);
  EXPECT_NEAR(c.pass_ratio, 1.0, 1e-9);
  EXPECT_NEAR(c.layer_ratio[kBlock], 1.0, 1e-9);
  EXPECT_NEAR(c.layer_ratio[kHead], 1.0, 1e-9);
}

// A type whose profile lacks the shape a stage ran, or a run without CPU times, keeps the one
// factor over all kinds.
TEST(Calibration, WithoutTheSplitOneFactorPerType) {
  const ModelSpec model = model_load("tiny-gpt");
  const Plan plan = two_stage_plan("cpu");
  TrainerResult run;
  run.ranks = {rank(0, 2 * kMicroBatches * 6.3e-3, {0, 0, 0}), rank(1, 2 * kMicroBatches * 9e-3, {0, 0, 0})};
  const std::vector<DeviceTypeCalibration> none = dist_calibration(run, plan, profile_for("cpu"), model);
  EXPECT_NEAR(none.at(0).pass_ratio, 2.0, 1e-9);
  for (double r : none.at(0).layer_ratio) EXPECT_EQ(r, 0);
  const Profile calibrated = profile_calibrated(profile_for("cpu"), none);
  EXPECT_NEAR(calibrated.device_types.at("cpu").layers[kHead].forward_seconds, 2e-3, 1e-12);

  run.ranks = {rank(0, kMicroBatches * 6.3e-3, {0.3, 6, 0}), rank(1, kMicroBatches * 12e-3, {0, 6, 6})};
  const DeviceTypeCalibration other = dist_calibration(run, plan, profile_for("another-type"), model).at(0);
  for (double r : other.layer_ratio) EXPECT_EQ(r, 0);
}

// Collectives over 2 ranks, profiled at 1 ms + bytes / 1 GB/s on both placements.
void collectives_add(Profile* profile, const std::string& type) {
  for (CollectiveOp op : {CollectiveOp::CollectiveOp_all_reduce, CollectiveOp::CollectiveOp_all_gather,
                          CollectiveOp::CollectiveOp_reduce_scatter}) {
    for (bool spans : {false, true}) {
      ProfiledCollective c;
      c.op = op;
      c.group_size = 2;
      c.spans_nodes = spans;
      c.latency_seconds = 1e-3;
      c.bandwidth_bytes_per_second = 1e9;
      c.samples = {{1e6, 2e-3}, {1e7, 11e-3}};
      profile->device_types[type].collectives.push_back(c);
    }
  }
}

// A collective both ranks waited for from its start (`blocked`), or one that ran under compute.
JoinedCollective joined(CollectiveOp op, double bytes, double seconds, bool blocked = true) {
  return {op, CollectiveGroup::CollectiveGroup_data, 2, false, static_cast<int64_t>(bytes), seconds, {0, 1}, blocked};
}

// All-reduces took twice their profiled time inside the run and all-gathers as profiled: each
// kind moves by its own ratio, at other group sizes too, and the kind the run had none of by
// all of them together.
TEST(Calibration, CollectivesMoveByWhatTheRunMeasured) {
  const ModelSpec model = model_load("tiny-gpt");
  const Plan plan = two_stage_plan("cpu");
  Profile profile = profile_for("cpu");
  collectives_add(&profile, "cpu");
  const ProfiledCollective over_4 = [&] {
    ProfiledCollective c = profile.device_types.at("cpu").collectives.front();
    c.group_size = 4;
    return c;
  }();
  profile.device_types["cpu"].collectives.push_back(over_4);  // an all_reduce over 4, not in the run
  TrainerResult run;
  run.ranks = {rank(0, kMicroBatches * 6.3e-3, {0.3, 6, 0}), rank(1, kMicroBatches * 9e-3, {0, 6, 3})};
  run.collectives = {joined(CollectiveOp::CollectiveOp_all_reduce, 1e6, 4e-3),
                     joined(CollectiveOp::CollectiveOp_all_reduce, 1e7, 22e-3),
                     joined(CollectiveOp::CollectiveOp_all_gather, 1e7, 11e-3),
                     // Ran under compute, and as slowly as the busy cores let it: left out.
                     joined(CollectiveOp::CollectiveOp_all_gather, 1e7, 55e-3, false),
                     // Smaller than any profiled size: its latency says nothing of 10 MB; left out.
                     joined(CollectiveOp::CollectiveOp_all_reduce, 8, 50e-3)};
  const DeviceTypeCalibration c = dist_calibration(run, plan, profile, model).at(0);
  ASSERT_EQ(c.collectives.size(), 2u);
  EXPECT_EQ(c.collectives[0].op, CollectiveOp::CollectiveOp_all_reduce);
  EXPECT_EQ(c.collectives[0].count, 2);
  EXPECT_NEAR(c.collectives[0].ratio(), 2.0, 1e-9);
  EXPECT_NEAR(c.collectives[1].ratio(), 1.0, 1e-9);
  EXPECT_NEAR(c.collective_ratio, (4 + 22 + 11) / (2.0 + 11 + 11), 1e-9);
  EXPECT_NEAR(c.pass_ratio, 1.0, 1e-9) << "collectives do not move the compute";
  EXPECT_NE(calibration_describe(c).find("all_reduce over 2 2.00x"), std::string::npos) << calibration_describe(c);

  const Profile calibrated = profile_calibrated(profile, {c});
  for (const ProfiledCollective& pc : calibrated.device_types.at("cpu").collectives) {
    const double ratio = pc.op == CollectiveOp::CollectiveOp_all_reduce   ? 2.0
                         : pc.op == CollectiveOp::CollectiveOp_all_gather ? 1.0
                                                                          : c.collective_ratio;
    SCOPED_TRACE(collective_op_name(pc.op));
    EXPECT_NEAR(pc.seconds(5e6), ratio * (2e-3 + 4e6 * 1e-9), 1e-12);
    EXPECT_NEAR(pc.latency_seconds, ratio * 1e-3, 1e-12);
    EXPECT_NEAR(pc.bandwidth_bytes_per_second, 1e9 / ratio, 1e-3);
  }
}

// One stage over 2 ranks under ZeRO-3: the gathers its passes did not wait for ran inside them
// and lengthened them; the profile's compute leaves them out, as it leaves out the waits.
TEST(Calibration, ZeroThreeGathersInsideThePassesAreLeftOut) {
  const ModelSpec model = model_load("tiny-gpt");
  Plan plan = two_stage_plan("cpu");
  plan.stages.resize(1);
  plan.micro_batch_sequences = 4;  // 2 per replica, as profiled
  plan.global_batch_sequences = 4 * kMicroBatches;
  PlanStage& st = plan.stages[0];
  st.device_ids = {0, 1};
  st.dp = 2;
  st.zero = 3;
  st.chunks = {{0, 4}};
  st.has_head = true;
  Profile profile = profile_for("cpu");
  collectives_add(&profile, "cpu");
  // Per micro-batch as profiled: 0.3 + 4 x 3 + 3 = 15.3 ms. Per step the passes waited 2 ms
  // for gathers and computed 8 ms longer: 10 ms of gathers (two timed steps of 5 x 2 ms).
  TrainerResult run;
  run.collective_steps = 2;
  const double passes = kMicroBatches * 15.3e-3;
  for (int r = 0; r < 2; ++r) {
    RankSummary s = rank(r, passes + 8e-3, {0.3, 12, 3}, 2e-3);
    s.stage = 0;
    s.dp_rank = r;
    run.ranks.push_back(s);
  }
  for (int k = 0; k < 10; ++k)
    run.collectives.push_back(joined(CollectiveOp::CollectiveOp_all_gather, 1e6, 2e-3, false));
  const DeviceTypeCalibration c = dist_calibration(run, plan, profile, model).at(0);
  EXPECT_NEAR(c.pass_ratio, 1.0, 1e-9);
  EXPECT_NEAR(c.layer_ratio[kBlock], 1.0, 1e-9);
  // Two replicas of the same work, one 20% slower in its passes and its optimizer: the step
  // waits for it, so its ratios are the type's.
  run.ranks[1].compute_seconds = 1.2 * passes + 8e-3 + 1.2 * 0.01;
  run.ranks[1].optimizer_seconds = 1.2 * 0.01;
  run.ranks[1].pass_seconds = run.ranks[1].compute_seconds - run.ranks[1].optimizer_seconds + 2e-3;
  const DeviceTypeCalibration slow = dist_calibration(run, plan, profile, model).at(0);
  EXPECT_NEAR(slow.pass_ratio, 1.2, 1e-9);
  EXPECT_GT(slow.slowest_alike_lift, 1.05);
  EXPECT_NEAR(slow.optimizer_ratio / c.optimizer_ratio, 1.2, 1e-9);
  EXPECT_NE(calibration_describe(slow).find("the slowest of ranks doing the same work"), std::string::npos);
  run.ranks[1] = run.ranks[0];
  run.ranks[1].rank = 1;
  run.ranks[1].dp_rank = 1;
  // Without ZeRO-3 the same all_gathers (ZeRO-1's, after the optimizer) leave the passes alone.
  st.zero = 1;
  EXPECT_NEAR(dist_calibration(run, plan, profile, model).at(0).pass_ratio, (passes + 8e-3) / passes, 1e-9);
}

}  // namespace
}  // namespace alloy
